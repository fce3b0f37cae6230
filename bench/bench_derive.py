"""Cost of the derive stage per cycle for 4 targets x 8 GPUs (budget: about 2 ms on an idle core)."""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT))
    from exporter.config import Config
    from exporter.derive import build_deriver
    from tests.test_derive_verdict import snapshot

    deriver = build_deriver(Config())
    snaps = [snapshot(float(i), targets=("a", "b", "c", "d"), gpus=8) for i in range(200)]
    costs = []
    for snap in snaps:
        started = time.process_time()
        deriver(snap, None)
        costs.append(time.process_time() - started)
    return [("derive CPU per cycle, 4 targets x 8 GPUs, median (ms)", f"{statistics.median(costs[20:]) * 1e3:.2f}")]
