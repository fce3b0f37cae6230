"""Start the twins `llm-exporter demo` scrapes (the exporter side is exporter.app.run_demo)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from exporter.simulator.scenarios import get_scenario
from exporter.simulator.server import TwinServer, start_server
from exporter.simulator.twin import Twin, TwinConfig


@dataclass(slots=True)
class RunningTwin:
    """One engine twin serving on loopback. `url` is the engine base URL (scrape `url + "/metrics"`);
    `twin` is what SimGpuSource reads; `stop()` shuts the server down."""

    url: str
    twin: Twin
    server: TwinServer

    async def stop(self) -> None:
        await self.server.stop()


async def start_twins(*, scenario: str, engines: int, gpus: int, engine_format: str, gpu_name: str, model: str,
                      host: str = "127.0.0.1", base_port: int = 0, seed: int = 0,
                      speed: float = 1.0, numa_mismatch: bool = False) -> list[RunningTwin]:
    """Start `engines` twins, each an engine on `gpus` tensor-parallel GPUs with distinct NVML indices
    (engine i owns indices i*gpus ..). Ports are base_port + i, or free ports when base_port is 0.
    Twins of one demo share the scenario and differ by seed, so their traffic is not identical.
    `numa_mismatch`: each engine pinned to CPUs of a NUMA node without its GPUs."""
    if engines < 1 or gpus < 1:
        raise ValueError("engines and gpus must be >= 1")
    started: list[RunningTwin] = []
    try:
        for i in range(engines):
            twin = Twin(TwinConfig(scenario=scenario, engine_format=engine_format, gpu=gpu_name, model=model,
                                   gpus=gpus, seed=seed + i, numa_mismatch=numa_mismatch,
                                   gpu_index_base=i * max(gpus, get_scenario(scenario).min_gpus)))
            server = await start_server(twin, host=host, port=base_port + i if base_port else 0, speed=speed)
            started.append(RunningTwin(server.url, twin, server))
    except BaseException:
        for running in started:
            with contextlib.suppress(Exception):
                await running.stop()
        raise
    return started
