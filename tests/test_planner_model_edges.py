"""The planner model's CPU device and its closed-loop interpolation, at the edges `make mutation`
(planner-model, partial run) found untested: the numbers `plan` prints for a CPU engine and the
client-side quantities it reads between and beyond the observed concurrency levels."""

from __future__ import annotations

import dataclasses
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


# --- the calibration's own edges (make mutation, planner-model's sample) ---------------------------


def _setup_and_point(in_flight: float = 8.0, tpot: float | None = 0.02):
    from exporter.planner.model import Setup, gpu_device
    from exporter.planner.observe import Point, Stat
    from exporter.specs.models import load_model

    setup = Setup(gpu_device("h100-sxm"), load_model("llama-3.1-8b"), max_num_seqs=256)
    point = Point("c=8", "concurrency", 8.0, in_flight, 0.0, 512.0, 128.0, Stat(0.2, 0.3, 400, 0.1),
                  Stat(tpot, tpot, 400, 0.05) if tpot else Stat(None), 100.0, 2.0)
    return setup, point


def test_calibration_refuses_nothing_and_points_without_tpot_by_name():
    from exporter.planner.model import calibrate

    setup, point = _setup_and_point(tpot=None)
    with pytest.raises(PlanError, match="^nothing observed to calibrate on$"):
        calibrate(setup, [])
    with pytest.raises(PlanError, match="^no observed TPOT to calibrate on$"):
        calibrate(setup, [point])


def test_calibration_intervals_name_each_fitted_figure():
    from exporter.planner.model import calibrate

    setup, point = _setup_and_point()
    cal = calibrate(setup, [point], refine=False)
    assert set(cal.ci) == {"bandwidth_efficiency", "decode_compute_efficiency", "prefill_compute_efficiency",
                           "host_seconds_per_request"}
    assert set(cal.as_dict()["ci95"]) == set(cal.ci)
    lo, hi = cal.ci["bandwidth_efficiency"]
    assert lo < cal.bw < hi


def test_the_decode_batch_is_the_mean_in_flight_else_the_level_within_the_engine_s_slots():
    from exporter.planner.model import _decode_batch

    setup, point = _setup_and_point(in_flight=5.5)
    assert _decode_batch(point, setup) == 5.5
    assert _decode_batch(dataclasses.replace(point, in_flight=0.0), setup) == 8.0  # not measured: the level
    assert _decode_batch(dataclasses.replace(point, in_flight=900.0), setup) == 256.0
    assert _decode_batch(dataclasses.replace(point, in_flight=0.2, level=0.2), setup) == 1.0


def test_the_search_grid_between_a_value_s_neighbours():
    from exporter.planner.model import _between

    grid = [1.0, 2.0, 4.0, 8.0]
    first = _between(grid, 0)
    assert len(first) == 9 and first[0] == 1.0 and first[-1] == pytest.approx(2.0)
    assert first[4] == pytest.approx(2 ** 0.5)
    last = _between(grid, 3)
    assert last[0] == 4.0 and last[-1] == pytest.approx(8.0)
    assert _between(grid, 1)[-1] == pytest.approx(4.0)
