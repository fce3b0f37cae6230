"""NVIDIA Dynamo's frontend (`dynamo_frontend_*`): lib/llm/src/http/service/metrics.rs and
lib/runtime/src/metrics/prometheus_names.rs of the 1.6 release. Dynamo does not run on this project's
machines (its workers need GPUs); the table is read from the source, and the conformance fixture is a
page written from it (tests/fixtures/routers/)."""

from types import MappingProxyType

from exporter.sources.routers.table import RouterAlias, RouterSpec

SPEC = RouterSpec(
    kind="dynamo",
    title="NVIDIA Dynamo frontend",
    markers=("dynamo_frontend_",),
    versions=("1.6.1",),
    source="lib/llm/src/http/service/metrics.rs of ai-dynamo/dynamo 1.6 (not run here: its workers need GPUs)",
    labels=MappingProxyType({"error_type": "cause", "worker_id": "backend"}),
    causes=MappingProxyType({"unavailable": "no_backend", "response_timeout": "timeout", "overload": "rejected",
                             "validation": "client", "not_found": "client", "not_implemented": "client",
                             "internal": "other", "cancelled": "other"}),
    aliases=MappingProxyType({
        "dynamo_frontend_requests_total": (
            RouterAlias("llm_router_requests_total", "counter", note="every status"),
            RouterAlias("llm_router_errors_total", "counter", where=("status", "error"))),
        "dynamo_frontend_model_rejection_total": RouterAlias("llm_router_errors_total", "counter", cause="rejected",
                                                             note="HTTP 529 when the workers are saturated"),
        "dynamo_frontend_inflight_requests": RouterAlias("llm_router_requests_active", "gauge"),
        "dynamo_frontend_router_queue_pending_requests": RouterAlias("llm_router_requests_queued", "gauge",
                                                                     note="the KV router's scheduler queue"),
        "dynamo_frontend_request_duration_seconds": RouterAlias("llm_router_request_duration_seconds", "histogram"),
        "dynamo_frontend_time_to_first_token_seconds": RouterAlias("llm_router_time_to_first_token_seconds",
                                                                   "histogram"),
    }),
    ignored=MappingProxyType({
        "dynamo_frontend_requests_started_total": "requests accepted (newer releases): requests_total counts them",
        "dynamo_frontend_active_requests": "inflight_requests under its newer name (read once, as inflight)",
        "dynamo_frontend_queued_requests": "requests not yet at their first token (prefill included), not a "
                                           "router queue: the KV router's pending queue is read",
        "dynamo_frontend_disconnected_clients": "clients that left (the engines count aborts)",
        "dynamo_frontend_inter_token_latency_seconds": "gaps between tokens as the frontend forwards them: the "
                                                       "engines' inter-token histograms are read",
        "dynamo_frontend_input_sequence_tokens": "prompt lengths: the engines' prompt-token histograms are read",
        "dynamo_frontend_output_sequence_tokens": "output lengths: the engines' histograms are read",
        "dynamo_frontend_cached_tokens": "prefix-cache hits per request: the engines' prefix counters are read",
        "dynamo_frontend_tokenizer_latency_ms": "the frontend's tokenizer time (CPU of the frontend)",
        "dynamo_frontend_output_tokens_total": "output tokens: the engines' token counters are read",
        "dynamo_frontend_embedding_latency_seconds": "the embeddings route (not token generation)",
        "dynamo_frontend_*_per_request": "multimodal parts per request",
        "dynamo_frontend_model_*": "the served model's configuration (KV blocks, max sequences, context) and "
                                   "migrations: the engines report their own",
        "dynamo_frontend_worker_*": "the last request's TTFT/ITL and KV load per worker: single values, no counts "
                                    "(no per-worker request counter exists to derive a share from)",
        "dynamo_frontend_kv_hit_rate": "the KV router's predicted hit rate (a routing input)",
        "dynamo_frontend_lora_*": "LoRA placement",
        "dynamo_frontend_failures_total": "terminal request failures (1.6.1): requests_total{status=\"error\"} "
                                          "counts them with their error type",
        "dynamo_frontend_router_queue_pending_*_tokens": "the KV router queue's prompt and cached tokens "
                                                         "(its request count is read)",
        "dynamo_frontend_stage_*": "requests and time per pipeline stage (preprocess, route, dispatch)",
        "dynamo_frontend_tokenize_seconds": "the preprocessor's tokenization time (CPU of the frontend)",
        "dynamo_frontend_template_seconds": "the preprocessor's chat-template time (CPU of the frontend)",
        "dynamo_frontend_tokenizer_cache_*": "the frontend's tokenizer cache",
        "dynamo_frontend_detokenize_*": "the frontend's detokenizer time and tokens",
        "dynamo_frontend_event_loop_*": "the frontend's async runtime health (event loop delay and stalls)",
    }),
    notes=("No per-worker request counter: the share and skew across workers are not derived for Dynamo; the "
           "engines' own request rates on the fleet board show them.",),
)
