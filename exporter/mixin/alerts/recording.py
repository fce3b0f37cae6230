"""Recording rules: per-(target, model) latency quantiles and means, throughput, the SLO
good-event ratios the slo area's burn-rate alerts read, and the client probe's TTFT gap.

Zero traffic gives no sample, never NaN: every ratio and mean divides by a denominator kept only
where it is above 0, and a quantile only reads histograms that saw a request (lib.quantile_of), so a
panel says "No traffic" and no alert compares a NaN. The per-model (fleet) rules are
exporter/mixin/alerts/fleet.py's."""

from __future__ import annotations

from exporter.mixin.alerts.lib import (
    LATENCY_HISTOGRAMS,
    engine_mean_rule,
    good_ratio_rule,
    le_matcher,
    nominal,
    probe_gap_rule,
    probe_mean_rule,
    quantile_of,
    quantile_rule,
    rec,
    request_rate_rule,
    sel,
    slo_windows,
    when_positive,
    without,
)

# The histograms that get p50/p95/p99; the others (queue, prefill, decode) only p99.
ALL_QUANTILES = ("ttft", "tbt", "e2e")


def groups(cfg: dict) -> list[dict]:
    w = cfg["rate_window"]
    n = nominal(w)  # in rule names: unscaled under --time-scale

    def sum_rate(series: str, window: str, *matchers: str, away: tuple[str, ...] = ()) -> str:
        """sum without (<aggregate_away>, <away>) (rate(series{<selector>, <matchers>}[window]))."""
        return f"sum {without(*away, cfg=cfg)} (rate({sel(series, *matchers, cfg=cfg)}[{window}]))"

    def aggregate(op: str, series: str) -> str:
        return f"{op} {without(cfg=cfg)} ({sel(series, cfg=cfg)})"

    latency: list[dict] = []
    for short, metric in LATENCY_HISTOGRAMS.items():
        # Each quantile reads the raw bucket rates rather than a recorded `_bucket:rate5m`: that
        # recording was one series per bucket per replica (about 140 of a vLLM replica's 180 recorded
        # series) that nothing but these rules read; the rate is taken again per quantile instead
        # (docs/benchmarks.md, "Central store at scale", measures both).
        buckets = sum_rate(metric + "_bucket", w)
        every_request = sum_rate(metric + "_bucket", w, 'le="+Inf"')
        for q in cfg["quantiles"] if short in ALL_QUANTILES else (0.99,):
            latency.append(rec(quantile_rule(metric, q, w), quantile_of(q, buckets, every_request)))
        latency.append(rec(engine_mean_rule(metric, w),
                           f"{sum_rate(metric + '_sum', w)}\n/\n{when_positive(sum_rate(metric + '_count', w))}"))

    throughput = [
        rec(f"target_model:llm_prompt_tokens:rate{n}", sum_rate("llm_prompt_tokens_total", w)),
        rec(f"target_model:llm_generation_tokens:rate{n}", sum_rate("llm_generation_tokens_total", w)),
        rec(f"target_model:llm_preemptions:rate{n}", sum_rate("llm_preemptions_total", w)),
        rec("target_model:llm_requests_running:sum", aggregate("sum", "llm_requests_running")),
        rec("target_model:llm_requests_waiting:sum", aggregate("sum", "llm_requests_waiting")),
        rec("target_model:llm_kv_cache_usage_ratio:max", aggregate("max", "llm_kv_cache_usage_ratio")),
    ]

    slo = [rec(request_rate_rule(window), sum_rate("llm_time_to_first_token_seconds_count", window))
           for window in slo_windows(cfg)]
    for spec in cfg["slos"].values():
        metric, le = spec["metric"], le_matcher(spec["threshold_seconds"])
        for window in slo_windows(cfg):
            slo.append(rec(good_ratio_rule(metric, window),
                           f"{sum_rate(metric + '_bucket', window, le, away=('le',))}\n/\n"
                           f"{when_positive(sum_rate(metric + '_count', window))}"))
    # The client probe (--probe): its mean TTFT, and the gap to the engine's own mean TTFT over the
    # same window, "what lies in front of the engine" (network, proxy, queueing). A recording rule
    # rather than an exporter-side derivation: both are cumulative histograms, whose window means
    # PromQL takes exactly from _sum and _count rates (resets handled), over any window and after
    # any aggregation, and the probe's series are read by no derive stage. `ignoring (engine)
    # group_left`: the result keeps the probe's labels, `engine` included; a probe of an engine that
    # is not scraped has no `engine` label (and no engine TTFT, so no gap).
    ttft = "llm_time_to_first_token_seconds"
    probe = [
        rec(probe_mean_rule(w), f"{sum_rate('llm_probe_time_to_first_token_seconds_sum', w)}\n/\n"
                                f"{when_positive(sum_rate('llm_probe_time_to_first_token_seconds_count', w))}"),
        rec(probe_gap_rule(w), f"{probe_mean_rule(w)}\n- ignoring (engine) group_left\n{engine_mean_rule(ttft, w)}"),
    ]
    return [
        {"name": "llm-exporter.latency.rules", "rules": latency},
        {"name": "llm-exporter.throughput.rules", "rules": throughput},
        {"name": "llm-exporter.slo.rules", "rules": slo},
        {"name": "llm-exporter.probe.rules", "rules": probe},
    ]
