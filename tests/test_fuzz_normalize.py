"""Fuzzing the normalizer (and the exposition parser under it) with engine-like pages: real family
names of every engine (with histogram parts, `_total`, `_created`), the labels engines use and
random ones, label values with escapes and unicode, odd numbers, TYPE/HELP lines, comments,
timestamps, junk lines. normalize_with_memo() may only raise ExpositionError or UnknownEngineError, its
output must be bounded by max_series, and one NormalizerState fed thousands of pages (as one
target is over days) keeps every cache within its bound. tests/test_exposition.py fuzzes the
parser alone with arbitrary text."""

from __future__ import annotations

import contextlib
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.sources.engines.exposition import MAX_CACHED_LABEL_SETS, ExpositionError
from exporter.sources.engines.page import UnknownEngineError
from exporter.sources.engines.registry import KINDS, SPECS
from exporter.sources.engines.replay import normalize_with_memo
from exporter.sources.engines.state import MAX_LE_FORMATS, MAX_MAPPED_LABEL_SETS, NormalizerState

NAMES = sorted({name + suffix
                for spec in SPECS.values() for name, alias in spec.alias_items()
                for suffix in (("_bucket", "_sum", "_count") if alias.type == "histogram" else ("",))}
               | {name for spec in SPECS.values() for name, _ in spec.alias_items()})
LABELS = sorted({label for spec in SPECS.values() for label in (*spec.labels, *spec.keep_only)}
                | {"le", "quantile", "finished_reason", "engine", "model_name", "request_id", "x"})
MAX_SERIES = 200

label_value = st.one_of(
    st.sampled_from(["0", "1", "+Inf", "0.5", "1e3", "stop", "length", "abort", "m", "", "NaN", "-1", "other"]),
    st.text(max_size=12),
    st.integers(0, 10**6).map(str),
)
number = st.one_of(
    st.sampled_from(["0", "1", "-1", "NaN", "+Inf", "-Inf", "1e308", "-0", "0x10", "1_000", "", "nan"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**12, 10**12).map(str),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def sample_line(draw) -> str:
    name = draw(st.one_of(st.sampled_from(NAMES), st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)))
    labels = draw(st.dictionaries(st.sampled_from(LABELS), label_value, max_size=4))
    block = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}" if labels or draw(st.booleans()) \
        else ""
    line = f"{name}{block} {draw(number)}"
    if draw(st.integers(0, 9)) == 0:
        line += f" {draw(st.integers(0, 2**41))}"
    return line


@st.composite
def meta_line(draw) -> str:
    name = draw(st.sampled_from(NAMES))
    kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", "info", "bogus"]))
    return draw(st.sampled_from([f"# TYPE {name} {kind}", f"# HELP {name} some help \\n text", "# just a comment",
                                 "", "# EOF", "garbage line without value", "{}", "x{a=b} 1"]))


page = st.lists(st.one_of(sample_line(), sample_line(), sample_line(), meta_line()), max_size=40).map(
    lambda lines: "\n".join(lines) + "\n")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page, st.sampled_from((None, *KINDS)))
def test_normalize_raises_only_its_own_errors_and_respects_max_series(text: str, kind: str | None):
    try:
        scrape = normalize_with_memo(text, target="t", kind=kind, state=NormalizerState(), max_series=MAX_SERIES)
    except (ExpositionError, UnknownEngineError):
        return
    assert scrape.kind in KINDS
    assert len(scrape.samples) <= MAX_SERIES  # histograms are cut whole, never over the bound
    for s in scrape.samples:
        assert s.name.startswith("llm_") and math.isfinite(s.value)
        assert dict(s.labels).get("target") == "t"


def _fresh_page(tag: int, n: int) -> str:
    """n series never seen before (a request id leaking into model_name)."""
    return "".join(f'vllm:num_requests_running{{model_name="m{tag}-{j}"}} 1\n' for j in range(n))


FRESH = [_fresh_page(tag, MAX_MAPPED_LABEL_SETS // 2 + 1) for tag in range(3)]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(page, min_size=3, max_size=6))
def test_one_state_over_many_pages_stays_bounded(pages: list[str]):
    """One target's state across scrapes with fresh label values every time (a slow cardinality
    leak) interleaved with fuzzed pages: every cache stays within its limit."""
    state = NormalizerState()
    for fresh in FRESH:  # 1.5x the cache bounds in distinct label sets, over three scrapes
        for body, kind in ((fresh, "vllm"), *((text, None) for text in pages)):
            with contextlib.suppress(ExpositionError, UnknownEngineError):
                normalize_with_memo(body, target="t", kind=kind, state=state, max_series=MAX_SERIES)
            assert len(state.label_cache) <= MAX_CACHED_LABEL_SETS
            assert sum(len(e) for e in state._entries) <= MAX_MAPPED_LABEL_SETS
            assert len(state._le) <= MAX_LE_FORMATS
