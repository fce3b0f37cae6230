"""trtllm-serve (TensorRT-LLM's OpenAI server, `/prometheus/metrics`): alias table. See docs/engines.md.

The first release (PR #5785, 1.1.0rc5) exposed unprefixed names; later ones prefix `trtllm_`.
NVIDIA Dynamo re-exported the first release's five with a `trtllm:` prefix before it switched to
`trtllm_`. All three are listed; where several exist, `trtllm_` has priority 3, the unprefixed
name 2 and `trtllm:` 1.
"""

from exporter.sources.engines.table import Alias, EngineSpec, Product, Term

CACHED_SAMPLE = "\ntrtllm_prompt_cached_tokens_total{"
"""A prompt_cached_tokens_total sample line: the servers that count cached prompt tokens."""

_HISTOGRAMS = {
    "time_to_first_token_seconds": "llm_time_to_first_token_seconds",
    "time_per_output_token_seconds": "llm_time_per_output_token_seconds",
    "e2e_request_latency_seconds": "llm_e2e_request_latency_seconds",
    "request_queue_time_seconds": "llm_request_queue_time_seconds",
    "request_prefill_time_seconds": "llm_request_prefill_time_seconds",
    "request_decode_time_seconds": "llm_request_decode_time_seconds",
    "request_inference_time_seconds": "llm_request_inference_time_seconds",
}

_FIRST_RELEASE = ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
                  "request_queue_time_seconds")
"""The first release's histograms (with request_success_total, its whole set)."""

ALIASES = {
    **{f"trtllm_{name}": Alias(family, "histogram", priority=3) for name, family in _HISTOGRAMS.items()},
    # the unprefixed first release had only these
    **{name: Alias(_HISTOGRAMS[name], "histogram", priority=2) for name in _FIRST_RELEASE},
    "request_success_total": Alias("llm_requests_finished_total", "counter", priority=2, reason="other"),
    # ... and Dynamo's `trtllm:` copies of them
    **{f"trtllm:{name}": Alias(_HISTOGRAMS[name], "histogram", priority=1, note="Dynamo's older prefix")
       for name in _FIRST_RELEASE},
    "trtllm:request_success_total": Alias("llm_requests_finished_total", "counter", priority=1, reason="other",
                                          note="Dynamo's older prefix"),
    "trtllm_request_success_total": Alias("llm_requests_finished_total", "counter", priority=3,
                                          reason="other", note="finished_reason -> reason"),
    "trtllm_prompt_tokens_total": (
        Alias("llm_prompt_tokens_total", "counter"),
        Alias("llm_prefix_cache_queries_total", "counter", when=(CACHED_SAMPLE, True),
              note="prompt tokens of finished requests: the tokens looked up for KV-cache reuse"),
    ),
    "trtllm_prompt_cached_tokens_total": Alias(
        "llm_prefix_cache_hits_total", "counter",
        note="prompt tokens of finished requests served from the KV cache (reused blocks)"),
    "trtllm_generation_tokens_total": Alias("llm_generation_tokens_total", "counter"),
    "trtllm_num_requests_running": Alias("llm_requests_running", "gauge"),
    "trtllm_num_requests_waiting": Alias("llm_requests_waiting", "gauge"),
    "trtllm_max_num_active_requests": Alias("llm_requests_running_max", "gauge"),
    "trtllm_kv_cache_utilization": Alias("llm_kv_cache_usage_ratio", "gauge", priority=2),
    "trtllm_kv_cache_hit_rate": Alias("llm_prefix_cache_hit_ratio", "gauge"),
    "trtllm_kv_cache_tokens_per_block": Alias("llm_kv_cache_block_size_tokens", "gauge"),
}

PRODUCTS = (
    Product("llm_kv_cache_capacity_tokens", "gauge",
            (Term("trtllm_kv_cache_max_blocks"), Term("trtllm_kv_cache_tokens_per_block")),
            note="kv_cache_max_blocks x kv_cache_tokens_per_block"),
    Product("llm_kv_cache_usage_ratio", "gauge",
            (Term("trtllm_kv_cache_used_blocks"), Term("trtllm_kv_cache_max_blocks", divide=True)),
            priority=1, note="used / max blocks when kv_cache_utilization is absent"),
)

SPEC = EngineSpec(
    kind="trtllm",
    title="TensorRT-LLM trtllm-serve",
    aliases=ALIASES,
    products=PRODUCTS,
    labels={"model_name": "model", "finished_reason": "reason"},
    markers=(("\ntrtllm_",), ("\ntrtllm:",), ("engine_type=", "\ntime_to_first_token_seconds")),
    flavors=(("\ntrtllm_", "trtllm-serve"),),
    default_flavor="trtllm-serve-legacy",
    notes=(
        "Prometheus lives at `/prometheus/metrics`; `/metrics` is JSON iteration stats.",
        "`model_name=\"undefined\"` (the first release's default) is treated as no model.",
        "time_per_output_token_seconds is observed once per request (TPOT), so it maps to "
        "llm_time_per_output_token_seconds; trtllm-serve has no ITL histogram.",
        "`engine_type` is dropped. No preemption counter.",
        "An idle first-release server (HELP/TYPE lines, no samples yet) is not recognised: the "
        "unprefixed names are NIM's too and only the samples' `engine_type` label tells them apart. "
        "Until the first request the target reads as an unknown engine unless `kind: trtllm` is set.",
        "Prefix cache: prompt_cached_tokens_total / prompt_tokens_total are hits / queries in tokens "
        "(both per finished request). trtllm_kv_cache_hit_rate (the engine's own block ratio) stays "
        "mapped to llm_prefix_cache_hit_ratio.",
        "Not mapped: kv_cache_reused/missed_blocks counters (blocks, not tokens), "
        "prompt_cache_hit_tokens_total{cache_level,cache_tier} (a per-level split of "
        "prompt_cached_tokens_total), memory gauges, *_config_info, spec-decode and per-iteration "
        "metrics.",
    ),
)
