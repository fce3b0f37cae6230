"""`python -m exporter.simulator --port P --scenario S --engine-format F --gpu NAME --model NAME --gpus N
--data-parallel D --seed K`: one twin served until interrupted (a prefill/decode scenario: its decode
instance on P, its prefill instance on P + 1)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from exporter.simulator.recorders import FORMATS
from exporter.simulator.scenarios import SCENARIOS, get_scenario
from exporter.simulator.server import start_server
from exporter.simulator.twin import DEFAULT_GPU, DEFAULT_MODEL, Twin, TwinConfig, pd_pair


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m exporter.simulator", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--scenario", default="decode-heavy", choices=sorted(SCENARIOS))
    p.add_argument("--engine-format", default="vllm", choices=FORMATS)
    p.add_argument("--gpu", default=DEFAULT_GPU, help="NVML device name or spec key (h100-sxm, l4, ...)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="built-in model name or a local config.json path")
    p.add_argument("--gpus", type=int, default=1, help="tensor-parallel GPUs of this engine")
    p.add_argument("--data-parallel", type=int, default=1,
                   help="vLLM data-parallel engines, each on --gpus GPUs of its own (one page, `engine` label)")
    p.add_argument("--gpu-index-base", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", type=float, default=1.0, help="twin seconds per wall-clock second")
    p.add_argument("--numa-mismatch", action="store_true",
                   help="pin the engine to CPUs of a NUMA node that holds none of its GPUs")
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    config = TwinConfig(scenario=args.scenario, engine_format=args.engine_format, gpu=args.gpu, model=args.model,
                        gpus=args.gpus, seed=args.seed, gpu_index_base=args.gpu_index_base,
                        numa_mismatch=args.numa_mismatch, data_parallel=args.data_parallel)
    if get_scenario(args.scenario).pd is not None:
        # A prefill/decode pair: the decode instance on --port, the prefill instance on --port + 1.
        pair = pd_pair(config)
        twins = [pair.decode, pair.prefill]
    else:
        twins = [Twin(config)]
    servers = []
    try:
        for i, twin in enumerate(twins):
            servers.append(await start_server(twin, host=args.host, port=args.port + i if args.port else 0,
                                              speed=args.speed))
            dp = f"{len(twin.engines)} engines x " if len(twin.engines) > 1 else ""
            role = f"{twin.config.role} instance, " if twin.config.role != "both" else ""
            print(f"twin ({role}{args.engine_format}, {twin.model.name} on {dp}{twin.hw.tp} x "
                  f"{twin.hw.gpu.nvml_name}, scenario {twin.scenario.name}) serving {servers[-1].url}/metrics",
                  flush=True)
        await _wait_for_signal()
    finally:
        for server in servers:
            await server.stop()


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):  # both end it cleanly, as a supervisor expects
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args))
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
