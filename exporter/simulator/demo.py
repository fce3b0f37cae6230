"""Start the twins `llm-exporter demo` scrapes (the exporter side is exporter.app.run_demo)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.simulator.scenarios import get_scenario
from exporter.simulator.server import TwinServer, start_server
from exporter.simulator.twin import Twin, TwinConfig, pd_pair


@dataclass(slots=True)
class RunningTwin:
    """One engine twin serving on loopback. `url` is the engine base URL (scrape `url + "/metrics"`);
    `twin` is what SimGpuSource reads; `stop()` shuts the server down."""

    url: str
    twin: Twin
    server: TwinServer

    @property
    def role(self) -> str:
        """prefill or decode for an instance of a prefill/decode pair; both otherwise."""
        return self.twin.config.role

    async def stop(self) -> None:
        await self.server.stop()


async def start_twins(*, scenario: str, engines: int, gpus: int, engine_format: str, gpu_name: str, model: str,
                      host: str = "127.0.0.1", base_port: int = 0, seed: int = 0,
                      speed: float = 1.0, numa_mismatch: bool = False) -> list[RunningTwin]:
    """Start `engines` twins, each an engine on `gpus` tensor-parallel GPUs with distinct NVML indices
    (engine i owns indices i*gpus ..). Ports are base_port + i, or free ports when base_port is 0.
    Twins of one demo share the scenario and differ by seed, so their traffic is not identical.
    `numa_mismatch`: each engine pinned to CPUs of a NUMA node without its GPUs.

    A prefill/decode scenario (`Scenario.pd`) runs each engine as a pair, two instances with their own
    port: the decode instance first (its TTFT includes the KV transfer: the sidecar's first target),
    then the prefill instance; `engines` counts pairs."""
    if engines < 1 or gpus < 1:
        raise ValueError("engines and gpus must be >= 1")
    sc = get_scenario(scenario)
    per_engine = max(gpus, sc.min_gpus)
    twins: list[Twin] = []
    for i in range(engines):
        config = TwinConfig(scenario=scenario, engine_format=engine_format, gpu=gpu_name, model=model, gpus=gpus,
                            seed=seed + i, numa_mismatch=numa_mismatch)
        if sc.pd is None:
            twins.append(Twin(dataclasses.replace(config, gpu_index_base=i * per_engine)))
        else:
            pair = pd_pair(dataclasses.replace(config, seed=seed + 2 * i, gpu_index_base=(2 * i + 1) * per_engine),
                           decode_gpu_index_base=2 * i * per_engine)
            twins += [pair.decode, pair.prefill]
    started: list[RunningTwin] = []
    try:
        for i, twin in enumerate(twins):
            server = await start_server(twin, host=host, port=base_port + i if base_port else 0, speed=speed)
            started.append(RunningTwin(server.url, twin, server))
    except BaseException:
        for running in started:
            with contextlib.suppress(Exception):
                await running.stop()
        raise
    return started


def announce_switches(running: RunningTwin, *, target: str, base: str, speed: float, settle_s: float,
                      announce: Callable[[str], None]) -> None:
    """What a `POST /sim/scenario` to this twin answers and logs in the demo: what to expect and where
    (the exporter at `base`, this twin's `target`), from the scenario's Expect as the start banner says
    it, the time at least `settle_s` (the exporter's windows still hold the previous scenario)."""
    where = {"status_page": base + "/", "metrics": base + "/metrics", "diagnosis": base + "/api/v1/diagnosis",
             "target": target}

    def expectation(name: str) -> dict[str, Any]:
        expect = get_scenario(name).expect
        return {} if expect is None else {**expect.describe(speed, settle_s), **where}

    def on_switch(doc: dict[str, Any]) -> None:
        expect = get_scenario(doc["scenario"]).expect
        backlog = (f"{doc['requests_aborted']} requests of the old traffic aborted" if doc["backlog"] == "dropped"
                   else "its requests kept")
        what = "no expectation declared" if expect is None else expect.line(
            speed, settle_s, where=f'{base}/ and llm_bottleneck{{target="{target}"}}')
        announce(f"llm-exporter demo: {target} ({running.url}) switched from {doc['previous']} to "
                 f"{doc['scenario']} ({backlog}): {what}")

    running.server.app.expectation = expectation
    running.server.app.on_switch = on_switch
