"""Run the exporter with N fake GPUs (tests/fake_pynvml.py) and the given engine URLs, as its own
process, so `make bench` measures /metrics the way Prometheus sees it: over a socket, from outside."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

from exporter.app import bind_listener, build_sources, serve, tune_gc
from exporter.config import load_config
from exporter.sources.gpu.nvml import NvmlOptions, NvmlSource

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--engine", action="append", default=[])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_pynvml import FakeNvml

    fake = FakeNvml(["h100"] * args.gpus, "busy")
    config = load_config({"listen": args.listen, "engines": args.engine, "gpu_backend": "none",
                          "interval": "1s", "log_level": "warning"}, {})
    gpu = NvmlSource(NvmlOptions(pynvml_module=fake, xid_events=False))
    sources = build_sources(config, gpu_source=gpu)
    tune_gc()  # as `llm-exporter run` does
    asyncio.run(serve(config, sources, bind_listener(config), own_process=True))


if __name__ == "__main__":
    main()
