"""vLLM (V1 engine >= 0.8 and the V0 engine <= 0.7): alias table. See docs/engines.md.

Priorities dedupe names that co-exist during vLLM's deprecation windows (deprecated in X.Y, hidden
in X.Y+1, removed in X.Y+2): the newer name has priority 2, the older 1.
"""

from exporter.sources.engines.table import Alias, EngineSpec, Product, Term

INFO = "vllm:cache_config_info"

ALIASES = {
    "vllm:num_requests_running": Alias("llm_requests_running", "gauge"),
    "vllm:num_requests_waiting": Alias("llm_requests_waiting", "gauge"),
    "vllm:kv_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", priority=2,
                                      note="a fraction 0..1 despite the name"),
    "vllm:gpu_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", priority=1,
                                       note="V0 / V1 <= 0.9 name of kv_cache_usage_perc"),
    "vllm:prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "vllm:generation_tokens_total": Alias("llm_generation_tokens_total", "counter"),
    "vllm:num_preemptions_total": Alias("llm_preemptions_total", "counter"),
    "vllm:request_success_total": Alias("llm_requests_finished_total", "counter", reason="other",
                                        note="finished_reason -> reason"),
    "vllm:prefix_cache_queries_total": Alias("llm_prefix_cache_queries_total", "counter", priority=2,
                                             note="counts tokens (>= 0.9)"),
    "vllm:prefix_cache_hits_total": Alias("llm_prefix_cache_hits_total", "counter", priority=2,
                                          note="counts tokens (>= 0.9)"),
    "vllm:gpu_prefix_cache_hit_rate": Alias("llm_prefix_cache_hit_ratio", "gauge", minimum=0.0,
                                            note="V0 gauge; -1 (prefix caching off) is dropped"),
    "vllm:time_to_first_token_seconds": Alias("llm_time_to_first_token_seconds", "histogram"),
    "vllm:inter_token_latency_seconds": Alias("llm_inter_token_latency_seconds", "histogram", priority=2),
    "vllm:time_per_output_token_seconds": Alias(
        "llm_inter_token_latency_seconds", "histogram", priority=1,
        note="old name of inter_token_latency_seconds (same data; both emitted in 0.11): new name wins"),
    "vllm:request_time_per_output_token_seconds": Alias("llm_time_per_output_token_seconds", "histogram"),
    "vllm:e2e_request_latency_seconds": Alias("llm_e2e_request_latency_seconds", "histogram"),
    "vllm:request_queue_time_seconds": Alias("llm_request_queue_time_seconds", "histogram", priority=2),
    "vllm:time_in_queue_requests": Alias("llm_request_queue_time_seconds", "histogram", priority=1,
                                         note="V0 duplicate of request_queue_time_seconds"),
    "vllm:request_prefill_time_seconds": Alias("llm_request_prefill_time_seconds", "histogram"),
    "vllm:request_decode_time_seconds": Alias("llm_request_decode_time_seconds", "histogram"),
    "vllm:request_inference_time_seconds": Alias("llm_request_inference_time_seconds", "histogram"),
    "vllm:request_prompt_tokens": Alias("llm_request_prompt_tokens", "histogram"),
    "vllm:request_generation_tokens": Alias("llm_request_generation_tokens", "histogram"),
    "vllm:iteration_tokens_total": Alias("llm_iteration_tokens", "histogram",
                                         note="a histogram despite the _total suffix"),
}

PRODUCTS = (
    Product("llm_kv_cache_capacity_tokens", "gauge",
            (Term(INFO, label="num_gpu_blocks"), Term(INFO, label="block_size")),
            note="cache_config_info labels num_gpu_blocks x block_size"),
    Product("llm_kv_cache_block_size_tokens", "gauge", (Term(INFO, label="block_size"),),
            note="cache_config_info label block_size"),
    # V1 0.8 counted prefix-cache lookups in blocks; hits are whole blocks, so x block_size is
    # tokens (queries: tokens in full blocks). Without cache_config_info there is no series.
    Product("llm_prefix_cache_queries_total", "counter",
            (Term("vllm:gpu_prefix_cache_queries_total"), Term(INFO, label="block_size")), priority=1,
            note="0.8 gpu_prefix_cache_queries counted blocks: x block_size"),
    Product("llm_prefix_cache_hits_total", "counter",
            (Term("vllm:gpu_prefix_cache_hits_total"), Term(INFO, label="block_size")), priority=1,
            note="0.8 gpu_prefix_cache_hits counted blocks: x block_size"),
)

SPEC = EngineSpec(
    kind="vllm",
    title="vLLM",
    aliases=ALIASES,
    products=PRODUCTS,
    labels={"model_name": "model", "engine": "rank", "finished_reason": "reason"},
    markers=(("\nvllm:",),),
    flavors=(("vllm:num_requests_swapped", "vllm-v0"), ("vllm:cpu_cache_usage_perc", "vllm-v0"),
             ("vllm:gpu_prefix_cache_hit_rate", "vllm-v0")),
    default_flavor="vllm-v1",
    notes=(
        "`engine` (the data-parallel engine index) becomes `rank`; `model_name` becomes `model`.",
        "`*_created` samples (V1 does not disable them) are not mapped.",
        "cache_config_info is set after KV profiling: capacity appears a few seconds after start.",
        "Not mapped: lora_requests_info (a timestamp value and adapter lists in labels), "
        "spec-decode counters, num_requests_swapped/cpu_cache_usage_perc (V0 swap), "
        "model_forward/execute_time_milliseconds (V0 tracing only), request_failure_total "
        "(labels not documented; would double-count reason=\"error\").",
        "Bucket bounds are kept as exposed (V0 TTFT stops at 10 s, V1 at 2560 s, and "
        "--custom-histogram-buckets can change them).",
    ),
)
