"""SLO alerts: multi-window, multi-burn-rate pairs per latency SLO (exporter/slo.py) per target and
model, the same pairs for the availability SLO per model's fleet (cluster, namespace, model; its
good ratios are exporter/mixin/alerts/fleet.py's), and the check that each latency SLO threshold is a bucket bound
of the engine's histogram."""

from __future__ import annotations

import functools
from collections.abc import Callable

from exporter.mixin.alerts.lib import (
    TM,
    alert,
    availability_good_ratio_rule,
    by_fleet,
    finished_rate_rule,
    fleet_who,
    fmt_num,
    fmt_pct,
    good_ratio_rule,
    le_matcher,
    request_rate_rule,
    sel,
    without,
)
from exporter.slo import budget_lasts


def burn_expr(good_ratio: Callable[[str], str], budget: float, br: dict, traffic_floor: str) -> str:
    """Both windows of a burn-rate pair burn faster than its factor, with enough traffic: the good
    ratio over a window comes from `good_ratio(window)` (a recording rule's name)."""
    burns = [f"(1 - {good_ratio(br[w])}) / {fmt_num(budget)} > {fmt_num(br['factor'])}" for w in ("long", "short")]
    return "\nand\n".join((*burns, traffic_floor))


def groups(cfg: dict) -> list[dict]:
    rules: list[dict] = []
    floor = fmt_num(cfg["min_request_rate"])
    for key, spec in cfg["slos"].items():
        metric, objective, threshold = spec["metric"], spec["objective"], spec["threshold_seconds"]
        budget = round(1 - objective, 10)
        for br in cfg["burn_rates"]:
            long, short, factor = br["long"], br["short"], br["factor"]
            expr = burn_expr(functools.partial(good_ratio_rule, metric), budget, br,
                             f"{request_rate_rule(long)} >= {floor}")
            page = br["severity"] == "critical"
            rules.append(alert(
                spec["alert"], expr, br["severity"],
                f"{spec['summary']} SLO error budget burning {'fast' if page else 'slowly'}.",
                f"{TM}: {{{{ $value | humanize }}}}x the sustainable error rate over {long} "
                f"(and over {short}) for the SLO \"{fmt_pct(objective)} of {spec['title']} "
                f"within {fmt_num(threshold)}s\" over {cfg['slo_period']}. At {fmt_num(factor)}x the "
                f"budget lasts {budget_lasts(cfg['slo_period'], factor)}.",
                br["for"], {"slo": key, "long": long, "short": short}, cfg=cfg,
                # A short window that empties for a moment (a lull between finishing requests, a
                # scrape gap) must not resolve the page and fire it again: each flip is a new
                # notification. Kept for one short window, it resolves that much later.
                keep_firing_for=short if cfg["burn_keep_firing"] else None,
            ))
    rules += availability(cfg)
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


def availability(cfg: dict) -> list[dict]:
    """LLMAvailabilityErrorBudgetBurn: the burn-rate pairs over a model's fleet. Aggregated per
    (cluster, namespace, model), so a breach across 40 replicas is one alert, not 40; the traffic
    floor is the fleet's finished requests/s over the long window. No traffic: the good ratios have
    no sample (fleet.py), so nothing compares and nothing fires."""
    spec = cfg["availability_slo"]
    budget = round(1 - spec["objective"], 10)
    floor = fmt_num(cfg["min_request_rate"])
    bad = " or ".join(spec["bad_reasons"])
    rules = []
    for br in cfg["burn_rates"]:
        long, short, factor = br["long"], br["short"], br["factor"]
        expr = burn_expr(availability_good_ratio_rule, budget, br,
                         f"sum {by_fleet('model', cfg=cfg)} ({finished_rate_rule(long)}) >= {floor}")
        page = br["severity"] == "critical"
        rules.append(alert(
            spec["alert"], expr, br["severity"],
            f"Availability SLO error budget burning {'fast' if page else 'slowly'}.",
            f"{fleet_who(cfg)}: {{{{ $value | humanize }}}}x the sustainable error rate over {long} (and over "
            f"{short}) for the SLO \"{fmt_pct(spec['objective'])} of finished requests not failed "
            f"by the server ({bad})\" over {cfg['slo_period']}. At {fmt_num(factor)}x the "
            f"budget lasts {budget_lasts(cfg['slo_period'], factor)}.",
            br["for"], {"slo": spec["key"], "long": long, "short": short}, cfg=cfg,
            keep_firing_for=short if cfg["burn_keep_firing"] else None,
        ))
    return rules
