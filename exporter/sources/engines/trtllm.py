"""trtllm-serve (TensorRT-LLM's OpenAI server, `/prometheus/metrics`): alias table. See docs/engines.md.

The first release (PR #5785, 1.1.0rc5) exposed unprefixed names; later ones prefix `trtllm_`.
Both are listed; the prefixed name has priority where both exist.
"""

from exporter.sources.engines.table import Alias, EngineSpec, Product, Term

_HISTOGRAMS = {
    "time_to_first_token_seconds": "llm_time_to_first_token_seconds",
    "time_per_output_token_seconds": "llm_time_per_output_token_seconds",
    "e2e_request_latency_seconds": "llm_e2e_request_latency_seconds",
    "request_queue_time_seconds": "llm_request_queue_time_seconds",
    "request_prefill_time_seconds": "llm_request_prefill_time_seconds",
    "request_decode_time_seconds": "llm_request_decode_time_seconds",
    "request_inference_time_seconds": "llm_request_inference_time_seconds",
}

ALIASES = {
    **{f"trtllm_{name}": Alias(family, "histogram", priority=2) for name, family in _HISTOGRAMS.items()},
    # the unprefixed first release had only these
    "time_to_first_token_seconds": Alias("llm_time_to_first_token_seconds", "histogram", priority=1),
    "time_per_output_token_seconds": Alias("llm_time_per_output_token_seconds", "histogram", priority=1),
    "e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram", priority=1),
    "request_queue_time_seconds": Alias("llm_request_queue_time_seconds", "histogram", priority=1),
    "request_success_total": Alias("llm_requests_finished_total", "counter", priority=1, reason="other"),
    "trtllm_request_success_total": Alias("llm_requests_finished_total", "counter", priority=2,
                                          reason="other", note="finished_reason -> reason"),
    "trtllm_prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
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
    markers=(("\ntrtllm_",), ("engine_type=", "\ntime_to_first_token_seconds")),
    flavors=(("\ntrtllm_", "trtllm-serve"),),
    default_flavor="trtllm-serve-legacy",
    notes=(
        "Prometheus lives at `/prometheus/metrics`; `/metrics` is JSON iteration stats.",
        "`model_name=\"undefined\"` (the first release's default) is treated as no model.",
        "time_per_output_token_seconds is observed once per request (TPOT), so it maps to "
        "llm_time_per_output_token_seconds; trtllm-serve has no ITL histogram.",
        "`engine_type` is dropped. No preemption counter.",
        "Not mapped: kv_cache_reused/missed_blocks counters (blocks, not tokens), memory gauges, "
        "*_config_info, spec-decode and per-iteration metrics.",
    ),
)
