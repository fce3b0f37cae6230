"""SGLang (`--enable-metrics`): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, EngineSpec

ALIASES = {
    "sglang:num_running_reqs": Alias("llm_requests_running", "gauge"),
    "sglang:num_queue_reqs": Alias("llm_requests_waiting", "gauge"),
    "sglang:token_usage": Alias("llm_kv_cache_usage_ratio", "gauge",
                                note="used / max_total_num_tokens: a token ratio of the KV pool"),
    "sglang:max_total_num_tokens": Alias("llm_kv_cache_capacity_tokens", "gauge",
                                         note="KV pool capacity, already in tokens"),
    "sglang:page_size": Alias("llm_kv_cache_block_size_tokens", "gauge"),
    "sglang:cache_hit_rate": Alias("llm_prefix_cache_hit_ratio", "gauge",
                                   note="radix-cache hit rate gauge"),
    "sglang:cached_tokens_total": Alias("llm_prefix_cache_hits_total", "counter",
                                        note="prompt tokens served from the radix cache"),
    "sglang:prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "sglang:generation_tokens_total": Alias("llm_generation_tokens_total", "counter"),
    "sglang:num_requests_total": Alias("llm_requests_total", "counter"),
    "sglang:num_retracted_requests_total": Alias("llm_preemptions_total", "counter",
                                                 note="retractions are SGLang's preemptions"),
    "sglang:time_to_first_token_seconds": Alias("llm_time_to_first_token_seconds", "histogram"),
    "sglang:inter_token_latency_seconds": Alias(
        "llm_inter_token_latency_seconds", "histogram", priority=2,
        note="_count counts tokens, not intervals: sum/count is the mean per-token latency"),
    "sglang:time_per_output_token_seconds": Alias(
        "llm_inter_token_latency_seconds", "histogram", priority=1,
        note="renamed to inter_token_latency_seconds (PR #3988/#4914): same concept"),
    "sglang:e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "sglang:queue_time_seconds": Alias("llm_request_queue_time_seconds", "histogram"),
    "sglang:prompt_tokens_histogram": Alias("llm_request_prompt_tokens", "histogram"),
    "sglang:generation_tokens_histogram": Alias("llm_request_generation_tokens", "histogram"),
}

SPEC = EngineSpec(
    kind="sglang",
    title="SGLang",
    aliases=ALIASES,
    # `name` was the model label of the first implementation (PR #1853); model_name wins when both.
    labels={"model_name": "model", "name": "model", "dp_rank": "rank"},
    # Every tensor/pipeline/expert-parallel rank of one replica runs the same batch and reports a
    # copy of the same scheduler numbers: summing them would multiply by the TP size.
    keep_only={"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"},
    markers=(("\nsglang:",),),
    default_flavor="sglang",
    notes=(
        "Scheduler series are reported by every TP/PP/EP rank; only rank 0's copy is kept "
        "(`tp_rank`, `pp_rank`, `moe_ep_rank` = \"0\"). A data-parallel `dp_rank` becomes `rank`.",
        "ITL quirk: SGLang adds the whole interval to `_sum` but the number of new tokens to one "
        "bucket and to `_count`, so the histogram is weighted per token and sum/count is the mean "
        "per-token latency. Passed through unchanged.",
        "No finish-reason breakdown: `num_aborted_requests_total` alone is not mapped to "
        "llm_requests_finished_total (a lone reason would make sums over reasons wrong).",
        "`num_retracted_reqs` is a gauge (retractions in the last interval), not mapped to the "
        "preemption counter; `num_retracted_requests_total` (newer builds) is.",
        "Not mapped: per_stage_req_latency_seconds{stage} (stage set not stable), "
        "gen_throughput (interval gauge), kv_transfer_*_ms (PD disaggregation), func_latency_seconds.",
    ),
)
