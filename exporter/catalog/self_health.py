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
           "Failed collections of the source, by reason code.", ("source", "reason"), "self"),
    family("llm_exporter_collections_total", "counter", "cycles",
           "Collection cycles completed since the exporter started.", (), "self"),
    family("llm_exporter_cycle_duration_seconds", "gauge", "seconds",
           "Wall time of the last whole collection cycle (all sources and derive; a page is rendered by its first scrape).", (), "self"),
    family("llm_exporter_scrapes_rejected_total", "counter", "requests",
           "/metrics requests answered 503 because too many scrapes were in flight.", (), "self"),
    family("llm_exporter_series_dropped_total", "counter", "series",
           "Series dropped by the cardinality limits, per source.", ("source",), "self"),
    family("llm_exporter_web_config_last_reload_successful", "gauge", "bool",
           "1 when the last load of --web.config.file succeeded, 0 when a changed file was refused and the "
           "last good one is still in use; absent without a web config file.", (), "self"),
    family("llm_exporter_web_config_last_reload_success_timestamp_seconds", "gauge", "seconds",
           "Unix time of the last successful load of --web.config.file (start or reload); absent without "
           "a web config file.", (), "self"),
    family("llm_exporter_build_info", "gauge", "info",
           "Always 1; the labels carry the exporter version and Python version.", ("version", "python"), "self"),
)
