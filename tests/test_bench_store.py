"""bench/bench_store.py's generator: what it loads into the store must be data a real fleet could
have written (histograms consistent, counters monotone, one label set per replica), and the replay's
dependency levels must put a chained rule after the rule it reads."""

from __future__ import annotations

import json
import math
import pathlib
import random

import yaml

from bench import bench_store

PAGE = """\
# HELP llm_requests_finished_total Requests finished.
# TYPE llm_requests_finished_total counter
llm_requests_finished_total{engine="vllm",model="m",reason="stop",target="demo-0"} 412.0
llm_requests_finished_total{engine="vllm",model="m",reason="length",target="demo-0"} 0.0
# TYPE llm_prompt_tokens_total counter
llm_prompt_tokens_total{engine="vllm",model="m",target="demo-0"} 12.5
# TYPE llm_kv_cache_usage_ratio gauge
llm_kv_cache_usage_ratio{engine="vllm",model="m",target="demo-0"} 0.42
# TYPE llm_engine_up gauge
llm_engine_up{engine="vllm",target="demo-0"} 1.0
# TYPE llm_time_to_first_token_seconds histogram
llm_time_to_first_token_seconds_bucket{engine="vllm",le="0.1",model="m",target="demo-0"} 3.0
llm_time_to_first_token_seconds_bucket{engine="vllm",le="0.5",model="m",target="demo-0"} 40.0
llm_time_to_first_token_seconds_bucket{engine="vllm",le="2.5",model="m",target="demo-0"} 97.0
llm_time_to_first_token_seconds_bucket{engine="vllm",le="+Inf",model="m",target="demo-0"} 100.0
llm_time_to_first_token_seconds_sum{engine="vllm",model="m",target="demo-0"} 61.0
llm_time_to_first_token_seconds_count{engine="vllm",model="m",target="demo-0"} 100.0
# TYPE llm_e2e_request_latency_seconds histogram
llm_e2e_request_latency_seconds_bucket{engine="vllm",le="1.0",model="m",target="demo-0"} 0.0
llm_e2e_request_latency_seconds_bucket{engine="vllm",le="+Inf",model="m",target="demo-0"} 0.0
llm_e2e_request_latency_seconds_sum{engine="vllm",model="m",target="demo-0"} 0.0
llm_e2e_request_latency_seconds_count{engine="vllm",model="m",target="demo-0"} 0.0
"""
REPLICAS = 7
STEP_S = 3600.0


def _series() -> list[dict]:
    shapes = bench_store.parse_page(PAGE)
    timeline = bench_store.Timeline.ending_now(2, STEP_S, 1_800_000_000.0)
    lines = list(bench_store.generate(shapes, REPLICAS, timeline, seed=3))
    assert len(lines) == bench_store.series_of(shapes) * REPLICAS
    return [json.loads(line) for line in lines]


def test_parse_page_groups_histograms():
    parsed = bench_store.parse_page(PAGE)
    shapes = {s.name: s for s in parsed}
    assert shapes["llm_time_to_first_token_seconds"].kind == "histogram"
    assert [le for le, _ in shapes["llm_time_to_first_token_seconds"].buckets] == ["0.1", "0.5", "2.5", "+Inf"]
    assert shapes["llm_prompt_tokens_total"].kind == "counter"
    assert shapes["llm_kv_cache_usage_ratio"].kind == "gauge"
    # 3 counters + 2 gauges + (4 + 2) + (2 + 2) histogram series + Prometheus' 5 per target
    assert len(parsed) == 3 + 2 + 2
    assert bench_store.series_of(parsed) == 5 + 6 + 4 + 5


def test_every_series_covers_the_days_ending_now():
    timeline = bench_store.Timeline.ending_now(2, STEP_S, 1_800_000_000.0)
    assert timeline.count == 49
    for s in _series():
        assert len(s["values"]) == len(s["timestamps"]) == timeline.count
        assert s["timestamps"][-1] == 1_800_000_000_000
        assert s["timestamps"] == sorted(s["timestamps"])
        assert all(math.isfinite(v) for v in s["values"])


def test_counters_never_decrease():
    counters = [s for s in _series() if s["metric"]["__name__"].endswith(("_total", "_count", "_sum", "_bucket"))]
    assert len(counters) == REPLICAS * (3 + 6 + 4)
    for s in counters:
        values = s["values"]
        assert all(b >= a for a, b in zip(values, values[1:], strict=False)), s["metric"]
    grows = [s for s in counters if s["metric"]["__name__"] == "llm_requests_finished_total"]
    assert all(s["values"][-1] > s["values"][0] for s in grows)


def test_histograms_are_cumulative_in_le_and_inf_is_the_count():
    by_key: dict[tuple, dict] = {}
    for s in _series():
        m = dict(s["metric"])
        name = m.pop("__name__")
        if not name.startswith(("llm_time_to_first_token_seconds", "llm_e2e_request_latency_seconds")):
            continue
        le = m.pop("le", None)
        base, part = name.rsplit("_", 1)
        entry = by_key.setdefault((base, tuple(sorted(m.items()))), {"buckets": {}})
        if part == "bucket":
            entry["buckets"][le] = s["values"]
        else:
            entry[part] = s["values"]
    assert len(by_key) == 2 * REPLICAS
    for (base, _), entry in by_key.items():
        edges = sorted(entry["buckets"], key=lambda le: math.inf if le == "+Inf" else float(le))
        assert edges[-1] == "+Inf"
        for k in range(len(entry["count"])):
            column = [entry["buckets"][le][k] for le in edges]
            assert column == sorted(column), (base, k, column)
            assert column[-1] == entry["count"][k]
            assert entry["sum"][k] >= 0
        assert entry["count"][-1] > 0, base  # a histogram empty on the page still gets requests


def test_one_label_set_per_replica_with_fleet_labels():
    series = _series()
    up = [s["metric"] for s in series if s["metric"]["__name__"] == "up"]
    assert len(up) == REPLICAS
    instances = {m["instance"] for m in up}
    assert len(instances) == len({m["pod"] for m in up}) == REPLICAS
    assert {m["cluster"] for m in up} == set(bench_store.CLUSTERS)
    assert {m["job"] for m in up} == {bench_store.JOB}
    assert 1 < len({m["model"] for m in up}) <= len(bench_store.MODELS)
    # The page's own labels stay; the replica's replace the demo's target and model.
    kv = [s["metric"] for s in series if s["metric"]["__name__"] == "llm_kv_cache_usage_ratio"]
    assert len({m["instance"] for m in kv}) == REPLICAS
    assert all(m["engine"] == "vllm" and m["target"] == "engine" and m["model"] != "m" for m in kv)
    # Every series of a replica carries that replica's labels.
    per_instance: dict[str, set[str]] = {}
    for s in series:
        per_instance.setdefault(s["metric"]["instance"], set()).add(s["metric"]["pod"])
    assert all(len(pods) == 1 for pods in per_instance.values())


def test_gauges_keep_flags_and_swing_around_the_page():
    series = _series()
    assert all(set(s["values"]) == {1} for s in series if s["metric"]["__name__"] in ("llm_engine_up", "up"))
    kv = [s["values"] for s in series if s["metric"]["__name__"] == "llm_kv_cache_usage_ratio"]
    assert all(0.42 * 0.7 * 0.75 - 1e-9 <= v <= 0.42 * 1.3 * 1.25 + 1e-9 for values in kv for v in values)
    assert any(len(set(values)) > 1 for values in kv)


def test_replay_levels_put_a_chained_rule_after_its_input(tmp_path: pathlib.Path):
    rules = {"groups": [{"name": "g", "rules": [
        {"record": "b:quantile", "expr": "histogram_quantile(0.9, a:bucket:rate5m)"},
        {"record": "a:bucket:rate5m", "expr": "sum by (le) (rate(x_bucket[5m]))"},
        {"record": "c:top", "expr": "max(b:quantile)"},
        {"alert": "A", "expr": "c:top > 1"},
    ]}]}
    source = tmp_path / "in"
    source.mkdir()
    (source / "r.yaml").write_text(yaml.safe_dump(rules))
    globs = bench_store.recording_levels(source / "*.yaml", tmp_path / "out")
    records = [[r["record"] for g in yaml.safe_load((glob.parent / "r.yaml").read_text())["groups"]
                for r in g["rules"]] for glob in globs]
    assert records == [["a:bucket:rate5m"], ["b:quantile"], ["c:top"]]


def test_timeline_patterns_are_monotone():
    timeline = bench_store.Timeline.ending_now(1, 600, random.Random(1).uniform(1.7e9, 1.8e9))
    for growth in timeline.growth:
        assert all(b > a for a, b in zip(growth, growth[1:], strict=False))
