"""The normalized router schema: the layer that picks which engine replica gets a request
(vllm-router, the SGLang model gateway, Dynamo's frontend, the Gateway API inference extension's
endpoint picker), one family per concept whatever the router calls it.

Labels: `target` (the configured router target), `router` (detected kind), `backend` (an engine
replica as the router names it, reduced to host:port, bounded), `cause` for errors, `state` for the
circuit breaker. Derived router families (share, skew, backends out, time before the engine) are at
the end; exporter/derive/routing.py computes them."""

from exporter.catalog.base import family

R = ("target", "router")
B = ("target", "router", "backend")
HISTOGRAM_HELP = " Native bucket bounds of the router, in seconds."

ERROR_CAUSES: tuple[str, ...] = ("backend", "timeout", "no_backend", "rejected", "client", "other")
"""The `cause` of llm_router_errors_total, whatever the router calls it: backend (the engine answered
with a server error or the connection to it failed), timeout (the router gave up waiting for the
engine), no_backend (no healthy backend to send to: all out or none registered), rejected (the router
refused the request itself: rate limit, queue full or queue timeout), client (the request was invalid:
4xx), other (anything else the router names)."""

BREAKER_STATES: tuple[str, ...] = ("closed", "open", "half_open")
"""The `state` of llm_router_backend_breaker_state: closed (traffic flows), open (the router took the
backend out after consecutive failures), half_open (trial requests decide whether it comes back)."""

FAMILIES = (
    family("llm_router_up", "gauge", "bool",
           "1 when the router target's /metrics was scraped and parsed, 0 otherwise.", R, "router"),
    family("llm_router_info", "gauge", "info",
           "Always 1; labels name the detected router kind and its load-balancing policy as the page names "
           "it (empty when the page does not say).", ("target", "router", "policy"), "router"),
    family("llm_router_requests_total", "counter", "requests",
           "Requests the router received from clients (every route).", R, "router"),
    family("llm_router_backend_requests_total", "counter", "requests",
           "Requests the router sent to each backend (after its policy chose one; retries count again).",
           B, "router"),
    family("llm_router_backend_requests_active", "gauge", "requests",
           "Requests in flight at each backend, as the router counts them.", B, "router"),
    family("llm_router_requests_active", "gauge", "requests",
           "Requests the router holds (in flight or queued in the router), over all backends.", R, "router"),
    family("llm_router_requests_queued", "gauge", "requests",
           "Requests waiting in the router's own queue for a backend or a concurrency slot.", R, "router"),
    family("llm_router_request_duration_seconds", "histogram", "seconds",
           "Request latency as the router sees it, from arrival at the router to the last byte back."
           + HISTOGRAM_HELP, R, "router"),
    family("llm_router_time_to_first_token_seconds", "histogram", "seconds",
           "Time from arrival at the router to the first token it forwards: the engine's TTFT plus the "
           "time before the engine (router queue, policy, retries, network)." + HISTOGRAM_HELP, R, "router"),
    family("llm_router_time_per_output_token_seconds", "histogram", "seconds",
           "Mean time per output token of each request as the router forwards them." + HISTOGRAM_HELP,
           R, "router"),
    family("llm_router_retries_total", "counter", "requests",
           "Requests the router sent again (to the same or another backend) after a failure.", R, "router"),
    family("llm_router_retries_exhausted_total", "counter", "requests",
           "Requests that failed after the router's last retry.", R, "router"),
    family("llm_router_errors_total", "counter", "requests",
           "Requests the router answered with an error, by cause (ERROR_CAUSES: backend, timeout, "
           "no_backend, rejected, client, other).", ("target", "router", "cause"), "router"),
    family("llm_router_backend_errors_total", "counter", "requests",
           "Failed requests to each backend, as the router's circuit breaker counts them.", B, "router"),
    family("llm_router_backend_up", "gauge", "bool",
           "1 when the router's health check passes for the backend, 0 when the router marked it unhealthy.",
           B, "router"),
    family("llm_router_backend_breaker_state", "gauge", "bool",
           "1 for the backend's current circuit-breaker state (BREAKER_STATES: closed, open, half_open), "
           "0 for the others; open: the router took the backend out.", ("target", "router", "backend", "state"),
           "router"),
    family("llm_router_backends", "gauge", "count",
           "Backends the router has registered (healthy or not).", R, "router"),
    family("llm_router_pd_requests_total", "counter", "requests",
           "Prefill/decode disaggregated requests the router sent, by the stage the backend ran "
           "(`role` prefill or decode).", ("target", "router", "backend", "role"), "router"),
    # --- derived (exporter/derive/routing.py)
    family("llm_router_backend_share_ratio", "gauge", "ratio",
           "Each backend's share of the requests the router sent over the rate window.", B, "router"),
    family("llm_router_load_skew", "gauge", "times",
           "Load skew across the backends in rotation (up and breaker not open): the busiest backend's "
           "request rate over the mean, over the rate window; 1 is even, N is all traffic on one of N.",
           R, "router"),
    family("llm_router_backends_out", "gauge", "count",
           "Backends the router has taken out of rotation: health check failing or circuit breaker open.",
           R, "router"),
    family("llm_router_pre_engine_seconds", "gauge", "seconds",
           "Median time a request spends before the engine: the router's median TTFT (or median latency "
           "where the router has no TTFT) minus the median of the same over its backends' engines that this "
           "exporter reads, over the rate window. Omitted when no backend engine is read here.",
           R, "router"),
)
