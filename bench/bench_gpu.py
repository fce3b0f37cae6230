"""Cost of one NVML GPU source cycle on 8 fake GPUs (issue 3: under 20 ms of CPU per cycle).

The fake pynvml answers in Python, so this measures the source's own work plus the fake's; real
NVML calls are C calls into the driver, whose cost only a GPU host can show. The NVML calls per
cycle are what carries over to one: each is a driver round trip plus pynvml's ctypes work.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys
import time

from exporter.sources.gpu.nvml import NvmlOptions, NvmlSource

ROOT = pathlib.Path(__file__).resolve().parent.parent
GPUS = 8
CYCLES = 300
WARMUP = 5


def _fake_nvml(model: str):
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from fake_pynvml import FakeNvml  # tests/ is not a package; the fake lives with the tests

    return FakeNvml([model] * GPUS, "busy")


def measure(model: str, cycles: int = CYCLES) -> tuple[float, float, int, float]:
    """(CPU ms per cycle, wall ms per cycle, samples per cycle, NVML calls per cycle) over `cycles`
    cycles."""
    fake = _fake_nvml(model)
    source = NvmlSource(NvmlOptions(pynvml_module=fake, clock=fake.clock))
    loop = asyncio.new_event_loop()
    try:
        for _ in range(WARMUP):
            loop.run_until_complete(source.collect())
            fake.advance(1.0)
        cpu = wall = 0.0
        samples = 0
        calls_before = sum(fake.calls.values())
        for _ in range(cycles):
            fake.advance(1.0)  # outside the timed part: it stands for the GPU doing work
            cpu0, wall0 = time.process_time(), time.perf_counter()
            data = loop.run_until_complete(source.collect())
            cpu += time.process_time() - cpu0
            wall += time.perf_counter() - wall0
            samples = len(data.samples)
        calls = (sum(fake.calls.values()) - calls_before) / cycles
        loop.run_until_complete(source.close())
    finally:
        loop.close()
    return cpu / cycles * 1e3, wall / cycles * 1e3, samples, calls


def run() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for model, label in (("h100", "H100"), ("a100", "A100")):
        cpu_ms, wall_ms, samples, calls = measure(model)
        rows.append((f"gpu source CPU per cycle, {GPUS} fake {label} (ms)", f"{cpu_ms:.2f}"))
        rows.append((f"gpu source wall per cycle, {GPUS} fake {label} (ms)", f"{wall_ms:.2f}"))
        rows.append((f"gpu source samples per cycle, {GPUS} fake {label}", str(samples)))
        rows.append((f"gpu source NVML calls per cycle, {GPUS} fake {label}", f"{calls:.1f}"))
    return rows


if __name__ == "__main__":
    for name, value in run():
        print(f"{name}: {value}")
