#!/usr/bin/env python3
"""Generate llm-exporter's Prometheus rules, the PrometheusRule CR and the Alertmanager config.

Like the kubernetes-mixin's config.libsonnet, every selector, SLO target and threshold lives in
CONFIG below and is spliced into the expressions; nothing else needs editing. Outputs:

    alerts/rules/<area>.yaml                 one rule file per area (see AREAS)
    deploy/kubernetes/base/prometheusrule.yaml  the same groups as a PrometheusRule custom resource
    deploy/alertmanager/alertmanager.yml     routing by severity, inhibition, webhook receivers

    python alerts/generate.py            write the files
    python alerts/generate.py --check    exit 1 when a committed file differs from what this writes
    python alerts/generate.py --time-scale 0.01 --out DIR
                                         the same rules and Alertmanager config with every
                                         window and `for` scaled (end-to-end tests), into DIR

docs/alerts.md explains the settings; docs/runbooks.md has one section per alert.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from collections.abc import Callable, Iterable

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------------------------
# The one place to configure. Durations are Prometheus durations; ratios are 0..1.
# ----------------------------------------------------------------------------------------------
CONFIG: dict = {
    # Selects the exporter's series (all llm_* families come from the exporter's scrape job).
    "exporter_selector": 'job="llm-exporter"',
    # The labels that identify one exporter (one sidecar, one host): Alertmanager's inhibitions
    # match on them.
    "exporter_labels": ("job", "instance"),
    # The labels that join GPU series (no `target`) to the engine series of the engines using those
    # GPUs: LLMGPUSlowdownWhileServing and LLMEngineWithoutGPUMetrics. ("job", "instance") when
    # one exporter serves both (sidecar, one exporter per host). In the DaemonSet layout
    # (deploy/kubernetes/daemonset) GPU series come from the node's exporter and engine series
    # from the sidecars, so join on the node: ("job", "kubernetes_node"), with every PodMonitor/ServiceMonitor
    # setting `node` from __meta_kubernetes_pod_node_name (the shipped ones do).
    "gpu_join_labels": ("job", "instance"),
    # Labels summed away when recording per-target rules; everything else is kept (`without`).
    # Add "instance" (or "pod") here to get fleet-wide SLOs per target name and model.
    "aggregate_away": ("rank",),
    "runbook_url": "https://github.com/llm-exporter/llm-exporter/blob/main/docs/runbooks.md#{anchor}",
    # Alerts to leave out entirely, e.g. ("LLMEngineWithoutGPUMetrics",) on CPU-only hosts.
    "disabled_alerts": (),
    # Window of the quantile and throughput recording rules.
    "rate_window": "5m",
    "quantiles": (0.5, 0.95, 0.99),
    # Latency SLOs: "objective of requests (or inter-token gaps) take at most threshold_seconds".
    # threshold_seconds MUST be a bucket bound of the engine's histogram (vLLM V1 TTFT bounds:
    # ... 0.5, 0.75, 1.0, 2.5, 5.0 ...; ITL bounds: ... 0.075, 0.1, 0.15, 0.2, 0.3 ...). When it
    # is not, the good-event ratio has no series, the SLO alerts are silent, and
    # LLMSLOThresholdNotABucketBound fires. See docs/alerts.md.
    "slos": {
        "ttft": {
            "metric": "llm_time_to_first_token_seconds",
            "title": "time to first token",
            "alert": "LLMTimeToFirstTokenErrorBudgetBurn",
            "objective": 0.99,
            "threshold_seconds": 2.5,
        },
        "tbt": {
            "metric": "llm_inter_token_latency_seconds",
            "title": "time between tokens",
            "alert": "LLMTimeBetweenTokensErrorBudgetBurn",
            "objective": 0.99,
            "threshold_seconds": 0.1,
        },
    },
    # SRE workbook multi-window, multi-burn-rate alerts for a 30-day budget: a pair fires when
    # both windows burn faster than `factor` times the sustainable rate.
    "slo_period": "30d",
    "burn_rates": (
        {"severity": "critical", "long": "1h", "short": "5m", "factor": 14.4, "for": "2m"},
        {"severity": "critical", "long": "6h", "short": "30m", "factor": 6, "for": "15m"},
        {"severity": "warning", "long": "3d", "short": "6h", "factor": 1, "for": "3h"},
    ),
    # Traffic floor, in requests/s (rate of the TTFT histogram's _count): latency and SLO alerts
    # stay quiet below it, so one slow request at 3 a.m. pages nobody. For SLO alerts it applies
    # to the long window.
    "min_request_rate": 0.05,
    # Plain tail alerts for teams without SLOs.
    "ttft_p99_seconds": 5.0,
    "tbt_p99_seconds": 0.2,
    "tail_for": "15m",
    # Saturation.
    "kv_cache_usage_ratio": 0.95,
    "kv_cache_for": "15m",
    "preemption_rate": 0.0,  # preemptions/s above which LLMPreemptionsHappening fires
    "preemption_for": "10m",
    "queue_min_waiting": 5,  # waiting requests before a growing queue matters
    "queue_window": "15m",
    "queue_running_flat_ratio": 0.1,  # running changed by at most this share over queue_window
    "queue_for": "10m",
    "headroom_min_sequences": 1,
    "headroom_for": "10m",
    # Hardware. XID codes: docs/alerts.md says why each code is in its list; a code in both
    # lists is an error.
    "xid_critical": (48, 62, 64, 74, 79, 95, 119, 120),
    "xid_warning": (13, 31, 43, 45, 63, 92, 94),
    "xid_window": "1h",
    "ecc_window": "1h",  # LLMGPUUncorrectableECCErrors: new uncorrected errors within this window
    "slowdown_reasons": ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"),
    # Throttled for more than slowdown_ratio of slowdown_window, for slowdown_for: a slowdown that
    # comes and goes (power brake 2 minutes of every 3) counts, a short spike does not.
    "slowdown_window": "5m",
    "slowdown_ratio": 0.5,
    "slowdown_for": "5m",
    "pcie_load_utilization": 0.5,  # GPU busy share above which a trained-down link matters
    "pcie_for": "10m",
    "gpu_memory_ratio": 0.98,  # engines preallocate ~90% on purpose; this is "nothing left"
    "gpu_memory_for": "15m",
    "gpu_lost_for": "1m",
    "numa_for": "15m",
    "bottleneck_resources": ("host_cpu", "power_thermal"),
    "bottleneck_for": "30m",
    # Pipeline.
    # LLMEngineDown pages for an engine that was up within engine_up_lookback and is down for
    # engine_down_for. An engine not up at all in that lookback (a new pod still loading its model,
    # or one down for longer than the lookback) is LLMEngineNotStarted, a ticket after
    # engine_not_started_for (the overlays' startup probe gives a model 15 minutes too).
    "engine_down_for": "2m",
    "engine_up_lookback": "6h",
    "engine_not_started_for": "15m",
    # Self-health of the GPU and host sources (engine sources are LLMEngineDown's).
    "source_failing_for": "10m",
    # LLMExporterSourceFlapping: a source failing on and off (failed in more than source_flapping_ratio
    # of the scrapes over source_flapping_window, with more than one recovery), for source_flapping_for.
    "source_flapping_window": "15m",
    "source_flapping_ratio": 0.1,
    "source_flapping_for": "15m",
    "exporter_down_for": "5m",
    "exporter_absent_for": "10m",
    "no_gpu_metrics_for": "15m",
    "bucket_bound_window": "1h",
    "bucket_bound_for": "30m",
    # Alertmanager: replace the placeholder URLs (or edit the generated file's copy you deploy).
    "alertmanager": {
        "pager_url": "http://alert-pager.example.invalid/llm-exporter",
        "ticket_url": "http://alert-tickets.example.invalid/llm-exporter",
        "group_by": ("alertname", "target", "model"),
        "group_wait": "30s",
        "group_interval": "5m",
        "repeat_interval_critical": "1h",
        "repeat_interval_warning": "12h",
    },
    # PrometheusRule metadata; kube-prometheus-stack selects rules by `release: <helm release>`.
    "prometheusrule": {
        "name": "llm-exporter",
        "labels": {"app.kubernetes.io/name": "llm-exporter", "release": "kube-prometheus-stack"},
    },
}

AREAS = ("recording", "slo", "latency", "saturation", "hardware", "pipeline")
RULES_DIR = ROOT / "alerts" / "rules"
PROMETHEUSRULE = ROOT / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
HEADER = "# Generated by alerts/generate.py from its CONFIG; do not edit by hand.\n"


# ----------------------------------------------------------------------------------------------
# PromQL helpers
# ----------------------------------------------------------------------------------------------
def sel(metric: str, *matchers: str, cfg: dict = CONFIG) -> str:
    """`metric{<exporter selector>,<matchers>}`."""
    return f"{metric}{{{','.join((cfg['exporter_selector'], *matchers))}}}"


def regex_of(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def le_matcher(seconds: float) -> str:
    """A matcher for the `le` bucket at `seconds`, whichever way the float is written (1 / 1.0)."""
    forms = {repr(float(seconds)), f"{seconds:g}"}
    if float(seconds).is_integer():
        forms |= {str(int(seconds)), f"{int(seconds)}.0"}
    if len(forms) == 1:
        return f'le="{forms.pop()}"'
    escaped = sorted(f.replace(".", "\\\\.").replace("+", "\\\\+") for f in forms)
    return f'le=~"{"|".join(escaped)}"'


def without(*extra: str, cfg: dict = CONFIG) -> str:
    return f"without ({', '.join((*cfg['aggregate_away'], *extra))})"


def on_gpu_join(cfg: dict = CONFIG) -> str:
    return ", ".join(cfg["gpu_join_labels"])


def gpu_join_who(cfg: dict = CONFIG) -> str:
    """The join labels other than `job`, as template values: who a joined alert is about."""
    return ", ".join(f"{{{{ $labels.{label} }}}}" for label in cfg["gpu_join_labels"] if label != "job")


def fmt_num(value: float) -> str:
    return repr(value) if not float(value).is_integer() else str(int(value))


def pct(q: float) -> str:
    return f"p{round(q * 100):d}"


def rec(name: str, expr: str) -> dict:
    return {"record": name, "expr": expr}


def alert(name: str, expr: str, severity: str, summary: str, description: str,
          for_: str | None = None, labels: dict | None = None, cfg: dict = CONFIG) -> dict:
    rule: dict = {"alert": name, "expr": expr}
    if for_ and for_ not in ("0", "0s", "0m"):
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": cfg["runbook_url"].format(anchor=name.lower()),
    }
    return rule


def fmt_pct(ratio: float) -> str:
    return f"{ratio * 100:g}%"


def budget_left(period: str, factor: float) -> str:
    hours = duration_seconds(period) / 3600 / factor
    return f"{hours / 24:g} days" if hours >= 72 else f"{hours:g} hours"


# Who an alert is about, for descriptions.
TM_SUMMARY = {"ttft": "Time-to-first-token", "tbt": "Time-between-tokens"}
TM = "{{ $labels.target }} ({{ $labels.model }})"
GPU = "GPU {{ $labels.gpu }} ({{ $labels.name }}, {{ $labels.uuid }}) on {{ $labels.instance }}"


def latency_hist(short: str) -> str:
    return {
        "ttft": "llm_time_to_first_token_seconds",
        "tbt": "llm_inter_token_latency_seconds",
        "e2e": "llm_e2e_request_latency_seconds",
        "queue": "llm_request_queue_time_seconds",
        "prefill": "llm_request_prefill_time_seconds",
        "decode": "llm_request_decode_time_seconds",
    }[short]


def request_rate_rule(window: str) -> str:
    return f"target_model:llm_time_to_first_token_seconds_count:rate{window}"


def good_ratio_rule(metric: str, window: str) -> str:
    return f"target_model:{metric}:slo_good_ratio_rate{window}"


def slo_windows(cfg: dict) -> list[str]:
    seen: list[str] = [cfg["rate_window"]]
    for br in cfg["burn_rates"]:
        for w in (br["short"], br["long"]):
            if w not in seen:
                seen.append(w)
    return sorted(seen, key=duration_seconds)


def duration_seconds(d: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    m = re.fullmatch(r"(\d+)([smhdw])", d)
    if not m:
        raise ValueError(f"unsupported duration {d!r}")
    return int(m.group(1)) * units[m.group(2)]


# ----------------------------------------------------------------------------------------------
# Areas: each returns a list of rule groups.
# ----------------------------------------------------------------------------------------------
def recording(cfg: dict) -> list[dict]:
    w = cfg["rate_window"]
    latency: list[dict] = []
    for short in ("ttft", "tbt", "e2e", "queue", "prefill", "decode"):
        metric = latency_hist(short)
        bucket_rule = f"target_model:{metric}_bucket:rate{w}"
        latency.append(rec(bucket_rule, f"sum {without(cfg=cfg)} (rate({sel(metric + '_bucket', cfg=cfg)}[{w}]))"))
        qs = cfg["quantiles"] if short in ("ttft", "tbt", "e2e") else (0.99,)
        for q in qs:
            latency.append(rec(f"target_model:{metric}:{pct(q)}_{w}", f"histogram_quantile({q}, {bucket_rule})"))
        latency.append(rec(
            f"target_model:{metric}:mean{w}",
            f"sum {without(cfg=cfg)} (rate({sel(metric + '_sum', cfg=cfg)}[{w}]))\n/\n"
            f"sum {without(cfg=cfg)} (rate({sel(metric + '_count', cfg=cfg)}[{w}]))",
        ))

    throughput = [
        rec(f"target_model:llm_prompt_tokens:rate{w}",
            f"sum {without(cfg=cfg)} (rate({sel('llm_prompt_tokens_total', cfg=cfg)}[{w}]))"),
        rec(f"target_model:llm_generation_tokens:rate{w}",
            f"sum {without(cfg=cfg)} (rate({sel('llm_generation_tokens_total', cfg=cfg)}[{w}]))"),
        rec(f"target_model:llm_preemptions:rate{w}",
            f"sum {without(cfg=cfg)} (rate({sel('llm_preemptions_total', cfg=cfg)}[{w}]))"),
        rec("target_model:llm_requests_running:sum", f"sum {without(cfg=cfg)} ({sel('llm_requests_running', cfg=cfg)})"),
        rec("target_model:llm_requests_waiting:sum", f"sum {without(cfg=cfg)} ({sel('llm_requests_waiting', cfg=cfg)})"),
        rec("target_model:llm_kv_cache_usage_ratio:max", f"max {without(cfg=cfg)} ({sel('llm_kv_cache_usage_ratio', cfg=cfg)})"),
    ]

    slo: list[dict] = []
    for window in slo_windows(cfg):
        slo.append(rec(request_rate_rule(window),
                       f"sum {without(cfg=cfg)} (rate({sel('llm_time_to_first_token_seconds_count', cfg=cfg)}[{window}]))"))
    for spec in cfg["slos"].values():
        metric, le = spec["metric"], le_matcher(spec["threshold_seconds"])
        for window in slo_windows(cfg):
            slo.append(rec(
                good_ratio_rule(metric, window),
                f"sum {without('le', cfg=cfg)} (rate({sel(metric + '_bucket', le, cfg=cfg)}[{window}]))\n/\n"
                f"sum {without(cfg=cfg)} (rate({sel(metric + '_count', cfg=cfg)}[{window}]))",
            ))
    return [
        {"name": "llm-exporter.latency.rules", "rules": latency},
        {"name": "llm-exporter.throughput.rules", "rules": throughput},
        {"name": "llm-exporter.slo.rules", "rules": slo},
    ]


def slo(cfg: dict) -> list[dict]:
    rules: list[dict] = []
    floor = fmt_num(cfg["min_request_rate"])
    for key, spec in cfg["slos"].items():
        metric, objective, threshold = spec["metric"], spec["objective"], spec["threshold_seconds"]
        budget = round(1 - objective, 10)
        for br in cfg["burn_rates"]:
            long, short, factor = br["long"], br["short"], br["factor"]
            expr = (
                f"(1 - {good_ratio_rule(metric, long)}) / {fmt_num(budget)} > {fmt_num(factor)}\n"
                f"and\n"
                f"(1 - {good_ratio_rule(metric, short)}) / {fmt_num(budget)} > {fmt_num(factor)}\n"
                f"and\n"
                f"{request_rate_rule(long)} >= {floor}"
            )
            page = br["severity"] == "critical"
            rules.append(alert(
                spec["alert"], expr, br["severity"],
                f"{TM_SUMMARY[key]} SLO error budget burning {'fast' if page else 'slowly'}.",
                f"{TM}: {{{{ $value | humanize }}}}x the sustainable error rate over {long} "
                f"(and over {short}) for the SLO \"{fmt_pct(objective)} of {spec['title']} "
                f"within {fmt_num(threshold)}s\" over {cfg['slo_period']}. At {fmt_num(factor)}x the "
                f"budget lasts {budget_left(cfg['slo_period'], factor)}.",
                br["for"], {"slo": key, "long": long, "short": short}, cfg=cfg,
            ))
    bw = cfg["bucket_bound_window"]
    for key, spec in cfg["slos"].items():
        metric, le = spec["metric"], le_matcher(spec["threshold_seconds"])
        expr = (
            f"sum {without(cfg=cfg)} (rate({sel(metric + '_count', cfg=cfg)}[{bw}])) > 0\n"
            f"unless\n"
            f"sum {without('le', cfg=cfg)} (rate({sel(metric + '_bucket', le, cfg=cfg)}[{bw}]))"
        )
        rules.append(alert(
            "LLMSLOThresholdNotABucketBound", expr, "warning",
            f"The {key} SLO threshold is not a bucket bound of this engine's histogram.",
            f"{TM} exposes {metric} but no bucket with bound {fmt_num(spec['threshold_seconds'])}s, so "
            f"the {key} SLO good-event ratio is empty and its burn-rate alerts can never fire. Pick a "
            f"threshold that is one of the engine's bucket bounds (docs/alerts.md).",
            cfg["bucket_bound_for"], {"slo": key}, cfg=cfg,
        ))
    return [{"name": "llm-exporter.slo.alerts", "rules": rules}]


def latency(cfg: dict) -> list[dict]:
    w, floor = cfg["rate_window"], fmt_num(cfg["min_request_rate"])
    rules = []
    for name, metric, thr, what in (
        ("LLMTimeToFirstTokenP99High", "llm_time_to_first_token_seconds", cfg["ttft_p99_seconds"], "time to first token"),
        ("LLMTimeBetweenTokensP99High", "llm_inter_token_latency_seconds", cfg["tbt_p99_seconds"], "time between tokens"),
    ):
        expr = (f"target_model:{metric}:p99_{w} > {fmt_num(thr)}\n"
                f"and\n"
                f"{request_rate_rule(w)} >= {floor}")
        rules.append(alert(
            name, expr, "warning",
            f"P99 {what} is above {fmt_num(thr)}s.",
            f"{TM}: p99 {what} over {w} is {{{{ $value | humanizeDuration }}}} (threshold "
            f"{fmt_num(thr)}s) with at least {floor} requests/s.",
            cfg["tail_for"], cfg=cfg,
        ))
    return [{"name": "llm-exporter.latency.alerts", "rules": rules}]


def saturation(cfg: dict) -> list[dict]:
    w, qw = cfg["rate_window"], cfg["queue_window"]
    rules = [
        alert("LLMKVCacheNearlyFull",
              f"target_model:llm_kv_cache_usage_ratio:max > {fmt_num(cfg['kv_cache_usage_ratio'])}",
              "warning", "KV cache nearly full.",
              f"{TM}: KV cache usage is {{{{ $value | humanizePercentage }}}} (threshold "
              f"{fmt_pct(cfg['kv_cache_usage_ratio'])}); new sequences wait or preempt others.",
              cfg["kv_cache_for"], cfg=cfg),
        alert("LLMPreemptionsHappening",
              f"target_model:llm_preemptions:rate{w} > {fmt_num(cfg['preemption_rate'])}",
              "warning", "The engine is preempting sequences: the KV cache ran out.",
              f"{TM}: {{{{ printf \"%.3g\" $value }}}} preemptions/s over {w}; preempted sequences are "
              f"recomputed or swapped, which costs throughput and tail latency.",
              cfg["preemption_for"], cfg=cfg),
        alert("LLMRequestQueueGrowing",
              f"target_model:llm_requests_waiting:sum > {fmt_num(cfg['queue_min_waiting'])}\n"
              f"and\n"
              f"sum {without(cfg=cfg)} (deriv({sel('llm_requests_waiting', cfg=cfg)}[{qw}])) > 0\n"
              f"and\n"
              f"abs(sum {without(cfg=cfg)} (delta({sel('llm_requests_running', cfg=cfg)}[{qw}])))\n"
              f"  <= {fmt_num(cfg['queue_running_flat_ratio'])} * target_model:llm_requests_running:sum",
              "warning", "Requests queue up while the running batch stays flat.",
              f"{TM}: {{{{ $value | humanize }}}} requests waiting and growing over {qw} while the "
              f"running batch did not grow: the engine is at its batch or KV limit.",
              cfg["queue_for"], cfg=cfg),
        alert("LLMKVCacheHeadroomExhausted",
              f"min {without(cfg=cfg)} ({sel('llm_kv_cache_headroom_sequences', cfg=cfg)}) "
              f"< {fmt_num(cfg['headroom_min_sequences'])}\n"
              f"and ignoring (engine)\n"
              f"target_model:llm_requests_waiting:sum > 0",
              "warning", "No KV cache room for another sequence while requests wait.",
              f"{TM}: room for {{{{ printf \"%.1f\" $value }}}} more sequences of the current mean length "
              f"while requests are waiting.",
              cfg["headroom_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.saturation.alerts", "rules": rules}]


def hardware(cfg: dict) -> list[dict]:
    crit, warn = set(cfg["xid_critical"]), set(cfg["xid_warning"])
    if crit & warn:
        raise ValueError(f"XID codes in both the critical and the warning list: {sorted(crit & warn)}")
    xw, join = cfg["xid_window"], on_gpu_join(cfg)
    sw = cfg["slowdown_window"]
    slowdown = sel("llm_gpu_clock_event_active", f'reason=~"{regex_of(cfg["slowdown_reasons"])}"', cfg=cfg)
    current, maximum = 'state="current"', 'state="max"'
    ecc = sel("llm_gpu_ecc_errors_total", 'type="uncorrected"', cfg=cfg)
    rules = []
    for name, sev, codes in (("LLMGPUXidCritical", "critical", cfg["xid_critical"]),
                             ("LLMGPUXidWarning", "warning", cfg["xid_warning"])):
        series = sel("llm_gpu_xid_errors_total", f'xid=~"{regex_of(codes)}"', cfg=cfg)
        # A series is created by its first event, and increase() of a new series is 0: the second
        # branch catches a series with no sample at all in the window before the last one. (Not
        # `unless S offset 1h`: that single point is missing after any scrape gap an hour ago,
        # and an old XID would page again.)
        rules.append(alert(
            name,
            f"increase({series}[{xw}]) > 0\n"
            f"or\n"
            f"({series} unless max_over_time({series}[{xw}] offset {xw}))",
            sev, "XID {{ $labels.xid }} on GPU {{ $labels.gpu }}.",
            f"{GPU} reported XID {{{{ $labels.xid }}}} ({{{{ $value | humanize }}}} events in the last "
            f"{xw}).",
            labels=None, cfg=cfg,
        ))
    rules += [
        alert("LLMGPUUncorrectableECCErrors",
              f"increase({ecc}[{cfg['ecc_window']}]) > 0",
              "critical", "New uncorrectable ECC errors on GPU {{ $labels.gpu }}.",
              f"{GPU} counted {{{{ $value | humanize }}}} new uncorrected (double-bit) ECC errors in "
              f"the last {cfg['ecc_window']}.", cfg=cfg),
        alert("LLMGPURowRemapFailure",
              sel("llm_gpu_remapped_rows", 'state="failed"', cfg=cfg) + " > 0",
              "critical", "Row remapping failed on GPU {{ $labels.gpu }}.",
              f"{GPU}: a memory row remap failed; the GPU needs service.", cfg=cfg),
        alert("LLMGPURowRemapPending",
              sel("llm_gpu_remapped_rows", 'state="pending"', cfg=cfg) + " > 0",
              "warning", "A row remap waits for a reset of GPU {{ $labels.gpu }}.",
              f"{GPU}: a memory row remap is pending; it takes effect at the next GPU reset.",
              "15m", cfg=cfg),
        alert("LLMGPUSlowdownWhileServing",
              f"avg_over_time({slowdown}[{sw}]) > {fmt_num(cfg['slowdown_ratio'])}\n"
              f"and on ({join})\n"
              f"(sum by ({join}) (max_over_time({sel('llm_requests_running', cfg=cfg)}[{sw}])) > 0)",
              "warning", "GPU {{ $labels.gpu }} is throttled ({{ $labels.reason }}) while serving.",
              f"{GPU} had clock event {{{{ $labels.reason }}}} active {{{{ $value | humanizePercentage }}}} "
              f"of the last {sw} while its engine ran requests: clocks, and so tokens/s, are held down "
              f"by heat or power.",
              cfg["slowdown_for"], cfg=cfg),
    ]
    load = f"{sel('llm_gpu_utilization_ratio', cfg=cfg)} > {fmt_num(cfg['pcie_load_utilization'])}"
    for name, metric, what in (("LLMGPUPCIeLinkGenerationDegraded", "llm_gpu_pcie_link_generation", "generation"),
                               ("LLMGPUPCIeLinkWidthDegraded", "llm_gpu_pcie_link_width", "width")):
        unit = "Gen {{ $value }}" if what == "generation" else "x{{ $value }}"
        rules.append(alert(
            name,
            f"{sel(metric, current, cfg=cfg)}\n"
            f"  < ignoring (state) {sel(metric, maximum, cfg=cfg)}\n"
            f"and ignoring (state)\n"
            f"({load})",
            "warning", f"PCIe link of GPU {{{{ $labels.gpu }}}} runs below its max {what} under load.",
            f"{GPU}: PCIe link at {unit}, below the max the GPU and slot support, while the GPU is "
            f"more than {fmt_pct(cfg['pcie_load_utilization'])} busy.",
            cfg["pcie_for"], cfg=cfg,
        ))
    rules += [
        alert("LLMGPUMemoryNearlyFull",
              f"{sel('llm_gpu_memory_used_bytes', cfg=cfg)}\n/\n{sel('llm_gpu_memory_total_bytes', cfg=cfg)}\n"
              f"> {fmt_num(cfg['gpu_memory_ratio'])}",
              "info", "GPU {{ $labels.gpu }} memory is nearly full.",
              f"{GPU}: {{{{ $value | humanizePercentage }}}} of device memory in use (threshold "
              f"{fmt_pct(cfg['gpu_memory_ratio'])}). Engines preallocate most memory on purpose; this "
              f"means nothing is left for activations, CUDA graphs or a second process.",
              cfg["gpu_memory_for"], cfg=cfg),
        alert("LLMGPULost", f"{sel('llm_gpu_up', cfg=cfg)} == 0",
              "critical", "GPU {{ $labels.gpu }} is lost.",
              f"{GPU} cannot be read through NVML (fallen off the bus, driver error, or reset "
              f"in progress).", cfg["gpu_lost_for"], cfg=cfg),
        alert("LLMEngineNUMAMismatch", f"{sel('llm_engine_numa_mismatch', cfg=cfg)} == 1",
              "warning", "The engine process runs on the wrong NUMA node.",
              "{{ $labels.instance }}: the engine process is pinned to CPUs outside the NUMA node of "
              "its GPUs; host-to-GPU copies and scheduling pay the cross-socket hop.",
              cfg["numa_for"], cfg=cfg),
        alert("LLMBottleneckStuck",
              sel("llm_bottleneck", f'resource=~"{regex_of(cfg["bottleneck_resources"])}"', cfg=cfg) + " == 1",
              "warning", "{{ $labels.target }} is limited by {{ $labels.resource }}, not by the GPU.",
              f"{{{{ $labels.target }}}} on {{{{ $labels.instance }}}}: the bottleneck verdict has been "
              f"{{{{ $labels.resource }}}} for {cfg['bottleneck_for']}. A faster GPU would not help; fix "
              f"the {{{{ $labels.resource }}}} limit first.",
              cfg["bottleneck_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.hardware.alerts", "rules": rules}]


def pipeline(cfg: dict) -> list[dict]:
    join, who = on_gpu_join(cfg), gpu_join_who(cfg)
    job = cfg["exporter_selector"]
    lookback = cfg["engine_up_lookback"]
    # Up at any time in the lookback, whatever `engine` label it had then: an engine whose kind is
    # detected is engine="unknown" until its first successful scrape.
    was_up = f"max without (engine) (max_over_time({sel('llm_engine_up', cfg=cfg)}[{lookback}])) == 1"
    not_engine = 'source!~"engine:.*"'
    sw = cfg["source_flapping_window"]
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


BUILDERS: dict[str, Callable[[dict], list[dict]]] = {
    "recording": recording, "slo": slo, "latency": latency,
    "saturation": saturation, "hardware": hardware, "pipeline": pipeline,
}


def build(cfg: dict = CONFIG) -> dict[str, list[dict]]:
    """area -> rule groups, with disabled alerts dropped."""
    out = {}
    for area in AREAS:
        groups = BUILDERS[area](cfg)
        for g in groups:
            g["rules"] = [r for r in g["rules"] if r.get("alert") not in cfg["disabled_alerts"]]
        out[area] = [g for g in groups if g["rules"]]
    return out


def scale_durations(cfg: dict, time_scale: float) -> dict:
    """A copy of `cfg` with every duration (rate and SLO windows, `for`, Alertmanager timers)
    multiplied by `time_scale`, in whole seconds, at least 1s. For end-to-end tests that cannot wait
    an hour; recording rule names follow their windows (rate5m becomes rate3s at 0.01)."""
    def walk(value: object) -> object:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(walk(v) for v in value)
        if isinstance(value, str) and re.fullmatch(r"\d+[smhdw]", value):
            return f"{max(1, round(duration_seconds(value) * time_scale))}s"
        return value
    return walk(cfg)  # type: ignore[return-value]


def render_scaled(out: pathlib.Path, time_scale: float, cfg: dict = CONFIG) -> dict[pathlib.Path, str]:
    """rules/<area>.yaml and alertmanager.yml under `out`, from `cfg` with durations scaled."""
    scaled = scale_durations(cfg, time_scale)
    areas = build(scaled)
    files = {out / "rules" / f"{area}.yaml": HEADER + dump({"groups": groups}) for area, groups in areas.items()}
    files[out / "alertmanager.yml"] = HEADER + dump(alertmanager(areas, scaled))
    return files


def alert_names_by_area(areas: dict[str, list[dict]]) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for area, groups in areas.items():
        for g in groups:
            for r in g["rules"]:
                if "alert" in r and r["alert"] not in names.setdefault(area, []):
                    names[area].append(r["alert"])
    return names


# ----------------------------------------------------------------------------------------------
# Alertmanager
# ----------------------------------------------------------------------------------------------
def alertmanager(areas: dict[str, list[dict]], cfg: dict = CONFIG) -> dict:
    am = cfg["alertmanager"]
    names = alert_names_by_area(areas)
    exporter_labels = list(cfg["exporter_labels"])
    engine_scoped = [n for a in ("slo", "latency", "saturation") for n in names.get(a, [])]
    gpu_scoped = [n for n in names.get("hardware", []) if n.startswith("LLMGPU") and n != "LLMGPULost"]
    inhibit = []
    for source in ("LLMEngineDown", "LLMEngineNotStarted"):
        if source in names.get("pipeline", []) and engine_scoped:
            inhibit.append({
                "source_matchers": [f'alertname="{source}"'],
                "target_matchers": [f'alertname=~"{regex_of(engine_scoped)}"'],
                "equal": [*exporter_labels, "target"],
            })
    if "LLMGPULost" in names.get("hardware", []) and gpu_scoped:
        inhibit.append({
            "source_matchers": ['alertname="LLMGPULost"'],
            "target_matchers": [f'alertname=~"{regex_of(gpu_scoped)}"'],
            "equal": [*exporter_labels, "gpu"],
        })
    # A critical XID on a GPU (XID 48 is the double-bit ECC event itself) already pages for it.
    xid_scoped = [n for n in ("LLMGPUXidWarning", "LLMGPUUncorrectableECCErrors") if n in names.get("hardware", [])]
    if "LLMGPUXidCritical" in names.get("hardware", []) and xid_scoped:
        inhibit.append({
            "source_matchers": ['alertname="LLMGPUXidCritical"'],
            "target_matchers": [f'alertname=~"{regex_of(xid_scoped)}"' if len(xid_scoped) > 1
                                else f'alertname="{xid_scoped[0]}"'],
            "equal": [*exporter_labels, "gpu"],
        })
    if {"LLMExporterAbsent", "LLMExporterDown"} <= set(names.get("pipeline", [])):
        inhibit.append({
            "source_matchers": ['alertname="LLMExporterAbsent"'],
            "target_matchers": ['alertname="LLMExporterDown"'],
            "equal": ["job"],
        })
    return {
        "route": {
            "receiver": "null",
            "group_by": list(am["group_by"]),
            "group_wait": am["group_wait"],
            "group_interval": am["group_interval"],
            "repeat_interval": am["repeat_interval_warning"],
            "routes": [
                {"matchers": ['severity="critical"'], "receiver": "pager",
                 "repeat_interval": am["repeat_interval_critical"]},
                {"matchers": ['severity="warning"'], "receiver": "ticket"},
                {"matchers": ['severity="info"'], "receiver": "null"},
            ],
        },
        "inhibit_rules": inhibit,
        "receivers": [
            {"name": "pager", "webhook_configs": [{"url": am["pager_url"], "send_resolved": True}]},
            {"name": "ticket", "webhook_configs": [{"url": am["ticket_url"], "send_resolved": True}]},
            {"name": "null"},
        ],
    }


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def dump(data: object) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=110, default_flow_style=False,
                     allow_unicode=True)


def render(cfg: dict = CONFIG) -> dict[pathlib.Path, str]:
    areas = build(cfg)
    files: dict[pathlib.Path, str] = {}
    for area, groups in areas.items():
        files[RULES_DIR / f"{area}.yaml"] = HEADER + dump({"groups": groups})
    all_groups = [g for groups in areas.values() for g in groups]
    pr = cfg["prometheusrule"]
    files[PROMETHEUSRULE] = HEADER + dump({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": pr["name"], "labels": dict(pr["labels"])},
        "spec": {"groups": all_groups},
    })
    files[ALERTMANAGER] = (
        HEADER
        + "# Replace the webhook URLs in CONFIG['alertmanager'] (or in your deployed copy): see docs/alerts.md.\n"
        + dump(alertmanager(areas, cfg))
    )
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a committed file is stale")
    parser.add_argument("--time-scale", type=float, help="with --out: scale every window and `for` (tests)")
    parser.add_argument("--out", type=pathlib.Path, help="directory for the --time-scale rendering")
    args = parser.parse_args(argv)
    if args.time_scale is not None or args.out is not None:
        if args.time_scale is None or args.out is None or args.check:
            parser.error("--time-scale and --out go together, without --check")
        files = render_scaled(args.out, args.time_scale)
    else:
        files = render()
    if args.out is not None:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return 0
    if args.check:
        problems = []
        for path, text in files.items():
            rel = path.relative_to(ROOT)
            if not path.exists():
                problems.append(f"{rel}: missing")
            elif path.read_text() != text:
                problems.append(f"{rel}: differs from what alerts/generate.py writes")
        for path in sorted(RULES_DIR.glob("*.y*ml")):
            if path not in files:
                problems.append(f"{path.relative_to(ROOT)}: not generated by alerts/generate.py")
        if problems:
            print("stale generated files (run `python alerts/generate.py`):", *problems, sep="\n  ", file=sys.stderr)
            return 1
        print(f"{len(files)} generated files up to date")
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
