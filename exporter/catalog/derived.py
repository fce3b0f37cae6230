"""Families computed by exporter/derive/ from the current and previous snapshots: what no single
source has. Formulas are in docs/diagnosis.md and in each derive module."""

from exporter.catalog.base import family

TM = ("target", "model")
RESOURCES = ("idle", "compute", "memory_bandwidth", "kv_capacity", "host_cpu", "interconnect", "power_thermal")

FAMILIES = (
    family("llm_prefill_tokens_per_second", "gauge", "tokens/s",
           "Prompt tokens processed per second (rate of llm_prompt_tokens_total over the last cycles; "
           "counter resets from an engine restart are not counted as negative spikes).", TM, "derived"),
    family("llm_decode_tokens_per_second", "gauge", "tokens/s",
           "Output tokens generated per second (rate of llm_generation_tokens_total).", TM, "derived"),
    family("llm_phase_time_ratio", "gauge", "ratio",
           "Share of engine time spent in each phase (prefill or decode), where the engine reports "
           "prefill/decode time.", TM + ("phase",), "derived"),
    family("llm_mean_batch_size", "gauge", "sequences",
           "Mean number of running sequences over the last cycles.", TM, "derived"),
    family("llm_decode_steps_per_second", "gauge", "steps/s",
           "Decode steps per second: decode tokens/s divided by the mean batch size.", TM, "derived"),
    family("llm_kv_cache_bytes_per_token", "gauge", "bytes",
           "KV cache bytes per token: 2 x layers x kv_heads x head_dim x bytes per element.", TM, "derived"),
    family("llm_kv_cache_used_tokens", "gauge", "tokens",
           "KV cache in use, in tokens: usage ratio x capacity.", TM, "derived"),
    family("llm_kv_cache_used_bytes", "gauge", "bytes",
           "KV cache in use, in bytes: used tokens x bytes per token.", TM, "derived"),
    family("llm_kv_cache_capacity_bytes", "gauge", "bytes",
           "KV cache capacity in bytes: capacity tokens x bytes per token.", TM, "derived"),
    family("llm_kv_cache_headroom_sequences", "gauge", "sequences",
           "How many more sequences of the current mean context length fit in the free KV cache.",
           TM, "derived"),
    family("llm_hbm_bandwidth_bytes_per_second", "gauge", "bytes/s",
           "Achieved HBM bandwidth per GPU: modelled from decode steps/s and model shape (source=model) "
           "or measured by GPM (source=gpm).", ("target", "gpu", "source"), "derived"),
    family("llm_hbm_bandwidth_efficiency_ratio", "gauge", "ratio",
           "Achieved HBM bandwidth over the card's peak, modelled (source=model) and measured "
           "(source=gpm); the gap between them is what the model does not explain.",
           ("target", "gpu", "source"), "derived"),
    family("llm_prefill_mfu_ratio", "gauge", "ratio",
           "Prefill model FLOPs utilization: 2 x active params x prefill tokens/s over the GPUs' peak "
           "dense FLOPS.", TM, "derived"),
    family("llm_energy_joules_per_token", "gauge", "joules",
           "GPU energy per generated token: rate of llm_gpu_energy_joules_total over decode tokens/s.",
           TM, "derived"),
    family("llm_cost_per_million_tokens", "gauge", "currency",
           "Cost of one million generated tokens at the configured price per GPU-hour.", TM, "derived"),
    family("llm_ttft_window_seconds", "gauge", "seconds",
           "Time-to-first-token quantiles over the sliding window, from histogram bucket deltas.",
           TM + ("quantile",), "derived"),
    family("llm_tbt_window_seconds", "gauge", "seconds",
           "Time-between-tokens (inter-token latency) quantiles over the sliding window.",
           TM + ("quantile",), "derived"),
    family("llm_e2e_window_seconds", "gauge", "seconds",
           "End-to-end latency quantiles over the sliding window.", TM + ("quantile",), "derived"),
    family("llm_ttft_slo_attainment_ratio", "gauge", "ratio",
           "Share of requests in the window whose TTFT is within the SLO threshold; `le` is the bucket "
           "bound actually used (the closest at or below the threshold).", TM + ("le",), "derived"),
    family("llm_tbt_slo_attainment_ratio", "gauge", "ratio",
           "Share of inter-token gaps in the window within the SLO threshold; `le` as above.",
           TM + ("le",), "derived"),
    family("llm_bottleneck", "gauge", "bool",
           "The bottleneck verdict: 1 for the resource that limits the target now, 0 for the others. "
           "Resources: " + ", ".join(RESOURCES) + ".", ("target", "resource"), "derived"),
    family("llm_bottleneck_score", "gauge", "ratio",
           "How strongly the evidence points at each resource (0..1); the verdict follows the "
           "diagnosis order with hysteresis.", ("target", "resource"), "derived"),
)
