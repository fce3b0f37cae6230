"""vLLM (V1 engine >= 0.8 and the V0 engine <= 0.7, and Triton's vLLM backend): alias table.
See docs/engines.md.

Priorities dedupe names that co-exist during vLLM's deprecation windows (deprecated in X.Y, hidden
in X.Y+1, removed in X.Y+2): the newer name has priority 2, the older 1.

vllm:gpu_prefix_cache_{queries,hits} changed unit without changing name: V1 0.8 counted blocks,
later releases (before the 0.9/0.10 rename to prefix_cache_*) count tokens. Only the HELP text
says which ("in terms of number of queried blocks" / "...tokens"); the parser does not read HELP
lines, so the aliases test the raw page for the blocks wording (`when`, one substring scan each):
blocks -> x block_size from cache_config_info, anything else (tokens, or no HELP) -> as is.
"""

from exporter.sources.engines.table import COMMON_IGNORED, US, Alias, Aliases, EngineSpec, Product, Term
from exporter.sources.engines.triton import IGNORED as TRITON_IGNORED

INFO = "vllm:cache_config_info"
KV_FETCH = "vllm:num_requests_kv_fetch_by_stage"
QUERIES_IN_BLOCKS = "prefix cache queries, in terms of number of queried blocks"
HITS_IN_BLOCKS = "prefix cache hits, in terms of number of cached blocks"

ALIASES: Aliases = {
    "vllm:num_requests_running": Alias("llm_requests_running", "gauge"),
    "vllm:num_requests_waiting": Alias("llm_requests_waiting", "gauge"),
    "vllm:kv_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", priority=2,
                                      note="a fraction 0..1 despite the name"),
    "vllm:gpu_cache_usage_perc": Alias("llm_kv_cache_usage_ratio", "gauge", priority=1,
                                       note="V0 / V1 <= 0.9 name of kv_cache_usage_perc"),
    "vllm:prompt_tokens_total": Alias("llm_prompt_tokens_total", "counter"),
    "vllm:generation_tokens_total": Alias("llm_generation_tokens_total", "counter"),
    "vllm:num_preemptions_total": Alias("llm_preemptions_total", "counter"),
    "vllm:request_success_total": Alias("llm_requests_finished_total", "counter", priority=2, reason="other",
                                        note="finished_reason -> reason"),
    "vllm:admission_rejections_total": Alias(
        "llm_requests_finished_total", "counter", priority=2, reason="rejected",
        note="requests refused before the queue (max_num_queued_reqs/tokens limits, HTTP 503): reason "
             "\"rejected\", whatever vLLM's own reason label; no `engine` label, so no rank"),
    "vllm:request_render_duration_seconds": Alias(
        "llm_request_render_time_seconds", "histogram",
        note="chat template and tokenization before the queue (>= 0.33): inside vLLM's TTFT; `request_type` "
             "dropped and summed"),
    "vllm:prefix_cache_queries_total": Alias("llm_prefix_cache_queries_total", "counter", priority=2,
                                             note="counts tokens (>= 0.9)"),
    "vllm:prefix_cache_hits_total": Alias("llm_prefix_cache_hits_total", "counter", priority=2, tier="device",
                                          note="counts tokens (>= 0.9); the local (GPU) cache only"),
    "vllm:external_prefix_cache_hits_total": Alias(
        "llm_prefix_cache_hits_total", "counter", priority=2, tier="external",
        note="tokens a KV connector (LMCache, NIXL, Mooncake) supplied: counted in prompt_tokens_total, "
             "not computed"),
    "vllm:gpu_prefix_cache_queries_total": Alias(
        "llm_prefix_cache_queries_total", "counter", priority=1, when=(QUERIES_IN_BLOCKS, False),
        note="old name of prefix_cache_queries; counts tokens unless its HELP says blocks (0.8: see below)"),
    "vllm:gpu_prefix_cache_hits_total": Alias(
        "llm_prefix_cache_hits_total", "counter", priority=1, when=(HITS_IN_BLOCKS, False), tier="device",
        note="old name of prefix_cache_hits; counts tokens unless its HELP says blocks (0.8: see below)"),
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
    "vllm:estimated_flops_per_gpu_total": Alias("llm_engine_estimated_flops_total", "counter",
                                                note="vLLM's own per-GPU estimate (>= 0.11)"),
    "vllm:estimated_read_bytes_per_gpu_total": Alias("llm_engine_estimated_read_bytes_total", "counter"),
    "vllm:estimated_write_bytes_per_gpu_total": Alias("llm_engine_estimated_write_bytes_total", "counter"),
    "vllm:spec_decode_num_draft_tokens_total": Alias("llm_spec_decode_draft_tokens_total", "counter"),
    "vllm:spec_decode_num_accepted_tokens_total": Alias("llm_spec_decode_accepted_tokens_total", "counter"),
    "vllm:spec_decode_num_drafts_total": Alias("llm_spec_decode_drafts_total", "counter"),
    # PD disaggregation through a KV connector (vllm/distributed/kv_transfer/kv_connector/v1/{nixl,mooncake}/
    # stats.py). Both connectors use the same bucket bounds, so on a page with both (MultiConnector) their
    # transfers add up bucket by bucket; bounds that ever differ make the merged histogram invalid and it
    # is dropped with a note, never mixed silently.
    "vllm:nixl_xfer_time_seconds": Alias(
        "llm_kv_transfer_seconds", "histogram",
        note="NIXL is pull-based: the decode (reading) instance records each transfer operation"),
    "vllm:mooncake_xfer_time_seconds": Alias(
        "llm_kv_transfer_seconds", "histogram",
        note="Mooncake is push-based: the prefill (sending) instance records each transfer"),
    "vllm:nixl_bytes_transferred": Alias("llm_kv_transfer_bytes", "histogram"),
    "vllm:mooncake_bytes_transferred": Alias("llm_kv_transfer_bytes", "histogram"),
    # Triton's vLLM backend: the vllm:* families above (labels `model`, `version`) beside Triton's
    # core per-model counters, which carry what the backend does not export (finished requests).
    "nv_inference_request_success": Alias("llm_requests_finished_total", "counter", priority=1, reason="other",
                                          note="Triton vLLM backend: Triton's per-model counter"),
    "nv_inference_request_failure": Alias("llm_requests_finished_total", "counter", priority=1, reason="error",
                                          note="Triton vLLM backend"),
    "nv_inference_request_duration_us": Alias("llm_request_duration_seconds_total", "counter", scale=US,
                                              note="Triton vLLM backend: cumulative microseconds -> seconds"),
    "nv_inference_queue_duration_us": Alias("llm_request_queue_seconds_total", "counter", scale=US,
                                            note="Triton vLLM backend: Triton's queue, cumulative µs -> seconds"),
    "nv_inference_pending_request_count": Alias("llm_requests_pending", "gauge",
                                                note="Triton vLLM backend: requests in Triton's queue"),
}

PRODUCTS = (
    Product("llm_kv_cache_capacity_tokens", "gauge", (Term(INFO, label="kv_cache_size_tokens"),), priority=2,
            note="cache_config_info label kv_cache_size_tokens (>= 0.33): this engine's own capacity, right "
                 "for data parallel and hybrid models"),
    Product("llm_kv_cache_capacity_tokens", "gauge",
            (Term(INFO, label="num_gpu_blocks"), Term(INFO, label="block_size")), priority=1,
            note="older releases: cache_config_info labels num_gpu_blocks x block_size. With data parallel "
                 "num_gpu_blocks is the sum over the DP engines, so this is N times one engine's capacity: "
                 "only on pages without kv_cache_size_tokens"),
    Product("llm_requests_waiting_kv_transfer", "gauge",
            (Term(KV_FETCH, where=("stage", "waiting_to_start")), Term(KV_FETCH, where=("stage", "in_progress"))),
            add=True,
            note="KV consumers (kv_consumer, kv_both) only: requests whose async KV load has not started or not "
                 "finished. `completed_waiting` (loaded, waiting for a slot) is left out: like SGLang's, such a "
                 "request only waits to be scheduled. All three stages are inside num_requests_waiting"),
    Product("llm_kv_transfer_failures_total", "counter",
            (Term("vllm:nixl_num_failed_transfers_total"), Term("vllm:mooncake_num_failed_transfers_total"),
             Term("vllm:mooncake_num_failed_recvs_total")), add=True,
            note="NIXL failed transfer operations, its handshake and notification failures included "
                 "(nixl_num_failed_notifications repeats the latter and is not added); Mooncake failed sends "
                 "(prefill) and receives (decode)"),
    Product("llm_kv_cache_block_size_tokens", "gauge", (Term(INFO, label="block_size"),),
            note="cache_config_info label block_size"),
    Product("llm_kv_cache_memory_bytes", "gauge", (Term(INFO, label="kv_cache_memory_bytes"),),
            note="cache_config_info label kv_cache_memory_bytes (newer releases)"),
    # V1 0.8 counted prefix-cache lookups in blocks (HELP "... number of queried blocks"); hits
    # are whole blocks, so x block_size is tokens (queries: tokens in full blocks). Without
    # cache_config_info there is no series. Later releases count tokens under the same name.
    Product("llm_prefix_cache_queries_total", "counter",
            (Term("vllm:gpu_prefix_cache_queries_total"), Term(INFO, label="block_size")), priority=1,
            when=(QUERIES_IN_BLOCKS, True),
            note="0.8 gpu_prefix_cache_queries counted blocks (its HELP says so): x block_size"),
    Product("llm_prefix_cache_hits_total", "counter",
            (Term("vllm:gpu_prefix_cache_hits_total"), Term(INFO, label="block_size")), priority=1,
            when=(HITS_IN_BLOCKS, True), tier="device",
            note="0.8 gpu_prefix_cache_hits counted blocks (its HELP says so): x block_size"),
)

SPEC = EngineSpec(
    kind="vllm",
    title="vLLM",
    aliases=ALIASES,
    products=PRODUCTS,
    # `model` is the Triton vLLM backend's model label (its `version` is dropped, series merged).
    labels={"model_name": "model", "model": "model", "engine": "rank", "finished_reason": "reason"},
    markers=(("\nvllm:",),),
    flavors=(("nv_inference_", "triton-vllm"), ("vllm:num_requests_swapped", "vllm-v0"),
             ("vllm:cpu_cache_usage_perc", "vllm-v0"), ("vllm:gpu_prefix_cache_hit_rate", "vllm-v0")),
    default_flavor="vllm-v1",
    waiting_includes_kv_transfer=True,
    reasons={"repetition": "stop"},
    versions=("0.7", "0.8", "0.9.0", "0.11", "0.32.0 (live)", "0.34.0"),
    ignored={
        "vllm:num_requests_waiting_by_reason": "the waiting queue split by reason (capacity, deferred); "
                                               "llm_requests_waiting is its total",
        "vllm:engine_sleep_state": "sleep mode (awake, weights_offloaded, discard_all): an operator's "
                                   "state, not a load signal",
        "vllm:prompt_tokens_by_source_total": "llm_prompt_tokens_total split by source (local_compute, "
                                              "local_cache_hit, external_kv_transfer): the hits by tier carry "
                                              "the same split",
        "vllm:prompt_tokens_cached_total": "cached prompt tokens of every tier: llm_prefix_cache_hits_total "
                                           "{tier=device|external} has them apart",
        "vllm:prompt_tokens_cached_by_source_total": "as prompt_tokens_cached_total, by source",
        "vllm:external_prefix_cache_queries_total": "connector lookups of the tokens the local cache missed: a "
                                                    "subset of prefix_cache_queries, so not added to it",
        "vllm:mm_cache_*": "the multimodal encoder cache (items, not tokens): no bottleneck of text serving",
        "vllm:request_max_num_generation_tokens": "the client's requested output bound per request",
        "vllm:request_params_*": "client request parameters (n, max_tokens), not engine behaviour",
        "vllm:request_num_preemptions": "preemptions per finished request; llm_preemptions_total has the rate",
        "vllm:request_prefill_kv_computed_tokens": "prompt tokens computed per request (cache hits left "
                                                   "out); the window's computed share comes from the counters",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total": "per draft position: the acceptance ratio needs "
                                                              "only the totals",
        "vllm:lora_requests_info": "a timestamp value with adapter lists in its labels",
        "vllm:num_requests_swapped": "V0 swap",
        "vllm:cpu_cache_usage_perc": "V0 swap",
        "vllm:cpu_prefix_cache_hit_rate": "V0 swap space's prefix cache",
        "vllm:model_forward_time_milliseconds": "V0 tracing only",
        "vllm:model_execute_time_milliseconds": "V0 tracing only",
        "vllm:request_failure_total": "labels not documented; would double-count reason=\"error\"",
        "vllm:corrupted_requests_total": "requests whose logits held NaNs (VLLM_COMPUTE_NANS_IN_LOGITS debug "
                                         "mode): a model-numerics alarm, not load",
        "vllm:watermark_requests_total": "requests watermarked (a feature's usage count)",
        "vllm:kv_block_*": "KV block residency (lifetime, idle before eviction, reuse gap), opt-in "
                           "--kv-cache-metrics: cache tuning detail; usage and preemptions carry the pressure",
        "vllm:kv_offload_*": "KV offload to CPU/disk tiers (legacy transfer_type and flat load/store names, "
                             "tiering): transfer volume and time, not yet a normalized family",
        "vllm:simple_kv_offload_*": "the simple KV offload connector's blocks and config",
        "vllm:nixl_*": "NIXL transfer detail (post time, descriptors per transfer, KV expiry and late "
                       "notifications; num_failed_notifications is inside num_failed_transfers, which is mapped)",
        "vllm:mooncake_*": "Mooncake transfer detail (descriptors, KV expiry) and the Mooncake KV store's "
                           "operations",
        "vllm:hf3fs_*": "hf3fs KV store load/save",
        "vllm:hisparse_*": "HiSparse host KV cache",
        "vllm:umbp_*": "UMBP KV connector",
        "vllm:lmcache_*": "LMCache connector's own statistics",
        "vllm:diffusion_*": "diffusion-LM decoding (canvas positions, denoising steps)",
        "vllm:rl_*": "online RL weight updates (duration, in flight)",
        "vllm:sleep_mode_*": "sleep-mode operations (duration, in flight): an operator's action, not load",
        "vllm:kvcr_*": "KV cache relocation (KVCR) operations, bytes and blocks: transfer detail",
        "vllm:tool_call_parser_*": "tool-call parser invocations: API features, not engine load",
        "vllm:reasoning_parser_*": "reasoning parser invocations: API features, not engine load",
        "vllm:websocket_*": "realtime websocket sessions of the API server",
        "vllm:realtime_*": "realtime API sessions",
        "vllm:api_server_*": "API-server process bookkeeping",
        **{name: why for name, why in TRITON_IGNORED.items() if name.startswith("nv_")},
        **COMMON_IGNORED,
    },
    notes=(
        "`engine` (the data-parallel engine index) becomes `rank`; `model_name` becomes `model`.",
        "`*_created` samples (V1 does not disable them) are not mapped.",
        "cache_config_info is set after KV profiling: capacity appears a few seconds after start.",
        "Data parallel: every engine's cache_config_info repeats num_gpu_blocks summed over the DP engines "
        "(the API server adds each engine's blocks as it reports ready), so blocks x block_size is N times "
        "one engine's capacity; kv_cache_size_tokens (>= 0.33, also right for hybrid models whose block "
        "size is enlarged) is each engine's own and wins wherever it is on the page.",
        "`prompt_tokens_total` counts every prompt token, the cached ones included; "
        "`prefix_cache_hits_total` (tokens, tier `device`) is the locally cached share and "
        "`external_prefix_cache_hits_total` (tier `external`) what a KV connector supplied, so the computed "
        "prompt tokens are the prompt tokens less both (the same split as llama.cpp's).",
        "Waiting semantics: num_requests_waiting (llm_requests_waiting) includes the requests deferred for a "
        "KV load (num_requests_waiting_by_reason{reason=\"deferred\"}), so llm_requests_waiting_kv_transfer "
        "is a part of it, not an addition.",
        "PD role: the page does not say. num_requests_kv_fetch_by_stage exists on KV consumers, but kv_both "
        "(what NIXL deployments run on prefill and decode instances alike) is a consumer too, and no metric "
        "carries kv_role: set the target's `role` option; otherwise `both`.",
        "TTFT starts when rendering starts: request_render_duration_seconds (llm_request_render_time_seconds) "
        "is the chat-template and tokenization part of it.",
        "Bucket bounds are kept as exposed (V0 TTFT stops at 10 s, V1 at 2560 s, and "
        "--custom-histogram-buckets can change them).",
        "gpu_prefix_cache_queries/hits: V1 0.8 counted blocks, later releases count tokens under "
        "the same name. The unit is read from the page's HELP text (\"in terms of number of queried "
        "blocks\"): blocks are multiplied by cache_config_info's block_size (no series before it is "
        "set); any other HELP, or none, is taken as tokens.",
        "Triton with the vLLM backend (`nv_inference_*` beside `vllm:*`, flavor `triton-vllm`) is "
        "read with this table: the backend's `vllm:*` families (labels `model`, `version`) plus "
        "Triton's per-model request counters (finished, duration, queue time; Triton's TTFT "
        "histogram is not read, vLLM's is). No rank label; every Triton model keeps its `model`.",
    ),
)
