"""llama.cpp server (`--metrics`): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, EngineSpec

ALIASES = {
    "llamacpp:prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "llamacpp:tokens_predicted_total": Alias("llm_generation_tokens_total", "counter"),
    "llamacpp:prompt_seconds_total": Alias("llm_prefill_seconds_total", "counter",
                                           note="prompt processing time, seconds"),
    "llamacpp:tokens_predicted_seconds_total": Alias("llm_decode_seconds_total", "counter",
                                                     note="generation time, seconds"),
    "llamacpp:requests_processing": Alias("llm_requests_running", "gauge", note="busy slots"),
    "llamacpp:requests_deferred": Alias("llm_requests_waiting", "gauge"),
    "llamacpp:kv_cache_usage_ratio": Alias("llm_kv_cache_usage_ratio", "gauge",
                                           note="removed in May 2025 (PR #13660); older builds only"),
}

SPEC = EngineSpec(
    kind="llamacpp",
    title="llama.cpp server",
    aliases=ALIASES,
    labels={},  # llama.cpp has no labels at all
    markers=(("\nllamacpp:",),),
    default_flavor="llamacpp",
    notes=(
        "No labels, so no model label and no rank.",
        "`n_tokens_max` (a maximum) and `n_busy_slots_per_decode` (an average, `nan`/`-nan(ind)` on "
        "older builds) are declared counters but are not: neither is exported.",
        "No histograms: mean prefill tokens/s = rate(llm_prompt_tokens_total) / "
        "rate(llm_prefill_seconds_total), mean decode s/token = rate(llm_decode_seconds_total) / "
        "rate(llm_generation_tokens_total).",
        "`prompt_tokens_seconds`/`predicted_tokens_seconds` are not mapped: older servers reset "
        "their interval on every /metrics call, so two scrapers see different values.",
        "`kv_cache_tokens` (older builds) is not mapped: no capacity comes with it.",
    ),
)
