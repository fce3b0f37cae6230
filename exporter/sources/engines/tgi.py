"""Hugging Face TGI (text-generation-inference 2.x/3.x): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, Aliases, EngineSpec

ALIASES: Aliases = {
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
                                 note="`err` -> reason (see the finish reasons above)"),
    "tgi_batch_current_size": Alias("llm_requests_running", "gauge"),
    "tgi_queue_size": Alias("llm_requests_waiting", "gauge"),
    "tgi_batch_max_total_tokens": Alias(
        "llm_kv_cache_capacity_tokens", "gauge",
        note="max batch total tokens, sized from free KV memory (v3); 3.3 sets it before its recorder is "
             "installed, so real pages lack it"),
    "tgi_batch_inference_duration": (
        Alias("llm_batch_prefill_time_seconds", "histogram", where=("method", "prefill")),
        Alias("llm_batch_decode_time_seconds", "histogram", where=("method", "decode")),
    ),
}

SPEC = EngineSpec(
    kind="tgi",
    title="Hugging Face TGI",
    aliases=ALIASES,
    # TGI has no model label; `method` is consumed by the aliases, `err` is the failure's reason.
    labels={"err": "reason"},
    reasons={"overloaded": "rejected", "validation": "error", "template": "error", "incomplete": "error",
             "generation": "error", "dropped": "abort"},
    markers=(("\ntgi_request_",), ("\ntgi_batch_",), ("\ntgi_queue_size",)),
    default_flavor="tgi",
    versions=("3.3", "3.3.6-dev0"),
    ignored={
        "tgi_request_validation_duration": "input validation and tokenization: a part of the request before the "
                                           "queue",
        "tgi_request_max_new_tokens": "the client's requested output bound",
        "tgi_request_skipped_tokens": "a summary of tokens skipped by speculation (0 without it)",
        "tgi_batch_current_max_tokens": "tokens the running batch has reserved (inputs + max_new_tokens); 0 when "
                                        "idle. Its capacity (max_batch_total_tokens) is not on the page, so no ratio",
        "tgi_batch_concat": "batch concatenations by reason (chunking, backpressure, wait_exceeded)",
        "tgi_batch_concat_duration": "a part of one step (always method=decode upstream)",
        "tgi_batch_forward_duration": "the model forward of one step: a part of tgi_batch_inference_duration (mapped)",
        "tgi_batch_decode_duration": "token decoding of one step: a part of tgi_batch_inference_duration",
        "tgi_batch_filter_duration": "batch filtering of one step: a part of tgi_batch_inference_duration",
        "tgi_batch_inference_count": "steps by method: the step histograms' _count",
        "tgi_batch_inference_success": "successful steps by method",
        "tgi_batch_inference_failure": "failed steps by method (each fails its requests: tgi_request_failure)",
        "tgi_batch_next_size": "the size of the next batch being formed",
    },
    notes=(
        "No model label: series carry `target` and `engine` only.",
        "No TTFT, ITL, token counters, KV usage, prefix cache or preemptions: those series are "
        "absent. TGI's own dashboard approximates TTFT with queue + prefill batch time; use "
        "llm_request_queue_time_seconds and llm_batch_prefill_time_seconds.",
        "Token totals are the `_sum` of the length histograms (finished requests only); no "
        "counter is made up from them.",
        "Series appear on first use, and the family order changes between scrapes (a hash map).",
    ),
)
