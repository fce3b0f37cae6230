"""Triton Inference Server (port 8002) with the tensorrtllm backend: alias table. See docs/engines.md."""

from exporter.sources.engines.table import MS, US, Alias, EngineSpec, Product, Term

BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
BLOCK_TYPE = "kv_cache_block_type"

ALIASES = {
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
    "nv_inference_request_failure": Alias("llm_requests_finished_total", "counter", reason="error"),
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

SPEC = EngineSpec(
    kind="triton",
    title="Triton + TensorRT-LLM backend",
    aliases=ALIASES,
    products=PRODUCTS,
    labels={"model": "model"},  # `version` (the model version) is dropped and its series merged
    markers=(("\nnv_trt_llm_",), ("\nnv_inference_",)),
    flavors=(("nv_trt_llm_", "triton-trtllm"),),
    default_flavor="triton",
    notes=(
        "Every Triton model (ensemble, preprocessing, tensorrt_llm, postprocessing) keeps its own "
        "`model` label: the core nv_inference_* counters are per model.",
        "No ITL, TPOT, token counters or per-request prefill/decode times: those series are absent. "
        "TTFT exists only with `--metrics-config histogram_latencies=true`, in ms, and measures the "
        "first response chunk.",
        "Triton before 23.12 reported 0 for nv_inference_* with the TRT-LLM backend: those zeros "
        "are the engine's, passed through.",
        "Not mapped: nv_inference_pending_request_count (Triton's queue; the TRT-LLM backend queues "
        "internally, so it reads 0 while requests wait), runtime memory, inflight-batcher and "
        "general metrics, nv_llm_*_token_len (secondary source only), nv_gpu_* (the GPU source "
        "reads NVML directly).",
    ),
)
