"""Plain p99 tail alerts, for teams without SLOs."""

from __future__ import annotations

from exporter.mixin.alerts.lib import LATENCY_HISTOGRAMS, TM, alert, fmt_num, quantile_rule, request_rate_rule


def groups(cfg: dict) -> list[dict]:
    w, floor = cfg["rate_window"], fmt_num(cfg["min_request_rate"])
    rules = []
    for name, metric, thr, what in (
        ("LLMTimeToFirstTokenP99High", LATENCY_HISTOGRAMS["ttft"], cfg["ttft_p99_seconds"],
         "time to first token"),
        ("LLMTimeBetweenTokensP99High", LATENCY_HISTOGRAMS["tbt"], cfg["tbt_p99_seconds"],
         "time between tokens"),
    ):
        expr = (f"{quantile_rule(metric, 0.99, w)} > {fmt_num(thr)}\n"
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
