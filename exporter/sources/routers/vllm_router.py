"""vllm-router (vllm-project/router, Rust; the SGLang router's fork for vLLM): src/metrics.rs of
0.1.17 and a live capture in front of two twins (tests/fixtures/routers/)."""

from types import MappingProxyType

from exporter.sources.routers.table import BREAKER_CODES, RouterAlias, RouterSpec

SPEC = RouterSpec(
    kind="vllm-router",
    title="vllm-router",
    markers=("vllm_router_",),
    versions=("0.1.17",),
    source="src/metrics.rs of vllm-project/router 0.1.17, and a live capture of the 0.1.17 wheel",
    labels=MappingProxyType({"worker": "backend", "error_type": "cause"}),
    causes=MappingProxyType({"no_available_workers": "no_backend", "server_selection": "no_backend",
                             "request_failed": "backend", "non_retryable_error": "backend", "timeout": "timeout",
                             "request_timeout": "timeout", "rate_limited": "rejected", "queue_full": "rejected",
                             "queue_timeout": "rejected", "invalid_request": "client", "bad_request": "client"}),
    policy_from=("vllm_router_policy_decisions_total", "policy"),
    aliases=MappingProxyType({
        "vllm_router_requests_total": RouterAlias("llm_router_requests_total", "counter",
                                                  note="summed over `route`"),
        "vllm_router_processed_requests_total": RouterAlias("llm_router_backend_requests_total", "counter"),
        "vllm_router_running_requests": RouterAlias("llm_router_backend_requests_active", "gauge"),
        "vllm_router_generate_duration_seconds": RouterAlias(
            "llm_router_request_duration_seconds", "histogram",
            note="0.1.17 records the OpenAI routes here (live capture), not in request_duration_seconds"),
        "vllm_router_pd_request_duration_seconds": RouterAlias("llm_router_request_duration_seconds", "histogram",
                                                               note="prefill/decode mode's requests"),
        "vllm_router_retries_total": RouterAlias("llm_router_retries_total", "counter"),
        "vllm_router_retries_exhausted_total": RouterAlias("llm_router_retries_exhausted_total", "counter"),
        "vllm_router_request_errors_total": RouterAlias("llm_router_errors_total", "counter"),
        "vllm_router_pd_errors_total": RouterAlias("llm_router_errors_total", "counter"),
        "vllm_router_cb_outcomes_total": RouterAlias("llm_router_backend_errors_total", "counter",
                                                     where=("outcome", "failure")),
        "vllm_router_worker_health": RouterAlias("llm_router_backend_up", "gauge"),
        "vllm_router_cb_state": RouterAlias("llm_router_backend_breaker_state", "gauge", states=BREAKER_CODES),
        "vllm_router_active_workers": RouterAlias("llm_router_backends", "gauge"),
        "vllm_router_pd_prefill_requests_total": RouterAlias("llm_router_pd_requests_total", "counter",
                                                             role="prefill"),
        "vllm_router_pd_decode_requests_total": RouterAlias("llm_router_pd_requests_total", "counter",
                                                            role="decode"),
    }),
    ignored=MappingProxyType({
        "vllm_router_request_duration_seconds": (
            "per-route latency that 0.1.17 does not record for the OpenAI routes (generate_duration does); "
            "mapping both would count a request twice"),
        "vllm_router_policy_decisions_total": "the policy's choices per backend: read for the policy name; "
                                              "processed_requests_total counts what was sent",
        "vllm_router_cb_state_transitions_total": "breaker transitions: the state gauge says which backends are out",
        "vllm_router_retry_backoff_duration_seconds": "sleep between retries: retries_total counts them",
        "vllm_router_worker_load": "the policy's own load estimate per backend (running_requests is the count)",
        "vllm_router_cache_hits_total": "cache-aware policy's prefix-tree matches (a routing input, not traffic)",
        "vllm_router_cache_misses_total": "cache-aware policy's prefix-tree misses",
        "vllm_router_tree_size": "cache-aware policy's prefix-tree size per backend",
        "vllm_router_load_balancing_events_total": "cache-aware policy falling back to load balancing",
        "vllm_router_max_load": "the policy's load extremes; the skew is derived from requests per backend",
        "vllm_router_min_load": "the policy's load extremes; the skew is derived from requests per backend",
        "vllm_router_pd_requests_total": "prefill/decode requests by route: the per-backend counters are read",
        "vllm_router_pd_prefill_errors_total": "per-stage failures; the breaker's failure outcomes count every backend",
        "vllm_router_pd_decode_errors_total": "per-stage failures; the breaker's failure outcomes count every backend",
        "vllm_router_pd_stream_errors_total": "streaming failures in PD mode; the request errors count the request",
        "vllm_router_pd_*": "prefill/decode scheduling internals (token budgets, affinity, KV preparation)",
        "vllm_router_discovery_*": "Kubernetes service discovery events: active_workers counts the result",
        "vllm_router_embeddings_*": "the embeddings route (not token generation)",
        "vllm_router_agent_aware_*": "program-level scheduling internals (--enable-program-scheduling)",
        "vllm_router_workflow_*": "program-level scheduling's output and return predictions",
        "vllm_router_kv_*": "kv_aware policy's KV-event inputs (a routing input, not traffic)",
        "vllm_router_prefix_routing_decisions_total": "kv_aware/prefix policy decisions (a routing input)",
        "vllm_tokenizer_*": "the router's own tokenizer (cache, encode/decode time): CPU of the router process",
    }),
    notes=("No router-side TTFT in 0.1.17: the time before the engine is read from the request latency.",),
)
