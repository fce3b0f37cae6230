"""Per-engine conformance: every fixture in tests/fixtures/engines/ is served by a real HTTP server
on loopback, fetched with httpx, normalized, and checked against key values and a golden file
(tests/golden/engines/<fixture>.metrics; `pytest --update-golden` rewrites them)."""

from __future__ import annotations

import functools
import http.server
import math
import pathlib
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import catalog
from exporter.catalog import engine as engine_catalog
from exporter.expose import render
from exporter.snapshot import Sample
from exporter.sources.engines import registry
from exporter.sources.engines.normalize import NormalizedScrape, normalize
from exporter.sources.engines.registry import detect_kind
from exporter.sources.engines.table import IGNORED

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "engines"
PAGES = sorted(path.name for path in FIXTURES.glob("*.prom"))
PREFIX_KIND = {"triton_trtllm": "triton", "triton_vllm": "vllm", "dynamo_trtllm": "trtllm"}
TARGET = "engine-under-test"


def expected_kind(fixture: str) -> str:
    prefix = fixture.split("-", 1)[0]
    return PREFIX_KIND.get(prefix, prefix)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture(scope="module")
def engine_server() -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 serving the fixtures folder, as an engine would."""
    handler = functools.partial(_QuietHandler, directory=str(FIXTURES))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def scrape(base_url: str, fixture: str, **kwargs: object) -> NormalizedScrape:
    response = httpx.get(f"{base_url}/{fixture}", timeout=5.0)
    assert response.status_code == 200
    return normalize(response.text, target=TARGET, **kwargs)


def series(scrape_: NormalizedScrape, name: str, **match: str) -> list[Sample]:
    return [s for s in scrape_.samples if s.name == name and all(s.label(k) == v for k, v in match.items())]


def value(scrape_: NormalizedScrape, name: str, **match: str) -> float:
    found = series(scrape_, name, **match)
    assert len(found) == 1, f"{name}{match}: {len(found)} series"
    return found[0].value


def names(scrape_: NormalizedScrape) -> set[str]:
    return {s.name for s in scrape_.samples}


def buckets(scrape_: NormalizedScrape, family: str, **match: str) -> list[str]:
    return [s.label("le") for s in series(scrape_, family + "_bucket", **match)]


# ---------------------------------------------------------------------------------------------
# Every fixture: schema, labels, golden file


@pytest.mark.parametrize("fixture", PAGES)
def test_fixture_matches_golden(engine_server: str, fixture: str, assert_golden) -> None:
    result = scrape(engine_server, fixture)
    assert result.kind == expected_kind(fixture)
    text = render(result.samples).decode()
    assert_golden(f"engines/{fixture.removesuffix('.prom')}.metrics", text)


@pytest.mark.parametrize("fixture", PAGES)
def test_fixture_follows_the_schema(engine_server: str, fixture: str) -> None:
    result = scrape(engine_server, fixture)
    assert result.samples, "every fixture maps to something"
    for sample in result.samples:
        fam = catalog.family_of(sample.name)
        assert fam is not None and fam.source == "engine", sample.name
        keys = {k for k, _ in sample.labels}
        allowed = set(fam.labels) | ({"le"} if sample.name.endswith("_bucket") else set())
        assert keys <= allowed, (sample.name, keys)
        assert sample.label("target") == TARGET
        assert sample.label("engine") == result.kind
        assert math.isfinite(sample.value), sample
        if sample.name == "llm_requests_finished_total":
            assert sample.label("reason") in engine_catalog.FINISH_REASONS
        if sample.name == "llm_prefix_cache_hits_total":
            assert sample.label("tier") in engine_catalog.CACHE_TIERS
    assert not any(s.name.endswith("_created") for s in result.samples)
    # the rendered page is a valid exposition for prometheus_client's own parser
    parsed = list(text_string_to_metric_families(render(result.samples).decode()))
    assert sum(len(f.samples) for f in parsed) == len(result.samples)


# The pages that map no histogram, and why; the test checks the why. Every other page must map at
# least one, so no page passes the histogram checks below by having nothing to check.
NATIVE_NONE = "the page has no histogram"
NATIVE_IGNORED = "its histograms are ones the engine's table ignores on purpose"
NATIVE_INCOMPLETE = "its one histogram is incomplete (no +Inf bucket) and is dropped whole"
NO_HISTOGRAM = {
    "llamacpp-b11434__crafted_from_source.prom": NATIVE_NONE,
    "llamacpp-old_with_kvcache-hardcoded_fallback.prom": NATIVE_NONE,
    "llamacpp-server_cuda_2026-opencode_session_log.prom": NATIVE_NONE,
    "sglang-dp_attention__crafted_from_source.prom": NATIVE_NONE,
    "triton_trtllm-23.11-tensorrtllm_backend_readme.prom": NATIVE_NONE,
    "sglang-v0.5.23_pd_decode__crafted_from_source.prom": NATIVE_IGNORED,  # KV-transfer bootstrap/alloc ms
    "vllm-v0.7-aibrix_runtime_docs.prom": NATIVE_INCOMPLETE,  # cut at le=96 in its source
}


@pytest.mark.parametrize("fixture", PAGES)
def test_histograms_are_whole_and_cumulative(engine_server: str, fixture: str) -> None:
    result = scrape(engine_server, fixture)
    text = (FIXTURES / fixture).read_text()
    native = [line.split()[2] for line in text.splitlines()
              if line.startswith("# TYPE ") and line.split()[-1] == "histogram"]
    mapped = [s for s in result.samples if (fam := catalog.family_of(s.name)) is not None and fam.type == "histogram"]
    why = NO_HISTOGRAM.get(fixture)
    if why is None:
        assert mapped, f"{fixture} maps no histogram: list it in NO_HISTOGRAM with the reason"
    else:
        assert not mapped, (fixture, why, {s.name for s in mapped})
        spec = registry.SPECS[result.kind]
        if why == NATIVE_NONE:
            assert native == [], native
        elif why == NATIVE_IGNORED:
            assert native and all(spec.state_of(name) == IGNORED for name in native), native
        else:
            assert len(native) == 1 and result.drops.get("histogram_no_inf", 0) > 0, (native, result.drops)
    by_series: dict[tuple, list[tuple[float, float]]] = {}
    counts: dict[tuple, float] = {}
    for sample in result.samples:
        rest = tuple(p for p in sample.labels if p[0] != "le")
        if sample.name.endswith("_bucket"):
            by_series.setdefault((sample.name[:-7], rest), []).append((float(sample.label("le")), sample.value))
        elif sample.name.endswith("_count"):
            counts[(sample.name[:-6], rest)] = sample.value
    for key, points in by_series.items():
        points.sort()
        assert points[-1][0] == math.inf, key
        assert points[-1][1] == counts[key], key
        assert all(a[1] <= b[1] for a, b in zip(points, points[1:], strict=False)), key


@pytest.mark.parametrize("fixture", PAGES)
def test_detect_kind_on_every_fixture(fixture: str) -> None:
    assert detect_kind((FIXTURES / fixture).read_text()) == expected_kind(fixture)


# ---------------------------------------------------------------------------------------------
# vLLM


def test_vllm_v1_dedupes_renamed_itl_and_keeps_ranks(engine_server: str) -> None:
    result = scrape(engine_server, "vllm-v0.11__documented.prom")
    assert (result.kind, result.flavor, result.model) == ("vllm", "vllm-v1", "meta-llama/Llama-3.1-8B-Instruct")
    # time_per_output_token_seconds and inter_token_latency_seconds carry the same data: one series
    # per rank, not doubled
    assert len(series(result, "llm_inter_token_latency_seconds_count")) == 2
    assert value(result, "llm_inter_token_latency_seconds_count", rank="0") == 511000
    assert value(result, "llm_inter_token_latency_seconds_sum", rank="1") == pytest.approx(497024 * 0.035)
    assert buckets(result, "llm_inter_token_latency_seconds", rank="0")[:3] == ["0.01", "0.025", "0.05"]
    assert value(result, "llm_time_per_output_token_seconds_count", rank="0") == 1000
    assert {s.label("rank") for s in result.samples} == {"0", "1"}
    assert buckets(result, "llm_time_to_first_token_seconds", rank="0") == [
        "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0",
        "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"]


def test_vllm_v1_kv_capacity_and_prefix_cache(engine_server: str) -> None:
    result = scrape(engine_server, "vllm-v0.11__documented.prom")
    for rank in ("0", "1"):
        # cache_config_info: num_gpu_blocks x block_size; the info gauge has no model_name
        assert value(result, "llm_kv_cache_capacity_tokens", rank=rank,
                     model="meta-llama/Llama-3.1-8B-Instruct") == 27000 * 16
        assert value(result, "llm_kv_cache_block_size_tokens", rank=rank) == 16
    assert value(result, "llm_kv_cache_usage_ratio", rank="1") == 0.375
    assert value(result, "llm_prefix_cache_queries_total", rank="0") == 1843200
    assert value(result, "llm_prefix_cache_hits_total", rank="0") == 921600
    assert value(result, "llm_requests_finished_total", rank="1", reason="error") == 1
    assert value(result, "llm_preemptions_total", rank="0") == 7


def test_vllm_v1_created_and_foreign_samples_are_unmapped(engine_server: str) -> None:
    result = scrape(engine_server, "vllm-v0.11__documented.prom")
    text = (FIXTURES / "vllm-v0.11__documented.prom").read_text()
    created = sum(1 for line in text.splitlines() if "_created{" in line)
    assert created > 0
    assert result.unmapped_samples >= created
    assert "llm_requests_total" not in names(result)  # vLLM has no such counter: no made-up series


def test_vllm_v0_flavor_capacity_and_sentinels(engine_server: str) -> None:
    result = scrape(engine_server, "vllm-v0.7-aibrix_runtime_docs.prom")
    assert result.flavor == "vllm-v0"
    assert value(result, "llm_kv_cache_capacity_tokens") == 81767 * 16
    # V0 has no rank label and the info gauge no model: the page's model fills it in
    assert series(result, "llm_kv_cache_capacity_tokens")[0].label("model") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert series(result, "llm_kv_cache_capacity_tokens")[0].label("rank") == ""
    # gpu_prefix_cache_hit_rate -1 means "prefix caching off": no series, a note
    assert "llm_prefix_cache_hit_ratio" not in names(result)
    assert any("gpu_prefix_cache_hit_rate" in note for note in result.notes)
    # the source truncated iteration_tokens_total at le=96 (no +Inf, no _count): dropped whole
    assert not any(name.startswith("llm_iteration_tokens") for name in names(result))
    assert value(result, "llm_requests_finished_total", reason="stop") == 4
    assert value(result, "llm_kv_cache_usage_ratio") == 0.0


def test_vllm_v08_prefix_blocks_become_tokens(engine_server: str) -> None:
    result = scrape(engine_server, "vllm-v0.8__documented.prom")
    assert result.flavor == "vllm-v1"
    # 0.8 counted prefix-cache lookups in blocks: x block_size (16)
    assert value(result, "llm_prefix_cache_queries_total") == 5000 * 16
    assert value(result, "llm_prefix_cache_hits_total") == 1250 * 16
    assert value(result, "llm_kv_cache_usage_ratio") == 0.125  # gpu_cache_usage_perc
    assert value(result, "llm_inter_token_latency_seconds_count") == 20320  # time_per_output_token
    assert value(result, "llm_kv_cache_capacity_tokens") == 20000 * 16


def test_vllm_v090_gpu_prefix_cache_counts_tokens(engine_server: str) -> None:
    # Same names as 0.8, but the HELP says tokens: not multiplied by block_size (16)
    result = scrape(engine_server, "vllm-v0.9.0__crafted_from_source.prom")
    assert value(result, "llm_prefix_cache_queries_total", rank="0") == 80000
    assert value(result, "llm_prefix_cache_hits_total", rank="0") == 20000
    assert value(result, "llm_kv_cache_capacity_tokens", rank="0") == 20000 * 16
    assert value(result, "llm_kv_cache_usage_ratio", rank="0") == 0.25


def test_triton_vllm_backend_is_read_as_vllm(engine_server: str) -> None:
    result = scrape(engine_server, "triton_vllm-backend__crafted_from_source.prom")
    assert (result.kind, result.flavor, result.model) == ("vllm", "triton-vllm", "vllm_model")
    assert value(result, "llm_requests_running") == 7
    assert value(result, "llm_requests_waiting") == 2
    assert value(result, "llm_kv_cache_usage_ratio") == 0.6
    assert value(result, "llm_prompt_tokens_total") == 1000
    assert value(result, "llm_time_to_first_token_seconds_count") == 42
    assert value(result, "llm_inter_token_latency_seconds_count") == 4158
    # Triton's core counters carry what the backend lacks
    assert value(result, "llm_requests_finished_total", reason="other") == 42
    assert value(result, "llm_requests_finished_total", reason="error") == 3
    assert value(result, "llm_request_duration_seconds_total") == 84.0
    assert value(result, "llm_request_queue_seconds_total") == 0.25
    assert {s.label("model") for s in result.samples} == {"vllm_model"}
    assert not any(s.label("rank") for s in result.samples)


# ---------------------------------------------------------------------------------------------
# SGLang


def test_sglang_current_capacity_and_tp_copies(engine_server: str) -> None:
    result = scrape(engine_server, "sglang-2026__documented.prom")
    assert (result.kind, result.model) == ("sglang", "Qwen/Qwen3-8B")
    # ITL weighted per token (_count counts tokens): left out, never relabelled
    assert "llm_inter_token_latency_seconds_count" not in names(result)
    # TP rank 0 and 1 report copies: neither summed nor duplicated
    assert value(result, "llm_preemptions_total") == 17
    assert value(result, "llm_requests_running") == 48
    assert value(result, "llm_request_queue_time_seconds_count") == 5110
    assert buckets(result, "llm_request_queue_time_seconds")[0] == "0.0"
    assert value(result, "llm_kv_cache_capacity_tokens") == 220544
    assert value(result, "llm_kv_cache_usage_ratio") == 0.4137
    assert value(result, "llm_prefix_cache_hits_total") == 1312500
    assert value(result, "llm_prefix_cache_queries_total") == 4.2e6  # prompt tokens
    assert "llm_prefix_cache_hit_ratio" not in names(result)  # cache_hit_rate: last prefill batch only
    assert value(result, "llm_requests_total") == 5120
    assert "llm_requests_finished_total" not in names(result)
    assert not any(s.label("rank") for s in result.samples)


def test_sglang_v04_per_token_itl_is_left_out(engine_server: str) -> None:
    result = scrape(engine_server, "sglang-v0.4-production_metrics_docs.prom")
    # time_per_output_token_seconds (ITL's old name) counts per token, not per output step
    assert "llm_inter_token_latency_seconds_count" not in names(result)
    assert value(result, "llm_time_to_first_token_seconds_sum") == pytest.approx(2351897.9474117756)
    assert buckets(result, "llm_time_to_first_token_seconds")[0] == "0.001"
    assert value(result, "llm_requests_waiting") == 2826
    # cache_hit_rate is not mapped, and without cached_tokens_total no prefix-cache series at all
    assert not any(name.startswith("llm_prefix_cache") for name in names(result))
    assert "llm_time_per_output_token_seconds_count" not in names(result)


def test_sglang_dp_attention_keeps_every_dp_rank(engine_server: str) -> None:
    result = scrape(engine_server, "sglang-dp_attention__crafted_from_source.prom")
    # DP rank 1 reports with tp_rank="2", moe_ep_rank="2": kept, as rank "1"
    assert value(result, "llm_requests_running", rank="0") == 10
    assert value(result, "llm_requests_running", rank="1") == 30
    assert value(result, "llm_requests_waiting", rank="1") == 12
    assert value(result, "llm_kv_cache_usage_ratio", rank="1") == 0.95
    assert value(result, "llm_kv_cache_capacity_tokens", rank="1") == 300000
    assert value(result, "llm_preemptions_total", rank="1") == 5
    # prefix cache: cached tokens by cache_source (the tier) / prompt tokens
    assert value(result, "llm_prefix_cache_hits_total", tier="device") == 150000
    assert value(result, "llm_prefix_cache_hits_total", tier="host") == 50000
    assert value(result, "llm_prefix_cache_queries_total") == 500000
    assert "llm_prefix_cache_hit_ratio" not in names(result)


# ---------------------------------------------------------------------------------------------
# TGI, llama.cpp


def test_tgi(engine_server: str) -> None:
    result = scrape(engine_server, "tgi-v3.3__documented.prom")
    assert (result.kind, result.model) == ("tgi", "")
    assert not any(s.label("model") for s in result.samples)
    assert value(result, "llm_requests_finished_total", reason="other") == 1398
    # err: validation and generation are errors, overloaded is a refusal
    assert value(result, "llm_requests_finished_total", reason="error") == 9 + 3
    assert value(result, "llm_requests_finished_total", reason="rejected") == 2
    assert value(result, "llm_requests_total") == 1412
    assert value(result, "llm_requests_running") == 14
    assert value(result, "llm_requests_waiting") == 2
    assert value(result, "llm_kv_cache_capacity_tokens") == 163840
    assert buckets(result, "llm_e2e_request_latency_seconds")[0] == "0.00015000000000000001"
    assert len(buckets(result, "llm_e2e_request_latency_seconds")) == 36
    assert value(result, "llm_batch_prefill_time_seconds_count") == 1430
    assert value(result, "llm_batch_decode_time_seconds_count") == 230100
    for absent in ("llm_time_to_first_token_seconds_count", "llm_prompt_tokens_total", "llm_kv_cache_usage_ratio"):
        assert absent not in names(result)


def test_llamacpp_current(engine_server: str) -> None:
    result = scrape(engine_server, "llamacpp-server_cuda_2026-opencode_session_log.prom")
    assert (result.kind, result.model) == ("llamacpp", "")
    assert value(result, "llm_prefill_seconds_total") == 32.378
    assert value(result, "llm_decode_seconds_total") == 469.376
    assert value(result, "llm_prompt_tokens_total") == 26129  # a build without prompt_tokens_cached_total
    assert value(result, "llm_generation_tokens_total") == 10911
    assert value(result, "llm_engine_steps_total") == 10420  # n_decode_total: llama_decode() calls
    # mistyped "counters" (a max and an average) and the throughput gauges are not exported
    assert len(result.samples) == 7
    assert "llm_kv_cache_usage_ratio" not in names(result)


def test_llamacpp_old_nan_is_handled(engine_server: str) -> None:
    result = scrape(engine_server, "llamacpp-old_with_kvcache-hardcoded_fallback.prom")
    assert value(result, "llm_kv_cache_usage_ratio") == 0.0
    assert all(math.isfinite(s.value) for s in result.samples)
    assert result.unmapped_samples == 4  # n_busy_slots (-nan(ind)), 2 throughputs, kv tokens


# ---------------------------------------------------------------------------------------------
# Triton, trtllm-serve, LMDeploy, NIM


def test_triton_2311_blocks_to_tokens(engine_server: str) -> None:
    result = scrape(engine_server, "triton_trtllm-23.11-tensorrtllm_backend_readme.prom")
    assert (result.flavor, result.model) == ("triton-trtllm", "tensorrt_llm")
    assert value(result, "llm_kv_cache_capacity_tokens") == 6239 * 64
    assert value(result, "llm_kv_cache_block_size_tokens") == 64
    assert value(result, "llm_kv_cache_usage_ratio") == pytest.approx(1 / 6239)  # used / max
    assert value(result, "llm_requests_running") == 0  # request_type="active": the engine's zero
    assert value(result, "llm_requests_running_max") == 512
    assert "llm_requests_waiting" not in names(result)  # no request_type="waiting" in 23.11
    assert "llm_time_to_first_token_seconds_count" not in names(result)


def test_triton_ms_histogram_and_us_counters(engine_server: str) -> None:
    result = scrape(engine_server, "triton_trtllm-newer__documented.prom")
    # nv_inference_first_response_histogram_ms: le and _sum converted to seconds, counts untouched
    assert buckets(result, "llm_time_to_first_token_seconds", model="ensemble") == ["0.1", "0.5", "2.0", "5.0", "+Inf"]
    assert value(result, "llm_time_to_first_token_seconds_sum", model="ensemble") == pytest.approx(312.6)
    assert value(result, "llm_time_to_first_token_seconds_count", model="ensemble") == 1200
    # microsecond counters -> seconds
    assert value(result, "llm_request_duration_seconds_total", model="ensemble") == pytest.approx(9876.54321)
    assert value(result, "llm_request_queue_seconds_total", model="tensorrt_llm") == pytest.approx(0.25)
    # the backend's own fraction wins over used / max
    assert value(result, "llm_kv_cache_usage_ratio") == 0.2416666667
    assert value(result, "llm_kv_cache_capacity_tokens") == 6000 * 32
    assert value(result, "llm_requests_waiting") == 6
    assert value(result, "llm_requests_finished_total", model="ensemble", reason="error") == 4
    assert {s.label("model") for s in series(result, "llm_requests_finished_total")} == {
        "ensemble", "preprocessing", "tensorrt_llm", "postprocessing"}


def test_trtllm_serve(engine_server: str) -> None:
    result = scrape(engine_server, "trtllm-serve_2026__documented.prom")
    assert (result.kind, result.flavor, result.model) == ("trtllm", "trtllm-serve", "nvidia/Llama-3.1-8B-Instruct-FP8")
    assert value(result, "llm_kv_cache_capacity_tokens") == 8192 * 32
    assert value(result, "llm_kv_cache_usage_ratio") == 0.305  # kv_cache_utilization over used/max
    assert value(result, "llm_requests_finished_total", reason="other") == 1  # finished_reason="unknown"
    assert value(result, "llm_requests_finished_total", reason="length") == 55
    assert value(result, "llm_time_per_output_token_seconds_count") == 756
    assert value(result, "llm_request_prefill_time_seconds_count") == 756
    assert value(result, "llm_prefix_cache_hit_ratio") == 0.21
    assert value(result, "llm_requests_running_max") == 256


def test_dynamo_trtllm_colon_prefix(engine_server: str) -> None:
    result = scrape(engine_server, "dynamo_trtllm-1.1.0rc5__crafted_from_source.prom")
    assert (result.kind, result.model) == ("trtllm", "Qwen/Qwen3-0.6B")
    assert value(result, "llm_requests_finished_total", reason="stop") == 9
    assert value(result, "llm_requests_finished_total", reason="length") == 1
    assert value(result, "llm_time_to_first_token_seconds_count") == 10
    assert value(result, "llm_time_per_output_token_seconds_sum") == 0.12
    assert value(result, "llm_e2e_request_latency_seconds_count") == 10
    assert value(result, "llm_request_queue_time_seconds_count") == 10


def test_trtllm_first_release_unprefixed(engine_server: str) -> None:
    result = scrape(engine_server, "trtllm-1.1.0rc5__documented.prom")
    assert (result.kind, result.flavor, result.model) == ("trtllm", "trtllm-serve-legacy", "")
    assert not any(s.label("model") for s in result.samples)  # model_name="undefined"
    assert value(result, "llm_requests_finished_total", reason="stop") == 40
    assert value(result, "llm_time_to_first_token_seconds_count") == 42


def test_lmdeploy(engine_server: str) -> None:
    result = scrape(engine_server, "lmdeploy-early__documented.prom")
    assert (result.kind, result.model) == ("lmdeploy", "internlm/internlm2_5-7b-chat")
    assert {s.label("rank") for s in result.samples} == {"0"}
    # time_per_output_token_seconds weights a gap per token: not ITL (iter_token_latency is, >= 0.16)
    assert "llm_inter_token_latency_seconds_count" not in names(result)
    assert value(result, "llm_kv_cache_usage_ratio") == 0.22
    assert value(result, "llm_request_prefill_time_seconds_count") == 400


def test_nim(engine_server: str) -> None:
    result = scrape(engine_server, "nim-llm_latest__documented.prom")
    assert (result.kind, result.model) == ("nim", "meta/llama-3.1-8b-instruct")
    assert value(result, "llm_kv_cache_usage_ratio") == 0.18
    assert value(result, "llm_requests_running_max") == 256
    assert value(result, "llm_inter_token_latency_seconds_count") == 209180
    assert buckets(result, "llm_time_to_first_token_seconds")[-2:] == ["10.0", "+Inf"]
    assert result.unmapped_samples == 0


def test_explicit_kind_overrides_detection(engine_server: str) -> None:
    result = scrape(engine_server, "nim-llm_latest__documented.prom", kind="nim")
    assert result.kind == "nim"
    # a vLLM page read as trtllm maps nothing it does not know: empty, not wrong
    assert scrape(engine_server, "vllm-v0.11__documented.prom", kind="trtllm").samples == ()


# ---------------------------------------------------------------------------------------------
# Engine truth at the newest versions: every family accounted for, one meaning per family


@pytest.mark.parametrize("fixture", PAGES)
def test_every_family_of_every_fixture_is_mapped_or_ignored_with_a_reason(fixture: str) -> None:
    """Each page (captured, documented or crafted from an engine release's source) has no family its
    table neither maps nor ignores, and the exporter's own account of the page agrees."""
    from exporter.sources.engines.accounting import page_families, unaccounted
    from exporter.sources.engines.registry import SPECS

    text = (FIXTURES / fixture).read_text()
    spec = SPECS[expected_kind(fixture)]
    assert unaccounted(spec, text) == []
    result = normalize(text, target=TARGET, kind=spec.kind)
    assert result.families.unaccounted == 0 and result.families.names == ()
    assert result.families.mapped + result.families.ignored == len(page_families(text, spec))
    assert result.families.mapped >= 3


def test_every_ignored_family_has_a_one_line_reason_and_every_table_names_its_versions() -> None:
    from exporter.sources.engines.registry import SPECS

    for spec in SPECS.values():
        for name, why in spec.ignored.items():
            assert why.strip() and "\n" not in why and len(why) < 400, (spec.kind, name)
        if spec.kind != "nim":  # closed source: only its documentation page
            assert spec.versions, spec.kind


NEWEST = {
    "vllm": "vllm-v0.34.0__crafted_from_source.prom",
    "sglang": "sglang-v0.5.23__crafted_from_source.prom",
    "llamacpp": "llamacpp-b11434__crafted_from_source.prom",
    "tgi": "tgi-v3.3.6__crafted_from_source.prom",
    "triton": "triton_trtllm-26.09__crafted_from_source.prom",
    "trtllm": "trtllm-serve_2026_union__crafted_from_source.prom",
    "lmdeploy": "lmdeploy-v0.18.0__crafted_from_source.prom",
}


def test_the_newest_release_of_each_engine_has_a_fixture() -> None:
    for kind, fixture in NEWEST.items():
        assert fixture in PAGES, kind


def test_vllm_data_parallel_capacity_is_per_engine(engine_server: str) -> None:
    """vLLM 0.34 with DP=2 repeats the DP-summed num_gpu_blocks (16384) on both engines'
    cache_config_info; each engine's own capacity is kv_cache_size_tokens (131072), not 16384 x 16."""
    result = scrape(engine_server, NEWEST["vllm"])
    capacity = {s.label("rank"): s.value for s in series(result, "llm_kv_cache_capacity_tokens")}
    assert capacity == {"0": 131072.0, "1": 131072.0}
    assert {s.label("rank") for s in series(result, "llm_requests_running")} == {"0", "1"}
    # Older pages without kv_cache_size_tokens keep blocks x block size, with no note.
    older = scrape(engine_server, "vllm-v0.11__documented.prom")
    assert series(older, "llm_kv_cache_capacity_tokens")
    assert not any("kv_cache_size_tokens" in note for note in older.notes)


def test_vllm_newest_reasons_rejections_render_time_and_cache_tiers(engine_server: str) -> None:
    result = scrape(engine_server, NEWEST["vllm"])
    reasons = {}
    for s in series(result, "llm_requests_finished_total"):
        reasons[s.label("reason")] = reasons.get(s.label("reason"), 0) + s.value
    assert reasons["rejected"] == 42  # admission_rejections_total, both of its reasons
    assert reasons["stop"] == 11849 + 11643 + 1  # `repetition` is the engine's own stop rule
    assert "other" not in reasons
    tiers = {s.label("tier") for s in series(result, "llm_prefix_cache_hits_total")}
    assert tiers == {"device", "external"}
    assert value(result, "llm_request_render_time_seconds_count") == 23169 + 3772


def test_lmdeploy_itl_is_the_iteration_gap_and_reasons_stay_apart(engine_server: str) -> None:
    """LMDeploy 0.18: llm_inter_token_latency_seconds comes from iter_token_latency (the gap between two
    outputs), not from time_per_output_token_seconds (that gap over its tokens); every ResponseType keeps
    its own reason."""
    text = (FIXTURES / NEWEST["lmdeploy"]).read_text()
    result = scrape(engine_server, NEWEST["lmdeploy"])
    native = {f.name: f for f in text_string_to_metric_families(text)}
    itl = native["lmdeploy:iter_token_latency"]
    counts = sum(s.value for s in itl.samples if s.name.endswith("_count"))
    assert value_sum(result, "llm_inter_token_latency_seconds_count") == counts
    sums = sum(s.value for s in itl.samples if s.name.endswith("_sum"))
    assert value_sum(result, "llm_inter_token_latency_seconds_sum") == pytest.approx(sums)
    tpot = native["lmdeploy:time_per_output_token_seconds"]
    assert sum(s.value for s in tpot.samples if s.name.endswith("_sum")) != pytest.approx(sums)
    assert {s.label("rank") for s in series(result, "llm_inter_token_latency_seconds_count")} == {"0", "1"}
    assert {s.label("reason") for s in series(result, "llm_requests_finished_total")} >= {"other", "abort", "error"}
    assert series(result, "llm_requests_pending") and series(result, "llm_spec_decode_accepted_tokens_total")


def test_triton_failure_reasons_stay_apart(engine_server: str) -> None:
    result = scrape(engine_server, NEWEST["triton"])
    reasons = {s.label("reason") for s in series(result, "llm_requests_finished_total")}
    assert {"rejected", "abort", "error"} <= reasons


def test_tgi_failure_kinds_stay_apart(engine_server: str) -> None:
    result = scrape(engine_server, NEWEST["tgi"])
    reasons = {s.label("reason") for s in series(result, "llm_requests_finished_total")}
    assert {"rejected", "abort", "error", "other"} <= reasons


def value_sum(scrape_: NormalizedScrape, name: str, **match: str) -> float:
    found = series(scrape_, name, **match)
    assert found, name
    return sum(s.value for s in found)


@pytest.mark.parametrize("engine_format", ["vllm", "sglang", "tgi", "llamacpp"])
def test_the_twins_pages_have_no_unaccounted_family(engine_format: str) -> None:
    """The demo's engines are accounted for like the real ones: no demo raises LLMEngineFamiliesUnaccounted."""
    from exporter.simulator import Twin, TwinConfig
    from exporter.sources.engines.accounting import unaccounted
    from exporter.sources.engines.registry import SPECS

    twin = Twin(TwinConfig(engine_format=engine_format, scenario="decode-heavy", data_parallel=1))
    twin.fast_forward(10.0)
    assert unaccounted(SPECS[engine_format], twin.metrics_text()) == []


# ---------------------------------------------------------------------------------------------
# Prefill/decode disaggregation (issue 28)


def test_sglang_pd_prefill_queues_transfer_units_and_role(engine_server: str) -> None:
    result = scrape(engine_server, "sglang-v0.5.23_pd_prefill__crafted_from_source.prom")
    assert result.role == "prefill"
    # bootstrap 5 + inflight 3; the per-priority copies beside each total are not added
    assert value(result, "llm_requests_waiting_kv_transfer") == 8.0
    assert value(result, "llm_requests_waiting") == 7.0  # the waiting queue alone (SGLang keeps PD apart)
    assert value(result, "llm_kv_transfer_failures_total") == 3.0  # 2 transfer + 1 bootstrap
    assert buckets(result, "llm_kv_transfer_seconds") == [
        "0.001", "0.002", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf"]
    assert value(result, "llm_kv_transfer_seconds_sum") == pytest.approx(127.0935)
    assert value(result, "llm_kv_transfer_seconds_count") == 2740.0
    assert buckets(result, "llm_kv_transfer_bytes")[0] == "1.048576e+06"  # 1 MiB
    assert value(result, "llm_kv_transfer_bytes_sum") == pytest.approx(1002147.75 * 1048576)


def test_sglang_pd_decode_holds_every_request_in_kv_transfer(engine_server: str) -> None:
    result = scrape(engine_server, "sglang-v0.5.23_pd_decode__crafted_from_source.prom")
    assert result.role == "decode"
    assert value(result, "llm_requests_running") == 0.0
    assert value(result, "llm_requests_waiting") == 0.0
    assert value(result, "llm_requests_waiting_kv_transfer") == 14.0  # prealloc 5 + transfer 9, not host 2
    assert value(result, "llm_kv_transfer_failures_total") == 5.0  # 1 transfer + 4 bootstrap
    assert not names(result) & {"llm_kv_transfer_seconds_count", "llm_kv_transfer_bytes_count"}


def test_vllm_nixl_decode_stages_transfers_and_failures(engine_server: str) -> None:
    result = scrape(engine_server, "vllm-v0.34.0_nixl_decode__crafted_from_source.prom")
    assert result.role is None  # kv_consumer and kv_both pages look alike: the target's option decides
    assert value(result, "llm_requests_waiting", rank="0") == 6.0  # includes the 5 deferred
    assert value(result, "llm_requests_waiting_kv_transfer", rank="0") == 4.0  # 1 not started + 3 in progress
    assert value(result, "llm_kv_transfer_failures_total", rank="0") == 4.0  # the notification is inside
    assert value(result, "llm_kv_transfer_seconds_count", rank="0") == 3337.0
    assert value(result, "llm_kv_transfer_seconds_sum", rank="0") == pytest.approx(81.356)
    assert buckets(result, "llm_kv_transfer_bytes", rank="0")[0] == "2048.0"
    assert value(result, "llm_kv_transfer_bytes_count", rank="0") == 3337.0


def test_vllm_nixl_and_mooncake_transfers_add_up(engine_server: str) -> None:
    """The 0.34.0 page carries both connectors (a MultiConnector): same bounds, one histogram."""
    result = scrape(engine_server, "vllm-v0.34.0__crafted_from_source.prom")
    assert not result.notes
    assert value(result, "llm_kv_transfer_failures_total", rank="0") == 8.0  # nixl 5 + mooncake 2 + 1 recv
    assert value(result, "llm_requests_waiting_kv_transfer", rank="0") == 2.0
