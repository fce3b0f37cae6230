"""SGLang (`--enable-metrics`): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, EngineSpec

CACHED_SAMPLE = "\nsglang:cached_tokens_total{"
"""A cached_tokens_total sample line (the counter has no series before the first cache hit)."""

ALIASES = {
    "sglang:num_running_reqs": Alias("llm_requests_running", "gauge"),
    "sglang:num_queue_reqs": Alias("llm_requests_waiting", "gauge"),
    "sglang:token_usage": Alias("llm_kv_cache_usage_ratio", "gauge",
                                note="used / max_total_num_tokens: a token ratio of the KV pool"),
    "sglang:max_total_num_tokens": Alias("llm_kv_cache_capacity_tokens", "gauge",
                                         note="KV pool capacity, already in tokens"),
    "sglang:page_size": Alias("llm_kv_cache_block_size_tokens", "gauge"),
    "sglang:cached_tokens_total": Alias(
        "llm_prefix_cache_hits_total", "counter",
        note="prompt tokens served from the prefix cache, counted per finished request (newer builds "
             "split it by `cache_source`: summed)"),
    "sglang:prompt_tokens_total": (
        Alias("llm_prompt_tokens_total", "counter"),
        Alias("llm_prefix_cache_queries_total", "counter", when=(CACHED_SAMPLE, True),
              note="every prompt token is matched against the radix cache; counted with cached_tokens "
                   "when a request finishes"),
    ),
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
    # With DP attention every DP rank's scheduler reports with its own (global) tp_rank and
    # moe_ep_rank and a dp_rank: those series are not copies, dp_rank tells them apart.
    keep_only_unless={"tp_rank": "dp_rank", "moe_ep_rank": "dp_rank"},
    markers=(("\nsglang:",),),
    default_flavor="sglang",
    notes=(
        "Scheduler series can be reported by every TP/PP/EP rank; only rank 0's copy is kept "
        "(`tp_rank`, `pp_rank`, `moe_ep_rank` = \"0\"). A data-parallel `dp_rank` becomes `rank`, "
        "and series with a `dp_rank` are kept whatever their `tp_rank`/`moe_ep_rank`: with "
        "`--enable-dp-attention` DP rank d's scheduler reports tp_rank = d x attention-TP size. "
        "By default only each DP rank's attention-TP rank 0 reports; with "
        "`--enable-metrics-for-all-schedulers` the other ranks' copies coincide with it: gauges take "
        "the maximum (exact for copies) but the retraction counter is summed over them.",
        "Prefix cache: `cached_tokens_total` / `prompt_tokens_total` are hits / queries in tokens, "
        "both counted when a request finishes (queries only once the page has a cached_tokens "
        "sample: SGLang creates it at the first hit). `cache_hit_rate` is not mapped: it is the "
        "last prefill batch's hit rate and is reset to 0 on every decode log, so a scrape reads "
        "0 or one batch's rate, not a hit ratio.",
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
