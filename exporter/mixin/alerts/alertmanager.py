"""The Alertmanager config: routing by severity (critical pages, warning opens a ticket, info goes
nowhere) and the inhibitions that keep one cause from paging twice (a critical XID, an absent
exporter; the longer burn-rate pair of an SLO over its shorter ones). Built from the rendered areas,
so a disabled alert drops out of its inhibitions too.

Alertmanager drops the resolved notification of an alert that resolves while inhibited
(prometheus/alertmanager#2754): an alert that had already notified is then never closed at the
receiver. So an inhibition only targets alerts that its source's cause makes fire at the same time,
never alerts that may have fired before it. LLMEngineDown inhibits nothing: an engine's outage cannot
make its latency, SLO or saturation alerts fire (their series vanish with it), those that fired
before it are earlier news whose resolve must reach the ticket, and the probe alert leaves an outage
to LLMEngineDown in its own expression (exporter/mixin/alerts/probe.py). A live vLLM showed it: the KV-full ticket
resolved during the outage, inhibited, and stayed open at the receiver. LLMGPULost inhibits nothing
for the same reason: a lost GPU's NVML series vanish, so none of its alerts can start, and the one
its loss does fire (XID 79, fallen off the bus) pages at once, a minute before LLMGPULost's `for`
ends, and resolves an hour later while the GPU is still lost. A critical XID inhibits only the ECC
alert of the same event (XID 48 is the double-bit error): both fire at once (no `for` on either), so
the ECC alert is muted before it ever notifies."""

from __future__ import annotations

from exporter.mixin.alerts.lib import nominal
from exporter.mixin.config import CONFIG, fleet_labels
from exporter.slo import duration_seconds


def alert_names_by_area(areas: dict[str, list[dict]]) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for area, groups in areas.items():
        for g in groups:
            for r in g["rules"]:
                if "alert" in r and r["alert"] not in names.setdefault(area, []):
                    names[area].append(r["alert"])
    return names


def burn_inhibitions(names: list[str], cfg: dict = CONFIG) -> list[dict]:
    """One SLO breach, one page: for each SLO alert, a burn pair inhibits the pairs of shorter long
    windows at its severity, and a paging pair inhibits the ticket pairs. Without these the pairs
    of one SLO (one Alertmanager group) flip in and out as their windows fill and empty, and
    every flip is a new notification."""
    rank = {"critical": 2, "warning": 1, "info": 0}
    # cluster and namespace: one cluster's page must not mute another's (a central store holds both);
    # the availability SLO's alerts carry no target or exporter labels, which then match as empty.
    scope = [*fleet_labels(cfg), *cfg["exporter_labels"], "target", "model", "slo"]
    pairs = sorted(cfg["burn_rates"], key=lambda br: duration_seconds(nominal(br["long"])))
    out = []
    for spec in (*cfg["slos"].values(), cfg["availability_slo"]):
        if spec["alert"] not in names:
            continue
        for source in pairs:
            for target in pairs:
                longer = duration_seconds(nominal(source["long"])) > duration_seconds(nominal(target["long"]))
                same, higher = source["severity"] == target["severity"], rank[source["severity"]] > rank[
                    target["severity"]]
                if (same and longer) or higher:
                    out.append({
                        "source_matchers": [f'alertname="{spec["alert"]}"', f'long="{source["long"]}"'],
                        "target_matchers": [f'alertname="{spec["alert"]}"', f'long="{target["long"]}"'],
                        "equal": list(scope),
                    })
    return out


def alertmanager(areas: dict[str, list[dict]], cfg: dict = CONFIG) -> dict:
    am = cfg["alertmanager"]
    names = alert_names_by_area(areas)
    exporter_labels = list(cfg["exporter_labels"])
    inhibit = burn_inhibitions(names.get("slo", []), cfg)
    # XID 48 is the double-bit ECC event itself: the critical XID already pages for it. (Not the
    # warning XIDs: those are other, often earlier, events, whose tickets must close.)
    hardware = names.get("hardware", [])
    if {"LLMGPUXidCritical", "LLMGPUUncorrectableECCErrors"} <= set(hardware):
        inhibit.append({
            "source_matchers": ['alertname="LLMGPUXidCritical"'],
            "target_matchers": ['alertname="LLMGPUUncorrectableECCErrors"'],
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
            "group_by": ["alertname", *fleet_labels(cfg), *am["group_by"]],
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
