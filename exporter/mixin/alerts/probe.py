"""Client probe alerts (`llm-exporter run --probe`): the engine's API failing for a client while its
/metrics may look fine, and a client-side TTFT far above the engine's own (what lies in front of it)."""

from __future__ import annotations

from exporter.mixin.alerts.lib import (
    TM,
    alert,
    engine_mean_rule,
    fmt_num,
    fmt_pct,
    probe_gap_rule,
    probe_mean_rule,
    sel,
    without,
)


def groups(cfg: dict) -> list[dict]:
    w = cfg["probe_failing_window"]
    errors = f"sum {without('reason', cfg=cfg)} (increase({sel('llm_probe_errors_total', cfg=cfg)}[{w}]))"
    requests = f"sum {without(cfg=cfg)} (increase({sel('llm_probe_requests_total', cfg=cfg)}[{w}]))"
    # An engine that was down in the window fails every probe: LLMEngineDown pages for that, so the
    # probe stays quiet until the window holds none of the outage (no second alert for one cause, and
    # no ticket opened right after the restart from the outage's errors).
    on = ", ".join((*cfg["exporter_labels"], "target"))
    engine_was_down = f"min by ({on}) (min_over_time({sel('llm_engine_up', cfg=cfg)}[{w}])) == 0"
    rw = cfg["rate_window"]
    gap, client = probe_gap_rule(rw), probe_mean_rule(rw)
    server = engine_mean_rule("llm_time_to_first_token_seconds", rw)
    seconds, factor = fmt_num(cfg["probe_gap_seconds"]), fmt_num(cfg["probe_gap_factor"])
    rules = [
        alert("LLMProbeFailing",
              f"{errors}\n/\n({requests} > 0)\n> {fmt_num(cfg['probe_failing_ratio'])}\n"
              f"unless on ({on})\n{engine_was_down}",
              "warning", f"Probe requests to {TM} are failing.",
              f"{{{{ $value | humanizePercentage }}}} of the client-side probe's streaming requests to {TM} from "
              f"the exporter on {{{{ $labels.instance }}}} failed over the last {w} (more than "
              f"{fmt_pct(cfg['probe_failing_ratio'])}): clients of its OpenAI-compatible API are likely failing "
              "too, even where the engine's /metrics looks healthy. llm_probe_errors_total{reason} says how.",
              cfg["probe_failing_for"], cfg=cfg),
        alert("LLMProbeLatencyGap",
              f"{gap} > {seconds}\n"
              f"and ignoring (engine)\n"
              f"({client}\n  > ignoring (engine) group_left\n  {factor} * {server})",
              "warning", f"Clients of {TM} wait far longer for a first token than the engine measures.",
              f"The probe's mean time to first token from the exporter on {{{{ $labels.instance }}}} is "
              f"{{{{ $value | humanizeDuration }}}} above the engine's own mean over {rw} (more than {seconds}s "
              f"and more than {factor}x it): the time goes in front of the engine (network, a proxy or gateway "
              "queueing, TLS, the API server's own work), not in its queue or prefill.",
              cfg["probe_gap_for"], cfg=cfg),
    ]
    return [{"name": "llm-exporter.probe.alerts", "rules": rules}]
