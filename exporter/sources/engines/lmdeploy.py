"""LMDeploy (`lmdeploy:` prefix, modelled on vLLM V1's loggers): alias table. See docs/engines.md.

With data parallel each rank runs its own API server with its own /metrics (one `engine` value per
page): configure one target per rank, or read them as ranks of one target behind a proxy that merges
them.
"""

from exporter.sources.engines.table import COMMON_IGNORED, Alias, Aliases, EngineSpec

ALIASES: Aliases = {
    "lmdeploy:num_requests_running": Alias("llm_requests_running", "gauge"),
    "lmdeploy:num_requests_waiting": Alias("llm_requests_waiting", "gauge"),
    "lmdeploy:num_api_requests_waiting": Alias(
        "llm_requests_pending", "gauge",
        note="accepted by the API server, not yet holding a request handle: total - succeeded - failed - routed"),
    "lmdeploy:gpu_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", note="a fraction 0..1"),
    "lmdeploy:prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "lmdeploy:generation_tokens_total": Alias(
        "llm_generation_tokens_total", "counter",
        note="double-counted by an early release (inc() twice per iteration); passed through"),
    "lmdeploy:cached_tokens_total": Alias("llm_prefix_cache_hits_total", "counter", tier="device",
                                          note="prompt tokens reused from the engine's prefix cache"),
    "lmdeploy:prefix_cache_hit_rate": Alias("llm_prefix_cache_hit_ratio", "gauge",
                                            note="the engine's own cumulative hit rate"),
    "lmdeploy:request_success_total": Alias(
        "llm_requests_finished_total", "counter", reason="other",
        note="finished_reason is a ResponseType; only FINISH is counted upstream (a normal end, stop or length "
             "not told apart: `other`), failures only in the num_requests_failed gauge"),
    "lmdeploy:time_to_first_token_seconds": Alias("llm_time_to_first_token_seconds", "histogram"),
    "lmdeploy:iter_token_latency": Alias(
        "llm_inter_token_latency_seconds", "histogram",
        note="one observation per output of a request after its first: the gap since its previous output, "
             "in seconds (>= 0.16)"),
    "lmdeploy:e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "lmdeploy:request_queue_time_seconds": Alias("llm_request_queue_time_seconds", "histogram"),
    "lmdeploy:request_prefill_time_seconds": Alias("llm_request_prefill_time_seconds", "histogram"),
    "lmdeploy:request_decode_time_seconds": Alias("llm_request_decode_time_seconds", "histogram"),
    "lmdeploy:request_inference_time_seconds": Alias("llm_request_inference_time_seconds", "histogram"),
    "lmdeploy:request_prompt_tokens": Alias("llm_request_prompt_tokens", "histogram"),
    "lmdeploy:request_generation_tokens": Alias("llm_request_generation_tokens", "histogram"),
    "lmdeploy:spec_decode_num_drafts_total": Alias("llm_spec_decode_drafts_total", "counter"),
    "lmdeploy:spec_decode_num_draft_tokens_total": Alias("llm_spec_decode_draft_tokens_total", "counter"),
    "lmdeploy:spec_decode_num_accepted_tokens_total": Alias("llm_spec_decode_accepted_tokens_total", "counter"),
}

SPEC = EngineSpec(
    kind="lmdeploy",
    title="LMDeploy",
    aliases=ALIASES,
    labels={"model_name": "model", "engine": "rank", "finished_reason": "reason"},
    reasons={"responsetype.finish": "other", "responsetype.success": "other", "responsetype.cancel": "abort",
             "responsetype.no_queue": "rejected", "responsetype.engine_stop_error": "error",
             "responsetype.internal_engine_error": "error", "responsetype.out_of_memory": "error",
             "responsetype.input_length_error": "error", "responsetype.session_repeat": "error",
             "responsetype.session_not_exist": "error", "responsetype.handler_not_exist": "error",
             "responsetype.prefix_cache_conflict": "error", "responsetype.not_supported": "error"},
    markers=(("\nlmdeploy:",),),
    default_flavor="lmdeploy",
    versions=("early (0168eed)", "0.18.0"),
    ignored={
        "lmdeploy:time_per_output_token_seconds": "the gap between two outputs divided by the tokens the later "
                                                  "one brought (per token, not per output step: under speculative "
                                                  "decoding a different tail), so not llm_inter_token_latency_seconds; "
                                                  "iter_token_latency is the gap itself",
        "lmdeploy:iteration_tokens_total": "observed once per request output, not per engine step despite its "
                                           "HELP: not the batch shape llm_iteration_tokens means",
        "lmdeploy:num_requests_succeeded": "a gauge holding a running total (request_success_total is the counter)",
        "lmdeploy:num_requests_failed": "a gauge holding a running total of failures; no reason is given",
        "lmdeploy:num_api_requests_routed": "requests holding a request handle (routed to the engine)",
        "lmdeploy:backend_config_info": "an info metric never filled in upstream (no labels, always 1)",
        "lmdeploy:request_cached_tokens": "cached prompt tokens per request: cached_tokens_total gives the rate",
        "lmdeploy:request_cache_hit_ratio": "hit ratio per request",
        "lmdeploy:spec_decode_num_accepted_tokens_per_pos_total": "per draft position: the totals are mapped",
        "lmdeploy:spec_decode_per_position_accept_rate": "per draft position",
        "lmdeploy:spec_decode_mean_accept_rate": "accepted / draft tokens since start: the counters give it per window",
        "lmdeploy:spec_decode_mean_accept_length": "1 + accepted / drafts since start: the counters give it per window",
        **COMMON_IGNORED,
    },
    notes=(
        "`engine` (the dp rank) becomes `rank`.",
        "The 1-2-5 token buckets assume max_model_len=4096 whatever the model.",
        "No KV capacity or preemption metrics.",
        "Early releases had no iter_token_latency: their time_per_output_token_seconds is left out like the "
        "newer one's, so they have no ITL series.",
    ),
)
