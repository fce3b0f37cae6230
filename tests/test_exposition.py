"""The exposition parser yields the same samples as prometheus_client's parsers, and fails cleanly.

Sameness is a property: hypothesis writes random valid pages (text format 0.0.4 and OpenMetrics)
and both parsers must read the same (name, labels, value, timestamp) list from them. Where
prometheus_client is quirky or wrong on valid input, the generator avoids that input and says why.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families
from prometheus_client.samples import Timestamp

from exporter.sources.engines.exposition import ExpositionError, LabelCache, parse

PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=300, deadline=None)


# --- comparing -------------------------------------------------------------------------------------


def _value_key(value: float) -> object:
    """NaN equals NaN here; -0.0 equals 0 (prometheus_client reads "-0" as the int 0)."""
    value = float(value)
    return "NaN" if math.isnan(value) else value


def _their_timestamp(timestamp: object) -> float | None:
    """prometheus_client gives text-format timestamps as float seconds (milliseconds / 1000) and
    OpenMetrics ones as Timestamp(sec, nsec) (or a float for exponent notation). We give float
    seconds, the correctly rounded value of the written decimal, so compare against that."""
    if timestamp is None:
        return None
    if isinstance(timestamp, Timestamp):
        return float(Decimal(f"{timestamp.sec}.{timestamp.nsec:09d}"))
    return float(timestamp)


def theirs(families) -> list[tuple]:
    return [
        (s.name, tuple(sorted(s.labels.items())), _value_key(s.value), _their_timestamp(s.timestamp))
        for family in families
        for s in family.samples
    ]


def ours(text: str, **kwargs) -> list[tuple]:
    return [
        (name, labels, _value_key(value), timestamp)
        for name, labels, value, timestamp in parse(text, **kwargs).samples
    ]


# --- generating ------------------------------------------------------------------------------------

# Metric names incl. colons (vLLM's `vllm:`). Each family's base gets a `_f<n>` suffix so no two
# families clash (OpenMetrics rejects `x` beside `x_total`; the text parser does not care).
BASE = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
# Label names starting with `__` are reserved: prometheus_client rejects them (Prometheus accepts).
LABEL_NAME = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: name not in ("le", "quantile")
)
TRICKY = ["\\", '"', "\n", "}", "{", ",", "=", " ", "#", " # ", "\t", "\r", "é", "日本", "\U0001f600",
          "\\n", '\\"', "le=", '"}', "\x00", "\u2028", "\x85"]
LABEL_VALUE = st.lists(st.sampled_from(TRICKY) | st.text(max_size=6), max_size=5).map("".join)
LABELSET = st.dictionaries(LABEL_NAME, LABEL_VALUE, max_size=3)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def text_value(draw) -> str:
    return draw(
        st.sampled_from(["NaN", "+Inf", "-Inf", "Inf", "-0", "-0.0", "0", "1e-3", "1E6", "-2.5e+10"])
        | st.integers(-(10**20), 10**20).map(str)
        | st.floats(allow_nan=False, allow_infinity=False).map(repr)
    )


@st.composite
def label_block(draw, labels: dict[str, str], openmetrics: bool) -> str:
    items = list(labels.items())
    if not items and draw(st.booleans()):
        return ""
    if openmetrics:  # OpenMetrics: no blanks, no trailing comma
        return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"
    pairs = []
    for key, value in items:
        blank = draw(st.sampled_from(["", "", " ", "\t"]))  # the text format allows blanks around tokens
        pairs.append(f'{blank}{key}{blank}={blank}"{_escape(value)}"{blank}')
    trailing = "," if items and draw(st.booleans()) else ""
    return "{" + ",".join(pairs) + trailing + "}"


@st.composite
def text_sample(draw, name: str, labels: dict[str, str]) -> str:
    block = draw(label_block(labels, openmetrics=False))
    before_value = draw(st.sampled_from([" ", "  ", "\t", " \t"])) if block == "" else draw(
        st.sampled_from(["", " ", " ", "\t"])
    )
    if block and draw(st.booleans()):  # `name {labels}` is valid in the text format too
        block = draw(st.sampled_from([" ", "\t"])) + block
        before_value = before_value or " "
    line = f"{name}{block}{before_value}{draw(text_value())}"
    if draw(st.booleans()):  # integer milliseconds
        line += draw(st.sampled_from([" ", "\t"])) + str(draw(st.integers(-(2**53) + 1, 2**53 - 1)))
    return line


@st.composite
def text_page(draw) -> str:
    """A text-format 0.0.4 page. Avoided: `# EOF` lines (OpenMetrics' end marker; we stop there),
    counters whose name lacks `_total` (prometheus_client renames their samples to `..._total`),
    quoted UTF-8 metric names (a newer extension we do not read)."""
    lines: list[str] = []
    for index in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", None]))
        base = f"{draw(BASE)}_f{index}"
        name = f"{base}_total" if kind == "counter" else base
        if draw(st.booleans()):
            doc = draw(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20))
            lines.append(f"# HELP {name} {doc.replace(chr(92), chr(92) * 2)}".rstrip())
        if kind is not None:
            lines.append(f"# TYPE {name} {kind}")
        labelsets = draw(st.lists(LABELSET, max_size=3))
        for labels in labelsets:
            if kind == "histogram":
                for bound in ["0.1", "1", "+Inf"]:
                    lines.append(draw(text_sample(f"{name}_bucket", {**labels, "le": bound})))
                lines.append(draw(text_sample(f"{name}_count", labels)))
                lines.append(draw(text_sample(f"{name}_sum", labels)))
                if draw(st.booleans()):
                    lines.append(draw(text_sample(f"{name}_created", labels)))
            elif kind == "summary":
                lines.append(draw(text_sample(name, {**labels, "quantile": "0.5"})))
                lines.append(draw(text_sample(f"{name}_count", labels)))
            else:
                lines.append(draw(text_sample(name, labels)))
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "# a free comment", "#", "   "])))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


@st.composite
def openmetrics_timestamp(draw) -> str:
    """Non-negative seconds, integer or with at most 9 decimals: prometheus_client reads `-0.5` as
    +0.5 (int("-0") loses the sign), truncates past nanoseconds, and fails on `1e3`."""
    seconds = str(draw(st.integers(0, 2**40)))
    if draw(st.booleans()):
        seconds += "." + draw(st.from_regex(r"[0-9]{1,9}", fullmatch=True))
    return seconds


@st.composite
def exemplar(draw) -> str:
    if not draw(st.booleans()):
        return ""
    trace = draw(st.from_regex(r"[0-9a-f]{1,16}", fullmatch=True))
    text = f' # {{trace_id="{trace}"}} {draw(st.sampled_from(["1", "0.5", "2.5e-3"]))}'
    if draw(st.booleans()):
        text += " " + draw(openmetrics_timestamp())
    return text


@st.composite
def openmetrics_page(draw) -> str:
    """An OpenMetrics page prometheus_client accepts: its checks (histogram bucket order, +Inf
    bucket, integer counts, _count == +Inf bucket, non-negative non-NaN counters, contiguous
    groups, one timestamp presence per group) are followed; exemplars only on buckets/_total."""
    lines: list[str] = []
    counts = st.integers(0, 10**6)
    for index in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["counter", "gauge", "histogram", "unknown"]))
        name = f"{draw(BASE)}_f{index}"
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {draw(st.from_regex(r'[a-zA-Z0-9 .]{1,20}', fullmatch=True))}")
        lines.append(f"# TYPE {name} {kind}")
        for labels in draw(st.lists(LABELSET, max_size=3, unique_by=lambda d: tuple(sorted(d.items())))):
            ts = (" " + draw(openmetrics_timestamp())) if draw(st.booleans()) else ""

            def sample(sample_name: str, value: str, extra: dict | None = None, example: str = "",
                       labels=labels, ts=ts) -> str:
                block = draw(label_block({**labels, **(extra or {})}, openmetrics=True))
                return f"{sample_name}{block} {value}{ts}{example}"

            if kind == "counter":
                lines.append(sample(f"{name}_total", draw(st.sampled_from(["0", "1.5", "1e3", "42"])),
                                    example=draw(exemplar())))
                if draw(st.booleans()):
                    lines.append(sample(f"{name}_created", "1.7e9"))
            elif kind == "histogram":
                cumulative = sorted(draw(st.lists(counts, min_size=3, max_size=3)))
                for bound, count in zip(["0.1", "1.0", "+Inf"], cumulative, strict=True):
                    lines.append(sample(f"{name}_bucket", str(count), {"le": bound}, draw(exemplar())))
                lines.append(sample(f"{name}_count", str(cumulative[-1])))
                lines.append(sample(f"{name}_sum", draw(st.sampled_from(["0", "12.5", "3e2"]))))
                if draw(st.booleans()):
                    lines.append(sample(f"{name}_created", "1.7e9"))
            else:
                lines.append(sample(name, draw(text_value())))
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


# --- (a), (b): same samples as prometheus_client ---------------------------------------------------


@PROPERTY
@given(text_page())
def test_text_format_matches_prometheus_client(page: str) -> None:
    expected = theirs(text_families(page))
    assert ours(page) == expected
    # Also through a warm cache (the exporter's way), and the cache must not change the answer.
    cache = LabelCache()
    assert ours(page, label_cache=cache) == expected
    assert ours(page, label_cache=cache) == expected


@PROPERTY
@given(openmetrics_page())
def test_openmetrics_matches_prometheus_client(page: str) -> None:
    expected = theirs(openmetrics_families(page))
    result = parse(page)
    assert result.openmetrics_eof
    cache = LabelCache()
    assert ours(page, label_cache=cache) == expected
    assert ours(page, label_cache=cache) == expected


def test_types_are_recorded() -> None:
    page = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n# TYPE b histogram\nb_count 0\n"
    assert parse(page).types == {"a_total": "counter", "b": "histogram"}
    cache = LabelCache()  # comment lines are cached: a warm parse still records every TYPE
    for _ in range(2):
        assert parse(page, label_cache=cache).types == {"a_total": "counter", "b": "histogram"}
    for _ in range(2):  # a malformed TYPE line fails warm (cached comment) as it did cold
        with pytest.raises(ExpositionError):
            parse("# TYPE broken\na 1\n", label_cache=cache)


def test_one_filter_is_asked_once_per_series_and_comments_are_bounded() -> None:
    asked: list[str] = []

    class Wanted(set):
        def __contains__(self, name: object) -> bool:
            asked.append(str(name))
            return super().__contains__(name)

    wanted = Wanted({"keep_me"})
    page = 'keep_me{a="1"} 1\ndrop_me{a="1"} 2\n'
    cache = LabelCache()
    for _ in range(3):  # the normalizer passes its set's bound __contains__ anew on every page
        result = parse(page, keep=wanted.__contains__, label_cache=cache)
        assert [s[0] for s in result.samples] == ["keep_me"] and result.dropped_samples == 1
    assert sorted(asked) == ["drop_me", "keep_me"]
    small = LabelCache(max_entries=20)
    for chunk in range(5):
        parse("".join(f"# HELP m{chunk}_{i} text {i}\n" for i in range(15)) + "m 1\n", label_cache=small)
        assert len(small) <= 20


# --- (c): units ------------------------------------------------------------------------------------


def test_escapes_in_label_values() -> None:
    page = 'm{a="x\\\\y",b="say \\"hi\\"",c="1\\n2",d="\\q",e="}{,="} 1\n'
    [(name, labels, value, timestamp)] = parse(page).samples
    assert dict(labels) == {"a": "x\\y", "b": 'say "hi"', "c": "1\n2", "d": "\\q", "e": "}{,="}
    assert (name, value, timestamp) == ("m", 1.0, None)


def test_timestamps_are_seconds_in_both_formats() -> None:
    assert parse("m 1 1700000000123\n").samples == [("m", (), 1.0, 1700000000.123)]
    assert parse("m 1 1700000000.5\n# EOF\n").samples == [("m", (), 1.0, 1700000000.5)]


def test_exemplars_are_ignored() -> None:
    page = (
        "# TYPE h histogram\n"
        'h_bucket{le="1"} 3 # {trace_id="abc",span="x y"} 0.5 1700000000.1\n'
        'h_bucket{le="+Inf"} 4 # {trace_id="def"} 9\n'
        "h_count 4\nh_sum 7\n# TYPE c counter\n"
        'c_total{a="b"} 5 1700000000 # {trace_id="1"} 1\n'
        "# EOF\n"
    )
    assert ours(page) == theirs(openmetrics_families(page))
    assert [s[2] for s in parse(page).samples] == [3.0, 4.0, 4.0, 7.0, 5.0]


def test_eof_stops_parsing() -> None:
    result = parse("a 1\n# EOF\nthis is not { an exposition\n")
    assert result.openmetrics_eof
    assert result.samples == [("a", (), 1.0, None)]
    assert not parse("a 1\n").openmetrics_eof


def test_llamacpp_nan_spellings() -> None:
    page = "llamacpp:a -nan(ind)\nllamacpp:b nan\nllamacpp:c -nan\nllamacpp:d NaN\n"
    values = [value for _, _, value, _ in parse(page).samples]
    assert len(values) == 4 and all(math.isnan(v) for v in values)


def test_values_nan_inf_exponent_negative_zero() -> None:
    page = "a +Inf\nb -Inf\nc 1.5e-3\nd -0\ne 1E6\n"
    values = [value for _, _, value, _ in parse(page).samples]
    assert values[:2] == [math.inf, -math.inf] and values[2] == 0.0015 and values[4] == 1e6
    assert math.copysign(1.0, values[3]) == -1.0


def test_keep_filter_counts_dropped_and_never_parses_their_labels() -> None:
    # The dropped family's label blocks are malformed: parsing them would raise.
    page = 'drop_me{not labels at all} 1\ndrop_me{a=unquoted} 2\nkeep_me{a="b"} 3\nkeep_me 4\n'
    for cache in (None, LabelCache()):
        for _ in range(2):  # cold, then warm
            result = parse(page, keep=lambda name: name.startswith("keep"), label_cache=cache)
            assert result.samples == [("keep_me", (("a", "b"),), 3.0, None), ("keep_me", (), 4.0, None)]
            assert result.dropped_samples == 2
    with pytest.raises(ExpositionError):
        parse(page)


def test_keep_can_change_between_calls_sharing_a_cache() -> None:
    page = 'a{x="1"} 1\nb{y="2"} 2\n'
    cache = LabelCache()
    assert [s[0] for s in parse(page, keep=lambda n: n == "a", label_cache=cache).samples] == ["a"]
    assert [s[0] for s in parse(page, keep=lambda n: n == "b", label_cache=cache).samples] == ["b"]
    assert [s[0] for s in parse(page, label_cache=cache).samples] == ["a", "b"]


def test_max_samples_bounds_kept_samples() -> None:
    page = "".join(f'm{{i="{i}"}} {i}\n' for i in range(100))
    cache = LabelCache()
    for _ in range(2):
        result = parse(page, max_samples=10, label_cache=cache)
        assert [value for _, _, value, _ in result.samples] == list(range(10))
        assert result.dropped_samples == 90
    assert len(parse(page, max_samples=1000).samples) == 100


def test_label_cache_is_bounded() -> None:
    cache = LabelCache(max_entries=50)
    for chunk in range(10):
        page = "".join(f'm{{i="{chunk}-{i}"}} 1\n' for i in range(40))
        assert len(parse(page, label_cache=cache).samples) == 40
        assert len(cache) <= 50
    assert len(cache) > 0


def test_label_set_is_sorted_and_shared() -> None:
    cache = LabelCache()
    result = parse('a{z="1",b="2"} 1\nb{z="1",b="2"} 2\n', label_cache=cache)
    first, second = (labels for _, labels, _, _ in result.samples)
    assert first == (("b", "2"), ("z", "1"))
    assert first is second  # one parse for a label block repeated across metrics


INVALID = {
    "html page": "<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n",
    "binary garbage": bytes(range(256)).decode("utf-8", errors="replace"),
    "truncated line": 'foo{a="b',
    "truncated after labels": 'foo{a="b"}',
    "missing value": "foo\n",
    "missing value with labels": 'foo{a="b"} \n',
    "bad value": "foo abc\n",
    "underscore in value": "foo 1_000\n",
    "bad timestamp": "foo 1 yesterday\n",
    "too many fields": "foo 1 2 3\n",
    "duplicate label names": 'foo{a="1",a="2"} 1\n',
    "unterminated quotes": 'foo{a="b} 1\n',
    "unquoted label value": "foo{a=b} 1\n",
    "bad label name": 'foo{1a="b"} 1\n',
    "bad metric name": "1foo 1\n",
    "bad escape at end": 'foo{a="b\\"} 1\n',
    "missing comma": 'foo{a="1" b="2"} 1\n',
    "malformed TYPE": "# TYPE foo\nfoo 1\n",
    "json": '{"error": "not found"}\n',
}


def test_comments_that_only_start_like_type_are_comments() -> None:
    text = "# TYPES of metrics below\n# TYPEfoo bar baz\n# TYPE foo counter\nfoo_total 1\n"
    for cache in (None, LabelCache()):
        result = parse(text, label_cache=cache)
        assert [s[:3] for s in result.samples] == [("foo_total", (), 1.0)]
        assert result.types == {"foo": "counter"}


@pytest.mark.parametrize("text", list(INVALID.values()), ids=list(INVALID))
def test_invalid_inputs_raise(text: str) -> None:
    with pytest.raises(ExpositionError):
        parse(text)
    with pytest.raises(ExpositionError):  # a warm cache must not let a bad line through
        cache = LabelCache()
        parse('foo{a="b"} 1\nfoo 2\n', label_cache=cache)
        parse(text, label_cache=cache)


def test_error_names_the_line() -> None:
    with pytest.raises(ExpositionError) as caught:
        parse('a 1\nb{x="1"} 2\nb{x="1"} oops\n')
    assert caught.value.line_number == 3


# --- (d): fuzz -------------------------------------------------------------------------------------

FRAGMENTS = ["# TYPE ", "# HELP ", "# EOF", "{", "}", '"', "\\", "=", ",", " ", "\t", "\n", "#",
             "le", "a", "_", ":", "1", "-", "+Inf", "NaN", "e5", ".", "m_total"]


@FUZZ
@given(st.text() | st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3)).map("".join))
def test_arbitrary_text_parses_or_raises_exposition_error(text: str) -> None:
    for kwargs in ({}, {"keep": lambda name: "a" in name, "max_samples": 3}):
        try:
            result = parse(text, **kwargs)
        except ExpositionError:
            continue
        for name, labels, value, timestamp in result.samples:
            assert isinstance(name, str) and isinstance(value, float)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels)
            assert timestamp is None or isinstance(timestamp, float)
