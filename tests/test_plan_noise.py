"""The live planner validation's bookkeeping (tests/live/plan_noise.py), without an engine: the rounds
interleave, the floor is each configuration's own spread, and only the error beyond it is gated."""

from __future__ import annotations

import pytest

from tests.live.plan_noise import KEYS, Repeats, Table, excess, interleave, median_index, noise_floor

LIMITS = {"tpot": 0.15, "output_tokens_per_s": 0.15, "ttft": 0.30}


def run(tpot: float, ttft: float = 0.5, tps: float = 40.0) -> dict[str, float]:
    return {"tpot": tpot, "ttft": ttft, "output_tokens_per_s": tps}


def pred(tpot: float, ttft: float = 0.5, tps: float = 40.0) -> dict[str, float | None]:
    # The plan's JSON has both statistics: the p50s here are the right answers, the means decoys.
    return {"tpot_p50_s": tpot, "ttft_p50_s": ttft, "tpot_mean_s": 9 * tpot, "ttft_mean_s": None,
            "output_tokens_per_s": tps}


def test_rounds_alternate_calibration_and_truth() -> None:
    seen: list[tuple[str, int]] = []
    out = interleave(["A", "B", "C"], 3, lambda g, r: seen.append((g, r)) or f"{g}{r}")
    assert [g for g, _ in seen] == list("ABCABCABC")
    assert out == [["A0", "A1", "A2"], ["B0", "B1", "B2"], ["C0", "C1", "C2"]]
    with pytest.raises(ValueError):
        interleave(["A"], 0, lambda g, r: None)


def test_floor_is_the_largest_distance_from_the_median() -> None:
    assert noise_floor([10.0]) == 0.0
    assert noise_floor([10.0, 10.0, 10.0]) == 0.0
    # One run strayed 50% while two agreed: the floor is the stray's distance, not half the range.
    assert noise_floor([10.0, 10.0, 15.0]) == pytest.approx(0.5)
    assert noise_floor([8.0, 10.0, 11.0]) == pytest.approx(0.2)
    assert noise_floor([9.0, 11.0]) == pytest.approx(0.1)  # even count: the mean of the middle two
    with pytest.raises(ValueError):
        noise_floor([])
    with pytest.raises(ValueError):
        noise_floor([0.0, 0.0])


def test_excess_is_what_lies_beyond_the_floor() -> None:
    assert excess(0.30, 0.10) == pytest.approx(0.20)
    assert excess(-0.30, 0.10) == pytest.approx(0.20)
    assert excess(0.05, 0.10) == 0.0


def test_median_index_picks_a_real_middle_run() -> None:
    assert median_index([30.0, 10.0, 20.0]) == 2
    assert median_index([5.0]) == 0
    assert median_index([4.0, 1.0, 3.0, 2.0]) == 3  # the lower median of an even count: a real run, not a mix


def test_repeats_median_and_floor_per_metric() -> None:
    rep = Repeats((run(0.010, 0.4, 40), run(0.012, 0.5, 44), run(0.011, 0.8, 42)))
    assert rep.median() == pytest.approx(run(0.011, 0.5, 42))
    floor = rep.floor()
    assert floor["tpot"] == pytest.approx(1 / 11)
    assert floor["ttft"] == pytest.approx(0.6)
    assert floor["output_tokens_per_s"] == pytest.approx(2 / 42)


def test_table_gates_the_error_beyond_the_floor() -> None:
    t = Table(LIMITS)
    no_floor = dict.fromkeys(KEYS, 0.0)
    t.add("e", "calibration", "c=1 (fitted)", "p50", pred(0.010), run(0.010), no_floor, 3)
    # +50% TPOT inside a 60% floor: nothing counts against the model.
    t.add("e", "held-out", "a", "p50", pred(0.015), run(0.010), {**no_floor, "tpot": 0.6}, 3)
    # +50% TPOT with a 10% floor: 40% counts.
    t.add("e", "held-out", "b", "p50", pred(0.015), run(0.010), {**no_floor, "tpot": 0.1}, 3)
    t.add("e", "held-out", "c", "p50", pred(0.010), run(0.010), no_floor, 3)
    assert t.medians()["tpot"] == pytest.approx(0.5)
    assert t.excess_medians()["tpot"] == pytest.approx(0.0)
    assert t.beyond()["tpot"] == 1
    text = t.markdown()
    assert "| e | held-out | b | 3 | p50 | 15.0 / 10.0 | +50% | 10% |" in text
    assert "tpot 0% (50%; 1 of 3)" in text
    assert "tpot meets 15%" in text
    t.unmeasured("e", "d", "1 of 3 rounds recorded a request")
    assert "Not measured (held out, left out of the medians): e d (1 of 3 rounds recorded a request)." \
        in t.markdown()
    assert t.excess_medians()["tpot"] == pytest.approx(0.0)
    with pytest.raises(AssertionError):
        t.add("e", "held-out", "d", "p50", {**pred(0.01), "ttft_p50_s": None}, run(0.01), no_floor, 3)
    with pytest.raises(AssertionError):  # vLLM's rows compare the engine's means: a missing one fails
        t.add("e", "held-out", "d", "mean", pred(0.01), run(0.01), no_floor, 3)
    with pytest.raises(ValueError):
        t.add("e", "other", "d", "p50", pred(0.01), run(0.01), no_floor, 3)
    with pytest.raises(ValueError):
        t.add("e", "held-out", "d", "p99", pred(0.01), run(0.01), no_floor, 3)
