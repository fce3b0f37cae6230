"""llama.cpp server (`--metrics`): alias table. See docs/engines.md."""

from exporter.sources.engines.table import Alias, Aliases, EngineSpec

CACHED = "\nllamacpp:prompt_tokens_cached_total "

ALIASES: Aliases = {
    # prompt_tokens_total excludes the tokens reused from the cache (its HELP says so), which
    # prompt_tokens_cached_total counts: every prompt token is their sum, as for the other engines.
    "llamacpp:prompt_tokens_total": (
        Alias("llm_prompt_tokens_total", "counter", note="tokens computed; + prompt_tokens_cached_total"),
        Alias("llm_prefix_cache_queries_total", "counter", when=(CACHED, True),
              note="+ prompt_tokens_cached_total: every prompt token is looked up"),
    ),
    "llamacpp:prompt_tokens_cached_total": (
        Alias("llm_prompt_tokens_total", "counter", note="added to prompt_tokens_total"),
        Alias("llm_prefix_cache_queries_total", "counter", note="added to prompt_tokens_total"),
        Alias("llm_prefix_cache_hits_total", "counter", tier="device",
              note="prompt tokens reused from the slot's KV cache"),
    ),
    "llamacpp:tokens_predicted_total": Alias("llm_generation_tokens_total", "counter"),
    "llamacpp:prompt_seconds_total": Alias("llm_prefill_seconds_total", "counter",
                                           note="per-slot prompt time, summed over slots"),
    "llamacpp:tokens_predicted_seconds_total": Alias("llm_decode_seconds_total", "counter",
                                                     note="per-slot generation time, summed over slots"),
    "llamacpp:n_decode_total": Alias("llm_engine_steps_total", "counter", note="llama_decode() calls"),
    "llamacpp:spec_decode_num_draft_tokens_total": Alias("llm_spec_decode_draft_tokens_total", "counter"),
    "llamacpp:spec_decode_num_accepted_tokens_total": Alias("llm_spec_decode_accepted_tokens_total", "counter"),
    "llamacpp:spec_decode_num_drafts_total": Alias("llm_spec_decode_drafts_total", "counter"),
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
    versions=("older (kv_cache_*)", "2026 (server-cuda)", "b11434"),
    ignored={
        "llamacpp:n_tokens_max": "the longest sequence seen since start: a high-water mark, declared a counter",
        "llamacpp:n_busy_slots_per_decode": "busy slots per llama_decode() averaged since start (a lifetime mean; "
                                            "`nan` on older builds): llm_requests_running is the batch now",
        "llamacpp:prompt_tokens_seconds": "throughput over the interval since the previous /metrics call: every "
                                          "scrape restarts it, so two scrapers (or a person with curl) see different "
                                          "values; rates come from the token counters instead",
        "llamacpp:predicted_tokens_seconds": "as prompt_tokens_seconds: reset by every /metrics call",
        "llamacpp:spec_decode_num_accepted_tokens_per_pos_total": "per draft position (label `position`): the "
                                                                  "acceptance ratio needs only the totals",
        "llamacpp:kv_cache_tokens": "older builds: no capacity comes with it",
        "llamacpp:kv_cache_tokens_count": "older builds: as kv_cache_tokens",
    },
    notes=(
        "No labels, so no model label and no rank: declare the model with the target's `model=` option "
        "(docs/configuration.md), or a fleet's per-model rules and boards group the replica under an empty model.",
        "`prompt_tokens_total` counts only the prompt tokens computed (its HELP: \"excluding cached "
        "tokens\"); builds with `prompt_tokens_cached_total` give the rest, and llm_prompt_tokens_total is "
        "their sum (every prompt token, as for vLLM and SGLang), with the cached ones as prefix-cache "
        "hits and the sum as queries. Older builds without it have no cached count: their "
        "llm_prompt_tokens_total is the computed tokens.",
        "The time counters are per slot, summed over the slots: with 4 slots busy they grow by about "
        "4 s per second. They give the mean time per output token "
        "(rate(llm_decode_seconds_total) / rate(llm_generation_tokens_total)) and a phase split "
        "weighted by slots, not engine time; `n_decode_total` (llm_engine_steps_total) counts the "
        "real forward passes.",
        "No histograms: no TTFT or inter-token quantiles; latency SLOs need the exporter's probe or "
        "the clients' own numbers.",
    ),
)
