"""trtllm-serve (TensorRT-LLM's OpenAI server, `/prometheus/metrics`): alias table. See docs/engines.md.

The first release (PR #5785, 1.1.0rc5) exposed unprefixed names; later ones prefix `trtllm_`.
NVIDIA Dynamo re-exported the first release's five with a `trtllm:` prefix before it switched to
`trtllm_`. All three are listed; where several exist, `trtllm_` has priority 3, the unprefixed
name 2 and `trtllm:` 1.
"""

from exporter.sources.engines.table import Alias, Aliases, EngineSpec, Product, Term

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

ALIASES: Aliases = {
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
        "llm_prefix_cache_hits_total", "counter", tier="unknown",
        note="prompt tokens of finished requests served from the KV cache, every level together"),
    "trtllm_prompt_cache_hit_tokens_total": Alias(
        "llm_prefix_cache_hits_total", "counter", priority=1, tier="unknown",
        note="the same tokens split by `cache_tier` (and `cache_level`, summed): preferred where present"),
    "trtllm_request_error_total": Alias(
        "llm_requests_finished_total", "counter", priority=3, reason="error",
        note="requests the server refused, by `http_code` (400 validation errors in 2026): 429 and 503 -> "
             "rejected, 499 -> abort, else error"),
    "trtllm_spec_decode_num_draft_tokens_total": Alias("llm_spec_decode_draft_tokens_total", "counter"),
    "trtllm_spec_decode_num_accepted_tokens_total": Alias("llm_spec_decode_accepted_tokens_total", "counter"),
    "trtllm_spec_decode_acceptance_length": Alias("llm_spec_decode_acceptance_length", "gauge"),
    "trtllm_iteration_latency_seconds": Alias("llm_engine_iteration_seconds", "gauge",
                                              note="the last iteration, converted from iterLatencyMS upstream"),
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
    labels={"model_name": "model", "finished_reason": "reason", "http_code": "reason", "cache_tier": "tier"},
    reasons={"cancelled": "abort", "timeout": "error", "unknown": "other",
             "429": "rejected", "503": "rejected", "499": "abort", "400": "error", "404": "error", "413": "error",
             "422": "error", "500": "error"},
    tiers={"gpu": "device", "device": "device", "primary": "device", "cpu": "host", "host": "host",
           "secondary": "host", "disk": "storage", "storage": "storage"},
    markers=(("\ntrtllm_",), ("\ntrtllm:",), ("engine_type=", "\ntime_to_first_token_seconds")),
    flavors=(("\ntrtllm_", "trtllm-serve"),),
    default_flavor="trtllm-serve-legacy",
    versions=("1.1.0rc5", "Dynamo trtllm:", "2026", "2026 (union of two collector.py versions)"),
    ignored={
        "trtllm_prompt_cached_tokens_per_request": "cached prompt tokens per request: the counters give the rate",
        "trtllm_spec_decode_drafted_tokens_total": "draft tokens per position (`token_position`): the totals are "
                                                   "mapped",
        "trtllm_spec_decode_accepted_tokens_total": "accepted tokens per position: the totals are mapped",
        "trtllm_spec_decode_draft_overhead": "the drafter's share of step time",
        "trtllm_prefill_perplexity": "output quality (perplexity of prompts), not serving load",
        "trtllm_generation_perplexity": "output quality (perplexity of outputs), not serving load",
        "trtllm_kv_cache_reused_blocks_total": "reused KV blocks (blocks, not tokens): prompt_cached_tokens is mapped",
        "trtllm_kv_cache_missed_blocks_total": "missed KV blocks (blocks, not tokens)",
        "trtllm_kv_cache_host_utilization": "the host (CPU) KV tier's usage: offload detail",
        "trtllm_kv_cache_iter_*": "per-iteration KV reuse detail (blocks)",
        "trtllm_kv_cache_gen_alloc_blocks_total": "KV blocks allocated for generation",
        "trtllm_kv_cache_onboard_bytes_total": "bytes moved from the host tier back to the GPU (offload detail)",
        "trtllm_kv_cache_offload_bytes_total": "bytes offloaded to the host tier",
        "trtllm_kv_cache_disk_prefetch_blocks_total": "blocks prefetched from the disk tier",
        "trtllm_kv_cache_intra_device_copy_bytes_total": "KV bytes copied within the GPU",
        "trtllm_kv_cache_free_blocks": "free KV blocks: max - used",
        "trtllm_num_requests_completed_total": "completed requests without a reason: request_success_total has them "
                                               "by reason",
        "trtllm_gpu_memory_usage_bytes": "the runtime's GPU memory: the GPU source reads NVML",
        "trtllm_cpu_memory_usage_bytes": "the runtime's host memory",
        "trtllm_pinned_memory_usage_bytes": "the runtime's pinned host memory",
        "trtllm_max_batch_size_static": "configured batch size bound",
        "trtllm_max_batch_size_runtime": "the batch size bound the runtime tuner chose",
        "trtllm_max_num_tokens_runtime": "the token bound per iteration the runtime tuner chose",
        "trtllm_num_context_requests": "requests in context (prefill) phase in the last iteration",
        "trtllm_num_generation_requests": "requests in generation phase in the last iteration",
        "trtllm_num_paused_requests": "requests paused (KV cache exhausted) in the last iteration: a gauge, not the "
                                      "preemption counter",
        "trtllm_num_scheduled_requests": "requests scheduled in the last iteration",
        "trtllm_total_context_tokens": "context tokens in the last iteration",
        "trtllm_avg_decoded_tokens_per_iter": "tokens decoded per request per iteration (speculation's gain)",
        "trtllm_prefill_batch_occupancy": "the last prefill batch's occupancy",
        "trtllm_prefill_batch_tokens": "tokens per prefill batch",
        "trtllm_scheduled_batch_size": "batch size per rank and process",
        "trtllm_*_config_info": "configuration (model, parallel, speculative, KV cache) in labels",
        "trtllm_ep_*": "expert-parallel rank health (MoE)",
        "dynamo_*": "NVIDIA Dynamo's own component metrics beside the engine's",
    },
    notes=(
        "Prometheus lives at `/prometheus/metrics`; `/metrics` is JSON iteration stats.",
        "`model_name=\"undefined\"` (the first release's default) is treated as no model.",
        "time_per_output_token_seconds is observed once per request (TPOT), so it maps to "
        "llm_time_per_output_token_seconds; trtllm-serve has no ITL histogram.",
        "`engine_type` is dropped. No preemption counter.",
        "An idle first-release server (HELP/TYPE lines, no samples yet) is not recognised: the "
        "unprefixed names are NIM's too and only the samples' `engine_type` label tells them apart. "
        "Until the first request the target reads as an unknown engine unless `kind: trtllm` is set.",
        "Prefix cache: prompt_cached_tokens_total (or its per-tier split) / prompt_tokens_total are hits / "
        "queries in tokens (both per finished request). trtllm_kv_cache_hit_rate (the engine's own block "
        "ratio) stays mapped to llm_prefix_cache_hit_ratio.",
    ),
)
