"""CONFIG: every label name, selector, SLO target and threshold the rules and the dashboards are built
from (the kubernetes-mixin's config.libsonnet `_config`). Durations are Prometheus durations; ratios
are 0..1.

The SLOs, the burn-rate pairs and the thresholds the dashboards draw too come from exporter/slo.py,
so the exporter, the rules and the panels read one declaration; the rest is alerting-only. CONFIG
stays a plain dict so a variant is `{**CONFIG, key: value}` and generate.scale_durations can walk it.
`with_overrides(CONFIG, mapping)` is what `llm-exporter mixin --config FILE` applies: a file's keys
replace the defaults', checked against them (docs/alerts.md, "Configuring the mixin").
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping

from exporter import slo
from exporter.derive.bottleneck import KV_QUEUE_LOW
from exporter.specs.gpu_faults import FAULT_WINDOW_S, XID_CRITICAL, XID_WARNING, window_text

CONFIG: dict = {
    "exporter_selector": slo.EXPORTER_SELECTOR,
    # The labels that identify one exporter (one sidecar, one host): Alertmanager's inhibitions
    # match on them.
    "exporter_labels": slo.EXPORTER_LABELS,
    # The labels that join GPU series (no `target`) to the engine series of the engines using those
    # GPUs: LLMGPUSlowdownWhileServing and LLMEngineWithoutGPUMetrics. ("job", "instance") when
    # one exporter serves both (sidecar, one exporter per host). In the DaemonSet layout
    # (deploy/kubernetes/daemonset) GPU series come from the node's exporter and engine series
    # from the sidecars, so join on the node: ("job", "kubernetes_node"), with every PodMonitor/ServiceMonitor
    # setting `node` from __meta_kubernetes_pod_node_name (the shipped ones do).
    "gpu_join_labels": ("job", "instance"),
    # Per engine pod GPU rules (pod:llm_gpu_*, the Fleet board's "GPUs per engine pod"): the label a
    # Kubernetes scrape gives each pod's series, and the prefix under which a scrape that keeps its own
    # target labels (honorLabels: false) stores the holder's pod and namespace that the DaemonSet
    # (--kubernetes-gpu-mapping) writes on each GPU, as it does dcgm-exporter's: exported_pod.
    "pod_label": "pod",
    "gpu_holder_label_prefix": "exported_",
    # Labels summed away when recording per-target rules; everything else is kept (`without`).
    # Add "instance" (or "pod") here to get fleet-wide SLOs per target name and model.
    "aggregate_away": ("rank",),
    "runbook_url": "https://github.com/llm-exporter/llm-exporter/blob/main/docs/runbooks.md#{anchor}",
    # Alerts to leave out entirely, e.g. ("LLMEngineWithoutGPUMetrics",) on CPU-only hosts.
    "disabled_alerts": (),
    # Window of the quantile and throughput recording rules.
    "rate_window": slo.RATE_WINDOW,
    "quantiles": slo.QUANTILES,
    # Latency SLOs (exporter/slo.py LatencySLO: the threshold must be a bucket bound).
    "slos": {
        s.key: {"metric": s.metric, "title": s.title, "summary": s.summary, "alert": s.alert,
                "objective": s.objective, "threshold_seconds": s.threshold_seconds}
        for s in slo.SLOS
    },
    # SRE workbook multi-window, multi-burn-rate alerts (exporter/slo.py BURN_RATES).
    "slo_period": slo.SLO_PERIOD,
    "burn_rates": tuple(
        {"severity": br.severity, "long": br.long, "short": br.short, "factor": br.factor, "for": br.for_}
        for br in slo.BURN_RATES
    ),
    # Each burn-rate alert keeps firing for its pair's short window after its condition clears
    # (Prometheus keep_firing_for, 2.42+): one page per breach instead of one per flip.
    "burn_keep_firing": True,
    # Availability SLO (exporter/slo.py AvailabilitySLO), per (cluster, namespace, model): the same
    # burn-rate pairs as the latency SLOs, read from the fleet area's good-ratio rules.
    "availability_slo": {
        "key": slo.AVAILABILITY.key, "alert": slo.AVAILABILITY.alert,
        "objective": slo.AVAILABILITY.objective, "bad_reasons": slo.AVAILABILITY.bad_reasons,
        "abort_reasons": slo.AVAILABILITY.abort_reasons,
    },
    # Latency and SLO alerts stay quiet below this many requests/s; for SLO alerts over the long window.
    "min_request_rate": slo.MIN_REQUEST_RATE,
    # Fleet (exporter/mixin/alerts/fleet.py, the Fleet board): the labels kept by every per-model rule (`sum by`),
    # the cluster label first, then fleet_extra_labels; present when a Prometheus per cluster sets them
    # (external_labels, Kubernetes scrapes), empty otherwise. Rules, inhibitions, Alertmanager's
    # grouping, panels and the boards' $cluster variable all read them through fleet_labels(cfg).
    "cluster_label": slo.CLUSTER_LABEL,
    "fleet_extra_labels": slo.FLEET_LABELS[1:],
    # Capacity loss: a model's up replicas (GPUs up, per cluster and namespace) against their most
    # within fleet_capacity_lookback. LLMFleetReplicasLost / LLMFleetGPUsLost: below it for
    # fleet_lost_for; LLMFleetCapacityHalved: at most fleet_capacity_critical_ratio of it for
    # fleet_halved_for. A deliberate scale-down warns too, until the lookback forgets the old maximum.
    "fleet_capacity_lookback": "1h",
    "fleet_lost_for": "10m",
    "fleet_capacity_critical_ratio": 0.5,
    "fleet_halved_for": "5m",
    # Plain tail alerts for teams without SLOs.
    "ttft_p99_seconds": 5.0,
    "tbt_p99_seconds": 0.2,
    "tail_for": "15m",
    # Scaling (alerts/scaling.py, docs/scaling.md): model:llm_replicas_needed:ratio sizes each model for
    # its observed request rate at this share below the rate where its replicas break their SLOs
    # (llm_slo_max_request_rate), for the cost model's error, bursts, and the minutes a new replica takes.
    "scaling_headroom": 0.2,
    # Saturation.
    # LLMKVCacheNearlyFull: usage at or above kv_cache_usage_ratio for kv_cache_share of kv_cache_window,
    # or reaching it in that window while the engine preempts. A real gauge at the limit is not flat:
    # each preemption frees blocks (vLLM with a small cache swings 1.0 -> 0.89 -> 0.78 and back), so
    # an instantaneous threshold with `for` resets at every dip.
    "kv_cache_usage_ratio": slo.SATURATION.kv_cache_usage_ratio,
    "kv_cache_window": "10m",
    "kv_cache_share": 0.5,
    "kv_cache_for": "5m",
    "preemption_rate": 0.0,  # preemptions/s above which LLMPreemptionsHappening fires
    "preemption_for": "10m",
    "queue_min_waiting": slo.SATURATION.queue_min_waiting,  # waiting requests before a growing queue matters
    "queue_window": "15m",
    "queue_running_flat_ratio": 0.1,  # running changed by at most this share over queue_window
    "queue_for": "10m",
    # LLMRequestQueueStanding: at least queue_min_waiting requests waiting in queue_standing_share of
    # queue_standing_window while the engine runs requests. Closed-loop clients or a seq cap hold a
    # deep queue flat: it never grows, and requests wait all the same.
    "queue_standing_window": "10m",
    "queue_standing_share": 0.8,
    "queue_standing_for": "5m",
    "headroom_min_sequences": slo.SATURATION.headroom_min_sequences,
    "headroom_for": "10m",
    # Speculative decoding: under this acceptance a draft costs more than it saves (the source
    # documents' warning), over spec_window, for spec_for.
    "spec_acceptance_min": 0.5,
    "spec_window": "15m",
    "spec_for": "15m",
    # Hardware. XID codes: docs/alerts.md says why each code is in its list; a code in both
    # lists is an error.
    # The lists and the window come from the one XID table (exporter/specs/gpu_faults.py), which
    # the diagnosis' GPU health reads too.
    "xid_critical": XID_CRITICAL,
    "xid_warning": XID_WARNING,
    "xid_window": window_text(FAULT_WINDOW_S),
    # LLMGPUUncorrectableECCErrors: new uncorrected errors within this window
    "ecc_window": window_text(FAULT_WINDOW_S),
    "row_remap_pending_for": "15m",  # a pending remap waits for a reset; a short one is a reset in flight
    "slowdown_reasons": ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                         "hw_power_brake_slowdown"),
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
    # The driver's recovery action (llm_gpu_recovery_action) and the NVLink fabric of NVSwitch
    # systems (llm_gpu_fabric_*). The actions listed page: the GPU is unusable until someone resets
    # or reboots it. Any other action but none (drain_p2p, recover_imex_domain, codes newer than
    # this list) warns. Fabric registration runs for seconds to minutes after boot or a fabric
    # manager restart, so it alerts only when still not done (or degraded) after fabric_for.
    "recovery_action_critical": ("gpu_reset", "node_reboot", "drain_and_reset", "bus_reset", "system_reboot"),
    "recovery_action_for": "1m",
    "fabric_for": "10m",
    "numa_for": "15m",
    "bottleneck_resources": ("host_cpu", "power_thermal"),
    "bottleneck_for": "30m",
    # Network (exporter/mixin/alerts/network.py), on the engine's links only. LLMNetworkLinkErrors: errors and drops
    # above network_errors_per_second over network_error_window. LLMNetworkLinkBelowRate: a link rate
    # below network_rate_ratio of its highest over network_rate_lookback. LLMKVTransferQueueStanding: at
    # least kv_transfer_queue_min requests waiting for a KV transfer in kv_transfer_queue_share of
    # kv_transfer_queue_window.
    "network_down_for": "2m",
    "network_error_window": "5m",
    "network_errors_per_second": 1.0,
    "network_errors_for": "10m",
    "network_rate_lookback": "1d",
    "network_rate_ratio": 0.9,
    "network_rate_for": "10m",
    "kv_transfer_queue_window": "10m",
    "kv_transfer_queue_share": 0.8,
    "kv_transfer_queue_min": KV_QUEUE_LOW,  # where the verdict's KV queue rule starts (the board draws it)
    "kv_transfer_queue_for": "5m",
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
    # LLMEngineFamiliesUnaccounted: an engine's page carries families its table neither maps nor
    # ignores (an upgrade) for this long: a ticket to update the table before a board goes blank.
    "unaccounted_families_for": "30m",
    "exporter_down_for": "5m",
    "exporter_absent_for": "10m",
    # LLMExporterClusterAbsent (central stores): a cluster (cluster_label) with exporters within
    # cluster_absent_lookback and none now, for cluster_absent_for. A cluster retired on purpose pages
    # until the lookback forgets it.
    "cluster_absent_lookback": "6h",
    "cluster_absent_for": "10m",
    "no_gpu_metrics_for": "15m",
    "bucket_bound_window": "1h",
    "bucket_bound_for": "30m",
    # Client probe (--probe). LLMProbeFailing: more than probe_failing_ratio of the probe's requests
    # failed over probe_failing_window, for probe_failing_for. LLMProbeLatencyGap: the probe's mean
    # TTFT exceeds the engine's own by probe_gap_seconds and by probe_gap_factor times, for probe_gap_for.
    "probe_failing_window": "10m",
    "probe_failing_ratio": slo.PROBE_FAILING_RATIO,
    "probe_failing_for": "5m",
    "probe_gap_seconds": slo.PROBE_GAP.gap_seconds,
    "probe_gap_factor": slo.PROBE_GAP.factor,
    "probe_gap_for": "10m",
    # Routers (--router; exporter/derive/routing.py). LLMRouterDown: the router's /metrics not read for
    # router_down_for. LLMRouterBackendOut: the router took a backend out of rotation (breaker open or
    # health check failing) for router_backend_out_for: short, as the router's own detection already
    # waited for its failure threshold. LLMRoutingSkew: the verdict names routing (one replica takes most
    # of the traffic and misses its SLO or queues while another idles) for routing_skew_for.
    # LLMRouterErrors: more than router_error_ratio of the router's requests failed (client errors
    # aside) over router_error_window, for router_errors_for.
    "router_down_for": "2m",
    "router_backend_out_for": "30s",
    "routing_skew_for": "10m",
    "router_error_window": "5m",
    "router_error_ratio": 0.05,
    "router_errors_for": "5m",
    # Alertmanager: replace the placeholder URLs (or edit the generated file's copy you deploy).
    "alertmanager": {
        "pager_url": "http://alert-pager.example.invalid/llm-exporter",
        "ticket_url": "http://alert-tickets.example.invalid/llm-exporter",
        # Grouped by alertname, the fleet labels (one notification per cluster's breach, not one for
        # every cluster whose model shares a name; absent labels group as empty), then these.
        "group_by": ("target", "model"),
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


def fleet_labels(cfg: Mapping) -> tuple[str, ...]:
    """The labels a fleet rule keeps and a fleet panel scopes by: the cluster label, then the others."""
    return (cfg["cluster_label"], *cfg["fleet_extra_labels"])


class MixinConfigError(ValueError):
    """An override the defaults cannot take: an unknown key or a value of the wrong kind."""


_DURATION = re.compile(r"(\d+[smhdw])+")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Keys whose value names labels: each must be a valid Prometheus label name, since it is spliced
# into every selector, grouping and template.
_LABEL_KEYS = frozenset({"cluster_label", "fleet_extra_labels", "exporter_labels", "gpu_join_labels",
                         "aggregate_away", "pod_label", "gpu_holder_label_prefix"})


def with_overrides(base: Mapping, overrides: object, where: str = "") -> dict:
    """`base` with the keys of `overrides` replaced, recursively into nested mappings. An unknown key
    (with the closest known ones), or a value whose kind differs from the default's (a number for a
    number, a list for a list, a Prometheus duration for a duration, a label name for a label), is a
    MixinConfigError naming the key's place (alertmanager.group_wait)."""
    if not isinstance(overrides, Mapping):
        raise MixinConfigError(f"{where or 'the config'}: expected a mapping of keys, got {_kind(overrides)}")
    out = dict(base)
    for key, value in overrides.items():
        name = str(key) if str(key).isprintable() else repr(key)  # a file's text never drives the terminal
        place = f"{where}.{name}" if where else name
        if key not in base:
            close = difflib.get_close_matches(str(key), [str(k) for k in base], n=3)
            hint = f"did you mean {' or '.join(close)}?" if close else "exporter/mixin/config.py lists the keys"
            raise MixinConfigError(f"{place}: unknown key; {hint}")
        out[key] = _checked(place, base[key], value, label=key in _LABEL_KEYS)
    return out


def _checked(place: str, default: object, value: object, *, label: bool = False) -> object:
    if isinstance(default, Mapping):
        return with_overrides(default, value, place)
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple):
            raise MixinConfigError(f"{place}: expected a list, got {_kind(value)}")
        # Items are checked against the default's first (burn-rate pairs: each a whole pair, every
        # key given); an empty default (disabled_alerts) holds names.
        model = default[0] if default else "name"
        items = []
        for i, item in enumerate(value):
            if isinstance(model, Mapping):
                if not isinstance(item, Mapping) or set(item) != set(model):
                    raise MixinConfigError(f"{place}[{i}]: expected a mapping of {', '.join(model)}")
                item = with_overrides(model, item, f"{place}[{i}]")
            else:
                item = _checked(f"{place}[{i}]", model, item, label=label)
            items.append(item)
        return tuple(items)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise MixinConfigError(f"{place}: expected true or false, got {_kind(value)}")
        return value
    if isinstance(default, int | float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MixinConfigError(f"{place}: expected a number, got {_kind(value)}")
        if not math.isfinite(value):  # .nan / .inf would be written into every rule that reads it
            raise MixinConfigError(f"{place}: expected a finite number, got {value}")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise MixinConfigError(f"{place}: expected a string, got {_kind(value)}")
        if _DURATION.fullmatch(default) and not _DURATION.fullmatch(value):
            raise MixinConfigError(f"{place}: expected a Prometheus duration (5m, 1h30m), got {value!r}")
        if label and not _LABEL_NAME.fullmatch(value):
            raise MixinConfigError(f"{place}: {value!r} is not a label name ([A-Za-z_][A-Za-z0-9_]*)")
        return value
    raise MixinConfigError(f"{place}: cannot be overridden")  # no default of another kind exists today


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__
