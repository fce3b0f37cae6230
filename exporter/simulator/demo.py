"""Start the twins `llm-exporter demo` scrapes (the CLI wiring lives in exporter/cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from exporter.config import Config, EngineTarget
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
                      speed: float = 1.0) -> list[RunningTwin]:
    """Start `engines` twins, each an engine on `gpus` tensor-parallel GPUs with distinct NVML indices
    (engine i owns indices i*gpus ..). Ports are base_port + i, or free ports when base_port is 0.
    Twins of one demo share the scenario and differ by seed, so their traffic is not identical."""
    if engines < 1 or gpus < 1:
        raise ValueError("engines and gpus must be >= 1")
    started: list[RunningTwin] = []
    try:
        for i in range(engines):
            twin = Twin(TwinConfig(scenario=scenario, engine_format=engine_format, gpu=gpu_name, model=model,
                                   gpus=gpus, seed=seed + i, gpu_index_base=i * max(gpus, get_scenario(scenario).min_gpus)))
            server = await start_server(twin, host=host, port=base_port + i if base_port else 0, speed=speed)
            started.append(RunningTwin(server.url, twin, server))
    except BaseException:
        for running in started:
            with contextlib.suppress(Exception):
                await running.stop()
        raise
    return started



async def run_demo(config: Config, *, scenario: str, engines: int, gpus: int, engine_format: str, gpu_name: str,
                   model: str, seed: int = 0, speed: float = 1.0, stop: asyncio.Event | None = None,
                   announce: Callable[[str], None] = print) -> None:
    """`llm-exporter demo`: twins on loopback, the exporter scraping them over HTTP exactly as it
    scrapes a real engine, the simulated GPU source reading the twins, the host source reading
    this machine. Runs until `stop` is set or SIGINT/SIGTERM."""
    from exporter.app import bind_listener, build_sources, serve
    from exporter.sources.gpu.sim import SimGpuSource

    sock = bind_listener(config)
    twins = await start_twins(scenario=scenario, engines=engines, gpus=gpus, engine_format=engine_format,
                              gpu_name=gpu_name, model=model, seed=seed, speed=speed)
    try:
        targets = tuple(EngineTarget(url=t.url + "/metrics", name=f"demo-{i}", kind=None,
                                     timeout_s=config.engine_timeout_s) for i, t in enumerate(twins))
        config = dataclasses.replace(config, engines=targets, model=config.model or model)
        sources = build_sources(config, gpu_source=SimGpuSource([t.twin for t in twins]))
        base = f"http://{'127.0.0.1' if config.listen_host in ('0.0.0.0', '') else config.listen_host}:" \
               f"{config.listen_port}"
        announce(
            f"llm-exporter demo: {engines} {engine_format} twin(s) of {model} on {gpus}x {gpu_name}, "
            f"scenario {scenario}\n"
            f"  status page   {base}/\n  metrics       {base}/metrics\n"
            f"  diagnosis     {base}/api/v1/diagnosis\n"
            + "".join(f"  twin {i}        {t.url}/metrics  (switch: curl -X POST '{t.url}/sim/scenario?name=overload')\n"
                      for i, t in enumerate(twins))
            + "Ctrl-C stops it."
        )
        await serve(config, sources, sock, stop)
    finally:
        for running in twins:
            with contextlib.suppress(Exception):
                await running.stop()
