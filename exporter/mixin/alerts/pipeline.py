"""Pipeline alerts: engines down or not started, exporter sources failing or flapping, the exporter
down or absent (from the whole store, or from one cluster of a central store), engines without GPU
metrics."""

from __future__ import annotations

from exporter.mixin.alerts.lib import alert, fmt_num, gpu_join_who, on_gpu_join, sel


def groups(cfg: dict) -> list[dict]:
    join, who = on_gpu_join(cfg), gpu_join_who(cfg)
    job = cfg["exporter_selector"]
    lookback = cfg["engine_up_lookback"]
    # Up at any time in the lookback, whatever `engine` label it had then: an engine whose kind is
    # detected is engine="unknown" until its first successful scrape.
    was_up = f"max without (engine) (max_over_time({sel('llm_engine_up', cfg=cfg)}[{lookback}])) == 1"
    not_engine = 'source!~"engine:.*"'
    unaccounted = 'state="unaccounted"'
    sw = cfg["source_flapping_window"]
    cl, cluster_lookback = cfg["cluster_label"], cfg["cluster_absent_lookback"]
    has_cluster = f'{cl}!=""'
    rules = [
        alert("LLMEngineDown",
              f"{sel('llm_engine_up', cfg=cfg)} == 0\n"
              f"and ignoring (engine)\n"
              f"{was_up}",
              "critical", "Engine target {{ $labels.target }} is down.",
              "The exporter on {{ $labels.instance }} cannot scrape or parse the /metrics of engine "
              f"target {{{{ $labels.target }}}} ({{{{ $labels.engine }}}}), which was up within the last "
              f"{lookback}.",
              cfg["engine_down_for"], cfg=cfg),
        alert("LLMEngineNotStarted",
              f"{sel('llm_engine_up', cfg=cfg)} == 0\n"
              f"unless ignoring (engine)\n"
              f"{was_up}",
              "warning", "Engine target {{ $labels.target }} has not come up.",
              "The exporter on {{ $labels.instance }} has not been able to scrape the /metrics of engine "
              f"target {{{{ $labels.target }}}} at any time in the last {lookback}: a new engine still "
              f"loading its model after {cfg['engine_not_started_for']}, or failing to start, or one down "
              f"for longer than {lookback}.",
              cfg["engine_not_started_for"], cfg=cfg),
        alert("LLMExporterSourceFailing", f"{sel('llm_exporter_source_up', not_engine, cfg=cfg)} == 0",
              "warning", "Exporter source {{ $labels.source }} is failing.",
              "The {{ $labels.source }} source of the exporter on {{ $labels.instance }} has failed "
              f"every collection for {cfg['source_failing_for']}; its series are missing.",
              cfg["source_failing_for"], cfg=cfg),
        alert("LLMExporterSourceFlapping",
              f"1 - avg_over_time({sel('llm_exporter_source_up', not_engine, cfg=cfg)}[{sw}])\n"
              f"  > {fmt_num(cfg['source_flapping_ratio'])}\n"
              f"and\n"
              f"changes({sel('llm_exporter_source_up', not_engine, cfg=cfg)}[{sw}]) > 2",
              "warning", "Exporter source {{ $labels.source }} fails on and off.",
              "The {{ $labels.source }} source of the exporter on {{ $labels.instance }} failed in "
              f"{{{{ $value | humanizePercentage }}}} of the scrapes over the last {sw}, recovering in "
              "between: its series keep dropping out (gaps in graphs, stale series, alert timers reset).",
              cfg["source_flapping_for"], cfg=cfg),
        alert("LLMEngineFamiliesUnaccounted",
              f"{sel('llm_exporter_engine_families', unaccounted, cfg=cfg)} > 0",
              "warning", "Engine target {{ $labels.target }} exposes families llm-exporter does not know.",
              "The {{ $labels.engine }} page of target {{ $labels.target }} on {{ $labels.instance }} carries "
              "{{ $value }} metric families that its engine table neither maps nor ignores, for "
              f"{cfg['unaccounted_families_for']}: most likely an engine upgrade that added or renamed "
              "metrics. Renamed ones leave normalized series (and the boards and alerts on them) empty. The "
              "exporter's /api/v1/snapshot and status page name them.",
              cfg["unaccounted_families_for"], cfg=cfg),
        alert("LLMExporterDown", f"up{{{job}}} == 0",
              "warning", "llm-exporter {{ $labels.instance }} is down.",
              "Prometheus cannot scrape llm-exporter at {{ $labels.instance }}: its engine, GPU and "
              "host metrics are missing.",
              cfg["exporter_down_for"], cfg=cfg),
        alert("LLMExporterAbsent", f"absent(llm_exporter_build_info{{{job}}})",
              "critical", "No llm-exporter is being scraped.",
              f"No series of llm_exporter_build_info{{{job}}} for {cfg['exporter_absent_for']}: no "
              "exporter target is discovered, all are down, or the job scrapes something else. "
              "Every other llm-exporter alert is blind.",
              cfg["exporter_absent_for"], cfg=cfg),
        # A central store holds several clusters: the fleet-wide absent() above stays quiet while one
        # cluster is silent. Clusters seen within the lookback, unless one exporter of theirs is there
        # now. Only series that carry the cluster label count: a Prometheus without it (one cluster,
        # LLMExporterAbsent's case) never fires this, nor does a cluster's own Prometheus, whose local
        # series lack its external_labels.
        alert("LLMExporterClusterAbsent",
              f"group by ({cl}) (max_over_time({sel('llm_exporter_build_info', has_cluster, cfg=cfg)}"
              f"[{cluster_lookback}]))\n"
              f"unless on ({cl})\n"
              f"group by ({cl}) ({sel('llm_exporter_build_info', cfg=cfg)})",
              "critical", f"No llm-exporter of cluster {{{{ $labels.{cl} }}}} is being scraped.",
              f"No series of llm_exporter_build_info{{{job}}} from cluster {{{{ $labels.{cl} }}}} for "
              f"{cfg['cluster_absent_for']}, though the cluster had some within the last {cluster_lookback}: "
              "its exporters are all down or gone, or its Prometheus stopped scraping them or stopped "
              "remote-writing. Every other llm-exporter alert of that cluster is blind.",
              cfg["cluster_absent_for"], cfg=cfg),
        alert("LLMEngineWithoutGPUMetrics",
              f"group by ({join}) ({sel('llm_engine_up', cfg=cfg)} == 1)\n"
              f"unless on ({join})\n"
              f"group by ({join}) ({sel('llm_gpu_up', cfg=cfg)})",
              "warning", f"Engine metrics but no GPU metrics from {who}.",
              (f"The exporter on {who} serves engine metrics but no llm_gpu_* series: "
               if "instance" in cfg["gpu_join_labels"] else
               f"Engines on {who} serve metrics but no exporter with the same {join} serves llm_gpu_* "
               f"series: ")
              + "the GPU source is off, failing, or cannot see the GPUs (device plugin, NVML library).",
              cfg["no_gpu_metrics_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.pipeline.alerts", "rules": rules}]
