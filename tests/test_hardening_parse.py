"""Hostile engine pages (issue 14, items 3-5): the parser stays linear in its input on every path,
label limits and byte-bounded caches keep memory flat under fresh long label values, and invalid
histograms and counters are dropped, counted by reason and logged once per change, so every derived
ratio stays in range and the OpenMetrics output passes a strict parser.

Real parts throughout: a loopback fake engine (tests/support.py), the real EngineSource, Collector,
Deriver and Renderer, and `llm-exporter run` as a subprocess. Time is bounded as process CPU time
ratios (4x input under 10x the CPU, best of 3), memory as RSS growth over a bounded run."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import pathlib
import random
import re
import time
from collections.abc import Callable
from contextlib import suppress

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_openmetrics

from exporter.collect import Collector
from exporter.config import Config
from exporter.derive import Deriver, quantiles
from exporter.expose import MAX_CACHED_LABEL_CHARS, Renderer, render
from exporter.sources.engines.exposition import (
    MAX_CACHED_CHARS,
    MAX_LABEL_VALUE_LENGTH,
    MAX_LABELS_PER_SERIES,
    ExpositionError,
    LabelCache,
    parse,
)
from exporter.sources.engines.normalize import normalize as plain_normalize
from exporter.sources.engines.replay import normalize_with_memo
from exporter.sources.engines.scrape import EngineSource
from exporter.sources.engines.state import MAX_MAPPED_LABEL_CHARS, NormalizerState
from exporter.targets import EngineTarget
from tests.support import exporter_run, fake_engine, wait_until

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"
VLLM = (FIXTURES / "vllm-v0.11__documented.prom").read_text()
MB = 1 << 20
RUNNING = "vllm:num_requests_running"
HEAD = f'# TYPE {RUNNING} gauge\n{RUNNING}{{model_name="m"}} 1\n'


# ---------------------------------------------------------------------------------------------
# Item 4: linear parse


def _cpu_best_of_3(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        gc.collect()
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best


def _parse_and_normalize(text: str) -> None:
    """Every path a page takes in the exporter: the parser alone, normalize with a configured kind
    and with detection (which also scans the raw page), errors included."""
    for step in (lambda: parse(text), lambda: normalize_with_memo(text, target="t", kind="vllm"),
                 lambda: normalize_with_memo(text, target="t")):
        with suppress(ExpositionError, ValueError):
            step()


def _assert_linear(shape: Callable[[int], str], n: int) -> None:
    small, large = shape(n), shape(4 * n)
    assert len(large) > 3 * len(small)
    one = _cpu_best_of_3(lambda: _parse_and_normalize(small))
    four = _cpu_best_of_3(lambda: _parse_and_normalize(large))
    # 4x the input must not cost 10x the CPU (quadratic costs 16x); the floor keeps a 1x run that is
    # too quick to time from deciding the ratio.
    assert four < 10 * max(one, 0.002), f"1x {one * 1000:.1f} ms, 4x {four * 1000:.1f} ms ({len(small)} chars)"


HOSTILE_SHAPES: dict[str, tuple[Callable[[int], str], int]] = {
    # (page of about n units, n): each is one class of hostile input
    "many_eof_markers_on_one_long_line": (lambda n: HEAD + "x # EOF" * n, 20_000),
    "many_eof_markers_after_text_on_their_lines": (lambda n: HEAD + "x # EOF\n" * n, 20_000),
    "huge_label_block": (lambda n: HEAD + RUNNING + "{" + 'a="b",' * n + "} 1\n", 10_000),
    "many_escapes_in_a_value": (lambda n: HEAD + f'{RUNNING}{{model_name="' + '\\"' * n + '"} 1\n', 20_000),
    "unterminated_block_of_quotes": (lambda n: HEAD + f'{RUNNING}{{a="' + '",b="' * n + "\n", 20_000),
    "very_long_single_line": (lambda n: HEAD + f"{RUNNING} " + "1" * n + "\n", 100_000),
    "long_run_of_blanks": (lambda n: HEAD + RUNNING + " " * n + "1\n", 100_000),
    "many_short_lines": (lambda n: HEAD + "".join(f'{RUNNING}{{model_name="m{i}"}} 1\n' for i in range(n)), 4_000),
    "many_comments": (lambda n: HEAD + "# HELP x y\n" * n, 10_000),
    "hashes_and_braces_in_an_exemplar": (lambda n: HEAD + f'{RUNNING}{{a="' + "#" * n + '"} 1 # ' + "{" * n + "\n",
                                         50_000),
}


@pytest.mark.parametrize("shape", sorted(HOSTILE_SHAPES))
def test_parse_cpu_time_grows_linearly_with_hostile_input(shape):
    build, n = HOSTILE_SHAPES[shape]
    _assert_linear(build, n)


_TOKENS = ("# EOF", " # EOF ", '"', '\\"', "\\", "{", "}", ",", "=", " ", "\t", "\n", "#", "a", "le",
           'model_name="', RUNNING, "1", "NaN", "_", "<html>")


@pytest.mark.parametrize("seed", range(4))
def test_parse_cpu_time_is_linear_on_random_hostile_pages(seed):
    rng = random.Random(seed)
    unit = "".join(rng.choice(_TOKENS) for _ in range(400))
    _assert_linear(lambda n: HEAD + unit * n, 100)


# ---------------------------------------------------------------------------------------------
# Item 3: label limits and caches bounded by bytes


def test_over_long_labels_drop_the_series_and_say_why():
    long_value = "x" * (MAX_LABEL_VALUE_LENGTH + 1)
    many = ",".join(f'l{i}="v"' for i in range(MAX_LABELS_PER_SERIES + 1))
    page = (HEAD + f'{RUNNING}{{model_name="{long_value}"}} 2\n'
            + f'{RUNNING}{{{"n" * 300}="v"}} 3\n' + f"{RUNNING}{{{many}}} 4\n"
            + f'{RUNNING}{{model_name="{"p" * MAX_LABEL_VALUE_LENGTH}"}} 5\n')  # at the limit: kept
    cache = LabelCache()
    for _ in range(2):  # cold, then from the warm cache
        result = parse(page, label_cache=cache)
        assert [s[2] for s in result.samples] == [1.0, 5.0]
        assert result.rejected == {"label_value_too_long": 1, "label_name_too_long": 1, "too_many_labels": 1}
    # Nothing of the rejected lines is cached.
    assert not [key for key in (*cache._entries, *cache._heads) if long_value in key or "n" * 300 in key or many in key]


def test_caches_stay_bounded_in_characters_under_fresh_long_label_values():
    state = NormalizerState()
    renderer = Renderer()
    value = "v" * (MAX_LABEL_VALUE_LENGTH - 100)
    for cycle in range(40):  # 40 pages x 500 series x ~4 KB fresh values: 80 M characters in all
        page = HEAD + "".join(f'{RUNNING}{{model_name="{cycle}-{i}-{value}"}} 1\n' for i in range(500))
        scrape = normalize_with_memo(page, target="t", kind="vllm", state=state)
        assert len(scrape.samples) == 501
        renderer.render(scrape.samples)
        assert state.label_cache.chars <= MAX_CACHED_CHARS
        assert state._entry_chars <= MAX_MAPPED_LABEL_CHARS + 500 * (MAX_LABEL_VALUE_LENGTH + 100)
        assert renderer._label_chars <= MAX_CACHED_LABEL_CHARS


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _fresh_long_values_page(cycle: int, *, huge: int = 100_000, series: int = 20) -> bytes:
    """The vLLM fixture plus kept series whose model names are fresh every cycle: 100 KB values
    (over the limit) and ~4 KB ones (under it, to fill the caches)."""
    extra = "".join(f'{RUNNING}{{model_name="{cycle}-{i}-{"h" * huge}"}} 1\n' for i in range(series))
    extra += "".join(f'vllm:num_requests_waiting{{model_name="{cycle}-{i}-{"w" * 4000}"}} 1\n' for i in range(300))
    return (VLLM + extra).encode()


def _collect_cycles(url: str, cycles: int, page_for: Callable[[int], bytes], behaviour, *,
                    derive=None, clock=None, measure_after: int = 0) -> tuple[list, int]:
    """Run `cycles` collections through the real EngineSource and Collector; returns the published
    cycles and the RSS growth after `measure_after` warm-up cycles."""
    source = EngineSource(EngineTarget(url=url, name="t", timeout_s=10), max_payload_bytes=32 * MB,
                          max_series=10_000)
    kwargs = {"derive": derive} if derive is not None else {}
    if clock is not None:
        kwargs["clock"] = clock

    async def scenario() -> tuple[list, int]:
        collector = Collector([source], interval_s=1.0, timeouts={source.name: 30.0}, **kwargs)
        published = []
        baseline = 0
        for cycle in range(cycles):
            if cycle == measure_after:
                baseline = _rss()
            behaviour.body = page_for(cycle)
            done = await collector.collect_once()
            done.text  # noqa: B018 - render the page, as a scrape would, so the renderer's caches fill
            published.append(done)
            published = published[-2:]  # keep only what a running exporter keeps
        growth = _rss() - baseline
        await collector.close()
        return published, growth
    return asyncio.run(scenario())


def _value(published, name: str, **labels: str) -> float | None:
    found = [s.value for s in published.samples if s.name == name and all(s.label(k) == v for k, v in labels.items())]
    return found[0] if found else None


def test_fresh_long_label_values_keep_rss_flat_through_the_engine_source():
    with fake_engine(keep_alive=True) as (url, behaviour):
        published, growth = _collect_cycles(url, 33, _fresh_long_values_page, behaviour, measure_after=3)
    last = published[-1]
    print(f"RSS growth over 30 cycles: {growth / MB:.1f} MB")
    assert growth < 50 * MB, f"RSS grew {growth / MB:.1f} MB over 30 cycles"
    assert _value(last, "llm_engine_up", target="t") == 1.0
    assert _value(last, "llm_exporter_series_dropped_total", source="engine:t",
                  reason="label_value_too_long") == 33 * 20
    text = last.text.decode()
    assert "h" * 1000 not in text  # no over-long value reaches /metrics
    assert "w" * 4000 in text  # values under the limit still do


# ---------------------------------------------------------------------------------------------
# Item 5: semantic validation of histograms and counters

TTFT = "vllm:time_to_first_token_seconds"
VALID_TTFT = [
    f'{TTFT}_bucket{{le="0.1",model_name="m"}} 4',
    f'{TTFT}_bucket{{le="1.0",model_name="m"}} 8',
    f'{TTFT}_bucket{{le="+Inf",model_name="m"}} 10',
    f'{TTFT}_count{{model_name="m"}} 10',
    f'{TTFT}_sum{{model_name="m"}} 3.5',
]
GOOD = (f"# TYPE {RUNNING} gauge\n{RUNNING}{{model_name=\"m\"}} 3\n"
        '# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name="m"} 100\n')


def _ttft(lines: list[str]) -> str:
    return f"# TYPE {TTFT} histogram\n" + "\n".join(lines) + "\n"


HOSTILE_PAGES = {
    "histogram_not_monotonic": _ttft([VALID_TTFT[0].replace(" 4", " 9"), *VALID_TTFT[1:]]),
    "histogram_no_inf": _ttft([VALID_TTFT[0], VALID_TTFT[1], *VALID_TTFT[3:]]),
    "histogram_bad_le": _ttft([VALID_TTFT[0].replace('le="0.1"', 'le="abc"'), *VALID_TTFT[1:]]),
    "histogram_count_mismatch": _ttft([*VALID_TTFT[:3], VALID_TTFT[3].replace(" 10", " 12"), VALID_TTFT[4]]),
    "histogram_fractional_count": _ttft([VALID_TTFT[0].replace(" 4", " 4.5"), *VALID_TTFT[1:]]),
    "non_finite": _ttft([VALID_TTFT[0].replace(" 4", " NaN"), *VALID_TTFT[1:]]),
}
HOSTILE_COUNTERS = {
    "non_finite": "NaN",
    "negative_counter": "-5",
}


def _counter_page(value: str) -> str:
    return (f"# TYPE {RUNNING} gauge\n{RUNNING}{{model_name=\"m\"}} 3\n"
            f'# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{model_name="m"}} {value}\n'
            + _ttft(VALID_TTFT))


CASES = {**{f"histogram:{k}": (k, GOOD + v, "llm_time_to_first_token_seconds_bucket")
            for k, v in HOSTILE_PAGES.items()},
         "counter:nan": ("non_finite", _counter_page("NaN"), "llm_generation_tokens_total"),
         "counter:inf": ("non_finite", _counter_page("+Inf"), "llm_generation_tokens_total"),
         "counter:negative": ("negative_counter", _counter_page("-5"), "llm_generation_tokens_total")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_histograms_and_counters_are_dropped_and_counted_by_reason(case):
    reason, page, family = CASES[case]
    with fake_engine(keep_alive=True) as (url, behaviour):
        published, _ = _collect_cycles(url, 3, lambda _cycle: page.encode(), behaviour)
    last = published[-1]
    assert _value(last, "llm_engine_up", target="t") == 1.0
    assert _value(last, family, target="t") is None, "the invalid series went out"
    dropped = _value(last, "llm_exporter_series_dropped_total", source="engine:t", reason=reason)
    assert dropped is not None and dropped > 0
    assert _value(last, "llm_requests_running", target="t") == 3.0  # the rest of the page is intact
    assert _value(last, "llm_exporter_series_dropped_total", source="engine:t", reason="cardinality") == 0.0


def test_the_whole_histogram_goes_when_one_of_its_series_is_invalid():
    page = GOOD + HOSTILE_PAGES["histogram_not_monotonic"]
    result = normalize_with_memo(page, target="t", kind="vllm")
    assert not [s for s in result.samples if s.name.startswith("llm_time_to_first_token_seconds")]
    assert dict(result.drops) == {"histogram_not_monotonic": 5}  # three buckets, _count and _sum


def test_a_replayed_page_is_validated_again():
    state = NormalizerState()
    good = GOOD + _ttft(VALID_TTFT)
    for _ in range(3):  # the second page records a plan, the third replays it
        assert any(s.name == "llm_time_to_first_token_seconds_bucket"
                   for s in normalize_with_memo(good, target="t", kind="vllm", state=state).samples)
    assert state.memo.plan is not None
    # Same series, same (finite) value mask: only the values say the histogram is now invalid.
    for reason, page in (("histogram_not_monotonic", HOSTILE_PAGES["histogram_not_monotonic"]),
                         ("histogram_count_mismatch", HOSTILE_PAGES["histogram_count_mismatch"]),
                         ("histogram_fractional_count", HOSTILE_PAGES["histogram_fractional_count"])):
        result = normalize_with_memo(GOOD + page, target="t", kind="vllm", state=state)
        assert dict(result.drops) == {reason: 5}
        assert not [s for s in result.samples if s.name.startswith("llm_time_to_first_token_seconds")]
        assert normalize_with_memo(good, target="t", kind="vllm", state=state).drops == {}
    negative = GOOD.replace("vllm:prompt_tokens_total{model_name=\"m\"} 100",
                            "vllm:prompt_tokens_total{model_name=\"m\"} -1")
    assert dict(normalize_with_memo(negative + _ttft(VALID_TTFT), target="t", kind="vllm", state=state).drops) == {
        "negative_counter": 1}


_COUNTS = st.sampled_from(["0", "1", "4", "8", "10", "12", "-1", "2.5", "NaN", "+Inf"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_COUNTS, _COUNTS, _COUNTS, _COUNTS, st.sampled_from(["0.1", "abc", "+Inf", "1.0"])),
                min_size=1, max_size=6))
def test_whatever_the_engine_prints_the_output_histograms_are_valid_and_warm_equals_cold(pages):
    """Random bucket, _count and _sum values and a sometimes bad or duplicate `le`, page after page
    through one warm state (plans recorded and replayed): each page's output equals a cold run's,
    and what it renders passes the strict OpenMetrics parser."""
    state = NormalizerState()
    for low, high, count, total, le in pages:
        page = GOOD + _ttft([f'{TTFT}_bucket{{le="{le}",model_name="m"}} {low}',
                             f'{TTFT}_bucket{{le="1.0",model_name="m"}} {high}',
                             f'{TTFT}_bucket{{le="+Inf",model_name="m"}} {count}',
                             f'{TTFT}_count{{model_name="m"}} {count}', f'{TTFT}_sum{{model_name="m"}} {total}'])
        for _ in range(2):  # the repeat records a plan, the next page may replay it
            warm = normalize_with_memo(page, target="t", kind="vllm", state=state)
        cold = plain_normalize(page, target="t", kind="vllm")
        assert repr(warm) == repr(cold)
        list(strict_openmetrics(render(warm.samples, openmetrics=True).decode()))


def test_drops_are_logged_once_when_they_start_and_once_when_they_stop(caplog):
    bad = (GOOD + HOSTILE_PAGES["histogram_not_monotonic"]).encode()
    good = (GOOD + _ttft(VALID_TTFT)).encode()
    pages = [good, bad, bad, bad, bad, good, good, bad]
    with caplog.at_level(logging.INFO, logger="llm_exporter.engine"), fake_engine(keep_alive=True) as (url, behaviour):
        _collect_cycles(url, len(pages), pages.__getitem__, behaviour)
    lines = [r.getMessage() for r in caplog.records if "dropping series" in r.getMessage()]
    assert len(lines) == 3, lines
    assert "histogram_not_monotonic" in lines[0] and "non-monotonic" in lines[0] and lines[0].startswith("target t:")
    assert lines[1] == "target t: no longer dropping series (histogram_not_monotonic)"
    assert "histogram_not_monotonic" in lines[2]


def test_slo_attainment_stays_in_range_when_window_deltas_are_not_monotonic():
    # Each page is a valid histogram, but between them the le=1.0 bucket's own count falls while
    # every cumulative count rises: the window's deltas (6, 1) are not monotonic.
    pages = [[0, 10, 10]] + [[6, 11, 11]] * 4
    assert quantiles.tail("ttft", (1.0, float("inf")), (6.0, 1.0), 2.5).slo_attainment == 1.0

    def page(counts: list[int]) -> bytes:
        low, high, total = counts
        return (GOOD + _ttft([f'{TTFT}_bucket{{le="0.1",model_name="m"}} 0',
                              f'{TTFT}_bucket{{le="1.0",model_name="m"}} {low}',
                              f'{TTFT}_bucket{{le="+Inf",model_name="m"}} {high}',
                              f'{TTFT}_count{{model_name="m"}} {total}', f'{TTFT}_sum{{model_name="m"}} 1'])).encode()

    ticks = itertools.count(1000.0, 5.0)
    deriver = Deriver(Config(slo_ttft_s=2.5, quantile_window_s=60.0), clock=time.perf_counter)
    seen = []
    with fake_engine(keep_alive=True) as (url, behaviour):
        def page_for(cycle: int) -> bytes:
            return page(pages[cycle])
        source = EngineSource(EngineTarget(url=url, name="t", timeout_s=10), max_payload_bytes=MB, max_series=10_000)

        async def scenario() -> None:
            collector = Collector([source], interval_s=1.0, derive=deriver, clock=lambda: next(ticks))
            for cycle in range(len(pages)):
                behaviour.body = page_for(cycle)
                done = await collector.collect_once()
                seen.extend(s for s in done.samples if s.name.endswith("_ratio") or s.name == "llm_ttft_window_seconds")
                strict = list(strict_openmetrics(done.openmetrics().decode()))
                assert strict
            await collector.close()
        asyncio.run(scenario())
    attainment = [s.value for s in seen if s.name == "llm_ttft_slo_attainment_ratio"]
    assert attainment, "no attainment was derived"
    assert all(0.0 <= s.value <= 1.0 for s in seen if s.name.endswith("_ratio")), seen
    assert all(0.0 <= s.value <= 1.0 for s in seen if s.name == "llm_ttft_window_seconds")  # within the bounds


def test_a_hostile_engine_page_renders_openmetrics_that_a_strict_parser_accepts():
    page = (VLLM + HOSTILE_PAGES["histogram_not_monotonic"].replace(TTFT, "vllm:e2e_request_latency_seconds")
            .replace('model_name="m"', 'model_name="meta-llama/Llama-3.1-8B-Instruct",engine="7"')
            + 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-'
              'Instruct"} NaN\n'
            + f'{RUNNING}{{model_name="{"x" * MB}"}} 1\n')
    ticks = itertools.count(1000.0, 5.0)
    with fake_engine(keep_alive=True) as (url, behaviour):
        published, _ = _collect_cycles(url, 4, lambda _cycle: page.encode(), behaviour,
                                       derive=Deriver(Config()), clock=lambda: next(ticks))
    last = published[-1]
    families = {f.name: f for f in strict_openmetrics(last.openmetrics().decode())}  # raises on any violation
    assert "llm_time_to_first_token_seconds" in families  # the fixture's valid histograms stay
    reasons = {s.labels["reason"]: s.value for s in families["llm_exporter_series_dropped"].samples}
    assert reasons["histogram_not_monotonic"] > 0 and reasons["label_value_too_long"] > 0


# ---------------------------------------------------------------------------------------------
# The same through `llm-exporter run`




def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _dropped(text: str, reason: str) -> float:
    match = re.search(r'llm_exporter_series_dropped_total\{[^}]*reason="' + reason + r'"[^}]*\} (\S+)', text)
    return float(match.group(1)) if match else 0.0


def test_run_drops_a_megabyte_model_name_counts_it_and_keeps_rss_flat():
    cycle = itertools.count()
    with fake_engine(keep_alive=True) as (url, behaviour):
        behaviour.body = _fresh_long_values_page(0, huge=MB, series=1)
        with exporter_run("--engine", f"{url},name=t") as (base, process, _stderr):
            assert wait_until(lambda: _dropped(httpx.get(base + "/metrics", timeout=5).text,
                                               "label_value_too_long") > 0, timeout=15)
            # The drop is counted on a good scrape; a later one may time out on a loaded machine.
            assert wait_until(lambda: re.search(r'llm_engine_up\{[^}]*target="t"[^}]*\} 1',
                                                httpx.get(base + "/metrics", timeout=5).text), timeout=15)
            text = httpx.get(base + "/metrics", timeout=5).text
            assert "h" * 1000 not in text and len(text) < 4 * MB
            # Now fresh 100 KB values every scrape (and ~4 KB ones under the limit).
            rss = psutil.Process(process.pid)
            baseline = rss.memory_info().rss
            requests = behaviour.requests
            for _ in range(30):
                behaviour.body = _fresh_long_values_page(next(cycle))
                seen = behaviour.requests
                assert wait_until(lambda seen=seen: behaviour.requests > seen, timeout=10)
            assert behaviour.requests - requests >= 30
            growth = rss.memory_info().rss - baseline
            # The last scrapes are published a moment after the engine answered them.
            assert wait_until(lambda: _dropped(httpx.get(base + "/metrics", timeout=5).text,
                                               "label_value_too_long") >= 30 * 20, timeout=10)
            text = httpx.get(base + "/metrics", timeout=5).text
    print(f"RSS growth over 30 scrapes: {growth / MB:.1f} MB")
    assert growth < 50 * MB, f"RSS grew {growth / MB:.1f} MB over 30 scrapes"
    assert "h" * 1000 not in text


def test_run_serves_strict_openmetrics_and_counts_drops_for_a_hostile_engine():
    page = (VLLM + HOSTILE_PAGES["histogram_bad_le"].replace(TTFT, "vllm:e2e_request_latency_seconds")
            .replace('model_name="m"', 'model_name="meta-llama/Llama-3.1-8B-Instruct",engine="7"')
            + 'vllm:prompt_tokens_total{engine="9",model_name="meta-llama/Llama-3.1-8B-Instruct"} -3\n')
    with fake_engine(page.encode(), keep_alive=True) as (url, _behaviour), \
            exporter_run("--engine", f"{url},name=t") as (base, _process, _stderr):
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}

        def scraped() -> str:
            return httpx.get(base + "/metrics", headers=accept, timeout=5).text
        assert wait_until(lambda: _dropped(scraped(), "histogram_bad_le") > 0, timeout=15)
        text = scraped()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in strict_openmetrics(text)}  # raises on any violation
    assert "llm_time_to_first_token_seconds" in families
    ranks = {s.labels.get("rank") for s in families["llm_e2e_request_latency_seconds"].samples}
    assert "0" in ranks and "7" not in ranks  # rank 7's invalid histogram went whole, the valid ones stay
    assert _dropped(text, "negative_counter") > 0
