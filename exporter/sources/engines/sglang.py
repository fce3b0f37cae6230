"""SGLang (`--enable-metrics`): alias table. See docs/engines.md."""

from exporter.sources.engines.table import COMMON_IGNORED, MIB, MS, Alias, Aliases, EngineSpec, Product, Term

CACHED_SAMPLE = "\nsglang:cached_tokens_total{"
"""A cached_tokens_total sample line (the counter has no series before the first cache hit)."""

ALIASES: Aliases = {
    "sglang:num_running_reqs": Alias("llm_requests_running", "gauge"),
    "sglang:num_queue_reqs": Alias("llm_requests_waiting", "gauge"),
    "sglang:token_usage": Alias("llm_kv_cache_usage_ratio", "gauge",
                                note="used / max_total_num_tokens: a token ratio of the KV pool"),
    "sglang:max_total_num_tokens": Alias("llm_kv_cache_capacity_tokens", "gauge",
                                         note="KV pool capacity, already in tokens"),
    "sglang:page_size": Alias("llm_kv_cache_block_size_tokens", "gauge"),
    "sglang:cached_tokens_total": Alias(
        "llm_prefix_cache_hits_total", "counter", tier="unknown",
        note="prompt tokens served from a prefix cache, counted per finished request; `cache_source` "
             "(newer builds) names the tier, older builds count every tier together (`unknown`)"),
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
    "sglang:request_time_per_output_token_seconds": Alias(
        "llm_time_per_output_token_seconds", "histogram",
        note="one observation per finished request (>= 0.5.x): TPOT"),
    "sglang:e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "sglang:queue_time_seconds": Alias("llm_request_queue_time_seconds", "histogram"),
    "sglang:prompt_tokens_histogram": Alias("llm_request_prompt_tokens", "histogram"),
    "sglang:generation_tokens_histogram": Alias("llm_request_generation_tokens", "histogram"),
    "sglang:estimated_flops_per_gpu_total": Alias("llm_engine_estimated_flops_total", "counter",
                                                  note="the same estimate as vLLM's, per GPU"),
    "sglang:estimated_read_bytes_per_gpu_total": Alias("llm_engine_estimated_read_bytes_total", "counter"),
    "sglang:estimated_write_bytes_per_gpu_total": Alias("llm_engine_estimated_write_bytes_total", "counter"),
    "sglang:spec_verify_calls_total": Alias("llm_spec_decode_drafts_total", "counter",
                                            note="target-model verification calls: one per draft checked"),
    "sglang:spec_accept_length": Alias("llm_spec_decode_acceptance_length", "gauge",
                                       note="mean accepted length over the scheduler's last log interval"),
    "sglang:forward_execution_seconds_total": Alias(
        "llm_engine_busy_seconds_total", "counter",
        note="GPU time of forward passes (CUDA events), by `category` (extend, decode, target_verify, eagle_draft, "
             "idle: the empty forwards DP attention syncs with, ...): summed; only with "
             "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1"),
    # PD disaggregation (--disaggregation-mode prefill|decode). Transfer metrics are recorded by the
    # prefill instance (disaggregation/prefill.py, req_time_stats.compute_and_observe_kv_transfer_metrics).
    "sglang:kv_transfer_latency_ms": Alias(
        "llm_kv_transfer_seconds", "histogram", scale=MS,
        note="ms -> s (`le`, `_sum`); one observation per request whose KV the prefill instance sent (the last "
             "chunk's send to its completion when the backend gives no latency)"),
    "sglang:kv_transfer_total_mb": Alias(
        "llm_kv_transfer_bytes", "histogram", scale=MIB,
        note="\"MB\" is MiB upstream (total_bytes / (1024 * 1024)): x 1048576 -> bytes (`le`, `_sum`)"),
}

PRODUCTS = (
    Product("llm_requests_waiting_kv_transfer", "gauge", (
        Term("sglang:num_prefill_bootstrap_queue_reqs"), Term("sglang:num_prefill_inflight_queue_reqs"),
        Term("sglang:num_decode_prealloc_queue_reqs"), Term("sglang:num_decode_transfer_queue_reqs")), add=True,
        note="the PD queues a request passes through outside the waiting queue: prefill bootstrap (handshake "
             "before the prefill) and inflight (prefilled, KV being sent); decode prealloc (handshake and KV "
             "memory) and transfer (KV being received). Disjoint; decode_host_receive_queue is a subset of the "
             "transfer queue, not added. The per-priority copies beside each total are not added (maximum)"),
    Product("llm_kv_transfer_failures_total", "counter", (
        Term("sglang:num_transfer_failed_reqs_total"), Term("sglang:num_bootstrap_failed_reqs_total")), add=True,
        note="requests whose KV transfer or bootstrap (the handshake that sets the transfer up) failed; both "
             "abort the request, on either side, and vLLM's NIXL counts its handshake failures the same way"),
)

IGNORED = {
    "sglang:inter_token_latency_seconds": "weighted per token, not per output step: each gap between two outputs "
                                          "is divided by the tokens it brought and added that many times, so under "
                                          "speculative decoding its tail is not llm_inter_token_latency_seconds' "
                                          "(never relabelled); request_time_per_output_token_seconds is mapped",
    "sglang:time_per_output_token_seconds": "the old name (<= 0.4) of inter_token_latency_seconds, weighted the "
                                            "same way",
    "sglang:cache_hit_rate": "the last prefill batch's hit rate, reset on decode logs: not a hit ratio",
    "sglang:gen_throughput": "tokens/s over the scheduler's last log interval: the token counters give rates",
    "sglang:num_retracted_reqs": "retractions in the last log interval (a gauge); num_retracted_requests_total is "
                                 "mapped",
    "sglang:num_retractions": "retractions per finished request (a 2025-26 histogram); "
                              "num_retracted_requests_total gives the rate",
    "sglang:num_retracted_input_tokens_total": "prompt tokens of retracted requests (recompute cost)",
    "sglang:num_retracted_output_tokens_total": "output tokens of retracted requests (recompute cost)",
    "sglang:num_paused_reqs": "requests paused for a weight update",
    "sglang:num_grammar_queue_reqs": "requests waiting for grammar compilation (structured output)",
    "sglang:num_grammar_*": "structured-output grammar cache and outcomes",
    "sglang:grammar_*": "structured-output grammar compilation detail",
    "sglang:decode_sum_seq_lens": "sum of the running sequences' lengths",
    "sglang:full_token_usage": "the full-attention pool's usage for hybrid (SWA) models; token_usage is mapped",
    "sglang:swa_*": "the sliding-window pool of hybrid models",
    "sglang:mamba_*": "the Mamba state pool of hybrid models",
    "sglang:num_used_tokens": "tokens in use: token_usage x max_total_num_tokens",
    "sglang:kv_available_tokens": "free KV tokens (with kv_used_tokens and kv_evictable_tokens: the pool's split)",
    "sglang:kv_evictable_tokens": "KV tokens held only by the radix cache, free to evict",
    "sglang:kv_used_tokens": "KV tokens held by running requests",
    "sglang:max_total_num_tokens_swa": "the sliding-window pool's capacity (hybrid models)",
    "sglang:weight_load_duration_seconds": "startup: weight loading time",
    "sglang:weight_memory_usage_gb": "GPU memory of the weights (startup constant)",
    "sglang:kv_cache_memory_usage_gb": "GPU memory of the KV pool (startup constant)",
    "sglang:graph_memory_usage_gb": "GPU memory of CUDA graphs (startup constant)",
    "sglang:startup_*": "startup phases' durations and memory",
    "sglang:context_len": "the model's context length (a constant)",
    "sglang:num_pages": "KV pages: max_total_num_tokens / page_size",
    "sglang:max_running_requests_under_SLO": "the scheduler's own estimate under its SLO mode",
    "sglang:spec_accept_rate": "accepted / drafted tokens over the last interval: spec_accept_length is mapped",
    "sglang:spec_cap_length": "speculative decoding's configured cap",
    "sglang:spec_block_accept_length": "block-wise acceptance length (a variant of spec_accept_length)",
    "sglang:spec_num_steps": "speculative steps configured",
    "sglang:spec_num_draft_tokens": "draft tokens per step configured",
    "sglang:utilization": "the scheduler's own busy estimate over its last interval: forward_execution_seconds_total "
                          "is mapped",
    "sglang:fwd_occupancy": "batch occupancy of the last forward",
    "sglang:new_token_ratio": "the scheduler's retraction-avoidance estimate",
    "sglang:is_cuda_graph": "whether the last forward ran as a CUDA graph",
    "sglang:cuda_graph_passes_total": "forward passes by CUDA-graph mode",
    "sglang:realtime_tokens_total": "tokens by forward mode (prefill/decode): the token counters carry the rates",
    "sglang:prefill_effective_tokens_total": "prefill tokens actually computed, by mode",
    "sglang:scheduler_idle_seconds_total": "scheduler idle time: forward_execution_seconds_total is the busy side",
    "sglang:scheduler_process_cpu_seconds_total": "the scheduler process's CPU time (the host source reads processes)",
    "sglang:scheduler_stage_seconds_total": "scheduler time by stage and overlap",
    "sglang:process_cpu_seconds_total": "CPU time per SGLang component process (the host source reads processes)",
    "sglang:per_stage_req_latency_seconds": "per-request latency by internal stage (the stage set changes between "
                                            "releases)",
    "sglang:func_latency_seconds": "profiling of named internal functions",
    "sglang:dp_attention_*": "DP-attention balance and sync detail",
    "sglang:dp_cooperation_*": "DP cooperation detail",
    "sglang:prefill_delayer_*": "the prefill delayer's waits and outcomes",
    "sglang:encoder_*": "the multimodal encoder (cache, requests, latency)",
    "sglang:lora_pool_*": "LoRA adapter pool slots",
    "sglang:hicache_*": "HiCache host/storage tiers (backup, prefetch, drops): transfer detail; hits by tier are "
                       "in cached_tokens_total",
    "sglang:prefetched_tokens_total": "HiCache: tokens prefetched from storage",
    "sglang:backuped_tokens_total": "HiCache: tokens backed up to host/storage",
    "sglang:storage_prefetch_*": "HiCache storage prefetch outcomes",
    "sglang:prefetch_pgs": "HiCache prefetch pages per operation",
    "sglang:backup_pgs": "HiCache backup pages per operation",
    "sglang:prefetch_bandwidth": "HiCache prefetch bandwidth",
    "sglang:backup_bandwidth": "HiCache backup bandwidth",
    "sglang:eviction_duration_seconds": "radix-cache eviction time",
    "sglang:evicted_tokens_total": "radix-cache tokens evicted",
    "sglang:load_back_*": "HiCache: tokens and bytes loaded back to the device",
    "sglang:eplb_*": "expert-parallel load balancing (MoE)",
    "sglang:num_decode_host_receive_queue_reqs": "PD disaggregation: the transfer-queue requests receiving into "
                                                 "host memory (a subset of num_decode_transfer_queue_reqs)",
    "sglang:num_decode_host_receive_reqs_total": "PD disaggregation: requests admitted to receive their KV in host "
                                                 "memory",
    "sglang:num_decode_deferred_kv_release_reqs": "PD disaggregation: failed decode requests whose KV memory waits for "
                                                  "the transfer to drain",
    "sglang:decode_deferred_kv_release_*": "PD disaggregation: deferred KV release",
    "sglang:kv_transfer_speed_gb_s": "PD disaggregation: per-transfer speed, total_mb / latency of the mapped pair",
    "sglang:kv_transfer_bootstrap_ms": "PD disaggregation: time from the bootstrap queue to the handshake's end (a "
                                       "TTFT component before the transfer)",
    "sglang:kv_transfer_alloc_ms": "PD disaggregation: time from the handshake's end to the KV memory allocation",
    "sglang:pending_prealloc_token_usage": "PD disaggregation: decode-side preallocation",
    "sglang:prealloc_*": "PD disaggregation: decode-side preallocation pools",
    "sglang:num_prefill_retries_total": "PD disaggregation: prefill retries",
    "sglang:num_unique_running_routing_keys": "router affinity keys",
    "sglang:routing_*": "router affinity keys",
    "sglang:num_streaming_sessions": "streaming sessions open",
    "sglang:streaming_session_held_tokens": "tokens held by streaming sessions",
    "sglang:failed_session_recoveries_total": "session recovery failures",
    "sglang:encoder_dp_pending_requests": "multimodal encoder DP queue",
    "sglang:http_*": "the API server's HTTP instrumentation",
    "sglang:uncached_prompt_tokens_histogram": "prompt tokens computed per request (cache hits left out): the "
                                               "counters give the window's split",
    "sglang:get_loads_duration_seconds": "the router's load queries",
    "sglang:num_so_requests_total": "structured-output requests",
    "sglang:num_aborted_requests_total": "aborted requests, with no count of the other outcomes beside it: as the "
                                         "lone reason of llm_requests_finished_total every sum over reasons would "
                                         "read as 100% aborted",
    "sglang:diffusion_*": "the diffusion (image/video) runtime",
    **COMMON_IGNORED,
}

SPEC = EngineSpec(
    kind="sglang",
    title="SGLang",
    aliases=ALIASES,
    products=PRODUCTS,
    # `name` was the model label of the first implementation (PR #1853); model_name wins when both.
    labels={"model_name": "model", "name": "model", "dp_rank": "rank", "cache_source": "tier"},
    tiers={"device": "device", "gpu": "device", "radix": "device", "host": "host", "cpu": "host",
           "storage": "storage", "l3": "storage", "disk": "storage", "total": "unknown"},
    versions=("0.4", "2026 (0.5.x)", "0.5.23"),
    ignored=IGNORED,
    # Every tensor/pipeline/expert-parallel rank of one replica runs the same batch and reports a
    # copy of the same scheduler numbers: summing them would multiply by the TP size.
    keep_only={"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"},
    # With DP attention every DP rank's scheduler reports with its own (global) tp_rank and
    # moe_ep_rank and a dp_rank: those series are not copies, dp_rank tells them apart.
    keep_only_unless={"tp_rank": "dp_rank", "moe_ep_rank": "dp_rank"},
    markers=(("\nsglang:",),),
    default_flavor="sglang",
    # engine_type (scheduler and tokenizer labels, 0.5.x): DisaggregationMode.to_engine_type, or "dynamic"
    # with --enable-pd-role-switch (the instance changes role at run time).
    roles=(('engine_type="prefill"', "prefill"), ('engine_type="decode"', "decode"),
           ('engine_type="unified"', "both"), ('engine_type="dynamic"', "both")),
    waiting_includes_kv_transfer=False,
    notes=(
        "Scheduler series can be reported by every TP/PP/EP rank; only rank 0's copy is kept "
        "(`tp_rank`, `pp_rank`, `moe_ep_rank` = \"0\"). A data-parallel `dp_rank` becomes `rank`, "
        "and series with a `dp_rank` are kept whatever their `tp_rank`/`moe_ep_rank`: with "
        "`--enable-dp-attention` DP rank d's scheduler reports tp_rank = d x attention-TP size. "
        "By default only each DP rank's attention-TP rank 0 reports; with "
        "`--enable-metrics-for-all-schedulers` the other ranks' copies coincide with it: gauges take "
        "the maximum (exact for copies) but the counters (retractions, KV-transfer failures) are summed over them.",
        "Prefix cache: `cached_tokens_total` / `prompt_tokens_total` are hits / queries in tokens, "
        "both counted when a request finishes (queries only once the page has a cached_tokens "
        "sample: SGLang creates it at the first hit); `cache_source` is the hit's tier.",
        "No ITL series: SGLang's inter_token_latency_seconds divides each gap between two outputs by "
        "the tokens it brought and counts it that many times, a per-token weighting that "
        "llm_inter_token_latency_seconds does not mean (under speculative decoding its tail is lower). "
        "TPOT per request (request_time_per_output_token_seconds) is mapped instead; the TBT SLO and "
        "its alerts have no series for SGLang targets.",
        "Waiting semantics: `num_queue_reqs` (llm_requests_waiting) is the scheduler's waiting queue only. "
        "The PD queues (llm_requests_waiting_kv_transfer) are apart from it: a decode instance whose requests "
        "all wait for their KV shows waiting 0 and running 0 with them there. A request whose KV has arrived "
        "joins the waiting queue.",
        "PD role: `engine_type` prefill or decode; unified (no disaggregation) and dynamic (a role switch at "
        "run time) are `both`. KV transfer time and size are recorded by the prefill instance only; failures "
        "by whichever side sees them.",
        "No finish-reason breakdown: `num_aborted_requests_total` alone is not mapped to "
        "llm_requests_finished_total (a lone reason would make sums over reasons wrong).",
    ),
)
