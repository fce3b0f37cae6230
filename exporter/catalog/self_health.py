"""The exporter's own health, per source (node_exporter's scrape_collector_* and
nvidia_gpu_exporter's renderHealth)."""

from exporter.catalog.base import family

FAMILIES = (
    family("llm_exporter_source_up", "gauge", "bool",
           "1 when the source's last collection succeeded, 0 when it failed.", ("source",), "self"),
    family("llm_exporter_collect_duration_seconds", "gauge", "seconds",
           "Wall time of the source's last collection.", ("source",), "self"),
    family("llm_exporter_last_success_timestamp_seconds", "gauge", "seconds",
           "Unix time of the source's last successful collection; absent until the first success.",
           ("source",), "self"),
    family("llm_exporter_collect_errors_total", "counter", "errors",
           "Failed collections of the source, by reason code: timeout, busy (the last one still running), "
           "exception; engine targets: dns (the host name does not resolve), connection, tls, http_status, "
           "too_large, parse, too_deep (a JSON document nested deeper than 64 levels: the twin's "
           "/sim documents, the probe's /v1/models), unknown_engine, credentials, too_many_families (a page "
           "of more than 5,000 metric families, refused while it is read); "
           "gpu: the NVML state (nvml_init, no_gpus, ...); "
           "host: procfs_missing.", ("source", "reason"), "self"),
    family("llm_exporter_collector_success", "gauge", "bool",
           "1 when every source of the collector (engine, probe, host, gpu; `--collector.NAME`) succeeded in the "
           "last cycle, 0 when one failed (llm_exporter_source_up and llm_engine_up say which). Absent for a "
           "collector that is off or has nothing to collect (probe without --probe).", ("collector",), "self"),
    family("llm_exporter_collector_duration_seconds", "gauge", "seconds",
           "Wall time of the collector's last collection: the longest of its sources', which run concurrently. "
           "Absent when llm_exporter_collector_success is.", ("collector",), "self"),
    family("llm_exporter_collections_total", "counter", "cycles",
           "Collection cycles completed since the exporter started.", (), "self"),
    family("llm_exporter_cycle_duration_seconds", "gauge", "seconds",
           "Wall time of the last whole collection cycle (all sources and derive; a page is rendered by its "
           "first scrape).", (), "self"),
    family("llm_exporter_cycle_overruns_total", "counter", "cycles",
           "Collection cycles that took longer than the interval (the next ticks are skipped). Engine targets are "
           "scraped 256 at a time, each with its own timeout from when its turn comes, so an exporter with "
           "too many targets runs late rather than marking healthy ones down.", (), "self"),
    family("llm_exporter_clock_steps_total", "counter", "steps",
           "Times the wall clock stepped (more than 1 s between two cycles against the monotonic clock: NTP, "
           "date -s, a VM resumed). Rates and windows run on the monotonic clock and are not affected; "
           "timestamps follow the wall clock.", (), "self"),
    family("llm_exporter_clock_offset_seconds", "gauge", "seconds",
           "How far the wall clock has stepped since the exporter started (wall minus monotonic, 0 at start; "
           "NTP's slewing moves it slowly, a step at once).", (), "self"),
    family("llm_exporter_scrapes_rejected_total", "counter", "requests",
           "/metrics requests answered 503 because too many scrapes were in flight.", (), "self"),
    family("llm_exporter_series_dropped_total", "counter", "series",
           "Engine series dropped, per source and reason: cardinality (over max_series_per_target), "
           "label_value_too_long, label_name_too_long, too_many_labels (the label limits, docs/security.md), "
           "non_finite (NaN/Inf value), negative_counter, out_of_range (outside the family's domain: "
           "negative, a ratio above 1, above 1e18), duplicate (a series printed twice with two values), "
           "and invalid histograms dropped whole: "
           "histogram_bad_le, histogram_no_inf, histogram_incomplete (no _count or _sum), "
           "histogram_not_monotonic, histogram_count_mismatch (_count is not the +Inf bucket), "
           "histogram_fractional_count.", ("source", "reason"), "self"),
    family("llm_exporter_log_lines_suppressed_total", "counter", "lines",
           "State-change log lines of the source held back by the rate limit (3 lines per kind of line and "
           "target a minute; the next line written says how many), by reason: unaccounted_families, "
           "series_dropped, role_conflict; gpu: pod_resources (the kubelet answering or not), gpu_attribution (the "
           "GPUs watched changing); every source: source_state (its failing and recovered lines).",
           ("source", "reason"), "self"),
    family("llm_exporter_gpu_attribution", "gauge", "bool",
           "1 for the way the GPU source chose the GPUs it watches, 0 for the others: explicit (--gpus), dra (a "
           "DRA ResourceClaim shared with the engine: every GPU NVML shows), pod_resources (the engine "
           "containers' nvidia.com/* devices from the kubelet's pod-resources API; in DaemonSet mode, "
           "--kubernetes-gpu-mapping, every GPU labelled with the pod, namespace and container holding it), "
           "all (nothing answered: every GPU NVML shows, which on a shared node includes other pods' GPUs). "
           "docs/gpu.md, \"Which GPUs\".", ("method",), "self"),
    family("llm_exporter_pod_resources_up", "gauge", "bool",
           "1 when the kubelet's pod-resources API answered the last call, 0 when it did not (its last answer is "
           "then used for up to 5 minutes); absent when the exporter does not ask it.", (), "self"),
    family("llm_exporter_pod_resources_errors_total", "counter", "errors",
           "Calls to the kubelet's pod-resources API that did not answer, by reason: socket_missing, "
           "unavailable, deadline, too_large (over 4 MiB), malformed, not_found (the kubelet does not know "
           "this pod), unimplemented, error.", ("reason",), "self"),
    family("llm_exporter_engine_families", "gauge", "families",
           "Native metric families on the target's last page, by what the engine table says of them: "
           "mapped (feeds an llm_* family), ignored (left out on purpose, docs/engines.md says why) or "
           "unaccounted (neither: an engine release newer than the table; /api/v1/snapshot and the status "
           "page name them). Each family on the page is counted once.", ("target", "engine", "state"), "self"),
    family("llm_exporter_web_config_last_reload_successful", "gauge", "bool",
           "1 when the last load of --web.config.file succeeded, 0 when a changed file was refused and the "
           "last good one is still in use; absent without a web config file.", (), "self"),
    family("llm_exporter_web_config_last_reload_success_timestamp_seconds", "gauge", "seconds",
           "Unix time of the last successful load of --web.config.file (start or reload); absent without "
           "a web config file.", (), "self"),
    family("llm_exporter_http_auth_failures_total", "counter", "requests",
           "Requests refused by basic auth, by reason: missing, malformed, unknown_user, bad_password, "
           "overloaded (503: too many bcrypt checks waiting); absent without a web config file.",
           ("reason",), "self"),
    family("llm_exporter_http_connections_open", "gauge", "connections",
           "HTTP connections open now (in the TLS handshake, idle, or serving a request).", (), "self"),
    family("llm_exporter_http_connections_limit", "gauge", "connections",
           "The bound on open HTTP connections (512, lower when the file descriptor limit is).", (), "self"),
    family("llm_exporter_http_connections_rejected_total", "counter", "connections",
           "HTTP connections the exporter closed on its own, by reason: too_many (every slot was serving a "
           "request), evicted (the oldest idle one, to admit a new one), tls_handshake (failed or over 10 s), "
           "idle_timeout (no request head begun: 10 s after connecting, 30 s after a response), header_timeout "
           "(a request head or body not complete within 10 s), write_timeout (the client read nothing for "
           "10 s), bad_request (a malformed or oversized request head), bad_framing (a request body framed "
           "ambiguously: Transfer-Encoding with Content-Length, or on HTTP/1.0, or not exactly chunked; "
           "differing or invalid Content-Length; answered 400).", ("reason",), "self"),
    family("llm_exporter_http_requests_rejected_total", "counter", "requests",
           "Requests for /api/v1/snapshot, /api/v1/diagnosis and / (the twin of "
           "llm_exporter_scrapes_rejected_total), by reason: too_many (503: as many in flight as the /metrics "
           "cap), too_large (the page was over its 8 MiB cap: the snapshot without samples, the others 503).",
           ("path", "reason"), "self"),
    family("llm_exporter_slo_threshold_edge", "gauge", "bool",
           "Per engine target and latency SLO (ttft, tbt), 1 for the state in force and 0 for the others: "
           "engine (the SLO threshold is one of the engine's bucket edges), lower_edge (it is not: /metrics "
           "writes a bucket at the threshold holding the count at the engine's largest edge below it, so "
           "the SLO never flatters; the log names the edges the threshold could be instead), none (no edge "
           "at or below the threshold: no bucket written, the SLO has no good-event ratio). Absent while the "
           "target exposes no such histogram.", ("target", "slo", "state"), "self"),
    family("llm_exporter_build_info", "gauge", "info",
           "Always 1; the labels carry the exporter version and Python version.", ("version", "python"), "self"),
)
