"""`llm-exporter plan --from URL` on the demo (issue 41): how a window is read (the lengths' spread
from 1-2-5 buckets, the prompt per admitted request), and the real processes: the demo in each
scenario, the plan's current row against what its window observed. docs/planner.md "On the demo"."""

from __future__ import annotations

import math
import random

import pytest

from exporter.planner.observe import HISTOGRAMS, LENGTHS, Scrape, _length_sigma, point_from_scrapes
from exporter.simulator.recorders import buckets_1_2_5

PROMPT, OUTPUT, TTFT = LENGTHS["prompt"], LENGTHS["output"], HISTOGRAMS["ttft"]


def _lengths_histogram(scrape: Scrape, family: str, values: list[int]) -> None:
    """`values` observed into vLLM's 1-2-5 token buckets, as an exporter scrape holds them."""
    bounds = [*buckets_1_2_5(32768), math.inf]
    scrape.buckets[family] = {b: float(sum(1 for v in values if v <= b)) for b in bounds}
    scrape.sums[f"{family}_sum"] = float(sum(values))
    scrape.sums[f"{family}_count"] = float(len(values))


@pytest.mark.parametrize(("mean", "sigma"), [(6000, 0.4), (600, 0.8), (300, 0.6), (10000, 0.5)])
def test_the_lengths_spread_is_read_from_1_2_5_buckets(mean: float, sigma: float) -> None:
    """The demo's prefill-heavy prompts (6000, sigma 0.4) read 0.23 from mean over the interpolated
    median, and decode-heavy's outputs (300, 0.6) 0.28: the fit to the buckets' CDF reads them."""
    rng = random.Random(7)
    mu = math.log(mean) - sigma * sigma / 2
    values = [max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(400)]
    last = Scrape()
    _lengths_histogram(last, PROMPT, values)
    assert abs(_length_sigma(Scrape(), last, PROMPT) - sigma) <= 0.06


def test_one_bucket_or_few_requests_read_as_fixed_lengths() -> None:
    last = Scrape()
    _lengths_histogram(last, PROMPT, [700] * 50)  # every prompt in (500, 1000]
    assert _length_sigma(Scrape(), last, PROMPT) == 0.0
    _lengths_histogram(last, PROMPT, [100, 3000, 9000])  # 3 requests: no spread to fit
    assert _length_sigma(Scrape(), last, PROMPT) == 0.0


def test_the_prompt_is_per_admitted_request_while_a_queue_builds() -> None:
    """kv-pressure's first minute: 14 requests got their first token (and their prompts counted) while
    7 finished. Prompt tokens per finished request read 19,600 where the demo draws 10,000."""
    first, last = Scrape(), Scrape()
    last.counters = {"llm_requests_finished_total": 7.0, "llm_prompt_tokens_total": 14 * 10_000.0,
                     "llm_generation_tokens_total": 12_000.0}
    first.counters = {name: 0.0 for name in last.counters}
    last.sums = {f"{TTFT}_sum": 14 * 0.6, f"{TTFT}_count": 14.0,
                 "llm_time_per_output_token_seconds_sum": 7 * 0.035,
                 "llm_time_per_output_token_seconds_count": 7.0}
    last.buckets = {TTFT: {1.0: 14.0, math.inf: 14.0},
                    "llm_time_per_output_token_seconds": {0.05: 7.0, math.inf: 7.0}}
    point, _ = point_from_scrapes(first, last, [33.0] * 20, 20.0, "window 20s")
    assert point.prompt_tokens == pytest.approx(10_000)
    assert point.requests_per_s == pytest.approx(7 / 20)


# --- the real processes --------------------------------------------------------------------------------

# The scenarios whose current row the plan predicts, with the bar: 30% on TTFT (measured -9% and
# -4% here since the calibration settles the decode steps under each prefill trial; -26% to +45% before),
# TPOT and tokens/s within 15% (measured within 3%). kv-pressure is left out: its queue grows for as long
# as the demo runs (docs/planner.md "On the demo" says why a window cannot say it).
DEMO_BOUNDS = {"decode-heavy": {"ttft": 0.3, "tpot": 0.15, "output_tokens_per_s": 0.15},
               "prefill-heavy": {"ttft": 0.3, "tpot": 0.15, "output_tokens_per_s": 0.15}}
DEMO_WARM_S = 20.0  # the protocol of the table: the plan starts 20 s after the demo
DEMO_WINDOW = "10s"


def _plan_a_demo(scenario: str, out: str) -> tuple[int, str, float]:
    """Start the real demo, wait DEMO_WARM_S from its start, run the real `plan --from URL`."""
    import subprocess
    import sys
    import time

    from tests.test_demo_host import start_demo, stop_demo

    started = time.monotonic()
    process, base = start_demo(scenario)
    try:
        time.sleep(max(0.0, DEMO_WARM_S - (time.monotonic() - started)))
        proc = subprocess.run([sys.executable, "-m", "exporter.cli", "plan", "--from", base, "--window", DEMO_WINDOW,
                               "--no-rate-search", "--json", out], capture_output=True, text=True, timeout=150)
        return proc.returncode, proc.stderr, time.monotonic() - started
    finally:
        stop_demo(process)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_plan_predicts_the_demos_current_row(tmp_path) -> None:
    """The demos side by side (each on its own free port), each planned from its own window; every error
    is on the statistic the window measured (its means)."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(DEMO_BOUNDS)) as pool:
        runs = {s: pool.submit(_plan_a_demo, s, str(tmp_path / f"{s}.json")) for s in DEMO_BOUNDS}
        results = {s: f.result() for s, f in runs.items()}
    for scenario, (code, err, took) in results.items():
        assert code == 0, (scenario, err)
        (row,) = json.loads((tmp_path / f"{scenario}.json").read_text())["current"]
        assert (row["compared"]["ttft"], row["compared"]["tpot"]) == ("mean", "mean"), row
        print(f"{scenario}: errors {row['error']} in {took:.0f} s")
        for key, bound in DEMO_BOUNDS[scenario].items():
            assert abs(row["error"][key]) <= bound, (scenario, key, row)


def test_a_window_whose_queue_grows_says_the_deployment_is_overloaded() -> None:
    """kv-pressure's window: 2 requests/s offered, 0.35 finished, the waiting queue growing. The plan says
    so instead of scoring a steady replay against a transient; a queue that holds says nothing."""
    from exporter.planner.observe import queue_growth

    first, last = Scrape(), Scrape()
    first.counters["llm_requests_finished_total"], last.counters["llm_requests_finished_total"] = 10.0, 17.0
    first.gauges.update({"llm_requests_running": 4.0, "llm_requests_waiting": 3.0})
    last.gauges.update({"llm_requests_running": 4.0, "llm_requests_waiting": 37.0})
    note = queue_growth(first, last, 20.0)
    assert note and "2.05 requests/s arrived" in note and "0.35/s finished" in note and "5.9 times" in note
    last.gauges["llm_requests_waiting"] = 4.0  # one more waiting over 7 finished: a queue that holds
    assert queue_growth(first, last, 20.0) is None
    del first.gauges["llm_requests_waiting"]  # no waiting gauge: nothing to say
    assert queue_growth(first, last, 20.0) is None
