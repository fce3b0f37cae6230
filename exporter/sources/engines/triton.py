"""Triton Inference Server (port 8002) with the tensorrtllm backend: alias table. See docs/engines.md."""

from exporter.sources.engines.table import MS, US, Alias, Aliases, EngineSpec, Product, Term

BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
BLOCK_TYPE = "kv_cache_block_type"

ALIASES: Aliases = {
    "nv_trt_llm_request_metrics": (
        Alias("llm_requests_running", "gauge", where=("request_type", "active")),
        Alias("llm_requests_waiting", "gauge", where=("request_type", "waiting"),
              note="request_type=\"waiting\" exists in newer backends only"),
        Alias("llm_requests_running_max", "gauge", where=("request_type", "max")),
    ),
    BLOCKS: (
        Alias("llm_kv_cache_usage_ratio", "gauge", where=(BLOCK_TYPE, "fraction"), priority=2),
        Alias("llm_kv_cache_block_size_tokens", "gauge", where=(BLOCK_TYPE, "tokens_per")),
    ),
    "nv_inference_request_success": Alias("llm_requests_finished_total", "counter", reason="other"),
    "nv_inference_request_failure": Alias(
        "llm_requests_finished_total", "counter", reason="error",
        note="`reason` (newer Triton): REJECTED -> rejected, CANCELED -> abort, BACKEND and OTHER -> error; "
             "without it, error"),
    "nv_inference_pending_request_count": Alias(
        "llm_requests_pending", "gauge",
        note="Triton's own queue in front of the model; the TRT-LLM backend takes requests at once and queues "
             "them internally (request_type=\"waiting\"), so with it this reads near 0"),
    "nv_inference_request_duration_us": Alias("llm_request_duration_seconds_total", "counter", scale=US,
                                              note="cumulative microseconds -> seconds"),
    "nv_inference_queue_duration_us": Alias("llm_request_queue_seconds_total", "counter", scale=US,
                                            note="cumulative microseconds -> seconds"),
    "nv_inference_first_response_histogram_ms": Alias(
        "llm_time_to_first_token_seconds", "histogram", scale=MS,
        note="opt-in (histogram_latencies=true), ms: `le` and `_sum` -> seconds; first response chunk"),
}

PRODUCTS = (
    Product("llm_kv_cache_capacity_tokens", "gauge",
            (Term(BLOCKS, where=(BLOCK_TYPE, "max")), Term(BLOCKS, where=(BLOCK_TYPE, "tokens_per"))),
            note="max blocks x tokens_per block"),
    Product("llm_kv_cache_usage_ratio", "gauge",
            (Term(BLOCKS, where=(BLOCK_TYPE, "used")), Term(BLOCKS, where=(BLOCK_TYPE, "max"), divide=True)),
            priority=1, note="used / max blocks when the backend has no `fraction`"),
)

IGNORED = {
    "nv_inference_count": "inferences performed (a batched request counts each of its items)",
    "nv_inference_exec_count": "model executions (batches): with nv_inference_count, Triton's own batching",
    "nv_inference_compute_input_duration_us": "time copying inputs to the model",
    "nv_inference_compute_infer_duration_us": "time in the model's execute call: the decoupled TRT-LLM backend "
                                              "returns from it once a request is enqueued, so it is not GPU time",
    "nv_inference_compute_output_duration_us": "time copying outputs from the model",
    "nv_inference_*_summary_us": "summaries of the duration counters (quantiles over Triton's own window)",
    "nv_cache_*": "Triton's response cache (whole responses by input hash), not the KV cache",
    "nv_gpu_*": "GPU power, utilization and memory: the GPU source reads NVML directly",
    "nv_energy_consumption": "GPU energy: the GPU source reads NVML directly",
    "nv_cpu_*": "host CPU and memory: the host source reads /proc",
    "nv_pinned_memory_pool_*": "Triton's pinned host memory pool",
    "nv_trt_llm_runtime_memory_metrics": "TRT-LLM runtime memory by type (cpu, gpu, pinned)",
    "nv_trt_llm_inflight_batcher_metrics": "inflight batcher detail (context tokens, generation requests, "
                                           "micro batch id, paused requests)",
    "nv_trt_llm_v1_metrics": "the V1 (static) batcher's detail",
    "nv_trt_llm_general_metrics": "the backend's timestamp and iteration counter",
    "nv_trt_llm_disaggregated_serving_metrics": "PD disaggregation: a counter pair, KV transfer milliseconds "
                                                "and requests, summed since start: no per-transfer distribution "
                                                "for llm_kv_transfer_seconds (its ratio of rates is the mean)",
    "nv_llm_*": "token-length histograms of the LLM API front end (secondary source)",
    "nv_model_load_duration_secs": "model load time (startup)",
}

SPEC = EngineSpec(
    kind="triton",
    title="Triton + TensorRT-LLM backend",
    aliases=ALIASES,
    products=PRODUCTS,
    labels={"model": "model", "reason": "reason"},  # `version` (the model version) is dropped and merged
    reasons={"rejected": "rejected", "canceled": "abort", "cancelled": "abort", "backend": "error",
             "other": "error"},
    markers=(("\nnv_trt_llm_",), ("\nnv_inference_",)),
    flavors=(("nv_trt_llm_", "triton-trtllm"),),
    default_flavor="triton",
    versions=("23.11", "newer (2024)", "26.09"),
    ignored=IGNORED,
    notes=(
        "Every Triton model (ensemble, preprocessing, tensorrt_llm, postprocessing) keeps its own "
        "`model` label: the core nv_inference_* counters are per model, so a sum over models counts "
        "an ensemble and its tensorrt_llm model twice.",
        "No ITL, TPOT, token counters or per-request prefill/decode times: those series are absent. "
        "TTFT exists only with `--metrics-config histogram_latencies=true`, in ms, and measures the "
        "first response chunk.",
        "Triton before 23.12 reported 0 for nv_inference_* with the TRT-LLM backend: those zeros "
        "are the engine's, passed through.",
    ),
)
