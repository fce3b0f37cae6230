"""The Gateway API Inference Extension's endpoint picker (EPP; llm-d's inference scheduler builds on
it): pkg/epp/metrics/metrics.go of kubernetes-sigs/gateway-api-inference-extension. It runs as a
gateway's ext-proc beside Envoy and a Kubernetes API server, not here; the table is read from the
source, and the conformance fixture is a page written from it (tests/fixtures/routers/)."""

from types import MappingProxyType

from exporter.sources.routers.table import RouterAlias, RouterSpec

SPEC = RouterSpec(
    kind="epp",
    title="Gateway API Inference Extension endpoint picker (llm-d)",
    markers=("inference_objective_", "inference_extension_", "inference_pool_"),
    versions=("1.2",),
    source="pkg/epp/metrics/metrics.go of kubernetes-sigs/gateway-api-inference-extension (not run here)",
    labels=MappingProxyType({"error_code": "cause", "pod_name": "backend"}),
    causes=MappingProxyType({"serviceunavailable": "no_backend", "modelservererror": "backend",
                             "internal": "other", "unknown": "other", "badrequest": "client",
                             "unauthorized": "client", "forbidden": "client", "notfound": "client",
                             "resourceexhausted": "rejected", "inferencepoolresourceexhausted": "rejected"}),
    aliases=MappingProxyType({
        "inference_objective_request_total": RouterAlias("llm_router_requests_total", "counter"),
        "inference_objective_request_error_total": RouterAlias("llm_router_errors_total", "counter"),
        "inference_objective_request_duration_seconds": RouterAlias("llm_router_request_duration_seconds",
                                                                    "histogram"),
        "inference_objective_request_ttft_seconds": RouterAlias("llm_router_time_to_first_token_seconds",
                                                                "histogram"),
        "inference_objective_request_tpot_seconds": RouterAlias("llm_router_time_per_output_token_seconds",
                                                                "histogram"),
        "inference_objective_running_requests": RouterAlias("llm_router_requests_active", "gauge"),
        "inference_extension_scheduler_attempts_total": RouterAlias(
            "llm_router_backend_requests_total", "counter", where=("status", "success"),
            note="successful scheduling attempts per pod: the picker's choice of backend"),
        "inference_extension_flow_control_queue_size": RouterAlias("llm_router_requests_queued", "gauge"),
        "inference_pool_ready_pods": RouterAlias("llm_router_backends", "gauge"),
    }),
    ignored=MappingProxyType({
        "inference_objective_inference_request_metric": "the last request's TTFT/TPOT and predictions (single "
                                                        "values): the histograms are read",
        "inference_objective_request_predicted_*": "the latency predictor's predictions",
        "inference_objective_request_*_prediction_duration_seconds": "time spent predicting",
        "inference_objective_request_slo_violation_total": "violations of the objective's own SLO (the "
                                                           "exporter's burn-rate rules judge ours)",
        "inference_objective_request_sizes": "request body sizes",
        "inference_objective_response_sizes": "response body sizes",
        "inference_objective_input_tokens": "prompt lengths: the engines' histograms are read",
        "inference_objective_output_tokens": "output lengths: the engines' histograms are read",
        "inference_objective_prompt_cached_tokens": "cached prompt tokens: the engines' prefix counters are read",
        "inference_objective_normalized_time_per_output_token_seconds": "latency over output tokens (TPOT is read)",
        "inference_pool_average_*": "the pool's averages of what the engines report (KV, queue, running): the "
                                    "engines' own series are read",
        "inference_pool_per_pod_queue_size": "each pod's queue as the picker scraped it: the engines' own",
        "inference_extension_scheduler_e2e_duration_seconds": "the picker's own scheduling time",
        "inference_extension_plugin_duration_seconds": "the picker's plugin time",
        "inference_extension_prefix_indexer_*": "the prefix-aware scorer's index",
        "inference_extension_info": "build information",
        "inference_extension_flow_control_*": "flow control's internals: its queue size is read",
        "inference_extension_model_rewrite_decisions_total": "model rewrites (traffic splitting)",
    }),
    notes=("Older releases name the objective families inference_model_*; they are unaccounted (a user of "
           "those releases sees them named in llm_exporter_engine_families{state=\"unaccounted\"}).",),
)
