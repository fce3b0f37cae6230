"""Unit tests of exporter/sources/engines/normalize.py on small hand-written pages: detection, label
and unit mapping, merging, priorities, bad values, bounds, and the coverage table."""

from __future__ import annotations

import pathlib
import random
import subprocess
import sys
import time

import pytest

from exporter.catalog import engine as engine_catalog
from exporter.sources.engines import alias_tables, drops, histograms
from exporter.sources.engines import normalize as normalize_module
from exporter.sources.engines import page as page_module
from exporter.sources.engines import state as state_module
from exporter.sources.engines.accounting import unaccounted
from exporter.sources.engines.coverage import coverage_table
from exporter.sources.engines.exposition import ExpositionError
from exporter.sources.engines.normalize import NormalizedScrape
from exporter.sources.engines.normalize import normalize as plain_normalize
from exporter.sources.engines.page import UnknownEngineError
from exporter.sources.engines.registry import DETECTION_ORDER, KINDS, SPECS, YIELDS_TO, detect_kind
from exporter.sources.engines.replay import MAX_PLAN_SAMPLES, normalize_if_unchanged, normalize_with_memo
from exporter.sources.engines.state import NormalizerState
from exporter.sources.engines.table import Alias

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "engines"


def run(text: str, **kwargs: object) -> NormalizedScrape:
    """What the exporter does (replay.normalize_with_memo: the plain pass, with the memo when given a state)."""
    return normalize_with_memo(text, target="t", **kwargs)


def plain(text: str, **kwargs: object) -> NormalizedScrape:
    """The plain pass alone (normalize.normalize)."""
    return plain_normalize(text, target="t", **kwargs)


def get(result: NormalizedScrape, name: str, **match: str) -> list[float]:
    return [s.value for s in result.samples
            if s.name == name and all(s.label(k) == v for k, v in match.items())]


def histogram(name: str, labels: str, bounds: list[str], counts: list[int], total: float | str) -> str:
    lines = [f"# TYPE {name} histogram"]
    sep = "," if labels else ""
    for bound, count in zip(bounds + ["+Inf"], counts, strict=True):
        lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {count}')
    lines.append(f"{name}_count{{{labels}}} {counts[-1]}")
    lines.append(f"{name}_sum{{{labels}}} {total}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Public API shape


def test_kinds() -> None:
    assert set(KINDS) == {"vllm", "sglang", "tgi", "llamacpp", "triton", "trtllm", "lmdeploy", "nim"}
    assert tuple(SPECS) == KINDS


def test_the_registry_imports_only_the_engine_tables() -> None:
    """Config validation and the docs read the engine kinds from the registry: importing it must
    not pull in the normalizer, the parser, the catalogue or config (no cycle back to config)."""
    code = ("import sys, exporter.sources.engines.registry; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('exporter'))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                timeout=60).stdout.split())
    tables = {f"exporter.sources.engines.{kind}" for kind in KINDS}
    assert loaded == {"exporter", "exporter.sources", "exporter.sources.engines", "exporter.sources.engines.registry",
                      "exporter.sources.engines.table", *tables}


def test_detection_order_names_every_kind_once_and_yields_only_to_earlier_kinds() -> None:
    assert sorted(DETECTION_ORDER) == sorted(KINDS)
    for kept, specific in YIELDS_TO.items():
        assert all(DETECTION_ORDER.index(more) < DETECTION_ORDER.index(kept) for more in specific)


def test_every_alias_targets_a_catalogue_family_of_the_same_type() -> None:
    types = {fam.name: fam.type for fam in engine_catalog.FAMILIES}
    for spec in SPECS.values():
        for source, alias in spec.alias_items():
            assert types.get(alias.family) == alias.type, (spec.kind, source)
            assert alias.type in ("gauge", "counter", "histogram")
        for product in spec.products:
            assert types.get(product.family) == product.type, (spec.kind, product.family)
        assert set(spec.labels.values()) <= {"model", "rank", "reason", "tier"}


def test_counters_keep_their_total_suffix_in_the_schema() -> None:
    for spec in SPECS.values():
        for _source, alias in spec.alias_items():
            assert (alias.type == "counter") == alias.family.endswith("_total") or alias.type == "histogram"


# ---------------------------------------------------------------------------------------------
# Detection


@pytest.mark.parametrize(("text", "kind"), [
    ("vllm:num_requests_running 1\n", "vllm"),
    ('# HELP x y\nvllm:num_requests_running{model_name="m"} 1\n', "vllm"),
    ("# TYPE vllm:num_requests_running gauge\n", "vllm"),
    ("sglang:num_running_reqs 1\n", "sglang"),
    ("tgi_queue_size 0\n", "tgi"),
    ("llamacpp:requests_processing 0\n", "llamacpp"),
    ('nv_inference_count{model="m",version="1"} 0\n', "triton"),
    ("trtllm_num_requests_running 0\n", "trtllm"),
    ('time_to_first_token_seconds_count{engine_type="undefined",model_name="undefined"} 1\n', "trtllm"),
    ('num_request_max{model_name="m"} 256\ntime_to_first_token_seconds_count{model_name="m"} 1\n', "nim"),
    ("trtllm:request_success_total 1\n", "trtllm"),
    ('vllm:num_requests_running{model="m",version="1"} 1\nnv_inference_count{model="m",version="1"} 0\n', "vllm"),
    ("lmdeploy:num_requests_running 0\nvllm:x 1\n", "lmdeploy"),
    ('num_requests_running{model_name="m"} 1\nvllm:num_requests_running 1\n', "vllm"),
])
def test_detect_kind(text: str, kind: str) -> None:
    assert detect_kind(text) == kind


@pytest.mark.parametrize("text", [
    "",
    "<html><head><title>502 Bad Gateway</title></head><body>vllm: upstream error</body></html>",
    '{"object": "error", "message": "vllm:num_requests_running"}',
    "\x00\x01\x02 binary",
    "node_load1 0.5\nprocess_cpu_seconds_total 1\n",
    "# just a comment mentioning sglang: and tgi_request_count\n",
    # an unprefixed TTFT without a NIM-only name: trtllm-serve's first release (no engine_type yet)
    # or NIM; the bare name proves neither
    'time_to_first_token_seconds_count{model_name="m"} 1\n',
])
def test_detect_kind_rejects_garbage(text: str) -> None:
    assert detect_kind(text) is None


@pytest.mark.parametrize(("fixture", "kind"), [
    ("vllm-v1-llmkube_testdata.names.txt", "vllm"),
    ("sglang-2026-llmkube_testdata.names.txt", "sglang"),
    ("llamacpp-2026-llmkube_testdata.names.txt", "llamacpp"),
])
def test_detect_kind_on_live_name_lists(fixture: str, kind: str) -> None:
    assert detect_kind((FIXTURES / fixture).read_text()) == kind


def test_html_page_is_a_parse_error_and_unknown_page_an_unknown_engine() -> None:
    with pytest.raises(ExpositionError):
        run("<html><body>502 Bad Gateway</body></html>")
    with pytest.raises(ExpositionError):
        run("<html><body>502</body></html>", kind="vllm")
    with pytest.raises(UnknownEngineError):
        run("node_load1 0.5\n")
    with pytest.raises(UnknownEngineError):
        run("vllm:num_requests_running 1\n", kind="ollama")
    assert issubclass(UnknownEngineError, ValueError)


def test_state_keeps_the_kind_and_notes_changes() -> None:
    state = NormalizerState()
    assert run("vllm:num_requests_running 3\n", state=state).kind == "vllm"
    assert state.last_kind == "vllm"
    # a page with no vLLM names (engine restarting) keeps the kind, says so, and invents nothing
    empty = run("process_cpu_seconds_total 1\n", state=state)
    assert (empty.kind, empty.samples) == ("vllm", ())
    assert any("kept the last detected kind" in note for note in empty.notes)
    changed = run("sglang:num_running_reqs 2\n", state=state)
    assert changed.kind == "sglang"
    assert any("changed from vllm to sglang" in note for note in changed.notes)
    assert get(changed, "llm_requests_running") == [2.0]


# ---------------------------------------------------------------------------------------------
# Labels


def test_labels_are_target_engine_model_rank_reason() -> None:
    text = (
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5\n'
        'vllm:request_success_total{engine="0",finished_reason="cancelled",model_name="m"} 1\n'
        'vllm:request_success_total{engine="0",finished_reason="timeout",model_name="m"} 2\n'
        'vllm:num_requests_running{engine="9999",model_name="m"} 1\n'
        'vllm:num_requests_running{engine="dp-a",model_name="m"} 2\n'
        # str.isdigit() is true for these and int() refuses them (found by the fuzz test)
        'vllm:num_requests_running{engine="\u00b3\u00b3",model_name="m"} 1\n'
        'vllm:num_requests_running{engine="\u2460",model_name="m"} 1\n'
    )
    result = run(text)
    finished = {s.label("reason"): s.value for s in result.samples if s.name == "llm_requests_finished_total"}
    assert finished == {"stop": 5.0, "other": 3.0}  # unknown reasons are bounded into "other"
    sample = next(s for s in result.samples if s.name == "llm_requests_finished_total")
    assert [k for k, _ in sample.labels] == ["engine", "model", "rank", "reason", "target"]
    assert sample.labels == tuple(sorted(sample.labels))
    # ranks outside 0..1023 or not numbers are bounded into "other" (and merged: gauges take max)
    assert get(result, "llm_requests_running", rank="other") == [2.0]


def test_reason_default_when_the_engine_gives_none() -> None:
    result = run("tgi_request_success 7\ntgi_request_failure{err=\"validation\"} 1\n"
                 "tgi_request_failure{err=\"overloaded\"} 2\n")
    assert get(result, "llm_requests_finished_total", reason="other") == [7.0]
    # TGI's `err` kinds keep their meaning: an overloaded queue refused, a validation error failed
    assert get(result, "llm_requests_finished_total", reason="error") == [1.0]
    assert get(result, "llm_requests_finished_total", reason="rejected") == [2.0]
    # an engine that gives no reason at all gets the alias's default
    result = run('nv_inference_request_failure{model="m",version="1"} 4\n')
    assert get(result, "llm_requests_finished_total", reason="error") == [4.0]


def test_absent_model_values_mean_no_model() -> None:
    result = run('trtllm_num_requests_running{engine_type="trtllm",model_name="undefined"} 3\n')
    assert result.model == ""
    assert result.samples[0].label("model") == ""


def test_sglang_keeps_rank_zero_copies_and_maps_dp_rank() -> None:
    # SGLang's scheduler adds labels["dp_rank"] when data-parallel. Copies of every TP rank (with
    # --enable-metrics-for-all-schedulers) are skipped without a dp_rank ...
    text = "".join(f'sglang:num_running_reqs{{model_name="m",pp_rank="0",tp_rank="{tp}"}} {10 + tp}\n'
                   for tp in (0, 1, 2, 3))
    result = run(text)
    assert [s.value for s in result.samples] == [10.0]
    assert result.unmapped_samples == 0  # copies are skipped, not "unmapped"
    # ... and with one they coincide per dp rank: equal copies of a gauge merge to their value
    text = "".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",model_name="m",pp_rank="0",tp_rank="{tp}"}} {10 + dp}\n'
        for dp in (0, 1) for tp in (0, 1, 2, 3))
    result = run(text)
    assert {s.label("rank"): s.value for s in result.samples} == {"0": 10.0, "1": 11.0}
    assert result.unmapped_samples == 0


def test_sglang_dp_attention_ranks_are_not_tp_copies() -> None:
    """With --enable-dp-attention DP rank d's scheduler reports its global tp_rank (and moe_ep_rank):
    not a copy of rank 0's numbers. Every dp rank is kept, as `rank`; pp_rank still filters."""
    labels = 'engine_type="unified",model_name="m",pp_rank="{pp}",tp_rank="{tp}",moe_ep_rank="{tp}",dp_rank="{dp}"'
    text = "".join(f"sglang:num_running_reqs{{{labels.format(pp=pp, tp=2 * dp, dp=dp)}}} {10 * (dp + 1) + pp}\n"
                   f"sglang:num_retracted_requests_total{{{labels.format(pp=pp, tp=2 * dp, dp=dp)}}} {dp + 1}\n"
                   for dp in (0, 1, 2, 3) for pp in (0, 1))
    result = run(text)
    assert {s.label("rank"): s.value for s in result.samples if s.name == "llm_requests_running"} == {
        "0": 10.0, "1": 20.0, "2": 30.0, "3": 40.0}
    assert {s.label("rank"): s.value for s in result.samples if s.name == "llm_preemptions_total"} == {
        "0": 1.0, "1": 2.0, "2": 3.0, "3": 4.0}
    # without a dp_rank a non-zero tp_rank / moe_ep_rank is still a copy
    assert run('sglang:num_running_reqs{model_name="m",moe_ep_rank="1",tp_rank="0"} 5\n').samples == ()


# ---------------------------------------------------------------------------------------------
# Prefix-cache units and sources

BLOCKS_HELP = ("# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, "
               "in terms of number of queried blocks.\n"
               "# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached blocks.\n")
TOKENS_HELP = BLOCKS_HELP.replace("queried blocks", "queried tokens").replace("cached blocks", "cached tokens")
GPU_PREFIX = ('vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 100\n'
              'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 40\n')
INFO_16 = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1\n'


def _prefix(result: NormalizedScrape) -> tuple[list[float], list[float]]:
    return get(result, "llm_prefix_cache_queries_total"), get(result, "llm_prefix_cache_hits_total")


def test_vllm_gpu_prefix_cache_unit_follows_its_help() -> None:
    # 0.8: HELP says blocks -> x block_size; without cache_config_info no series (not blocks as tokens)
    assert _prefix(run(BLOCKS_HELP + GPU_PREFIX + INFO_16)) == ([1600.0], [640.0])
    assert _prefix(run(BLOCKS_HELP + GPU_PREFIX)) == ([], [])
    # ~0.9.0: same names, HELP says tokens -> as is, whatever the block size
    assert _prefix(run(TOKENS_HELP + GPU_PREFIX + INFO_16)) == ([100.0], [40.0])
    # no HELP at all: tokens (every release since 0.8.x)
    assert _prefix(run(GPU_PREFIX + INFO_16)) == ([100.0], [40.0])
    # the renamed counters win over the old ones, whatever their unit
    renamed = ('vllm:prefix_cache_queries_total{engine="0",model_name="m"} 7\n'
               'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 3\n')
    assert _prefix(run(TOKENS_HELP + GPU_PREFIX + renamed + INFO_16)) == ([7.0], [3.0])
    assert _prefix(run(BLOCKS_HELP + GPU_PREFIX + renamed + INFO_16)) == ([7.0], [3.0])


def test_warm_state_follows_a_help_text_change() -> None:
    """An upgrade from 0.8 to 0.9 keeps every sample name and label: only the HELP text changes.
    A plan recorded on the blocks page must not be replayed on the tokens page."""
    state = NormalizerState()
    for text in [BLOCKS_HELP + GPU_PREFIX + INFO_16] * 3 + [TOKENS_HELP + GPU_PREFIX + INFO_16] * 3 \
            + [BLOCKS_HELP + GPU_PREFIX + INFO_16] * 2:
        _same(run(text, state=state), plain(text))
        assert normalize_if_unchanged(text, target="t", kind=None, state=state) in (None, run(text))


def test_sglang_prefix_cache_is_cached_over_prompt_tokens() -> None:
    rate = 'sglang:cache_hit_rate{model_name="m",tp_rank="0"} 0.0\n'
    prompt = 'sglang:prompt_tokens_total{model_name="m"} 1000\n'
    cached = ('sglang:cached_tokens_total{cache_source="device",model_name="m"} 300\n'
              'sglang:cached_tokens_total{cache_source="host",model_name="m"} 100\n')
    result = run(rate + prompt + cached)
    assert _prefix(result) == ([1000.0], [300.0, 100.0])  # hits by tier: device, host
    assert sorted(s.label("tier") for s in result.samples if s.name == "llm_prefix_cache_hits_total") == [
        "device", "host"]
    assert get(result, "llm_prompt_tokens_total") == [1000.0]
    # the gauge is the last prefill batch's hit rate (0 after every decode log): never mapped
    assert get(result, "llm_prefix_cache_hit_ratio") == []
    # before the first hit SGLang has no cached_tokens sample (only HELP/TYPE): no queries either
    idle = rate + prompt + "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n" \
        + "# TYPE sglang:cached_tokens_total counter\n"
    assert _prefix(run(idle)) == ([], [])
    assert get(run(idle), "llm_prompt_tokens_total") == [1000.0]


def test_trtllm_prompt_cached_tokens_are_prefix_cache_hits() -> None:
    labels = '{engine_type="trtllm",model_name="m"}'
    text = (f"trtllm_prompt_tokens_total{labels} 5000\n"
            f"trtllm_prompt_cached_tokens_total{labels} 1200\n"
            f"trtllm_kv_cache_hit_rate{labels} 0.3\n")
    result = run(text)
    assert _prefix(result) == ([5000.0], [1200.0])
    assert get(result, "llm_prompt_tokens_total") == [5000.0]
    assert get(result, "llm_prefix_cache_hit_ratio") == [0.3]
    # a server without the cached-tokens counter: prompt tokens are not called queries
    assert _prefix(run(f"trtllm_prompt_tokens_total{labels} 5000\n")) == ([], [])


# ---------------------------------------------------------------------------------------------
# Detection: Triton's vLLM backend, NIM vs trtllm-serve, Dynamo's trtllm: prefix

TRITON_CORE = ('nv_inference_request_success{model="vllm_model",version="1"} 42\n'
               'nv_inference_request_failure{model="vllm_model",version="1"} 1\n')
TRITON_VLLM = TRITON_CORE + ('vllm:num_requests_running{model="vllm_model",version="1"} 7\n'
                             'vllm:gpu_cache_usage_perc{model="vllm_model",version="1"} 0.6\n')


def test_triton_vllm_backend_is_vllm_with_model_label() -> None:
    result = run(TRITON_VLLM)
    assert (result.kind, result.flavor, result.model) == ("vllm", "triton-vllm", "vllm_model")
    assert get(result, "llm_requests_running", model="vllm_model") == [7.0]
    assert get(result, "llm_kv_cache_usage_ratio", model="vllm_model") == [0.6]
    assert get(result, "llm_requests_finished_total", reason="other") == [42.0]
    assert get(result, "llm_requests_finished_total", reason="error") == [1.0]
    # native vLLM: its own request_success_total wins over Triton's (never both on a real page)
    both = TRITON_CORE + 'vllm:request_success_total{model_name="m",finished_reason="stop"} 5\n'
    assert get(run(both), "llm_requests_finished_total") == [5.0]


def test_kept_kind_gives_way_to_a_more_specific_one() -> None:
    # Triton registers the vLLM backend's families once the model has loaded: triton, then vllm
    state = NormalizerState()
    assert run(TRITON_CORE, state=state).kind == "triton"
    result = run(TRITON_VLLM, state=state)
    assert result.kind == "vllm" and state.last_kind == "vllm"
    assert any("changed from triton to vllm" in note for note in result.notes)
    _same(run(TRITON_VLLM, state=state), run(TRITON_VLLM))
    # the vLLM model unloaded: Triton alone again
    assert run(TRITON_CORE, state=state).kind == "triton"
    # a kept nim gives way to trtllm-serve (same unprefixed names, engine_type on its samples)
    state = NormalizerState()
    assert run('num_requests_running{model_name="m"} 1\n', state=state).kind == "nim"
    assert run(TRTLLM_RC5, state=state).kind == "trtllm"


TRTLLM_RC5 = ('time_to_first_token_seconds_count{engine_type="undefined",model_name="undefined"} 1\n'
              'time_to_first_token_seconds_sum{engine_type="undefined",model_name="undefined"} 0.1\n'
              'time_to_first_token_seconds_bucket{engine_type="undefined",le="+Inf",model_name="undefined"} 1\n')
TRTLLM_RC5_IDLE = "".join(
    f"# HELP {name} help\n# TYPE {name} {kind}\n"
    for name, kind in (("request_success_total", "counter"), ("e2e_request_latency_seconds", "histogram"),
                       ("time_to_first_token_seconds", "histogram"), ("time_per_output_token_seconds", "histogram"),
                       ("request_queue_time_seconds", "histogram")))


def test_idle_trtllm_first_release_is_not_nim() -> None:
    """trtllm-serve 1.1.0rc5 prints only HELP/TYPE lines until its first request; the bare
    unprefixed names are NIM's too, so the page proves no engine (it used to read as NIM and, the
    kind being kept, stay NIM once samples appeared)."""
    assert detect_kind(TRTLLM_RC5_IDLE) is None
    state = NormalizerState()
    with pytest.raises(UnknownEngineError):
        run(TRTLLM_RC5_IDLE, state=state)
    result = run(TRTLLM_RC5_IDLE + TRTLLM_RC5, state=state)
    assert result.kind == "trtllm"
    assert get(result, "llm_time_to_first_token_seconds_count") == [1.0]
    assert run(TRTLLM_RC5_IDLE, kind="trtllm").samples == ()  # configured: an empty, valid page


def test_dynamo_trtllm_colon_prefix_ranks_below_current_names() -> None:
    colon = 'trtllm:request_success_total{engine_type="trtllm",finished_reason="stop",model_name="m"} 10\n'
    assert detect_kind(colon) == "trtllm"
    assert get(run(colon), "llm_requests_finished_total", reason="stop") == [10.0]
    current = 'trtllm_request_success_total{engine_type="trtllm",finished_reason="stop",model_name="m"} 12\n'
    unprefixed = 'request_success_total{engine_type="trtllm",finished_reason="stop",model_name="m"} 11\n'
    assert get(run(colon + current), "llm_requests_finished_total") == [12.0]
    assert get(run(colon + unprefixed), "llm_requests_finished_total") == [11.0]


# ---------------------------------------------------------------------------------------------
# Merging and priorities


def test_duplicates_after_label_mapping_sum_counters_and_max_gauges() -> None:
    text = (
        'vllm:prompt_tokens_total{model_name="m",pid="1"} 10\n'
        'vllm:prompt_tokens_total{model_name="m",pid="2"} 32\n'
        'vllm:num_requests_running{model_name="m",pid="1"} 4\n'
        'vllm:num_requests_running{model_name="m",pid="2"} 6\n'
        + histogram("vllm:e2e_request_latency_seconds", 'model_name="m",pid="1"', ["1.0"], [1, 2], 3.0)
        + histogram("vllm:e2e_request_latency_seconds", 'model_name="m",pid="2"', ["1"], [4, 5], 6.0)
    )
    result = run(text)
    assert get(result, "llm_prompt_tokens_total") == [42.0]
    assert get(result, "llm_requests_running") == [6.0]
    # "1" and "1.0" are one bound after formatting: summed
    assert get(result, "llm_e2e_request_latency_seconds_bucket", le="1.0") == [5.0]
    assert get(result, "llm_e2e_request_latency_seconds_bucket", le="+Inf") == [7.0]
    assert get(result, "llm_e2e_request_latency_seconds_sum") == [9.0]


def test_new_name_wins_over_deprecated_twin() -> None:
    text = (histogram("vllm:time_per_output_token_seconds", 'model_name="m"', ["0.1"], [1, 9], 0.9)
            + histogram("vllm:inter_token_latency_seconds", 'model_name="m"', ["0.1"], [1, 2], 0.2)
            + 'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n')
    result = run(text)
    assert get(result, "llm_inter_token_latency_seconds_count") == [2.0]
    assert get(result, "llm_kv_cache_usage_ratio") == [0.5]
    only_old = run(histogram("vllm:time_per_output_token_seconds", 'model_name="m"', ["0.1"], [1, 9], 0.9))
    assert get(only_old, "llm_inter_token_latency_seconds_count") == [9.0]


def test_units_are_converted_exactly() -> None:
    text = histogram("nv_inference_first_response_histogram_ms", 'model="m",version="1"',
                     ["0.3", "250", "1000", "7.5"], [1, 3, 4, 2, 5], 12345.0)  # ascending by le
    text += 'nv_inference_queue_duration_us{model="m",version="1"} 2500000\n'
    result = run(text)
    bounds = [s.label("le") for s in result.samples if s.name == "llm_time_to_first_token_seconds_bucket"]
    assert bounds == ["0.0003", "0.25", "1.0", "0.0075", "+Inf"]
    assert get(result, "llm_time_to_first_token_seconds_sum") == [pytest.approx(12.345)]
    assert get(result, "llm_time_to_first_token_seconds_count") == [5.0]
    assert get(result, "llm_request_queue_seconds_total") == [2.5]


def test_triton_used_over_max_only_without_fraction() -> None:
    base = ('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="m",version="1"} 25\n'
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m",version="1"} 100\n'
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m",version="1"} 64\n')
    assert get(run(base), "llm_kv_cache_usage_ratio") == [0.25]
    assert get(run(base), "llm_kv_cache_capacity_tokens") == [6400.0]
    with_fraction = base + (
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="m",version="1"} 0.3\n')
    assert get(run(with_fraction), "llm_kv_cache_usage_ratio") == [0.3]
    zero_max = base.replace("} 100", "} 0")
    result = run(zero_max)
    assert get(result, "llm_kv_cache_usage_ratio") == []
    assert any("division by zero" in note for note in result.notes)


def test_products_need_every_term() -> None:
    # blocks but no block size: no capacity, no made-up number
    result = run('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m",version="1"} 100\n')
    assert get(result, "llm_kv_cache_capacity_tokens") == []
    info = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    result = run(info)
    assert get(result, "llm_kv_cache_capacity_tokens") == []
    assert get(result, "llm_kv_cache_block_size_tokens") == [16.0]
    assert any("num_gpu_blocks" in note for note in result.notes)


# ---------------------------------------------------------------------------------------------
# Bad values and bounds


def test_non_finite_values_are_dropped_with_a_note() -> None:
    text = ('vllm:num_requests_running{model_name="m"} NaN\n'
            'vllm:num_requests_waiting{model_name="m"} +Inf\n'
            'vllm:prompt_tokens_total{model_name="m"} -nan\n'
            'vllm:generation_tokens_total{model_name="m"} 3\n')
    result = run(text)
    assert [s.name for s in result.samples] == ["llm_generation_tokens_total"]
    assert any("vllm:num_requests_running" in note for note in result.notes)
    assert any("vllm:num_requests_waiting" in note for note in result.notes)


def test_incomplete_histogram_is_dropped_whole() -> None:
    text = ('# TYPE vllm:e2e_request_latency_seconds histogram\n'
            'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 1\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} 1\n')
    result = run(text)
    assert result.samples == ()
    assert any("incomplete" in note for note in result.notes)


def test_max_series_drops_whole_histograms_and_counts_them() -> None:
    text = "".join(histogram("vllm:e2e_request_latency_seconds", f'engine="{rank}",model_name="m"',
                             ["1.0", "2.5"], [1, 2, 3], 4.0) for rank in range(4))
    text += 'vllm:num_requests_running{model_name="m"} 1\n'
    result = run(text, max_series=12)
    # each histogram series is 5 samples: two fit in 12 with the gauge (1 + 5 + 5 = 11)
    assert len(result.samples) == 11
    assert result.dropped_series == 10
    ranks = {s.label("rank") for s in result.samples if s.name.startswith("llm_e2e")}
    assert len(ranks) == 2
    for rank in ranks:
        assert len([s for s in result.samples if s.label("rank") == rank]) == 5
    assert any("over the limit" in note for note in result.notes)


def test_notes_are_bounded(monkeypatch) -> None:
    # NaN on every name the vLLM table maps: more distinct notes than the bound.
    page = "".join(f'{name}{{model_name="m"}} NaN\n' for name in sorted(alias_tables.TABLES["vllm"].keep))
    bound = normalize_module.MAX_NOTES
    monkeypatch.setattr(normalize_module, "MAX_NOTES", 10_000)
    assert len(run(page).notes) > bound
    monkeypatch.setattr(normalize_module, "MAX_NOTES", bound)
    assert len(run(page).notes) == bound


def test_alias_minimum_sentinel() -> None:
    assert Alias("llm_prefix_cache_hit_ratio", "gauge", minimum=0.0).minimum == 0.0
    result = run('vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.25\n')
    assert get(result, "llm_prefix_cache_hit_ratio") == [0.25]


def test_live_vllm_v1_names_cover_the_core_schema() -> None:
    """Every name a live vLLM V1 exposes (LLMKube's list) either maps or is knowingly unmapped."""
    mapped = set(alias_tables.TABLES["vllm"].keep)
    live = (FIXTURES / "vllm-v1-llmkube_testdata.names.txt").read_text().split()
    assert set(live) - mapped == {"vllm:request_failure_total"}


def test_live_sglang_names_cover_the_core_families() -> None:
    mapped = alias_tables.TABLES["sglang"].keep
    live = set((FIXTURES / "sglang-2026-llmkube_testdata.names.txt").read_text().split())
    for name in ("sglang:time_to_first_token_seconds_bucket",
                 "sglang:token_usage", "sglang:max_total_num_tokens", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:prompt_tokens_total", "sglang:cached_tokens_total"):
        assert name in live and name in mapped
    assert "sglang:cache_hit_rate" in live and "sglang:cache_hit_rate" not in mapped  # a last-batch gauge
    # weighted per token, so not llm_inter_token_latency_seconds: accounted for as ignored
    itl = "sglang:inter_token_latency_seconds_count"
    assert itl in live and itl not in mapped
    assert SPECS["sglang"].state_of("sglang:inter_token_latency_seconds") == "ignored"


# ---------------------------------------------------------------------------------------------
# Coverage table and cost


def test_coverage_table_lists_every_engine_and_family() -> None:
    table = coverage_table()
    for spec in SPECS.values():
        assert spec.title in table.splitlines()[0]
    for fam in engine_catalog.FAMILIES:
        if fam.name not in ("llm_engine_up", "llm_engine_info"):
            assert f"`{fam.name}`" in table
    ttft = next(line for line in table.splitlines() if "`llm_time_to_first_token_seconds`" in line)
    cells = [cell.strip() for cell in ttft.strip("|").split("|")[1:]]
    assert dict(zip(KINDS, cells, strict=True))["tgi"] == "–"
    assert dict(zip(KINDS, cells, strict=True))["vllm"] == "✔"


def test_normalize_is_cheap_on_a_200kb_vllm_page() -> None:
    page = (FIXTURES / "vllm-v0.11__documented.prom").read_text()
    lines = [line for line in page.splitlines() if 'engine="0"' in line]
    big = page + "".join("\n".join(line.replace('engine="0"', f'engine="{rank}"') for line in lines) + "\n"
                         for rank in (2, 3, 4, 5))
    assert len(big) > 200_000
    state = NormalizerState()
    normalize_with_memo(big, target="t", state=state)
    best = min(_timed(lambda: normalize_with_memo(big, target="t", state=state)) for _ in range(5))
    # a few ms of CPU; a guard against a pathological slowdown (bench_normalize measures it)
    assert best < 0.25


def _timed(call) -> float:
    start = time.thread_time()  # CPU time of this thread: a loaded machine does not inflate it
    call()
    return time.thread_time() - start


def test_docs_engines_md_is_generated_from_the_tables() -> None:
    from exporter.sources.engines.coverage import engines_markdown

    docs = pathlib.Path(__file__).resolve().parent.parent / "docs" / "engines.md"
    assert docs.read_text() == engines_markdown(), (
        "docs/engines.md is stale: python -m exporter.sources.engines.coverage > docs/engines.md")


def test_bad_bucket_bound_drops_the_whole_histogram_and_is_counted_on_every_page() -> None:
    text = histogram("vllm:e2e_request_latency_seconds", 'model_name="m"', ["1.0"], [1, 2], 3.0)
    text = text.replace('le="1.0"', 'le="NaN"')
    state = NormalizerState()
    for _ in range(3):  # the plan (recorded on the second page) replays the drop
        result = run(text, state=state)
        assert any("bad le" in note for note in result.notes)
        assert not [s for s in result.samples if s.name.startswith("llm_e2e_request_latency_seconds")]
        assert dict(result.drops) == {"histogram_bad_le": 4}  # two buckets, _count, _sum


# ---------------------------------------------------------------------------------------------
# Warm state (the per-page plan) gives exactly what a cold one does

PROM_FIXTURES = sorted(FIXTURES.glob("*.prom"))


def _same(warm: NormalizedScrape, cold: NormalizedScrape) -> None:
    # repr too: == would accept 0.0 for -0.0
    assert warm == cold
    assert repr(warm) == repr(cold)


@pytest.mark.parametrize("path", PROM_FIXTURES, ids=lambda path: path.stem)
def test_warm_state_yields_exactly_what_a_cold_one_does(path: pathlib.Path) -> None:
    page = path.read_text()
    state = NormalizerState()
    first = normalize_with_memo(page, target="t", state=state)
    assert state.memo.plan is None  # planned once the page repeats
    _same(normalize_with_memo(page, target="t", state=state), first)
    plan = state.memo.plan
    assert plan is not None
    for _ in range(3):
        warm = normalize_with_memo(page, target="t", state=state)
        _same(warm, plain_normalize(page, target="t"))
        _same(warm, first)
    assert state.memo.plan is plan  # replayed, not rebuilt


def _perturbed(page: str, rng: random.Random, odd: float) -> str:
    """The page with new values: mostly random numbers, some zeros, sentinels and non-finite."""
    lines = []
    for line in page.split("\n"):
        head, space, value = line.rpartition(" ")
        if not line.startswith("#") and space and head:
            pick = rng.random()
            if pick < odd:
                value = rng.choice(["NaN", "+Inf", "-Inf", "-1", "0", "0.0", "-0.0"])
            elif pick < 0.8:
                value = repr(rng.uniform(0, 1e6) if rng.random() < 0.5 else float(rng.randrange(10**9)))
            line = head + space + value
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("path", PROM_FIXTURES, ids=lambda path: path.stem)
def test_warm_state_follows_changing_values(path: pathlib.Path) -> None:
    """Values change every cycle; now and then one becomes NaN, a sentinel or a zero divisor (which
    changes what is dropped): the warm state must notice and still match a cold pass."""
    page = path.read_text()
    rng = random.Random(path.name)
    state = NormalizerState()
    normalize_with_memo(page, target="t", state=state)
    for cycle in range(30):
        text = _perturbed(page, rng, odd=0.0 if cycle % 3 else 0.02)
        _same(normalize_with_memo(text, target="t", state=state), plain_normalize(text, target="t"))
        _same(normalize_with_memo(page, target="t", state=state), plain_normalize(page, target="t"))


@pytest.mark.parametrize("max_series", [3, 7, 10_000])
def test_warm_state_with_merges_model_fill_and_products(max_series: int) -> None:
    """Series merged across label sets, re-keyed to the page's model after the fact (and merged
    again there), a product, the sentinel minimum and the series limit, with changing values."""
    template = (
        'vllm:prompt_tokens_total{engine="0"} @a\n'
        'vllm:prompt_tokens_total{model_name="m",engine="0"} @b\n'
        'vllm:prompt_tokens_total{engine="0",other="x"} @c\n'
        'vllm:num_requests_running{engine="0"} @a\n'
        'vllm:num_requests_running{model_name="m",engine="0"} @c\n'
        'vllm:num_requests_running{engine="0",other="y"} @b\n'
        'vllm:gpu_prefix_cache_hit_rate{model_name="m"} @d\n'
        'vllm:gpu_prefix_cache_queries_total{model_name="m",engine="0"} @c\n'
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",engine="0"} 1\n'
        'vllm:request_success_total{model_name="m",finished_reason="stop"} @a\n'
        'vllm:request_success_total{model_name="m",finished_reason="weird"} @b\n'
        'vllm:request_success_total{model_name="m",finished_reason="odd"} @c\n'
    ) + histogram("vllm:e2e_request_latency_seconds", 'engine="0"', ["1.0", "2.5"], [1, 2, 3], "@d") \
      + histogram("vllm:e2e_request_latency_seconds", 'engine="0",model_name="m"', ["1.0", "2.5"], [1, 2, 3], "@a")
    rng = random.Random(max_series)
    state = NormalizerState()
    for cycle in range(40):
        values = {key: repr(rng.uniform(-2, 1e3)) for key in "abc"}
        values["d"] = repr(rng.uniform(0, 1))  # a hit ratio: above 1 is out of range, never planned
        if cycle % 5 == 4:
            values[rng.choice("abcd")] = "NaN"
        text = template
        for key, value in values.items():
            text = text.replace("@" + key, value)
        warm = run(text, state=state, max_series=max_series)
        _same(warm, plain(text, max_series=max_series))
    assert state.memo.plan is not None


def test_warm_state_products_with_a_zero_divisor() -> None:
    page = ("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"used\",model=\"m\",version=\"1\"} 5\n"
            "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\",model=\"m\",version=\"1\"} {max}\n"
            "nv_inference_request_success{model=\"m\",version=\"1\"} 3\n")
    state = NormalizerState()
    for divisor in ("10", "0", "0", "20", "0.0", "7"):
        text = page.replace("{max}", divisor)
        _same(run(text, state=state, kind="triton"), plain(text, kind="triton"))


def test_warm_state_stays_bounded_under_a_cardinality_bomb() -> None:
    bomb = "".join(f'vllm:num_requests_running{{model_name="m",engine="{i}"}} 1\n'
                   for i in range(MAX_PLAN_SAMPLES + 1))
    state = NormalizerState()
    result = normalize_with_memo(bomb, target="t", state=state, max_series=100)
    assert result.dropped_series > 0
    assert state.memo.plan is None  # too big to plan: nothing per page is kept
    assert sum(len(entries) for entries in state._entries) <= state_module.MAX_MAPPED_LABEL_SETS
    normalize_with_memo(bomb, target="t", state=state, max_series=100)
    assert state.memo == (None, None)
    # Many pages of fresh series, each seen twice: one plan at a time, the label caches bounded.
    for round_ in range(30):
        page = "".join(f'vllm:num_requests_running{{model_name="m{round_}-{i}",engine="0"}} 1\n'
                       for i in range(2_000))
        normalize_with_memo(page, target="t", state=state)
        normalize_with_memo(page, target="t", state=state)
        assert state.memo.plan is not None and len(state.memo.plan.names) == 2_000
        assert sum(len(entries) for entries in state._entries) <= state_module.MAX_MAPPED_LABEL_SETS
        assert len(state.label_cache) <= state.label_cache.max_entries
        assert len(state._le) <= state_module.MAX_LE_FORMATS


def test_warm_state_follows_target_kind_and_limit() -> None:
    page = (FIXTURES / "vllm-v0.11__documented.prom").read_text()
    state = NormalizerState()
    for target, max_series in (("a", 10_000), ("b", 10_000), ("b", 50), ("a", 10_000)):
        warm = normalize_with_memo(page, target=target, state=state, max_series=max_series)
        _same(warm, plain_normalize(page, target=target, max_series=max_series))
    lmdeploy = (FIXTURES / "lmdeploy-early__documented.prom").read_text()
    for text, kind in ((page, "vllm"), (lmdeploy, "lmdeploy"), (lmdeploy, "vllm"), (page, None)):
        _same(normalize_with_memo(text, target="a", state=state, kind=kind),
              plain_normalize(text, target="a", kind=kind))


def test_normalize_if_unchanged_replays_only_a_repeated_page_and_matches_the_full_pass(monkeypatch) -> None:
    page = (FIXTURES / "vllm-v0.11__documented.prom").read_text()
    state = NormalizerState()
    parses: list[str] = []
    real_parse = page_module.parse
    monkeypatch.setattr(page_module, "parse", lambda text, **kw: parses.append(text) or real_parse(text, **kw))
    assert normalize_if_unchanged(page, target="t", kind=None, state=state) is None  # nothing recorded
    assert not parses and state.last_kind is None  # and nothing parsed or noted for the full pass to repeat
    first = normalize_with_memo(page, target="t", state=state)
    normalize_with_memo(page, target="t", state=state)  # the repeat records the plan
    replayed = normalize_if_unchanged(page.replace(" 12.0\n", " 13.0\n"), target="t", kind=None, state=state)
    full = normalize_with_memo(page.replace(" 12.0\n", " 13.0\n"), target="t", state=NormalizerState())
    assert replayed is not None and replayed == full and replayed != first
    changed = page.replace('model_name="', 'model_name="other-')
    assert normalize_if_unchanged(changed, target="t", kind=None, state=state) is None


LIVE = pathlib.Path(__file__).parent / "fixtures" / "live"


@pytest.mark.parametrize("page", sorted(p.name for p in LIVE.glob("*.prom")))
def test_every_family_on_a_live_engine_page_is_mapped_or_listed_with_a_reason(page):
    """Pages captured from the real engines of the live tier (tests/live): a family that is neither
    mapped nor in its table's `unmapped` (docs/engines.md) fails, so a new engine release that adds
    families shows up here and in `make test-live`."""
    from exporter.sources.engines.registry import SPECS

    text = (LIVE / page).read_text()
    scrape = plain_normalize(text, target="live")
    assert unaccounted(SPECS[scrape.kind], text) == []
    assert scrape.samples and not scrape.drops, scrape.notes


def test_the_unaccounted_check_names_a_new_family():
    from exporter.sources.engines.registry import SPECS

    page = "vllm:num_requests_running 1\nvllm:brand_new_total 3\nvllm:brand_new_created 1\nprocess_open_fds 9\n"
    assert unaccounted(SPECS["vllm"], page) == ["vllm:brand_new_total"]


@pytest.mark.parametrize("page", sorted(p.name for p in LIVE.glob("*.prom")))
def test_a_live_page_normalizes_to_the_independent_reading_of_the_alias_tables(page):
    """tests/live/expected.py reads a page with prometheus_client's parser and the alias tables
    alone; the normalizer must agree on every total and every bucket (what make test-live checks
    through the real exporter, here on the committed captures)."""
    from exporter.sources.engines.registry import SPECS
    from tests.live.expected import expected_totals

    text = (LIVE / page).read_text()
    scrape = plain_normalize(text, target="t")
    got: dict = {}
    for s in scrape.samples:
        le = dict(s.labels).get("le")
        key = (s.name, float(le) if s.name.endswith("_bucket") else None)
        got[key] = got.get(key, 0.0) + s.value
    assert got == expected_totals(SPECS[scrape.kind], text)


# ---------------------------------------------------------------------------------------------
# Prefill/decode disaggregation: sums of disjoint parts, KV-transfer units, roles, hostile parts

SG = 'engine_type="{role}",model_name="m",moe_ep_rank="0",pp_rank="0",priority="{priority}",tp_rank="0"'


def _sglang_queues(role: str = "decode", **queues: str) -> str:
    """SGLang scheduler gauges; a queue's value may be "total/p0/p1" (the per-priority copies)."""
    lines = [f'sglang:num_running_reqs{{{SG.format(role=role, priority="")}}} 0']
    for name, value in queues.items():
        total, *copies = value.split("/")
        lines.append(f"sglang:{name}{{{SG.format(role=role, priority='')}}} {total}")
        lines += [f"sglang:{name}{{{SG.format(role=role, priority=str(p))}}} {v}" for p, v in enumerate(copies)]
    return "\n".join(lines) + "\n"


def test_a_sum_of_parts_adds_the_queues_but_not_their_per_priority_copies() -> None:
    page = _sglang_queues(num_decode_prealloc_queue_reqs="5/5/0", num_decode_transfer_queue_reqs="9/6/3",
                          num_decode_host_receive_queue_reqs="2/2/0", num_queue_reqs="0/0/0")
    result = run(page)
    assert get(result, "llm_requests_waiting_kv_transfer", model="m") == [14.0]  # host_receive is in transfer
    assert get(result, "llm_requests_waiting") == [0.0]
    assert result.role == "decode"
    # One part is enough (a release without the others has none of those requests); none, no series.
    assert get(run(_sglang_queues(num_decode_transfer_queue_reqs="3")), "llm_requests_waiting_kv_transfer") == [3.0]
    assert get(run(_sglang_queues(num_queue_reqs="4")), "llm_requests_waiting_kv_transfer") == []


def test_vllm_kv_fetch_stages_add_up_without_completed_waiting() -> None:
    page = "".join(f'vllm:num_requests_kv_fetch_by_stage{{engine="0",model_name="m",stage="{stage}"}} {n}\n'
                   for stage, n in (("waiting_to_start", 2), ("in_progress", 5), ("completed_waiting", 7)))
    page += 'vllm:num_requests_waiting{engine="0",model_name="m"} 15\n'
    result = run(page)
    assert get(result, "llm_requests_waiting_kv_transfer", rank="0") == [7.0]
    assert get(result, "llm_requests_waiting", rank="0") == [15.0]
    assert result.role is None  # kv_both is a consumer too: the page cannot say decode
    assert SPECS["vllm"].waiting_includes_kv_transfer is True
    assert SPECS["sglang"].waiting_includes_kv_transfer is False


def test_sglang_kv_transfer_ms_and_mib_become_seconds_and_bytes() -> None:
    labels = SG.format(role="prefill", priority="")
    page = (histogram("sglang:kv_transfer_latency_ms", labels, ["100.0", "250.0", "500.0"], [0, 1, 1, 1], 250)
            + histogram("sglang:kv_transfer_total_mb", labels, ["1.0", "5.0"], [0, 1, 1], 1.5))
    result = run(page)
    assert result.role == "prefill"
    le = {s.label("le"): s.value for s in result.samples if s.name == "llm_kv_transfer_seconds_bucket"}
    assert le == {"0.1": 0.0, "0.25": 1.0, "0.5": 1.0, "+Inf": 1.0}  # a 250 ms transfer is 0.25 s
    assert get(result, "llm_kv_transfer_seconds_sum") == [0.25]
    le = {s.label("le"): s.value for s in result.samples if s.name == "llm_kv_transfer_bytes_bucket"}
    # upstream MB = bytes / (1024 * 1024); bounds formatted as Prometheus formats floats
    assert le == {"1.048576e+06": 0.0, "5.24288e+06": 1.0, "+Inf": 1.0}
    assert get(result, "llm_kv_transfer_bytes_sum") == [1.5 * 2**20]


def test_failures_add_transfer_and_bootstrap_but_not_nixl_notifications() -> None:
    sglang = (f'sglang:num_transfer_failed_reqs_total{{{SG.format(role="decode", priority="")}}} 2\n'
              f'sglang:num_bootstrap_failed_reqs_total{{{SG.format(role="decode", priority="")}}} 3\n')
    assert get(run(sglang), "llm_kv_transfer_failures_total") == [5.0]
    vllm = ('vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 4\n'
            'vllm:nixl_num_failed_notifications_total{engine="0",model_name="m"} 1\n'
            'vllm:mooncake_num_failed_recvs_total{engine="0",model_name="m"} 2\n')
    assert get(run(vllm), "llm_kv_transfer_failures_total") == [6.0]


@pytest.mark.parametrize(("engine_type", "role"), [("prefill", "prefill"), ("decode", "decode"),
                                                   ("unified", "both"), ("dynamic", "both"), ("other", None)])
def test_sglang_engine_type_names_the_role(engine_type: str, role: str | None) -> None:
    assert run(_sglang_queues(engine_type, num_queue_reqs="1")).role == role
    assert {name for _, name in SPECS["sglang"].roles} <= set(engine_catalog.ROLES)


@pytest.mark.parametrize("bad", ["-3", "NaN", "+Inf"])
def test_a_hostile_part_drops_the_whole_sum_as_out_of_range(bad: str) -> None:
    page = _sglang_queues(num_decode_prealloc_queue_reqs="5", num_decode_transfer_queue_reqs=bad)
    result = run(page)
    assert get(result, "llm_requests_waiting_kv_transfer") == []  # never 5, a partial sum
    assert result.drops.get("out_of_range") == 1
    assert any("llm_requests_waiting_kv_transfer" in note for note in result.notes)
    failures = (f'sglang:num_transfer_failed_reqs_total{{{SG.format(role="decode", priority="")}}} {bad}\n'
                f'sglang:num_bootstrap_failed_reqs_total{{{SG.format(role="decode", priority="")}}} 3\n')
    result = run(failures)
    assert get(result, "llm_kv_transfer_failures_total") == []
    assert result.drops.get("out_of_range") == 1
    # A hostile copy beside a good total of the same part: the number wins, as for any gauge copy.
    copy = _sglang_queues(num_decode_transfer_queue_reqs=f"9/{bad}/3")
    assert get(run(copy), "llm_requests_waiting_kv_transfer") == [9.0]


def test_a_hostile_kv_transfer_histogram_is_dropped_whole() -> None:
    labels = SG.format(role="prefill", priority="")
    page = histogram("sglang:kv_transfer_latency_ms", labels, ["100.0", "250.0"], [0, 1, 1], -250)
    result = run(page)
    assert not [s for s in result.samples if s.name.startswith("llm_kv_transfer_seconds")]
    assert result.drops


def test_warm_state_with_sums_of_parts() -> None:
    template = _sglang_queues(num_prefill_bootstrap_queue_reqs="@a/@a/0", num_prefill_inflight_queue_reqs="@b",
                              num_decode_transfer_queue_reqs="@c") + (
        f'sglang:num_transfer_failed_reqs_total{{{SG.format(role="decode", priority="")}}} @d\n'
        f'sglang:num_bootstrap_failed_reqs_total{{{SG.format(role="decode", priority="")}}} @a\n')
    rng = random.Random(28)
    state = NormalizerState()
    for cycle in range(40):
        values = {key: repr(float(rng.randint(-1 if cycle % 7 == 6 else 0, 50))) for key in "abcd"}
        if cycle % 5 == 4:
            values[rng.choice("abcd")] = "NaN"
        text = template
        for key, value in values.items():
            text = text.replace("@" + key, value)
        _same(run(text, state=state), plain(text))
    for _ in range(2):  # a clean page, twice: planned, and the plan replays the sums
        clean = template.replace("@a", "1").replace("@b", "2").replace("@c", "3").replace("@d", "4")
        _same(run(clean, state=state), plain(clean))
    assert state.memo.plan is not None


def test_the_page_role_wins_over_the_option_and_the_option_over_both(caplog) -> None:
    from exporter.sources.engines.scrape import EngineSource
    from exporter.targets import EngineTarget

    def role_of(option: str | None, page_role: str | None) -> str:
        source = EngineSource(EngineTarget(url="http://127.0.0.1:9/metrics", name="t", role=option),
                              max_payload_bytes=1 << 20, max_series=100)
        page = _sglang_queues(page_role, num_queue_reqs="1") if page_role else 'vllm:num_requests_waiting 1\n'
        return source._role(run(page))

    assert role_of(None, None) == "both"
    assert role_of("decode", None) == "decode"
    assert role_of(None, "prefill") == "prefill"
    with caplog.at_level("WARNING", logger="llm_exporter.engine"):
        assert role_of("decode", "prefill") == "prefill"
    assert "the page says role prefill, the target's role option decode" in caplog.text


def test_cache_tiers_and_ranks_are_bounded_label_values():
    # SGLang's cache_source through its tier map (any case), a catalogue tier it does not map kept,
    # anything else `unknown`; a dp_rank below MAX_RANK (1024) kept, 1024 and up `other`
    # (make mutation: normalize's _bound_tier and _bound_rank).
    page = ("# TYPE sglang:cached_tokens_total counter\n"
            'sglang:cached_tokens_total{model_name="m",cache_source="GPU",dp_rank="0"} 10\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="cpu",dp_rank="0"} 5\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="L3",dp_rank="0"} 2\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="External",dp_rank="1023"} 3\n'
            'sglang:cached_tokens_total{model_name="m",cache_source="weird",dp_rank="1024"} 1\n')
    samples = normalize_with_memo(page, target="a", kind="sglang").samples
    hits = {(s.label("tier"), s.label("rank")): s.value for s in samples
            if s.name == "llm_prefix_cache_hits_total"}
    assert hits == {("device", "0"): 10, ("host", "0"): 5, ("storage", "0"): 2, ("external", "1023"): 3,
                    ("unknown", "other"): 1}


def test_a_duplicated_series_drops_what_it_fed_and_nothing_else():
    # Printed twice with different values: model m's running gauge and one TTFT bucket. Half a
    # histogram or one of two gauges would be a guess: m's gauge and m's whole TTFT histogram go,
    # model m2's series of the same families and m's E2E histogram stay (make mutation: normalize's
    # Pass._drop_duplicated).
    page = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 3\n'
            'vllm:num_requests_running{model_name="m"} 4\n'
            'vllm:num_requests_running{model_name="m2"} 5\n'
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 1\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 2\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 2\n'
            'vllm:time_to_first_token_seconds_count{model_name="m"} 2\n'
            'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.6\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m2",le="0.5"} 3\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m2",le="+Inf"} 4\n'
            'vllm:time_to_first_token_seconds_count{model_name="m2"} 4\n'
            'vllm:time_to_first_token_seconds_sum{model_name="m2"} 1.2\n'
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            'vllm:e2e_request_latency_seconds_bucket{model_name="m",le="1"} 1\n'
            'vllm:e2e_request_latency_seconds_bucket{model_name="m",le="+Inf"} 2\n'
            'vllm:e2e_request_latency_seconds_count{model_name="m"} 2\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.5\n')
    result = normalize_with_memo(page, target="a", kind="vllm")
    kept = sorted((s.name, s.label("model"), s.label("le"), s.value) for s in result.samples)
    assert kept == sorted([
        ("llm_requests_running", "m2", "", 5.0),
        ("llm_time_to_first_token_seconds_bucket", "m2", "0.5", 3.0),
        ("llm_time_to_first_token_seconds_bucket", "m2", "+Inf", 4.0),
        ("llm_time_to_first_token_seconds_count", "m2", "", 4.0),
        ("llm_time_to_first_token_seconds_sum", "m2", "", 1.2),
        ("llm_e2e_request_latency_seconds_bucket", "m", "1.0", 1.0),
        ("llm_e2e_request_latency_seconds_bucket", "m", "+Inf", 2.0),
        ("llm_e2e_request_latency_seconds_count", "m", "", 2.0),
        ("llm_e2e_request_latency_seconds_sum", "m", "", 1.5)])
    assert result.notes == ("dropped a duplicated llm_requests_running series",
                            "dropped a duplicated llm_time_to_first_token_seconds histogram")
    assert result.drops == {"duplicate": 2}
    # Both models' TTFT histograms duplicated, before a duplicated gauge: each histogram counts
    # as one drop, and the gauge after them is still dropped and noted.
    page = ("# TYPE vllm:time_to_first_token_seconds histogram\n"
            'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 1\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.5"} 2\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 2\n'
            'vllm:time_to_first_token_seconds_count{model_name="m"} 2\n'
            'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.6\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m2",le="0.5"} 3\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m2",le="+Inf"} 4\n'
            'vllm:time_to_first_token_seconds_bucket{model_name="m2",le="+Inf"} 5\n'
            'vllm:time_to_first_token_seconds_count{model_name="m2"} 4\n'
            'vllm:time_to_first_token_seconds_sum{model_name="m2"} 1.2\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 3\n'
            'vllm:num_requests_running{model_name="m"} 4\n'
            'vllm:num_requests_waiting{model_name="m2"} 1\n')
    result = normalize_with_memo(page, target="a", kind="vllm")
    assert [(s.name, s.label("model"), s.value) for s in result.samples] == [("llm_requests_waiting", "m2", 1.0)]
    assert result.notes == ("dropped a duplicated llm_requests_running series",
                            "dropped a duplicated llm_time_to_first_token_seconds histogram")
    assert result.drops == {"duplicate": 3}


# ---------------------------------------------------------------------------------------------
# Survivors of `make mutation` (normalize), each killed here (docs/testing.md "Mutation testing")


def _synthetic_pass(spec, text: str, max_series: int = 10_000) -> NormalizedScrape:
    """A page through the full pass under an engine table no shipped engine has (the branches that
    exist for a table shape the registry does not use yet)."""
    from exporter.sources.engines.exposition import parse

    table = alias_tables._compile(spec)
    page = page_module.Page(text, spec.kind, table, parse(text, keep=table.keep.__contains__), {})
    return normalize_module.full_pass(page, NormalizerState(), "t", max_series)[1]


def test_a_product_whose_first_term_divides_is_its_reciprocal_times_the_rest() -> None:
    from exporter.sources.engines.table import EngineSpec, Product, Term

    spec = EngineSpec("synthetic", "Synthetic", {}, products=(Product(
        "llm_kv_cache_capacity_tokens", "gauge", (Term("x_inverse_blocks", divide=True), Term("x_tokens_per_block"))),),
        labels={"model_name": "model"})
    page = 'x_inverse_blocks{model_name="m"} 0.25\nx_tokens_per_block{model_name="m"} 16\n'
    assert get(_synthetic_pass(spec, page), "llm_kv_cache_capacity_tokens") == [64.0]
    zero = _synthetic_pass(spec, page.replace("} 0.25", "} 0"))
    assert get(zero, "llm_kv_cache_capacity_tokens") == []
    assert "llm_kv_cache_capacity_tokens: division by zero" in zero.notes
    one = _synthetic_pass(spec, page.replace("} 0.25", "} 1"))
    assert get(one, "llm_kv_cache_capacity_tokens") == [16.0] and not one.notes
    # Per model: one model's zero leaves the other's product.
    two = _synthetic_pass(spec, 'x_inverse_blocks{model_name="n"} 0\nx_tokens_per_block{model_name="n"} 16\n' + page)
    assert get(two, "llm_kv_cache_capacity_tokens", model="m") == [64.0]
    assert get(two, "llm_kv_cache_capacity_tokens", model="n") == []


SGLANG_PD = ("sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs")


def test_an_added_products_parts_sum_and_copies_take_the_largest() -> None:
    bootstrap, inflight = SGLANG_PD
    page = (f'{bootstrap}{{model_name="m",priority="0"}} 2\n{bootstrap}{{model_name="m",priority="1"}} 5\n'
            f'{inflight}{{model_name="m"}} 1\n'
            'sglang:num_transfer_failed_reqs_total{model_name="m",pid="1"} 2\n'
            'sglang:num_transfer_failed_reqs_total{model_name="m",pid="2"} 3\n'
            'sglang:num_bootstrap_failed_reqs_total{model_name="m"} 4\n')
    result = run(page, kind="sglang")
    assert get(result, "llm_requests_waiting_kv_transfer", model="m") == [6.0]  # max(2, 5) + 1
    assert get(result, "llm_kv_transfer_failures_total", model="m") == [9.0]  # (2 + 3) + 4
    # The copy with the larger value first: still the larger.
    swapped = page.replace('"0"} 2', '"0"} 7')
    assert get(run(swapped, kind="sglang"), "llm_requests_waiting_kv_transfer") == [8.0]


def test_an_added_part_without_a_model_takes_the_pages_model_and_says_which_part_had_no_number() -> None:
    bootstrap, inflight = SGLANG_PD
    page = f'sglang:num_running_reqs{{model_name="m"}} 3\n{bootstrap} 2\n{inflight}{{model_name="m"}} 1\n'
    result = run(page, kind="sglang")
    assert {s.label("model") for s in result.samples if s.name == "llm_requests_waiting_kv_transfer"} == {"m"}
    nan = run(f'sglang:num_running_reqs{{model_name="m"}} 3\n{bootstrap}{{model_name="m"}} NaN\n', kind="sglang")
    assert get(nan, "llm_requests_waiting_kv_transfer") == []
    assert f"llm_requests_waiting_kv_transfer: no number in {bootstrap}" in nan.notes


def test_the_pages_model_is_the_first_a_product_term_names() -> None:
    bootstrap, inflight = SGLANG_PD
    page = f'{bootstrap}{{model_name="a"}} 2\n{inflight}{{model_name="b"}} 1\nsglang:num_running_reqs 3\n'
    result = run(page, kind="sglang")
    assert result.model == "a"
    assert [s.label("model") for s in result.samples if s.name == "llm_requests_running"] == ["a"]


def test_a_bad_histogram_series_drops_only_itself_and_the_series_bound_is_inclusive() -> None:
    good = histogram("vllm:e2e_request_latency_seconds", 'model_name="m",engine="1"', ["1.0"], [1, 2], 3.0)
    bad = histogram("vllm:e2e_request_latency_seconds", 'model_name="m",engine="0"', ["1.0"], [3, 2], 3.0)
    result = run(bad + good)
    assert {s.label("rank") for s in result.samples} == {"1"}
    assert result.drops.get(drops.HISTOGRAM_NOT_MONOTONIC) == 4
    assert len(run(good, max_series=4).samples) == 4  # bucket 1.0, +Inf, _count, _sum: exactly the bound
    assert run(good, max_series=3).samples == ()


@pytest.mark.parametrize(("members", "fault"), [
    ({"_bucket+Inf": 2, "_bucket1.0": 1, "_sum": 3.0}, drops.HISTOGRAM_INCOMPLETE),
    ({"_bucket+Inf": 2, "_bucket1.0": 1, "_count": 2}, drops.HISTOGRAM_INCOMPLETE),
    ({"_bucket+Inf": 2, "_bucket": 1, "_count": 2, "_sum": 3.0}, drops.HISTOGRAM_BAD_LE),
    ({"_bucket+Inf": 0, "_bucket1.0": 0, "_count": 0, "_sum": 0.0}, None),
    ({"_bucket+Inf": 2, "_bucket1.0": 0, "_count": 2, "_sum": 0.0}, None),
    ({"_bucket+Inf": 2, "_bucket1.0": 1, "_count": 2, "_sum": -1.0}, drops.NEGATIVE_COUNTER),
    ({"_bucket+Inf": 1e18, "_bucket1.0": 1e18, "_count": 1e18, "_sum": 1e18}, None),  # MAX_VALUE is in range
    ({"_bucket+Inf": 2e18, "_bucket1.0": 1, "_count": 2e18, "_sum": 3.0}, drops.OUT_OF_RANGE),
    # Bounds: +-MAX_VALUE are in range, past it out (the first bound, and the last before +Inf).
    ({"_bucket+Inf": 2, "_bucket1e18": 1, "_count": 2, "_sum": 3.0}, None),
    ({"_bucket+Inf": 2, "_bucket-1e18": 1, "_count": 2, "_sum": 3.0}, None),
    ({"_bucket+Inf": 2, "_bucket-2e18": 0, "_bucket1.0": 1, "_count": 2, "_sum": 3.0},
     drops.OUT_OF_RANGE),
    ({"_bucket+Inf": 2, "_bucket2e18": 1, "_count": 2, "_sum": 3.0}, drops.OUT_OF_RANGE),
    # Counts are whole numbers: a fractional bucket under a whole _count is refused too.
    ({"_bucket+Inf": 2, "_bucket1.0": 0.5, "_count": 2, "_sum": 3.0}, drops.HISTOGRAM_FRACTIONAL),
])
def test_histogram_faults_at_their_edges(members: dict, fault: str | None) -> None:
    family = "llm_e2e_request_latency_seconds"
    parts = []
    for part, value in members.items():
        name, bound = family + part[:part.index("t") + 1 if part.startswith("_bucket") else len(part)], None
        if part.startswith("_bucket"):
            bound = part[len("_bucket"):]
        labels = (("target", "t"), ("le", bound)) if bound else (("target", "t"),)
        parts.append(((name, labels), float(value)))
    assert histograms.histogram_fault(family, parts) == fault


def test_bucket_bounds_are_converted_exactly_and_their_cache_is_bounded(monkeypatch) -> None:
    fmt = histograms.format_le
    assert fmt("3", 2.0) == "6.0" and fmt("250", 0.001) == "0.25" and fmt("0.3", 0.001) == "0.0003"
    assert fmt("2.5", 1e-6) == "2.5e-06"  # µs -> s: 2.4999999999999998e-06 in binary floats
    assert fmt("1", 1.0) == "1.0" and fmt("+Inf", 0.001) == "+Inf" and fmt("x", 1.0) is None
    state = NormalizerState()
    longest = "0." + "1" * (state_module.MAX_CACHED_LE_LENGTH - 2)
    assert state.format_le(longest, 0.001) == fmt(longest, 0.001)
    assert state.format_le(longest + "1", 0.001) == fmt(longest + "1", 0.001)
    assert list(state._le) == [(longest, 0.001)]  # the longer one computed, not cached
    calls = []
    monkeypatch.setattr(state_module, "format_le", lambda raw, scale: calls.append(raw) or fmt(raw, scale))
    assert state.format_le(longest, 0.001) == fmt(longest, 0.001) and calls == []  # from the cache
    monkeypatch.setattr(state_module, "MAX_LE_FORMATS", 3)
    for bound in ("1", "2"):
        state.format_le(bound, 1.0)
    assert len(state._le) == 3
    state.format_le("4", 1.0)
    assert list(state._le) == [("4", 1.0)]  # full: cleared, then the new one


def test_the_notes_bound_keeps_the_first_ones(monkeypatch) -> None:
    monkeypatch.setattr(normalize_module, "MAX_NOTES", 2)
    notes: dict[str, None] = {}
    run_ = normalize_module.Pass(alias_tables.TABLES["vllm"], NormalizerState(), notes, "t")
    for text in ("a", "b", "c"):
        run_.note(text)
    assert list(notes) == ["a", "b"]


def test_a_page_with_too_many_families_says_how_many() -> None:
    budget = page_module.MAX_PAGE_FAMILIES
    assert str(page_module.TooManyFamiliesError(6_000)) == (
        f"the page has 6000 families, over the budget of {budget} families (real engines print 100-300): "
        "none of it is read")
    assert str(page_module.TooManyFamiliesError()).startswith(
        f"the page has more than {page_module.MAX_PAGE_NAMES} metric names, over the budget of {budget}")
    assert page_module._keep_nothing("vllm:num_requests_running") is False


def _cached_label_sets(state: NormalizerState) -> set:
    return {labels for cache in state._entries for labels in cache}


def test_the_route_caches_hold_at_most_their_bound_and_start_again_when_full(monkeypatch) -> None:
    monkeypatch.setattr(state_module, "MAX_MAPPED_LABEL_SETS", 3)

    def page(ranks: range) -> str:
        return "".join(f'vllm:num_requests_running{{model_name="m",engine="{r}"}} {r}\n' for r in ranks)

    state = NormalizerState()
    first = run(page(range(5)), state=state, kind="vllm")
    assert sorted(get(first, "llm_requests_running")) == [0.0, 1.0, 2.0, 3.0, 4.0]  # all mapped, 3 cached
    assert state._entry_count == 3 and len(_cached_label_sets(state)) == 3
    # Full: the next page starts the caches again, with its own first label sets.
    second = plain(page(range(10, 15)), state=state, kind="vllm")
    assert sorted(get(second, "llm_requests_running")) == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert {dict(labels)["engine"] for labels in _cached_label_sets(state)} == {"10", "11", "12"}
    # Not full: a page with one new label set adds to the count.
    state = NormalizerState()
    plain(page(range(2)), state=state, kind="vllm")
    plain(page(range(3)), state=state, kind="vllm")
    assert state._entry_count == 3 and state.room() == 0
    labels = (("engine", "0"), ("model_name", "m"))
    expected = state_module._ENTRY_BYTES + 2 * state_module._PAIR_BYTES + len("engine0model_namem")
    assert state_module.labels_chars(labels) == expected
    assert state._entry_chars == 3 * expected - 0 and state.chars_room() == (
        state_module.MAX_MAPPED_LABEL_CHARS - 3 * expected)


def test_the_route_caches_are_bounded_by_characters_too(monkeypatch) -> None:
    one = state_module.labels_chars((("engine", "0"), ("model_name", "m")))
    monkeypatch.setattr(state_module, "MAX_MAPPED_LABEL_CHARS", 2 * one)
    state = NormalizerState()
    page = "".join(f'vllm:num_requests_running{{model_name="m",engine="{r}"}} 1\n' for r in range(5))
    assert len(get(plain(page, state=state, kind="vllm"), "llm_requests_running")) == 5
    assert state._entry_count == 2 and state.chars_room() == 0
    # Full at exactly the bound: the next page starts the caches again with its own label sets.
    plain(page.replace('engine="', 'engine="1'), state=state, kind="vllm")
    assert {dict(labels)["engine"] for labels in _cached_label_sets(state)} == {"10", "11"}


def test_the_route_caches_are_kept_across_a_target_s_scrapes_and_started_again_for_another() -> None:
    page = 'vllm:num_requests_running{model_name="m"} 1\n'
    state = NormalizerState()
    plain(page, state=state, kind="vllm")
    caches = state._entries
    plain(page, state=state, kind="vllm")
    assert state._entries is caches and state._entry_count == 1
    normalize_module.normalize(page, target="other", state=state, kind="vllm")
    assert state._entries is not caches and state._entry_count == 1


def test_a_series_printed_twice_with_one_value_counts_once_and_says_so() -> None:
    page = 'vllm:num_requests_running{model_name="m"} 3\n' * 2 + 'vllm:num_requests_waiting{model_name="m"} 1\n'
    result = plain(page, kind="vllm")
    assert get(result, "llm_requests_running") == [3.0]
    assert "ignored 1 repeated series (printed again with the same value)" in result.notes


def test_samples_no_route_takes_and_lines_the_parser_refused_are_counted() -> None:
    blocks = ('nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="weird",model="m",version="1"} 5\n'
              'nv_inference_pending_request_count{model="m",version="1"} 2\n')
    result = plain(blocks, kind="triton")
    assert result.unmapped_samples == 1 and get(result, "llm_requests_pending") == [2.0]
    # Samples of names the table does not know (left out by the parse) add to those no route takes.
    both = plain(blocks + "made_up_total 7\nmade_up_other 8\n", kind="triton")
    assert both.unmapped_samples == 3 and get(both, "llm_requests_pending") == [2.0]
    weird_two = blocks + blocks.splitlines()[0].replace("weird", "odd") + "\n"
    assert plain(weird_two, kind="triton").unmapped_samples == 2
    long_value = "x" * 5000  # over the parser's label value bound
    refused = plain(f'vllm:num_requests_running{{model_name="{long_value}"}} 1\n'
                    'vllm:num_requests_waiting{model_name="m"} 1\n', kind="vllm")
    assert sum(refused.drops.values()) >= 1 and get(refused, "llm_requests_waiting") == [1.0]
    assert plain('vllm:num_requests_waiting{model_name="m"} 1\n', kind="vllm").drops == {}


def test_the_family_account_is_kept_while_the_names_repeat_and_counts_dropped_names(monkeypatch) -> None:
    state = NormalizerState()
    page = ('vllm:num_requests_running{model_name="m"} 1\n'  # mapped, no TYPE line: counted by its name
            '# TYPE vllm:brand_new_thing gauge\nvllm:brand_new_thing 1\nother_unmapped_total 4\n')
    first = run(page, state=state, kind="vllm").families
    again = run(page.replace("} 1", "} 2"), state=state, kind="vllm").families
    assert again is first  # the same names: the memo, not a second count
    assert (first.mapped, first.ignored, first.unaccounted) == (1, 0, 2)
    assert run(page + "vllm:num_requests_waiting 1\n", state=state, kind="vllm").families.mapped == 2
    # A page with more names than the memo keeps: counted each time, the same counts.
    monkeypatch.setattr(state_module, "MAX_MEMO_NAMES", 3)
    big = run(page, state=state, kind="vllm").families
    assert (big.mapped, big.ignored, big.unaccounted) == (1, 0, 2)
    assert run(page, state=state, kind="vllm").families is not big
    monkeypatch.setattr(state_module, "MAX_MEMO_NAMES", 4)  # names + declared == 4: still memoized
    assert run(page, state=state, kind="vllm").families is run(page, state=state, kind="vllm").families


def test_unknown_engine_errors_say_what_was_asked_and_what_is_known() -> None:
    known = ", ".join(KINDS)
    with pytest.raises(UnknownEngineError) as asked:
        run("g 1\n", kind="nope")
    assert str(asked.value) == f"unknown engine kind 'nope'; expected one of {known}"
    with pytest.raises(UnknownEngineError) as detected:
        run("# TYPE some_gauge gauge\nsome_gauge 1\n")
    assert str(detected.value) == f"the page matches no known engine ({known})"


VLLM_034 = "vllm-v0.34.0__crafted_from_source.prom"


def test_the_family_budget_counts_mapped_ignored_and_unaccounted_families_to_its_edge() -> None:
    """MAX_PAGE_FAMILIES counts every family of the page however it is accounted: a real vLLM page
    (mapped and ignored families) plus made-up ones, read at the budget exactly and refused one over
    it with the count."""
    base = (FIXTURES / VLLM_034).read_text()
    own = run(base).families
    assert own.mapped > 0 and own.ignored > 0
    budget = page_module.MAX_PAGE_FAMILIES
    room = budget - (own.mapped + own.ignored + own.unaccounted)

    def page(extra: int) -> str:
        return base + "".join(f"made_up_{i} 1\n" for i in range(extra))

    full = run(page(room), state=NormalizerState()).families
    assert (full.mapped, full.ignored, full.unaccounted) == (own.mapped, own.ignored, own.unaccounted + room)
    with pytest.raises(page_module.TooManyFamiliesError) as over:
        run(page(room + 1), state=NormalizerState())
    assert str(over.value) == str(page_module.TooManyFamiliesError(budget + 1))


def test_a_target_s_scrapes_parse_through_its_own_label_cache() -> None:
    """The parse's label cache lives in the target's state (one per target, kept across scrapes: a
    page's label blocks are parsed once, not every scrape)."""
    state = NormalizerState()
    run((FIXTURES / VLLM_034).read_text(), state=state)
    assert len(state.label_cache) > 10


def test_histograms_by_reason_and_tier_stay_apart_and_take_the_page_s_model() -> None:
    """A histogram whose route declares a finish reason and a cache tier (no shipped engine's does
    yet): one histogram per (reason, tier) the series carry, each with the page's model when its
    series have none, nothing dropped, and the page with the model on every series reads the same.
    A route that declares neither drops both labels and sums the histograms they told apart."""
    from exporter.sources.engines.table import Alias, EngineSpec

    # Each pair of these differs in one label only: reason, tier or rank.
    parts = {("stop", "device", "0"): [1, 2, 3], ("length", "device", "0"): [5, 6, 9],
             ("stop", "host", "0"): [2, 2, 2], ("stop", "device", "1"): [0, 4, 4]}
    name = "llm_e2e_request_latency_seconds"

    def spec(**route: str) -> EngineSpec:
        return EngineSpec("synthetic", "Synthetic", {
            "x_latency_seconds": Alias(name, "histogram", **route),
            "x_running": Alias("llm_requests_running", "gauge")},
            labels={"model_name": "model", "finish": "reason", "where": "tier", "dp": "rank"})

    def page(model: str) -> str:
        # Without a model, a second copy of the gauge: the page's model makes it the first's (the larger kept).
        return 'x_running{model_name="m"} 3\n' + ("x_running 2\n" if not model else "") + "".join(
            histogram("x_latency_seconds", f'{model}finish="{reason}",where="{tier}",dp="{rank}"', ["1", "2"], counts,
                      sum(counts))
            for (reason, tier, rank), counts in parts.items())

    for model in ("", 'model_name="m",'):
        result = _synthetic_pass(spec(reason="other", tier="unknown"), page(model))
        assert not result.drops and not result.notes, (result.drops, result.notes)
        assert get(result, "llm_requests_running") == [3]
        assert {s.label("engine") for s in result.samples} == {"synthetic"}
        for (reason, tier, rank), counts in parts.items():
            own = {"model": "m", "reason": reason, "tier": tier, "rank": rank}
            assert get(result, f"{name}_bucket", **own) == counts
            assert get(result, f"{name}_count", **own) == [counts[-1]]
            assert get(result, f"{name}_sum", **own) == [sum(counts)]
        assert len([s for s in result.samples if s.name.startswith(name)]) == 4 * 5

        merged = _synthetic_pass(spec(), page(model))
        assert not merged.drops, merged.drops
        series = [s for s in merged.samples if s.name.startswith(name)]
        assert {(s.label("model"), s.label("reason"), s.label("tier")) for s in series} == {("m", "", "")}
        assert get(merged, f"{name}_bucket", rank="0") == [8, 10, 14] and get(merged, f"{name}_count", rank="0") == [14]
        assert get(merged, f"{name}_sum", rank="0") == [32] and get(merged, f"{name}_bucket", rank="1") == [0, 4, 4]


def test_the_parse_s_label_limit_refusals_join_the_pass_s_own_drops_by_reason() -> None:
    """A scrape's drops are the parse's refusals (series over a label limit) and the pass's own (a
    negative counter), each counted by reason, whichever path (plain pass or memo replay) read it."""
    from exporter.sources.engines.exposition import LABEL_VALUE_TOO_LONG, TOO_MANY_LABELS

    long_value = "v" * 5_000
    many = ",".join(f'l{i}="x"' for i in range(70))
    page = ('vllm:num_requests_running{model_name="m"} 1\n'
            f'vllm:num_requests_waiting{{model_name="m",junk="{long_value}"}} 2\n'
            f'vllm:num_requests_waiting{{model_name="m",other="{long_value}"}} 3\n'
            f'vllm:num_preemptions_total{{model_name="m",{many}}} 4\n'
            'vllm:request_success_total{model_name="m",finished_reason="stop"} -1\n')
    state = NormalizerState()
    for result in (plain(page), run(page, state=state), run(page, state=state)):
        assert dict(result.drops) == {LABEL_VALUE_TOO_LONG: 2, TOO_MANY_LABELS: 1,
                                      drops.NEGATIVE_COUNTER: 1}
        assert get(result, "llm_requests_running") == [1.0] and get(result, "llm_requests_waiting") == []
    assert dict(plain('vllm:num_requests_running{model_name="m"} 1\n').drops) == {}


def test_products_carry_their_declared_tier() -> None:
    """A product (multiplied or added) that declares its cache tier writes it, as an alias's does."""
    from exporter.sources.engines.table import EngineSpec, Product, Term

    spec = EngineSpec("synthetic", "Synthetic", {}, labels={"model_name": "model"}, products=(
        Product("llm_prefix_cache_hits_total", "counter", (Term("x_hit_blocks_total"), Term("x_block_tokens")),
                tier="device"),
        Product("llm_prefix_cache_queries_total", "counter", (Term("x_queries_a_total"), Term("x_queries_b_total")),
                tier="host", add=True)))
    page = ('x_hit_blocks_total{model_name="m"} 3\nx_block_tokens{model_name="m"} 16\n'
            'x_queries_a_total{model_name="m"} 5\nx_queries_b_total{model_name="m"} 7\n')
    result = _synthetic_pass(spec, page)
    assert get(result, "llm_prefix_cache_hits_total", model="m", tier="device") == [48.0]
    assert get(result, "llm_prefix_cache_queries_total", model="m", tier="host") == [12.0]


def test_the_default_series_bound_is_the_max_series_per_target_setting_s_default() -> None:
    from exporter.settings import BY_NAME

    bound = BY_NAME["max_series_per_target"].default
    page = "".join(f'vllm:num_requests_running{{model_name="m{i}"}} 1\n' for i in range(bound + 1))
    for result in (plain(page, kind="vllm"), run(page, kind="vllm")):
        assert len(result.samples) == bound and result.dropped_series == 1


def test_a_conflicting_series_drops_the_output_other_series_also_feed() -> None:
    """Two processes' copies merge into one output (pid is dropped); one copy printed twice with two
    values makes the merged output a guess: it is dropped, not read from the other copy alone."""
    page = ('vllm:num_requests_running{model_name="m",pid="1"} 2\n'
            'vllm:num_requests_running{model_name="m",pid="1"} 5\n'
            'vllm:num_requests_running{model_name="m",pid="2"} 3\n'
            'vllm:num_requests_waiting{model_name="m"} 1\n')
    result = plain(page, kind="vllm")
    assert get(result, "llm_requests_running") == [] and get(result, "llm_requests_waiting") == [1.0]
    assert dict(result.drops) == {drops.DUPLICATE: 1}


def test_a_histogram_printed_twice_whole_with_other_values_is_dropped_alone() -> None:
    first = histogram("vllm:e2e_request_latency_seconds", 'model_name="m"', ["1.0"], [1, 2], 3.0)
    second = histogram("vllm:e2e_request_latency_seconds", 'model_name="m"', ["1.0"], [2, 4], 5.0)
    result = plain(first + second + 'vllm:num_requests_running{model_name="m"} 1\n', kind="vllm")
    assert [s.name for s in result.samples] == ["llm_requests_running"]
    assert dict(result.drops) == {drops.DUPLICATE: 1}


def test_a_page_of_made_up_names_is_refused_at_the_names_bound_before_it_is_read_whole() -> None:
    """The parse keeps only the table's names and stops counting new ones at MAX_PAGE_NAMES: a page
    of made-up families is refused there (the names message), not after every family was parsed and
    counted (the families message)."""
    names = page_module.MAX_PAGE_NAMES + 1
    page = 'vllm:num_requests_running{model_name="m"} 1\n' + "".join(f"made_up_{i} 1\n" for i in range(names))
    with pytest.raises(page_module.TooManyFamiliesError) as refused:
        run(page, kind="vllm", state=NormalizerState())
    assert str(refused.value) == str(page_module.TooManyFamiliesError())


def _plans(page: str, kind: str) -> bool:
    """Whether the memo plans `page` (two full passes of it, then a replay): a page that failed
    validation on its values is not planned, since the next one may pass."""
    state = NormalizerState()
    run(page, kind=kind, state=state)
    run(page, kind=kind, state=state)
    return normalize_if_unchanged(page, target="t", kind=kind, state=state) is not None


def test_a_product_term_printed_twice_with_two_values_is_dropped_and_the_other_products_stay() -> None:
    nixl = "vllm:nixl_num_failed_transfers_total"
    good = ('vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n')
    page = good + f'{nixl}{{model_name="m"}} 2\n{nixl}{{model_name="m"}} 3\n'
    result = plain(page, kind="vllm")
    assert f"dropped {drops.FAULT_NOTES[drops.DUPLICATE]} {nixl} (a product's term)" \
        in result.notes
    assert dict(result.drops) == {drops.DUPLICATE: 2} and result.unmapped_samples == 0
    assert get(result, "llm_kv_transfer_failures_total") == []
    assert get(result, "llm_kv_cache_block_size_tokens") == [16.0]  # the page's other products stay
    assert plain(good, kind="vllm").unmapped_samples == 0  # a product's term is used, not unmapped
    assert get(result, "llm_kv_cache_capacity_tokens") == [1600.0]
    assert not _plans(page, "vllm") and _plans(good, "vllm")


def test_a_repeated_series_keeps_the_page_from_being_planned() -> None:
    page = 'vllm:num_requests_running{model_name="m"} 3\n' * 2
    assert get(plain(page, kind="vllm"), "llm_requests_running") == [3.0]
    assert not _plans(page, "vllm") and _plans(page[: len(page) // 2], "vllm")


def test_a_product_term_s_rank_copy_is_skipped_not_unmapped() -> None:
    bootstrap, _ = SGLANG_PD
    page = (f'sglang:num_running_reqs{{model_name="m",tp_rank="0"}} 3\n'
            f'{bootstrap}{{model_name="m",tp_rank="0"}} 2\n{bootstrap}{{model_name="m",tp_rank="1"}} 2\n')
    result = plain(page, kind="sglang")
    assert get(result, "llm_requests_waiting_kv_transfer") == [2.0] and result.unmapped_samples == 0


def test_label_sets_a_route_does_not_take_are_cached_once() -> None:
    """Triton's request metric has three routes, one per request_type: each label set is mapped
    once per route, including the routes it does not apply to, and the next scrape maps nothing."""
    page = ('nv_trt_llm_request_metrics{model="m",request_type="active",version="1"} 2\n'
            'nv_trt_llm_request_metrics{model="m",request_type="max",version="1"} 8\n')
    state = NormalizerState()
    first = plain(page, kind="triton", state=state)
    count = state._entry_count
    assert get(first, "llm_requests_running") == [2.0] and count >= 2
    plain(page, kind="triton", state=state)
    assert state._entry_count == count


PROMPTS = "sglang:prompt_tokens_total"  # one series, two outputs: prompt tokens and prefix-cache queries


def test_a_series_with_two_outputs_is_judged_for_each() -> None:
    """A series printed twice with two values drops both outputs it feeds (a duplicate each), a
    non-finite one is dropped from both (counted for each)."""
    # A cached_tokens sample makes prompt tokens prefix-cache queries too.
    head = 'sglang:num_running_reqs{model_name="m"} 1\nsglang:cached_tokens_total{model_name="m"} 1\n'
    twice = plain(head + f'{PROMPTS}{{model_name="m"}} 5\n{PROMPTS}{{model_name="m"}} 6\n', kind="sglang")
    assert get(twice, "llm_prompt_tokens_total") == [] and get(twice, "llm_prefix_cache_queries_total") == []
    assert dict(twice.drops) == {drops.DUPLICATE: 2}
    nan = plain(head + f'{PROMPTS}{{model_name="m"}} NaN\n', kind="sglang")
    assert get(nan, "llm_prompt_tokens_total") == [] and get(nan, "llm_prefix_cache_queries_total") == []
    assert dict(nan.drops) == {drops.NON_FINITE: 2}
    assert f"dropped a non-finite value of {PROMPTS}" in nan.notes


def test_a_minimum_holds_back_only_its_own_route() -> None:
    from exporter.sources.engines.table import Alias, EngineSpec

    spec = EngineSpec("synthetic", "Synthetic", {"x_ratio": (
        Alias("llm_prefix_cache_hit_ratio", "gauge", minimum=1.0), Alias("llm_kv_cache_usage_ratio", "gauge"))},
        labels={"model_name": "model"})
    result = _synthetic_pass(spec, 'x_ratio{model_name="m"} 0.5\n')
    assert get(result, "llm_prefix_cache_hit_ratio") == [] and get(result, "llm_kv_cache_usage_ratio") == [0.5]
    assert normalize_module.minimum_note("x_ratio", 0.5) in result.notes
    at = _synthetic_pass(spec, 'x_ratio{model_name="m"} 1\n')  # the minimum itself is kept
    assert get(at, "llm_prefix_cache_hit_ratio") == [1.0]


def test_a_zero_hit_rate_is_a_value_not_a_sentinel() -> None:
    page = 'vllm:num_requests_running{model_name="m"} 1\nvllm:gpu_prefix_cache_hit_rate{model_name="m"} 0\n'
    assert get(plain(page, kind="vllm"), "llm_prefix_cache_hit_ratio") == [0.0]


def test_the_page_s_model_is_the_first_a_series_names() -> None:
    page = ('vllm:num_requests_running{model_name="a"} 1\nvllm:num_requests_waiting{model_name="b"} 2\n'
            'vllm:num_preemptions_total 3\n')
    result = plain(page, kind="vllm")
    assert result.model == "a" and [s.label("model") for s in result.samples if s.name == "llm_preemptions_total"] \
        == ["a"]


@pytest.mark.parametrize(("series", "family", "note", "reason", "kept"), [
    # Counters: negatives dropped each, zero and a fraction kept.
    (('vllm:request_success_total{model_name="m",finished_reason="stop"} -2',
      'vllm:request_success_total{model_name="m",finished_reason="length"} -0.5',
      'vllm:request_success_total{model_name="m",finished_reason="abort"} 0',
      'vllm:request_success_total{model_name="m",finished_reason="error"} 0.5'),
     "llm_requests_finished_total", "dropped 2 negative llm_requests_finished_total series",
     drops.NEGATIVE_COUNTER, [0.0, 0.5]),
    # A ratio: outside [0, 1] dropped each, both edges and a value between kept.
    (tuple(f'vllm:gpu_cache_usage_perc{{model_name="{m}"}} {v}' for m, v in
           (("a", 1.5), ("b", 2), ("c", 0), ("d", 0.5), ("e", 1))),
     "llm_kv_cache_usage_ratio", "dropped 2 llm_kv_cache_usage_ratio series outside [0, 1] (e.g. 1.5)",
     drops.OUT_OF_RANGE, [0.0, 0.5, 1.0]),
])
def test_values_a_family_cannot_take_are_dropped_each_and_its_edges_kept(series, family, note, reason, kept) -> None:
    page = 'vllm:num_requests_running{model_name="m"} 1\n' + "".join(line + "\n" for line in series)
    result = plain(page, kind="vllm")
    assert note in result.notes and dict(result.drops) == {reason: 2}
    assert sorted(get(result, family)) == kept
    assert not _plans(page, "vllm")


def test_the_series_bound_holds_across_families_and_counts_what_it_cut() -> None:
    gauges = ('vllm:num_requests_running{model_name="a"} 1\nvllm:num_requests_running{model_name="b"} 2\n'
              'vllm:num_requests_waiting{model_name="a"} 3\nvllm:num_requests_waiting{model_name="b"} 4\n')
    result = plain(gauges, kind="vllm", max_series=3)
    assert len(result.samples) == 3 and result.dropped_series == 1
    assert "dropped 1 series over the limit of 3" in result.notes
    assert dict(result.drops) == {drops.CARDINALITY: 1}
    full = plain(gauges, kind="vllm", max_series=2)  # the second family finds no room at all
    assert len(full.samples) == 2 and full.dropped_series == 2
    # Whole histograms: two of 4 series each under a bound of 5, the second cut whole, then a third.
    hists = "".join(histogram(name, f'model_name="{m}"', ["1.0"], [1, 2], 3.0)
                    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds")
                    for m in ("a", "b"))
    cut = plain(hists, kind="vllm", max_series=5)
    assert len(cut.samples) == 4 and cut.dropped_series == 12 and dict(cut.drops) == {drops.CARDINALITY: 12}


def test_a_counter_whose_only_output_conflicts_is_dropped_without_a_fault() -> None:
    """Its one output fed by two copies, one of them printed twice with two values: the family is
    left with no series at all, which the negative check must take."""
    page = ('vllm:num_requests_running{model_name="m"} 1\n'
            'vllm:num_preemptions_total{model_name="m",pid="1"} 2\n'
            'vllm:num_preemptions_total{model_name="m",pid="1"} 3\n'
            'vllm:num_preemptions_total{model_name="m",pid="2"} 4\n')
    result = plain(page, kind="vllm")
    assert get(result, "llm_preemptions_total") == [] and dict(result.drops) == {drops.DUPLICATE: 1}


def test_every_table_numbers_its_routes_densely_and_types_its_products_as_the_catalogue() -> None:
    """One label cache per route (NormalizerState.route_entries): the indexes are 0 .. route_count - 1
    in every variant, and a family only products write is typed as the catalogue types it (the
    negative-counter check reads the type)."""
    catalogue = {fam.name: fam.type for fam in engine_catalog.FAMILIES}
    for kind, base in alias_tables.TABLES.items():
        for table in (base, *(base.variants or {}).values()):
            indexes = sorted({route.index for routes in table.routes.values() for route in routes})
            if table is base:
                assert indexes == list(range(base.route_count)), kind
            assert set(indexes) <= set(range(base.route_count)) and table.route_count == base.route_count, kind
        for product in SPECS[kind].products:
            assert base.types[product.family] == catalogue[product.family], (kind, product.family)


def test_the_table_compiler_refuses_what_the_catalogue_does_not_have_by_name() -> None:
    from exporter.sources.engines.table import Alias, EngineSpec, Product, Term

    wrong_type = EngineSpec("synthetic", "Synthetic", {"x_running": Alias("llm_requests_running", "counter")})
    with pytest.raises(ValueError, match=r"^synthetic: x_running -> llm_requests_running \(counter\) not in the "
                                         r"catalogue$"):
        alias_tables._compile(wrong_type)
    for family, type_ in (("llm_e2e_request_latency_seconds", "histogram"), ("llm_made_up", "gauge")):
        product = EngineSpec("synthetic", "Synthetic", {}, products=(Product(family, type_, (Term("x_a"),)),))
        with pytest.raises(ValueError, match=rf"^synthetic: product {family} \({type_}\) not in the catalogue$"):
            alias_tables._compile(product)


def test_the_kind_compiler_refuses_unknown_roles_and_more_than_four_page_conditions() -> None:
    from exporter.sources.engines.table import Alias, EngineSpec

    roles = EngineSpec("synthetic", "Synthetic", {}, roles=(("x_prefill_marker", "made_up"),))
    with pytest.raises(ValueError) as refused:
        alias_tables._compile_kind(roles)
    assert str(refused.value) == f"synthetic: roles ['made_up'] not in {engine_catalog.ROLES}"

    def spec(conditions: int) -> EngineSpec:
        return EngineSpec("synthetic", "Synthetic", {
            f"x_running_{i}": Alias("llm_requests_running", "gauge", when=(f"marker{i}", True))
            for i in range(conditions)})

    four = alias_tables._compile_kind(spec(4))
    assert len(four.variants) == 16 and four.conditions == tuple(f"marker{i}" for i in range(4))
    with pytest.raises(ValueError, match="^synthetic: too many page conditions \\(5\\)$"):
        alias_tables._compile_kind(spec(5))


def test_a_configured_kind_is_remembered_for_a_page_that_lacks_its_markers() -> None:
    state = NormalizerState()
    run('vllm:num_requests_running{model_name="m"} 1\n', kind="vllm", state=state)
    assert state.last_kind == "vllm"
    bare = run("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n", state=state)
    assert bare.kind == "vllm" and "no vllm metric names on the page; kept the last detected kind" in bare.notes
