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
    from exporter.planner.observe import Point, Stat

    setup = _h100_setup()
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


# --- the closed-form fit and the calibration's passes (make mutation, planner-model's survivors) -----


def _synthetic_points(setup, truth, batches=(1, 2, 8, 16), shapes=((256, 64), (2048, 256)), spread=0.0):
    """Points whose steps and prefills are exactly `truth`'s: two prompt shapes at each decode batch."""
    from exporter.planner.model import decode_step_s, prefill_s
    from exporter.planner.observe import Point, Stat

    points = []
    for b in batches:
        for prompt, out in shapes:
            step = decode_step_s(setup, truth, b, prompt + out / 2)
            first = prefill_s(setup, truth, prompt)
            points.append(Point(f"c={b}", "concurrency", b, b, 0.0, prompt, out,
                                Stat(first, first, 400, spread), Stat(step, step, 400, spread), 100.0, 2.0))
    return points


def _cpu_setup():
    from exporter.planner.model import Setup
    from exporter.specs.models import load_model

    # Four CPU threads: 4 FLOPs per byte at the ridge, so batches 1 and 2 are memory-bound and 8 and 16
    # compute-bound, and the points fix both fractions.
    return Setup(cpu_device(4), load_model("llama-3.1-8b"), max_num_seqs=64)


def _on_grid():
    """A calibration whose fractions and overhead lie on the fit's grids (exactly recoverable)."""
    from exporter.planner.model import GRID, OVERHEAD_GRID, Calibration

    return Calibration(GRID[100], GRID[90], GRID[95], OVERHEAD_GRID[15])


def _assert_steps_match(setup, cal, points, rel: float) -> None:
    """Each point's decode step under `cal` is its observed TPOT, within `rel`."""
    from exporter.planner.model import _context, decode_step_s

    for p in points:
        assert decode_step_s(setup, cal, p.in_flight, _context(p)) == pytest.approx(p.tpot.centre, rel=rel), p


def test_the_closed_form_fit_reproduces_every_observed_step_and_finds_compute_and_prefill():
    from exporter.planner.model import _fit

    setup = _cpu_setup()
    truth = _on_grid()
    points = _synthetic_points(setup, truth)
    cal = _fit(setup, points, [(p, p.tpot.centre) for p in points])
    _assert_steps_match(setup, cal, points, rel=1e-3)  # the level per batch is what the points fix
    # The compute-bound batches fix the compute fraction and the lightest TTFTs the prefill's, both on
    # the grid exactly; the bandwidth and overhead trade against the per-batch factors (the priors decide).
    assert (cal.compute, cal.prefill) == (truth.compute, truth.prefill)
    assert [b for b, _ in cal.batch_factors] == [1, 2, 8, 16]
    assert all(0.9 < f < 1.1 for _, f in cal.batch_factors)
    assert truth.bw / 1.2 < cal.bw < truth.bw * 1.2


def test_the_fit_never_puts_a_gpu_past_its_peak_and_leaves_the_excess_to_the_batch_factors():
    from exporter.planner.model import Calibration, _fit

    setup = _h100_setup()
    # Steps 1.5x faster than HBM allows: no fraction of the peak explains them.
    fast = Calibration(1.5, 1.5, 0.6, 0.3e-3)
    points = _synthetic_points(setup, fast, batches=(1, 4))
    cal = _fit(setup, points, [(p, p.tpot.centre) for p in points])
    assert max(cal.bw, cal.compute) <= 1.0
    assert all(f < 0.8 for _, f in cal.batch_factors)
    _assert_steps_match(setup, cal, points, rel=0.02)


def test_a_memory_bound_prefill_takes_the_prior_prefill_fraction():
    from exporter.physics.costs import PRIOR_EFFICIENCY
    from exporter.planner.model import _fit

    setup = _cpu_setup()
    # One-token prompts read every weight for one token's FLOPs: any fraction above 1/4 fits the TTFT.
    points = _synthetic_points(setup, _on_grid(), shapes=((1, 64),))
    cal = _fit(setup, points, [(p, p.tpot.centre) for p in points])
    assert cal.prefill == pytest.approx(PRIOR_EFFICIENCY["prefill"], rel=0.05)


def test_the_host_time_interval_widens_with_the_ttft_standard_error():
    from exporter.planner.model import calibrate

    setup = _cpu_setup()
    points = _synthetic_points(setup, _on_grid(), batches=(1, 8), spread=0.5)
    rse = points[0].ttft.rse()
    assert rse == pytest.approx(1.2533 * (0.5 / 1.645) / 20)
    cal = calibrate(setup, points, refine=False)
    assert cal.ci["host_seconds_per_request"] == pytest.approx(
        (cal.host_s * (1 - 1.96 * rse), cal.host_s * (1 + 1.96 * rse)))


def test_calibrate_fits_again_on_the_stall_corrected_steps_then_searches_and_settles(monkeypatch):
    """The refinement's order, each pass's input read back: the second closed-form fit divides each
    point's TPOT by its replayed stall (replayed TPOT / pure step), 1 where the replay has no TPOT or an
    open loop's replay fell behind; the search runs plain, then settled."""
    from exporter.planner import model
    from exporter.planner.observe import Point, Stat

    setup = _cpu_setup()
    closed = _synthetic_points(setup, _on_grid(), batches=(1, 8), shapes=((256, 64),))
    step = closed[1].tpot.centre
    behind = Point("r=4", "rate", 4.0, 8.0, 4.0, 256.0, 64.0, Stat(0.5, 0.5, 400), Stat(step, step, 400), 100.0, 2.0)
    kept = dataclasses.replace(behind, label="r=2", level=2.0, requests_per_s=2.0)
    points = [*closed, behind, kept]
    replayed = {  # label -> (replayed TPOT, replayed requests/s)
        "c=1": (None, 1.0), "c=8": (1.25, 1.0), "r=4": (1.5, 3.5), "r=2": (1.5, 1.9)}
    calls = []

    def replay_point(setup_, cal, point, seed, prefix):
        ratio, rps = replayed[point.label]
        pure = model.decode_step_s(setup_, cal, model._decode_batch(point, setup_), model._context(point))
        return SimpleNamespace(requests_per_s=rps, centre=lambda *a: ratio and ratio * pure)

    real_fit = model._fit

    def fit(setup_, points_, obs):
        calls.append(("fit", [t for _, t in obs]))
        return real_fit(setup_, points_, obs)

    monkeypatch.setattr(model, "_replay_point", replay_point)
    monkeypatch.setattr(model, "_fit", fit)
    monkeypatch.setattr(model, "_refine", lambda *a, settle=False: calls.append(("refine", settle)) or a[2])
    monkeypatch.setattr(model, "_batch_factors", lambda *a, **k: calls.append(("factors",)) or a[2])
    model.calibrate(setup, points)
    observed = [p.tpot.centre for p in points]
    assert calls[0] == ("fit", observed)
    assert calls[1][0] == "fit"
    # c=1: no replayed TPOT; c=8: 1.25; r=4 replayed 3.5 of 4 requests/s (under 90%): 1; r=2: 1.5.
    assert calls[1][1] == pytest.approx([observed[0], observed[1] / 1.25, observed[2], observed[3] / 1.5])
    assert calls[2:] == [("refine", False), ("factors",), ("refine", True), ("factors",)]


def test_one_observed_step_takes_the_priors_split_of_it():
    """One point fixes the level of its batch and nothing else: of the splits that fit it, the fit
    keeps the prior's bandwidth-to-compute ratio (0.9 : 0.6) and per-step overhead (0.3 ms on a
    GPU) and leaves the batch's factor at 1, each within a step of the fine grid."""
    from exporter.planner.model import Calibration, _fit

    setup = _h100_setup()
    points = _synthetic_points(setup, Calibration(0.5, 0.2, 0.6, 2e-3), batches=(4,), shapes=((512, 128),))
    cal = _fit(setup, points, [(p, p.tpot.centre) for p in points])
    assert cal.bw / cal.compute == pytest.approx(0.9 / 0.6, rel=0.1)
    assert cal.overhead_s == pytest.approx(0.3e-3, rel=0.1)
    assert [b for b, _ in cal.batch_factors] == [4] and cal.batch_factors[0][1] == pytest.approx(1.0, abs=0.05)
    _assert_steps_match(setup, cal, points, rel=1e-3)


def test_steps_shorter_than_any_overhead_are_refused_by_name():
    from exporter.planner.model import Calibration, _fit

    setup = _cpu_setup()
    points = _synthetic_points(setup, Calibration(1.0, 1.0, 1.0, 0.0), batches=(1,), shapes=((16, 16),))
    tiny = [(p, 5e-6) for p in points]  # below the 10 us the overhead grid starts at
    with pytest.raises(PlanError, match="^the observed TPOTs are shorter than any per-step overhead the planner "
                                        "can fit$"):
        _fit(setup, points, tiny)


def _closed_form_replay(setup_, cal, point, seed, prefix):
    """A replay without queueing: the point's TPOT is one decode step at its batch, its TTFT the
    prefill plus the host time, as the calibration's parameters say (the search and the factor rounds
    are checked against it without running the twin)."""
    from exporter.planner.model import _context, _decode_batch, decode_step_s, prefill_s

    tpot = decode_step_s(setup_, cal, _decode_batch(point, setup_), _context(point))
    ttft = prefill_s(setup_, cal, point.prompt_tokens) + cal.host_s
    return SimpleNamespace(requests_per_s=point.requests_per_s,
                           centre=lambda which, *_: tpot if which == "tpot" else ttft)


def _observed(setup, truth, batches=(1, 8), shapes=((64, 64), (2048, 64))):
    """Points as _closed_form_replay replays `truth`."""
    return [dataclasses.replace(p, ttft=dataclasses.replace(p.ttft, p50=p.ttft.p50 + truth.host_s,
                                                            p99=p.ttft.p50 + truth.host_s))
            for p in _synthetic_points(setup, truth, batches=batches, shapes=shapes)]


def _factors_from_scratch(monkeypatch, setup, truth, **observed):
    """The points `truth` gives (`_observed`), and the factor rounds' calibration from `truth`
    without its batch factors, replayed in closed form."""
    from exporter.planner import model

    monkeypatch.setattr(model, "_replay_point", _closed_form_replay)
    points = _observed(setup, truth, **observed)
    return points, model._batch_factors(setup, points, dataclasses.replace(truth, batch_factors=()), 0, 0.0)


@pytest.mark.parametrize(("device", "prefill"), [("cpu", 1.3), ("gpu", 1.3), ("gpu", 0.9)])
def test_the_search_finds_prefill_and_host_time_and_keeps_a_gpu_under_its_peak(monkeypatch, device, prefill):
    from exporter.planner import model

    monkeypatch.setattr(model, "_replay_point", _closed_form_replay)
    setup = _cpu_setup() if device == "cpu" else _h100_setup()
    truth = model.Calibration(0.5, 0.3, prefill, 1e-3, host_s=1.5e-3)
    start = dataclasses.replace(truth, prefill=0.6, host_s=model.PRIOR_HOST_S)
    cal = model._refine(setup, _observed(setup, truth), start, 0, 0.0)
    if device == "gpu" and prefill > 1:  # a GPU's peak cannot be beaten: the search stops under it
        assert 0.9 < cal.prefill <= 1.0
        return
    assert cal.prefill == pytest.approx(prefill, rel=0.05)  # a CPU's nominal peak can
    if device == "gpu":  # a CPU's prefills take seconds: the host's milliseconds are not seen there
        assert cal.host_s == pytest.approx(truth.host_s, rel=0.1)


def test_the_search_leaves_what_the_points_cannot_see_at_its_prior(monkeypatch):
    """Host time no observation depends on (a replay without it) is pulled back to the prior."""
    from exporter.planner import model

    def no_host(setup_, cal, point, seed, prefix):
        return _closed_form_replay(setup_, dataclasses.replace(cal, host_s=0.0), point, seed, prefix)

    monkeypatch.setattr(model, "_replay_point", no_host)
    setup = _cpu_setup()
    truth = model.Calibration(0.5, 0.3, 0.6, 1e-3, host_s=0.0)
    start = dataclasses.replace(truth, host_s=4 * model.PRIOR_HOST_S)
    cal = model._refine(setup, _observed(setup, truth), start, 0, 0.0)
    assert cal.host_s == pytest.approx(model.PRIOR_HOST_S, rel=0.05)
    assert cal.prefill == pytest.approx(0.6, rel=0.05)


def test_the_search_settles_each_trial_s_decode_only_when_asked(monkeypatch):
    from exporter.planner import model

    monkeypatch.setattr(model, "_replay_point", _closed_form_replay)
    settled = []
    monkeypatch.setattr(model, "_batch_factors", lambda *a, rounds=3: settled.append(rounds) or a[2])
    setup = _cpu_setup()
    truth = model.Calibration(0.5, 0.3, 0.6, 1e-3, host_s=2e-3)
    points = _observed(setup, truth)
    model._refine(setup, points, truth, 0, 0.0)
    assert settled == []
    model._refine(setup, points, truth, 0, 0.0, settle=True)
    assert settled and set(settled) == {1}


def test_the_batch_factors_converge_on_each_batch_s_observed_step(monkeypatch):
    """Each round replays with the factors so far: the steps the replay gives at the end are the
    observed ones at every batch (a round that replayed the starting factors would overshoot)."""
    from exporter.planner.model import Calibration

    setup = _cpu_setup()
    truth = Calibration(0.5, 0.3, 0.6, 1e-3, batch_factors=((1, 1.6), (8, 0.7)))
    points, cal = _factors_from_scratch(monkeypatch, setup, truth, shapes=((512, 64),))
    _assert_steps_match(setup, cal, points, rel=0.01)


def _h100_setup():
    from exporter.planner.model import Setup, gpu_device
    from exporter.specs.models import load_model

    return Setup(gpu_device("h100-sxm"), load_model("llama-3.1-8b"), max_num_seqs=256)


def test_the_batch_factors_correct_only_the_roofline_part_of_a_step_that_carries_an_overhead(monkeypatch):
    """Steps of 8.5 ms of overhead and about 10 ms of weights read: a factor corrects the second
    part, so the rounds find it; a correction of the whole step would still be 2% short after three."""
    from exporter.planner.model import Calibration

    setup = _h100_setup()
    truth = Calibration(0.5, 0.3, 0.6, 8.5e-3, batch_factors=((1, 1.6), (8, 1.3)))
    points, cal = _factors_from_scratch(monkeypatch, setup, truth, shapes=((512, 64),))
    _assert_steps_match(setup, cal, points, rel=0.01)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_factors_level_moves_into_the_fractions_up_to_a_gpu_s_peak(monkeypatch, device):
    """Steps 25-30% faster than a bandwidth of 0.95 of the peak explains: on a CPU (a nominal peak)
    the whole level moves into the fractions and the factors keep only the batches' spread; on a GPU
    the fractions stop at the peak and the factors keep the rest."""
    from exporter.planner.model import Calibration

    setup = _cpu_setup() if device == "cpu" else _h100_setup()
    truth = Calibration(0.95, 0.9, 0.6, 0.3e-3, batch_factors=((1, 0.7), (8, 0.75)))
    points, cal = _factors_from_scratch(monkeypatch, setup, truth, shapes=((512, 64),))
    factors = [f for _, f in cal.batch_factors]
    level = (factors[0] * factors[1]) ** 0.5
    if device == "cpu":
        assert level == pytest.approx(1.0, abs=0.01) and cal.bw > 1.0
    else:
        assert max(cal.bw, cal.compute) == pytest.approx(1.0) and level < 0.8
    _assert_steps_match(setup, cal, points, rel=0.01)


def test_steps_the_overhead_dominates_are_corrected_whole_even_below_the_overhead(monkeypatch):
    """Under twice the overhead a step's roofline part is too small to divide by: the factor follows
    the whole step's ratio (closing most of the gap in three rounds), and an observed step shorter than
    the fitted overhead (no roofline part at all) still gives a factor, the smallest."""
    from exporter.planner import model

    monkeypatch.setattr(model, "_replay_point", _closed_form_replay)
    setup = _h100_setup()
    truth = model.Calibration(0.5, 0.3, 0.6, 20e-3, batch_factors=((1, 1.6),))
    points = _observed(setup, truth, batches=(1,), shapes=((512, 64),))
    start = dataclasses.replace(truth, batch_factors=())
    seen = points[0].tpot.centre

    def gap(cal):
        return abs(model.decode_step_s(setup, cal, 1, model._context(points[0])) - seen)

    assert gap(model._batch_factors(setup, points, start, 0, 0.0)) < 0.5 * gap(start)
    below = dataclasses.replace(start, overhead_s=seen * 1.2)
    cal = model._batch_factors(setup, points, below, 0, 0.0)
    assert cal.batch_factors and all(f <= 1.0 for _, f in cal.batch_factors)


def test_without_any_ttft_the_prefill_fraction_is_the_decode_compute_fraction():
    from exporter.planner.model import _fit
    from exporter.planner.observe import Stat

    setup = _cpu_setup()
    truth = _on_grid()
    points = [dataclasses.replace(p, ttft=Stat(None)) for p in _synthetic_points(setup, truth)]
    cal = _fit(setup, points, [(p, p.tpot.centre) for p in points])
    assert cal.prefill == cal.compute == truth.compute


def test_a_cpu_device_s_hardware_record_describes_a_cpu():
    from exporter.planner.model import Calibration, hardware

    hw = hardware(_cpu_setup(), Calibration(0.5, 0.4, 0.3, 1e-3))
    gpu = hw.gpu
    assert (gpu.key, gpu.display, gpu.memory_type, gpu.mem_bandwidth_bytes_per_s, gpu.bf16_dense_flops) == (
        "cpu", "CPU (4 threads)", "DDR", 100e9, 400e9)
    assert (gpu.max_sm_clock_hz, gpu.max_mem_clock_hz, gpu.fp8_dense_flops, gpu.tdp_watts) == (1e9, 1e9, None, 0.0)
    assert (hw.bw_efficiency, hw.compute_efficiency, hw.prefill_efficiency, hw.step_overhead_s) == (0.5, 0.4, 0.3, 1e-3)
