"""sglang-router (the SGLang model gateway, `smg_*`): sgl-model-gateway/src/observability/metrics.rs
of the 0.3.2 release and a live capture of the 0.3.2 wheel (tests/fixtures/routers/)."""

from types import MappingProxyType

from exporter.sources.routers.table import BREAKER_CODES, RouterAlias, RouterSpec

SPEC = RouterSpec(
    kind="sglang-router",
    title="sglang-router (SGLang model gateway)",
    markers=("smg_router_", "smg_worker_", "smg_http_"),
    versions=("0.3.2",),
    source="sgl-model-gateway/src/observability/metrics.rs of the 0.3.2 release, and a live capture of its wheel",
    labels=MappingProxyType({"worker": "backend", "error_code": "cause"}),
    causes=MappingProxyType({"no_workers": "no_backend", "no_available_workers": "no_backend", "timeout": "timeout",
                             "request_timeout": "timeout", "upstream_timeout": "timeout",
                             "call_upstream_request_error": "backend", "backend_error": "backend",
                             "rate_limited": "rejected", "too_many_requests": "rejected", "queue_full": "rejected",
                             "validation_error": "client", "invalid_request": "client", "bad_request": "client",
                             "model_not_found": "client", "internal_error": "other"}),
    policy_from=("smg_worker_selection_total", "policy"),
    aliases=MappingProxyType({
        "smg_router_requests_total": RouterAlias("llm_router_requests_total", "counter",
                                                 note="summed over router_type, backend_type, model, endpoint"),
        "smg_worker_cb_outcomes_total": (
            RouterAlias("llm_router_backend_requests_total", "counter",
                        note="the gateway counts no requests per backend; its breaker records every attempt's "
                             "outcome per backend, so success + failure is what was sent"),
            RouterAlias("llm_router_backend_errors_total", "counter", where=("outcome", "failure"))),
        "smg_worker_requests_active": RouterAlias("llm_router_backend_requests_active", "gauge"),
        "smg_router_request_duration_seconds": RouterAlias("llm_router_request_duration_seconds", "histogram"),
        "smg_worker_retries_total": RouterAlias("llm_router_retries_total", "counter"),
        "smg_worker_retries_exhausted_total": RouterAlias("llm_router_retries_exhausted_total", "counter"),
        "smg_http_responses_total": RouterAlias(
            "llm_router_errors_total", "counter", where_not=("error_code", ""),
            note="the HTTP layer's responses with an error code: every error once, in HTTP and gRPC mode"),
        "smg_worker_health": RouterAlias("llm_router_backend_up", "gauge", removed=-1.0),
        "smg_worker_cb_state": RouterAlias("llm_router_backend_breaker_state", "gauge", states=BREAKER_CODES,
                                           removed=-1.0),
        "smg_worker_pool_size": RouterAlias("llm_router_backends", "gauge", note="summed over worker types"),
    }),
    ignored=MappingProxyType({
        "smg_http_requests_total": "every HTTP request, health checks and /metrics included: the routed "
                                   "requests are smg_router_requests_total",
        "smg_http_request_duration_seconds": "every HTTP request's duration: the routed requests' is read",
        "smg_http_inflight_request_age_count": "in-flight requests by age bucket (HTTP layer)",
        "smg_router_request_errors_total": "the gRPC router's errors (the HTTP router never counts here); the HTTP "
                                           "layer's error responses count both once",
        "smg_http_rate_limit_total": "the rate limiter's decisions: a rejected request is an error response too",
        "smg_router_ttft_seconds": "router TTFT, but a summary in 0.3.2 (quantiles over the process's life, no "
                                   "buckets: not aggregatable over replicas or windows), and from the gRPC "
                                   "router only",
        "smg_router_tpot_seconds": "router TPOT: a summary in 0.3.2, from the gRPC router only (as ttft)",
        "smg_http_connections_active": "client connections (not requests)",
        "smg_router_stage_duration_seconds": "the gRPC pipeline's stages (tokenize, select, dispatch)",
        "smg_router_upstream_responses_total": "backend HTTP statuses: the breaker's outcomes per backend are read",
        "smg_router_tokens_total": "tokens through the gRPC router: the engines' token counters are read",
        "smg_router_generation_duration_seconds": "generation time (gRPC only): the request latency is read",
        "smg_worker_connections_active": "connections to workers by type (not requests)",
        "smg_worker_routing_keys_active": "routing keys per worker (consistent hashing state)",
        "smg_worker_health_checks_total": "health-check results: the health gauge says which backends are up",
        "smg_worker_selection_total": "selections per policy: read for the policy name",
        "smg_worker_errors_total": "worker errors by type (no backend named): the breaker's failures per backend",
        "smg_worker_cb_transitions_total": "breaker transitions: the state gauge says which backends are out",
        "smg_worker_cb_consecutive_failures": "the breaker's running count toward opening",
        "smg_worker_cb_consecutive_successes": "the breaker's running count toward closing",
        "smg_worker_retry_backoff_seconds": "sleep between retries: the retries counter counts them",
        "smg_manual_policy_*": "the manual policy's branches and cache",
        "smg_consistent_hashing_policy_branch_total": "the consistent-hash policy's branches",
        "smg_prefix_hash_policy_branch_total": "the prefix-hash policy's branches",
        "smg_discovery_*": "service discovery: the pool size counts the result",
        "smg_mcp_*": "MCP tool calls made by the gateway (agent features, not inference routing)",
        "smg_db_*": "the gateway's response and conversation store",
        "router_mesh_*": "state sync between gateway replicas (HA mesh)",
    }),
    notes=("No per-backend request counter: the breaker's outcomes stand in (0 with --disable-circuit-breaker).",
           "Router TTFT and TPOT are summaries from the gRPC router only: the time before the engine is read from "
           "the request latency, which for a streamed request ends at the response headers (the first chunk).",
           "Errors come from the HTTP layer's responses by error code (smg_router_request_errors_total is the "
           "gRPC router's)."),
)
