"""The renderer's caches never change what is rendered: a reused Renderer equals a fresh one."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from exporter.expose import Renderer, render
from exporter.snapshot import Sample, format_value, labels_of


def _histogram(target: str, values: tuple[float, float, float]) -> list[Sample]:
    bounds = ("0.1", "1.0", "+Inf")
    out = [Sample("llm_time_to_first_token_seconds_bucket", labels_of(target=target, le=le), v)
           for le, v in zip(bounds, values, strict=True)]
    out.append(Sample("llm_time_to_first_token_seconds_count", labels_of(target=target), values[-1]))
    out.append(Sample("llm_time_to_first_token_seconds_sum", labels_of(target=target), values[-1] * 0.4))
    return out


def test_reused_renderer_matches_fresh_rendering_as_values_and_series_change():
    renderer = Renderer()
    cycles = [
        _histogram("b", (1, 2, 3)) + _histogram("a", (4, 5, 6)),
        _histogram("b", (2, 3, 4)) + _histogram("a", (5, 6, 7)),  # same series, new values
        _histogram("a", (5, 6, 8)),  # a series vanished
        _histogram("c", (0, 0, 1)) + _histogram("a", (5, 6, 9)),  # a new one appeared
    ]
    for samples in cycles:
        for openmetrics in (False, True):
            assert renderer.render(samples, openmetrics=openmetrics) == render(samples, openmetrics=openmetrics)


def test_rendering_is_sorted_and_parseable():
    text = render(_histogram("b", (1, 2, 3)) + _histogram("a", (4, 5, 6))).decode()
    targets = [line.split('target="')[1][0] for line in text.splitlines() if "_bucket" in line]
    assert targets == ["a", "a", "a", "b", "b", "b"]
    buckets = [line.split('le="')[1].split('"')[0] for line in text.splitlines()
               if 'target="a"' in line and "_bucket" in line]
    assert buckets == ["0.1", "1.0", "+Inf"]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["llm_time_to_first_token_seconds"].type == "histogram"


def test_unknown_families_are_not_exported():
    assert render([Sample("not_in_catalogue", (), 1.0)]) == b""


def test_value_formatting():
    assert [format_value(v) for v in (3, 0.5, 1e-05, math.nan, math.inf, -math.inf)] == \
        ["3.0", "0.5", "1e-05", "NaN", "+Inf", "-Inf"]


def test_label_values_are_escaped():
    text = render([Sample("llm_requests_running", labels_of(target='a"b\\c\nd'), 1.0)]).decode()
    assert 'target="a\\"b\\\\c\\nd"' in text


def test_page_plan_reuse_formats_special_values_and_notices_changed_labels():
    renderer = Renderer()
    first = _histogram("a", (1, 2, 3)) + [Sample("llm_requests_running", labels_of(target="a"), 2.0)]
    renderer.render(first)
    specials = (_histogram("a", (math.inf, -math.inf, 3))
                + [Sample("llm_requests_running", labels_of(target="a"), math.nan)])
    assert renderer.render(specials) == render(specials)
    assert b'llm_requests_running{target="a"} NaN' in renderer.render(specials)
    # Same names in the same order, one label value changed: the cached layout must not be used.
    relabelled = first[:-1] + [Sample("llm_requests_running", labels_of(target="z"), 2.0)]
    assert renderer.render(relabelled) == render(relabelled)
    assert b'target="z"' in renderer.render(relabelled)


def test_empty_page_in_both_formats():
    renderer = Renderer()
    assert renderer.render([]) == b""
    assert renderer.render([], openmetrics=True) == b"# EOF\n"
