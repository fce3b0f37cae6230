"""Families computed by exporter/derive/ from the current and previous snapshots: what no single
source has. Formulas are in docs/diagnosis.md and in each derive module."""

from exporter.catalog.base import family

# Every per-target family carries the labels of the target's engine series (target, engine, model),
# so a derived series, and an alert built on one, names the engine as the engine's own series do.
TE = ("target", "engine")
TM = TE + ("model",)
# The verdict's resources, in the diagnosis order (ties go to the earlier one). idle: no work;
# headroom: serving with no resource near its limit (healthy); then the roofs, then the constraints.
RESOURCES = ("idle", "headroom", "compute", "memory_bandwidth", "kv_capacity", "scheduler", "host_cpu",
             "interconnect", "power_thermal", "routing")

WINDOW_QUANTILE = "q"
"""The quantile label of llm_*_window_seconds ("0.5", "0.95", "0.99")."""
SLO_BOUND = "bound"
"""The bucket-bound label of llm_*_slo_attainment_ratio (seconds)."""

FAMILIES = (
    family("llm_prefill_tokens_per_second", "gauge", "tokens/s",
           "Prompt tokens processed per second: increase of llm_prompt_tokens_total over a short window "
           "(default max(15 s, 5 intervals)) / its length. A counter reset (engine restart) is read as a "
           "restart from zero, as PromQL rate() does: never negative, never above what was counted.", TM, "derived"),
    family("llm_decode_tokens_per_second", "gauge", "tokens/s",
           "Output tokens generated per second: windowed rate of llm_generation_tokens_total, reset-safe as "
           "above. Engines without token counters (TGI): rate of the finished requests' token "
           "histogram _sum (llm_request_generation_tokens; prompt tokens likewise).", TM, "derived"),
    family("llm_phase_time_ratio", "gauge", "ratio",
           "Share of engine time in each phase: increase of prefill time / (prefill + decode time), from "
           "the per-batch forward-time histograms' _sum, else the per-request prefill/decode time "
           "histograms' _sum, else llama.cpp's per-slot llm_prefill_seconds_total/llm_decode_seconds_total "
           "(the last two weight decode by batch size). Absent when the engine reports none.",
           TM + ("phase",), "derived"),
    family("llm_mean_batch_size", "gauge", "sequences",
           "Mean of llm_requests_running over the rate window.", TM, "derived"),
    family("llm_decode_steps_per_second", "gauge", "steps/s",
           "Engine steps per second: the windowed rate of llm_engine_steps_total where the engine counts "
           "its forward passes (llama.cpp), else decode tokens/s / max(1, mean batch size): each step "
           "emits one token per running sequence.", TM, "derived"),
    family("llm_spec_decode_acceptance_ratio", "gauge", "ratio",
           "Speculative decoding: draft tokens accepted / draft tokens proposed over the rate window. "
           "Under about 0.5 the draft model costs more than it saves and decoding gets slower "
           "(LLMSpecDecodeLowAcceptance). Absent without speculative decoding.", TM, "derived"),
    family("llm_kv_cache_bytes_per_token", "gauge", "bytes",
           "KV cache bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per KV element, "
           "from the model shape (--model, else the engine's model name when it is a built-in shape); "
           "absent when the shape is unknown.", TM, "derived"),
    family("llm_kv_cache_used_tokens", "gauge", "tokens",
           "KV cache in use, in tokens = sum over ranks of llm_kv_cache_usage_ratio x "
           "llm_kv_cache_capacity_tokens.", TM, "derived"),
    family("llm_kv_cache_used_bytes", "gauge", "bytes",
           "KV cache in use, in bytes = used tokens x bytes per token.", TM, "derived"),
    family("llm_kv_cache_capacity_bytes", "gauge", "bytes",
           "KV cache capacity in bytes = llm_kv_cache_capacity_tokens x bytes per token.", TM, "derived"),
    family("llm_kv_cache_headroom_sequences", "gauge", "sequences",
           "Sequences of the current mean context that still fit = floor((capacity - used tokens) / mean "
           "context), mean context = used tokens / running sequences (with none running: mean prompt + "
           "output tokens of the requests finished in the window).",
           TM, "derived"),
    family("llm_hbm_bandwidth_bytes_per_second", "gauge", "bytes/s",
           "Achieved HBM bandwidth per GPU. source=model: decode steps/s x (weight bytes read per step x "
           "data-parallel ranks + KV used tokens x KV bytes per token) / (tensor-parallel x data-parallel "
           "GPUs); KV bytes per token from the model shape and kv_cache_dtype. source=gpm: "
           "llm_gpu_dram_bandwidth_utilization_ratio, averaged over the rate window the model's steps/s and "
           "the engine's estimate read (so the three cover the same seconds), x the card's peak bandwidth "
           "(exporter/specs/gpus.py). "
           "source=engine: the engine's own estimate of bytes read + written per GPU (vLLM "
           "estimated_read/write_bytes_per_gpu_total), as a rate.",
           TE + ("gpu", "source"), "derived"),
    family("llm_hbm_bandwidth_efficiency_ratio", "gauge", "ratio",
           "Achieved HBM bandwidth / the card's peak: source=model from the formula above, source=gpm the "
           "GPM DRAM_BW_UTIL ratio over the same window, source=engine the engine's own estimate; the gap between them "
           "is what the model does not explain (prefill traffic, activations, other processes).",
           TE + ("gpu", "source"), "derived"),
    family("llm_engine_flops_utilization_ratio", "gauge", "ratio",
           "The engine's own estimate of FLOP/s per GPU (vLLM estimated_flops_per_gpu_total, as a rate) / "
           "the card's peak dense FLOPS for the model's precision: engine-measured MFU over prefill and "
           "decode together, beside the modelled llm_prefill_mfu_ratio.", TE + ("gpu",), "derived"),
    family("llm_prefill_mfu_ratio", "gauge", "ratio",
           "Prefill model FLOPs utilization = prefill FLOPs per token at the window's mean prompt length "
           "(matmuls + attention; 2 x active params without a prompt-length histogram) x computed prompt "
           "tokens/s (prompt tokens minus prefix-cache hits) / (GPUs x peak dense FLOPS: FP8 peak for FP8 "
           "W8A8 models on cards with FP8, INT8 for INT8 W8A8, else BF16, weight-only AWQ/GPTQ included).",
           TM, "derived"),
    family("llm_energy_joules_per_token", "gauge", "joules",
           "GPU energy per generated token = sum over the target's GPUs of the rate of "
           "llm_gpu_energy_joules_total (else llm_gpu_power_watts) / decode tokens/s; absent while "
           "nothing is generated.",
           TM, "derived"),
    family("llm_cost_per_million_tokens", "gauge", "currency",
           "Cost of one million generated tokens = price per GPU-hour x GPUs / 3600 / decode tokens/s x "
           "1e6; absent without --gpu-price-per-hour.", TM, "derived"),
    family("llm_model_predicted_tpot_seconds", "gauge", "seconds",
           "The planner's cost model (llm-exporter plan, docs/planner.md) live: one decode step of the "
           "window's mean batch at its mean context on the target's GPUs, by the twin's roofline at the "
           "planner's prior fractions of peak (90% of HBM bandwidth, 60% of dense FLOPS, 0.3 ms a step). "
           "Needs the model shape and a GPU in the spec table.", TM, "derived"),
    family("llm_model_tpot_error_ratio", "gauge", "ratio",
           "The cost model's TPOT error: llm_model_predicted_tpot_seconds / observed TPOT - 1, observed "
           "TPOT = mean batch / decode tokens/s: what `llm-exporter plan` calibrates away. Steady: this "
           "deployment's efficiency; drifting: the model or the deployment changed. Negative under "
           "prompt-heavy load (prefill shares the steps).", TM, "derived"),
    family("llm_model_predicted_decode_tokens_per_second", "gauge", "tokens/s",
           "Mean batch / llm_model_predicted_tpot_seconds: the decode tokens/s the cost model expects "
           "for the window's batch.", TM, "derived"),
    family("llm_model_decode_throughput_error_ratio", "gauge", "ratio",
           "The cost model's throughput error: llm_model_predicted_decode_tokens_per_second / "
           "llm_decode_tokens_per_second - 1.", TM, "derived"),
    family("llm_slo_max_request_rate", "gauge", "requests/s",
           "The request rate at which this replica would break its SLOs (TTFT p99 <= --slo-ttft, TPOT <= "
           "--slo-tbt), for the window's mean prompt and output lengths and prefix-cache share: the live "
           "cost model's step time (llm_model_predicted_tpot_seconds' roofline at the planner's prior "
           "fractions of peak) at the largest batch that keeps TPOT within its SLO, the running-sequence "
           "limit and the KV cache, and TTFT p99 (an M/M/c wait for a slot plus the prefill step) within "
           "its SLO. Searched again at most every 10 s. Absent without the model shape, a GPU in the spec "
           "table, or requests finished in the window (docs/scaling.md).", TM, "derived"),
    family("llm_slo_load_ratio", "gauge", "ratio",
           "Requests finished per second in the window / llm_slo_max_request_rate: the share of this "
           "replica's SLO-bounded capacity in use (1: at the rate where it breaks its SLOs); what a "
           "per-replica autoscaler targets (docs/scaling.md).", TM, "derived"),
    family("llm_ttft_window_seconds", "gauge", "seconds",
           "Time-to-first-token quantiles (0.5, 0.95, 0.99) over the sliding window (--quantile-window, "
           "default 5m): current cumulative buckets minus a checkpoint one window old, interpolated "
           "as PromQL histogram_quantile() does. The quantile is the `q` label: `quantile` is reserved for "
           "summaries, and promtool check metrics refuses it on a gauge.",
           TM + (WINDOW_QUANTILE,), "derived"),
    family("llm_tbt_window_seconds", "gauge", "seconds",
           "Time-between-tokens (inter-token latency) quantiles over the sliding window, as above.",
           TM + (WINDOW_QUANTILE,), "derived"),
    family("llm_e2e_window_seconds", "gauge", "seconds",
           "End-to-end request latency quantiles over the sliding window, as above.", TM + (WINDOW_QUANTILE,),
           "derived"),
    family("llm_ttft_slo_attainment_ratio", "gauge", "ratio",
           "Share of requests in the window with TTFT <= bound = window count of the bucket `bound` / window "
           "total, where bound (a label: `le` is reserved for histograms) is the largest bucket bound at or "
           "below --slo-ttft (so it never flatters). The same window as llm_ttft_window_seconds and rate(): "
           "across an engine restart the requests before it count until they leave the window. Absent, "
           "never 0, while the window holds none (no recent traffic).",
           TM + (SLO_BOUND,), "derived"),
    family("llm_tbt_slo_attainment_ratio", "gauge", "ratio",
           "Share of inter-token gaps in the window <= bound, the largest bucket bound at or below "
           "--slo-tbt; the same window, and absent without any, as above.",
           TM + (SLO_BOUND,), "derived"),
    family("llm_bottleneck", "gauge", "bool",
           "The bottleneck verdict (docs/diagnosis.md): 1 for the resource that limits the target now, 0 "
           "for the others; absent on the first cycle and for unreachable targets. Resources: "
           + ", ".join(RESOURCES) + " (idle: no work; headroom: serving, no resource near its limit).",
           TE + ("resource",), "derived"),
    family("llm_bottleneck_score", "gauge", "score",
           "How strongly the evidence points at each resource (0..1; formulas in docs/diagnosis.md); the "
           "verdict follows the diagnosis order with hysteresis.", TE + ("resource",), "derived"),
    family("llm_unhealthy_gpus", "gauge", "gpus",
           "GPUs of the target with a fault that takes them out of service (docs/diagnosis.md, GPU health): "
           "a new uncorrected ECC error, an XID whose action is a restart, reset, reboot or RMA, a new row "
           "remapped for an uncorrectable error in the last hour; a pending or failed row remap, a recovery "
           "action other than none, or a GPU lost, while they last. Above 0 the diagnosis says UNHEALTHY "
           "before any bottleneck. Absent while the target has no GPU source.", TE, "derived"),
    family("llm_gpu_fault", "gauge", "bool",
           "1 for each fault llm_unhealthy_gpus counts, by GPU, fault (ecc_uncorrected, xid_<code>, "
           "remap_uncorrectable, remap_pending, remap_failed, recovery_action, lost) and the action it "
           "needs (restart_engine, reset_gpu, reboot_node, rma, or the driver's recovery action's name).",
           TE + ("gpu", "uuid", "fault", "action"), "derived"),
)
