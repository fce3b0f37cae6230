"""Hugging Face TGI (text-generation-inference 2.x/3.x): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, EngineSpec

ALIASES = {
    "tgi_request_duration": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "tgi_request_queue_duration": Alias("llm_request_queue_time_seconds", "histogram"),
    "tgi_request_inference_duration": Alias("llm_request_inference_time_seconds", "histogram"),
    "tgi_request_mean_time_per_token_duration": Alias(
        "llm_time_per_output_token_seconds", "histogram",
        note="inference time / generated tokens per request: includes prefill"),
    "tgi_request_input_length": Alias("llm_request_prompt_tokens", "histogram"),
    "tgi_request_generated_tokens": Alias("llm_request_generation_tokens", "histogram"),
    "tgi_request_count": Alias("llm_requests_total", "counter"),
    "tgi_request_success": Alias("llm_requests_finished_total", "counter", reason="other",
                                 note="no _total suffix; success does not say stop or length"),
    "tgi_request_failure": Alias("llm_requests_finished_total", "counter", reason="error",
                                 note="all `err` values summed into reason=\"error\""),
    "tgi_batch_current_size": Alias("llm_requests_running", "gauge"),
    "tgi_queue_size": Alias("llm_requests_waiting", "gauge"),
    "tgi_batch_max_total_tokens": Alias("llm_kv_cache_capacity_tokens", "gauge",
                                        note="max batch total tokens, sized from free KV memory (v3)"),
    "tgi_batch_inference_duration": (
        Alias("llm_batch_prefill_time_seconds", "histogram", where=("method", "prefill")),
        Alias("llm_batch_decode_time_seconds", "histogram", where=("method", "decode")),
    ),
}

SPEC = EngineSpec(
    kind="tgi",
    title="Hugging Face TGI",
    aliases=ALIASES,
    labels={},  # TGI has no model label; `method`, `err` and `reason` are consumed by the aliases
    markers=(("\ntgi_request_",), ("\ntgi_batch_",), ("\ntgi_queue_size",)),
    default_flavor="tgi",
    notes=(
        "No model label: series carry `target` and `engine` only.",
        "No TTFT, ITL, token counters, KV usage, prefix cache or preemptions: those series are "
        "absent. TGI's own dashboard approximates TTFT with queue + prefill batch time; use "
        "llm_request_queue_time_seconds and llm_batch_prefill_time_seconds.",
        "Token totals are the `_sum` of the length histograms (finished requests only); no "
        "counter is made up from them.",
        "Not mapped: tgi_batch_forward/decode/filter/concat_duration (parts of one step), "
        "tgi_request_validation_duration, tgi_request_skipped_tokens (a summary).",
    ),
)
