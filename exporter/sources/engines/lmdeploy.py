"""LMDeploy (`lmdeploy:` prefix, a clone of vLLM V1's loggers): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, EngineSpec

ALIASES = {
    "lmdeploy:num_requests_running": Alias("llm_requests_running", "gauge"),
    "lmdeploy:num_requests_waiting": Alias("llm_requests_waiting", "gauge"),
    "lmdeploy:gpu_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", note="a fraction 0..1"),
    "lmdeploy:prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "lmdeploy:generation_tokens_total": Alias(
        "llm_generation_tokens_total", "counter",
        note="double-counted by an early release (inc() twice per iteration); passed through"),
    "lmdeploy:time_to_first_token_seconds": Alias("llm_time_to_first_token_seconds", "histogram"),
    "lmdeploy:time_per_output_token_seconds": Alias(
        "llm_inter_token_latency_seconds", "histogram",
        note="observed per output step, like vLLM's pre-0.11 name: ITL"),
    "lmdeploy:e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "lmdeploy:request_queue_time_seconds": Alias("llm_request_queue_time_seconds", "histogram"),
    "lmdeploy:request_prefill_time_seconds": Alias("llm_request_prefill_time_seconds", "histogram"),
    "lmdeploy:request_decode_time_seconds": Alias("llm_request_decode_time_seconds", "histogram"),
    "lmdeploy:request_inference_time_seconds": Alias("llm_request_inference_time_seconds", "histogram"),
    "lmdeploy:request_prompt_tokens": Alias("llm_request_prompt_tokens", "histogram"),
    "lmdeploy:request_generation_tokens": Alias("llm_request_generation_tokens", "histogram"),
}

SPEC = EngineSpec(
    kind="lmdeploy",
    title="LMDeploy",
    aliases=ALIASES,
    labels={"model_name": "model", "engine": "rank"},
    markers=(("\nlmdeploy:",),),
    default_flavor="lmdeploy",
    notes=(
        "`engine` (the dp rank) becomes `rank`.",
        "request_success_total is commented out upstream: no finish reasons.",
        "The 1-2-5 token buckets assume max_model_len=4096 whatever the model.",
        "No KV capacity, prefix cache or preemption metrics.",
    ),
)
