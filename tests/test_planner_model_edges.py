"""The planner model's CPU device and its closed-loop interpolation, at the edges `make mutation`
(planner-model, partial run) found untested: the numbers `plan` prints for a CPU engine and the
client-side quantities it reads between and beyond the observed concurrency levels."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from exporter.planner.limits import MAX_CPU_THREADS
from exporter.planner.model import PlanError, along_level, cpu_device

GiB = 1 << 30


def test_cpu_device_peaks_follow_the_free_cores():
    four = cpu_device(4)
    # 25 GB/s and 100 GFLOP/s a thread, bandwidth capped at 200 GB/s, 64 GiB nominal memory.
    assert (four.name, four.kind, four.bandwidth, four.flops, four.memory_bytes, four.threads) == (
        "CPU (4 threads)", "cpu", 100e9, 400e9, 64 * GiB, 4)
    assert cpu_device(16).bandwidth == 200e9 and cpu_device(16).flops == 1600e9
    shared = cpu_device(8, free_cores=3)  # threads past the free cores add nothing
    assert (shared.name, shared.bandwidth, shared.flops, shared.threads) == (
        "CPU (8 threads, 3 cores free)", 75e9, 300e9, 8)
    assert cpu_device(MAX_CPU_THREADS).threads == MAX_CPU_THREADS
    with pytest.raises(PlanError, match=f"threads {MAX_CPU_THREADS + 1}: 1..{MAX_CPU_THREADS}"):
        cpu_device(MAX_CPU_THREADS + 1)


def closed(*points: tuple[float, float]) -> list[SimpleNamespace]:
    return [SimpleNamespace(mode="concurrency", level=x, y=y) for x, y in points]


@pytest.mark.parametrize(("level", "expected"), [
    (0.5, 5.0),  # below the first level: the first two points' line
    (1.5, 15.0), (3.0, 20.0),  # between: the neighbours' line
    (6.0, 20.0),  # above the last: the last two points' line (flat here, 60 on the first two's)
])
def test_along_level_interpolates_between_and_extends_past_the_observed_levels(level, expected):
    points = closed((1, 10), (2, 20), (4, 20)) + [SimpleNamespace(mode="rate", level=3, y=99)]
    assert along_level(points, level, lambda p: p.y) == pytest.approx(expected)


def test_along_level_with_few_points_and_never_negative():
    assert along_level([], 3, lambda p: p.y) == 0.0
    assert along_level(closed((2, 7)), 5, lambda p: p.y) == 7
    assert along_level(closed((1, 1), (2, 10)), 0, lambda p: p.y) == 0.0  # the line says -8
