"""Plain p99 tail alerts, for teams without SLOs."""

from __future__ import annotations

from alerts.lib import TM, alert, fmt_num, request_rate_rule


def groups(cfg: dict) -> list[dict]:
    w, floor = cfg["rate_window"], fmt_num(cfg["min_request_rate"])
    rules = []
    for name, metric, thr, what in (
        ("LLMTimeToFirstTokenP99High", "llm_time_to_first_token_seconds", cfg["ttft_p99_seconds"],
         "time to first token"),
        ("LLMTimeBetweenTokensP99High", "llm_inter_token_latency_seconds", cfg["tbt_p99_seconds"],
         "time between tokens"),
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
