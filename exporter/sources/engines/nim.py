"""NVIDIA NIM for LLMs (`/v1/metrics`, vLLM-style names without a prefix): alias table.
See docs/engines.md.

A NIM whose backend also publishes its own `vllm:` series is detected as vLLM (richer data);
configure `kind=nim` to force this table. Detection needs a NIM-only name (the request gauges or
the KV usage gauge): the unprefixed histograms are trtllm-serve's first release's too, whose idle
page (HELP/TYPE lines only) would otherwise read as NIM."""

from exporter.sources.engines.table import Alias, Aliases, EngineSpec

ALIASES: Aliases = {
    "num_requests_running": Alias("llm_requests_running", "gauge"),
    "num_requests_waiting": Alias("llm_requests_waiting", "gauge"),
    "num_request_max": Alias("llm_requests_running_max", "gauge"),
    "gpu_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", note="a fraction 0..1"),
    "prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "generation_tokens_total": Alias("llm_generation_tokens_total", "counter"),
    "request_success_total": Alias("llm_requests_finished_total", "counter", priority=2, reason="other"),
    "request_finish_total": Alias("llm_requests_finished_total", "counter", priority=1, reason="other",
                                  note="name reported by a third-party exporter; unverified"),
    "num_preemptions_total": Alias("llm_preemptions_total", "counter"),
    "time_to_first_token_seconds": Alias("llm_time_to_first_token_seconds", "histogram"),
    "time_per_output_token_seconds": Alias("llm_inter_token_latency_seconds", "histogram",
                                           note="vLLM V0 semantics (one observation per token): ITL"),
    "e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "request_prompt_tokens": Alias("llm_request_prompt_tokens", "histogram"),
    "request_generation_tokens": Alias("llm_request_generation_tokens", "histogram"),
}

SPEC = EngineSpec(
    kind="nim",
    title="NVIDIA NIM for LLMs",
    aliases=ALIASES,
    labels={"model_name": "model", "finished_reason": "reason"},
    markers=(("\nnum_requests_running",), ("\ngpu_cache_usage_perc",), ("\nnum_request_max",)),
    default_flavor="nim",
    notes=(
        "The documented table is mapped; request_success_total/request_finish_total and "
        "num_preemptions_total are mapped when present but not verified. Queue, prefill/decode "
        "times and prefix cache are not documented, so absent.",
        "The backend varies (TRT-LLM, vLLM, SGLang) and may add its own prefixed series.",
    ),
)
