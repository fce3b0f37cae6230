"""exporter/buckets.py: coarse layouts and the SLO threshold bucket, in units and in the real process.

The units drive Rebucketer.apply with pages shaped as the normalizer writes them (and hostile ones it
would not); the process tests run `llm-exporter demo --engine-format sglang` (the twin's SGLang page,
whose TTFT edges are 2 and 4 around the shipped 2.5 s target) and read its /metrics."""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from exporter.buckets import MAX_CACHED_CHARS, MAX_PLANS, PASS, SLO_SPAN, Rebucketer, choose_edges, plan_for
from exporter.config import load_config
from exporter.logstate import StateLog
from exporter.simulator.recorders import SGLANG_TTFT, TGI_DURATION, VLLM_ITL, VLLM_TTFT
from exporter.snapshot import Sample, labels_of
from tests.support import free_port, wait_until

TTFT = "llm_time_to_first_token_seconds"
TBT = "llm_inter_token_latency_seconds"
THRESHOLDS = {TTFT: ("ttft", 2.5), TBT: ("tbt", 0.1)}


def page(family: str, edges, *, target: str = "t", model: str = "m", per_bucket: float = 1.0,
         order=None) -> list[Sample]:
    """A normalized histogram series: one observation per bucket (cumulative counts 1, 2, ...)."""
    les = [floatToGoString(e) for e in edges] + ["+Inf"]
    buckets = [Sample(family + "_bucket", labels_of(le=le, model=model, target=target), per_bucket * (i + 1))
               for i, le in enumerate(les)]
    if order is not None:
        buckets = [buckets[i] for i in order]
    total = per_bucket * len(les)
    return [*buckets, Sample(family + "_sum", labels_of(model=model, target=target), total),
            Sample(family + "_count", labels_of(model=model, target=target), total)]


def buckets_of(samples, family: str, target: str = "t") -> dict[str, float]:
    return {s.label("le"): s.value for s in samples if s.name == family + "_bucket" and s.label("target") == target}


def finite(les) -> list[float]:
    return [float(le) for le in les if le != "+Inf"]


def rebucketer(*, coarse: bool, max_edges: int = 8, clock=None) -> Rebucketer:
    log = StateLog(reasons=("slo_threshold_edge",), clock=clock) if clock else None
    return Rebucketer(coarse=coarse, max_edges=max_edges, thresholds=THRESHOLDS, state_log=log)


# ------------------------------------------------------------------------------------------------
# The edge choice
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edges", [SGLANG_TTFT, VLLM_TTFT, VLLM_ITL, TGI_DURATION,
                                   tuple(0.001 * 1.01 ** k for k in range(3000))])
@pytest.mark.parametrize("limit", [2, 4, 8, 12, 64])
def test_choose_edges_is_a_subset_of_at_most_n_with_the_must_edge_and_both_ends(edges, limit):
    edges = sorted(set(edges))
    must = edges[len(edges) // 3]
    chosen = choose_edges(edges, (must,), limit)
    assert len(chosen) == min(limit, len(edges)) and list(chosen) == sorted(set(chosen))
    assert set(chosen) <= set(edges) and must in chosen
    # Both ends of the range the edges are chosen in: the layout's, narrowed to SLO_SPAN either side of
    # the threshold where enough edges lie there.
    inside = [e for e in edges if must / SLO_SPAN <= e <= must * SLO_SPAN]
    span = inside if len(inside) >= limit else edges
    if limit >= 3 and len(edges) > limit:
        assert chosen[0] == span[0] and chosen[-1] == span[-1]


def test_choose_edges_keeps_to_the_slo_range_where_it_can():
    """vLLM's TTFT layout runs from 1 ms to 2560 s: around a 2.5 s SLO the kept edges stay within 100x."""
    chosen = choose_edges(sorted(VLLM_TTFT), (2.5,), 8)
    assert 2.5 in chosen and min(chosen) >= 0.025 and max(chosen) <= 250
    assert choose_edges(sorted(VLLM_TTFT), (), 8)[-1] == max(VLLM_TTFT)  # no SLO: the whole layout


def test_choose_edges_spreads_evenly_in_log_space():
    """On a geometric layout (TGI's 1.5^k) the gaps between kept edges are equal within one engine step."""
    edges = sorted(TGI_DURATION)
    chosen = choose_edges(edges, (), 8)
    gaps = [math.log(b / a) for a, b in zip(chosen, chosen[1:], strict=False)]
    assert max(gaps) - min(gaps) <= math.log(1.5) + 1e-9, gaps


def test_choose_edges_keeps_a_small_layout_whole_and_copes_with_zero_and_one_positive_edge():
    assert choose_edges([0.1, 1.0, 10.0], (), 8) == (0.1, 1.0, 10.0)
    assert len(choose_edges([0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10], (), 4)) == 4
    chosen = choose_edges([-3.0, -2.0, -1.0, 0.0, 5.0], (), 3)
    assert len(chosen) == 3 and set(chosen) <= {-3.0, -2.0, -1.0, 0.0, 5.0}


# ------------------------------------------------------------------------------------------------
# Plans for hostile layouts
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("les", [
    [],
    ["0.1", "NaN", "+Inf"],
    ["0.1", "abc", "+Inf"],
    ["0.1", "0.1", "+Inf"],
    ["0.1", "0.10", "+Inf"],  # one bound written twice
    ["0.1", "1.0"],  # no +Inf
    ["-Inf", "0.1", "+Inf"],
])
def test_a_layout_the_module_cannot_read_is_written_as_it_came(les):
    assert plan_for(les, slo="ttft", threshold=2.5, limit=2) is PASS


def test_the_threshold_bucket_takes_the_count_at_the_edge_below():
    samples = page(TTFT, SGLANG_TTFT)
    out = rebucketer(coarse=False).apply(samples)
    got = buckets_of(out, TTFT)
    assert got["2.5"] == got["2.0"] == 7.0 and got["4.0"] == 8.0
    les = [s.label("le") for s in out if s.name == TTFT + "_bucket"]
    assert les == sorted(les, key=float) and len(les) == len(SGLANG_TTFT) + 2
    assert [s for s in out if s.label("le") != "2.5"] == samples  # nothing else changes, order kept


def test_engine_mode_leaves_a_layout_with_the_threshold_as_an_edge_untouched():
    samples = [*page(TTFT, VLLM_TTFT), *page(TBT, VLLM_ITL), *page("llm_e2e_request_latency_seconds", SGLANG_TTFT),
               Sample("llm_engine_up", labels_of(target="t"), 1.0)]
    buckets = rebucketer(coarse=False)
    assert buckets.apply(samples) == tuple(samples)
    states = {(s.label("slo"), s.label("state")): s.value for s in buckets.health()}
    assert states == {("ttft", "engine"): 1.0, ("ttft", "lower_edge"): 0.0, ("ttft", "none"): 0.0,
                      ("tbt", "engine"): 1.0, ("tbt", "lower_edge"): 0.0, ("tbt", "none"): 0.0}


@pytest.mark.parametrize(("edges", "limit"), [(SGLANG_TTFT, 4), (SGLANG_TTFT, 8), (VLLM_TTFT, 4), (VLLM_TTFT, 12),
                                              (TGI_DURATION, 8), (tuple(0.001 * 1.01 ** k for k in range(3000)), 8)])
def test_coarse_keeps_at_most_n_engine_edges_with_exact_counts_and_the_threshold(edges, limit):
    samples = page(TTFT, edges, per_bucket=3.0)
    full = buckets_of(samples, TTFT)
    out = rebucketer(coarse=True, max_edges=limit).apply(samples)
    got = buckets_of(out, TTFT)
    engine_edges = [le for le in got if le in full]
    assert len(finite(engine_edges)) <= limit and got["+Inf"] == full["+Inf"]
    assert all(got[le] == full[le] for le in engine_edges)  # a subset: no invented counts
    assert "2.5" in got and len(finite(got)) <= limit + 1
    assert [le for le in got] == sorted(got, key=float)
    names = {s.name for s in out}
    assert {TTFT + "_sum", TTFT + "_count"} <= names


def test_coarse_also_cuts_tokens_and_bytes_histograms_but_not_the_ones_it_does_not_own():
    samples = [*page("llm_request_prompt_tokens", [float(2 ** k) for k in range(20)]),
               *page("llm_kv_transfer_bytes", [float(2 ** k) for k in range(10, 40)])]
    out = rebucketer(coarse=True, max_edges=4).apply(samples)
    for family in ("llm_request_prompt_tokens", "llm_kv_transfer_bytes"):
        assert len(finite(buckets_of(out, family))) == 4


def test_unsorted_buckets_come_out_sorted_and_a_family_without_buckets_is_left_alone():
    order = list(reversed(range(len(SGLANG_TTFT) + 1)))
    samples = [Sample(TBT + "_sum", labels_of(target="t"), 1.0), Sample(TBT + "_count", labels_of(target="t"), 1.0),
               *page(TTFT, SGLANG_TTFT, order=order)]
    out = rebucketer(coarse=True, max_edges=4).apply(samples)
    assert out[:2] == tuple(samples[:2])
    les = [s.label("le") for s in out if s.name == TTFT + "_bucket"]
    assert les == sorted(les, key=float) and les[-1] == "+Inf" and "2.5" in les


def test_series_of_several_targets_and_models_are_rewritten_apart():
    samples = [*page(TTFT, SGLANG_TTFT, target="a", model="x"), *page(TTFT, SGLANG_TTFT, target="a", model="y",
                                                                         per_bucket=2.0),
               *page(TTFT, VLLM_TTFT, target="b")]
    buckets = rebucketer(coarse=False)
    out = buckets.apply(samples)
    by_model = {(s.label("model"), s.label("le")): s.value for s in out if s.label("target") == "a"}
    assert by_model[("x", "2.5")] == 7.0 and by_model[("y", "2.5")] == 14.0
    assert [s for s in out if s.label("target") == "b"] == page(TTFT, VLLM_TTFT, target="b")
    states = {(s.label("target"), s.label("state")): s.value for s in buckets.health() if s.value}
    assert states == {("a", "lower_edge"): 1.0, ("b", "engine"): 1.0}


def test_a_threshold_below_every_edge_writes_no_bucket_and_says_so():
    buckets = Rebucketer(coarse=False, max_edges=8, thresholds={TTFT: ("ttft", 0.05)})
    samples = page(TTFT, SGLANG_TTFT)
    assert buckets.apply(samples) == tuple(samples)
    assert {s.label("state") for s in buckets.health() if s.value} == {"none"}


def test_the_plan_cache_is_bounded():
    buckets = rebucketer(coarse=True, max_edges=4)
    for shift in range(MAX_PLANS + 50):
        buckets.apply(page(TTFT, [e * (1 + shift / 1e4) for e in SGLANG_TTFT]))
    assert len(buckets._plans) <= MAX_PLANS


def test_the_caches_are_bounded_by_the_text_they_hold_not_only_by_entries():
    """An engine chooses how many buckets a series has and how long its labels are: pages of new
    2,000-bucket layouts with long label values keep at most MAX_CACHED_CHARS of text."""
    buckets = rebucketer(coarse=True, max_edges=4)
    wide = [0.001 * 1.005 ** k for k in range(2000)]
    for shift in range(40):
        buckets.apply(page(TTFT, [e * (1 + shift / 1e4) for e in wide], model=f"m{shift}" + "x" * 2000))
        held = sum(len(le) + 1 for _, les in buckets._plans for le in les)
        held += sum(len(k) + len(v) for labels in buckets._split for k, v in labels)
        assert held <= MAX_CACHED_CHARS, (shift, held)


def test_one_log_line_per_state_change_naming_the_edges_and_the_targets_to_pick(caplog):
    buckets = rebucketer(coarse=False)
    with caplog.at_level(logging.INFO, logger="llm_exporter.buckets"):
        for _ in range(3):  # the first page and two steady ones: one line
            buckets.apply(page(TTFT, SGLANG_TTFT))
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert "target t: the ttft SLO threshold 2.5s is not a bucket edge" in lines[0]
        assert "2s below, 4s above" in lines[0] and "--slo-ttft 2s or --slo-ttft 4s" in lines[0]
        assert 'le="2.5" holding the count at le="2.0"' in lines[0]
        buckets.apply(page(TTFT, VLLM_TTFT))  # the engine now has the edge: one line back
        buckets.apply(page(TTFT, VLLM_TTFT))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "is a bucket edge of its engine's" in lines[1] and "again" in lines[1]


def test_a_first_page_whose_threshold_is_an_edge_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="llm_exporter.buckets"):
        rebucketer(coarse=True).apply(page(TTFT, VLLM_TTFT))
    assert not caplog.records


def test_a_target_gone_from_the_page_leaves_the_state_metric():
    buckets = rebucketer(coarse=False)
    buckets.apply(page(TTFT, SGLANG_TTFT))
    assert buckets.health()
    buckets.apply([Sample("llm_engine_up", labels_of(target="t"), 0.0)])
    assert buckets.health() == []


@pytest.mark.parametrize(("profile", "mode", "coarse"), [("minimal", "auto", True), ("default", "auto", False),
                                                         ("full", "auto", False), ("minimal", "engine", False),
                                                         ("default", "coarse", True)])
def test_auto_is_coarse_under_the_minimal_profile_only(profile, mode, coarse):
    config = load_config({"profile": profile, "histogram_buckets": mode}, {})
    assert Rebucketer.from_config(config).coarse is coarse


# ------------------------------------------------------------------------------------------------
# The real process
# ------------------------------------------------------------------------------------------------
def _metrics(base: str) -> dict[str, list]:
    text = httpx.get(base + "/metrics", timeout=10).text
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["engine", "coarse"])
def test_the_demo_of_sglang_writes_the_threshold_bucket_and_coarse_layouts(mode):
    """`llm-exporter demo --engine-format sglang`: its TTFT histogram gets le="2.5" equal to le="2.0"
    (both on one page), coarse histograms have at most N engine edges plus the threshold's, the state
    metric says lower_edge, the log says it once, and derive still reads the full layout (the
    attainment's bound is the engine's edge 2.0)."""
    port, limit = free_port(), 4
    args = [sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}", "--engine-format",
            "sglang", "--speed", "5", "--interval", "300ms", "--no-probe", "--histogram-buckets", mode,
            "--histogram-buckets-max", str(limit), "--log-level", "info"]
    demo = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _ready(port), timeout=60)

        def ttft_seen() -> bool:
            return any(s.value > 0 for s in _metrics(base).get(TTFT, []) if s.name == TTFT + "_count")
        assert wait_until(ttft_seen, timeout=60)
        families = _metrics(base)
        ttft = {s.labels["le"]: s.value for s in families[TTFT] if s.name == TTFT + "_bucket"}
        assert ttft["2.5"] == ttft["2.0"] <= ttft["+Inf"]
        engine_les = {floatToGoString(e) for e in SGLANG_TTFT} | {"+Inf"}
        assert set(ttft) - {"2.5"} <= engine_les
        if mode == "coarse":
            histograms = [name for name, samples in families.items()
                          if any(s.name == name + "_bucket" for s in samples) and name.startswith("llm_")]
            assert TTFT in histograms and len(histograms) >= 3
            for name in histograms:
                series: dict[tuple, int] = {}
                for s in families[name]:
                    if s.name == name + "_bucket" and s.labels["le"] != "+Inf":
                        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                        series[key] = series.get(key, 0) + 1
                assert series and max(series.values()) <= limit + 2, (name, series)
        else:
            assert set(ttft) == engine_les | {"2.5"}
        state = {s.labels["state"]: s.value for s in families["llm_exporter_slo_threshold_edge"]
                 if s.labels["slo"] == "ttft" and s.labels["target"] == "demo-0"}
        assert state == {"engine": 0.0, "lower_edge": 1.0, "none": 0.0}

        def bound() -> set[str]:
            return {s.labels["bound"] for s in _metrics(base).get("llm_ttft_slo_attainment_ratio", [])}
        assert wait_until(lambda: bound() == {"2.0"}, timeout=60), bound()
    finally:
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=30)
    lines = re.findall(r"the ttft SLO threshold 2\.5s is not a bucket edge[^\n]*", err)
    assert len(lines) == 1 and "--slo-ttft 2s or --slo-ttft 4s" in lines[0], err[-3000:]
