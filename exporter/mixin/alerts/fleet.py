"""The fleet view: per-model rules over every replica (of a model, in a cluster and namespace), and
the capacity-loss alerts.

Every per-model rule aggregates `by (cluster, namespace, model, ...)` (lib.by_fleet), naming what it
keeps: `cluster` and `namespace` stay when the series carry them (a Prometheus per cluster with
external_labels, Kubernetes scrapes), nothing a scrape adds leaks in, and a central store holding
several clusters keeps them apart.

- Latency: `model:<hist>_bucket:rate5m` sums the replicas' bucket rates and `model:<hist>:p99_5m` is
  its quantile: the fleet's p99, where each replica weighs by its traffic. The max of per-replica
  p99s is not it: one slow replica serving a request a minute would set it. The bucket sum keeps
  `engine`: engines' bucket layouts differ (vLLM TTFT ... 1, 2.5, 5; SGLang ... 1, 2, 4), and summing
  different layouts mixes cumulative counts of different bounds, which gives wrong quantiles and
  negative heatmap cells. A model served by two engines has a p99 per engine.
- Requests: finished requests/s by reason (every SLO window: the availability SLO reads them), the
  error ratio (FINISH_REASONS `error` and `rejected`: the server failed the request) and the abort
  ratio (`abort`: the client cancelled), per model and per replica; tokens/s, running and waiting.
- Availability SLO (exporter/slo.py AVAILABILITY): good-ratio rules per burn window, which the slo
  area's LLMAvailabilityErrorBudgetBurn reads.
- Capacity: replicas up per model, GPUs up per cluster and namespace, KV cache capacity per model;
  LLMFleetReplicasLost / LLMFleetCapacityHalved / LLMFleetGPUsLost compare them with their most
  within a lookback.

Zero traffic gives no sample, never NaN: denominators are kept only above 0 (lib.when_positive), and
quantiles read only histograms that saw a request (lib.quantile_of). An error ratio is 0, not absent,
when a model has traffic but no error series: `or 0 * total`, so an outage of a model whose engine
only exposes the reasons it has seen still has a ratio to alert on.
"""

from __future__ import annotations

from exporter.mixin.alerts.lib import (
    GPUS_UP,
    LATENCY_HISTOGRAMS,
    REPLICAS_UP,
    alert,
    availability_good_ratio_rule,
    by_fleet,
    cluster_who,
    finished_rate_rule,
    fleet_bucket_rule,
    fleet_quantile_rule,
    fleet_who,
    fmt_num,
    fmt_pct,
    nominal,
    quantile_of,
    rec,
    regex_of,
    sel,
    slo_windows,
    when_positive,
    without,
)
from exporter.mixin.config import fleet_labels

# The histograms that get a fleet quantile: the three a user feels.
FLEET_HISTOGRAMS = ("ttft", "tbt", "e2e")
FINISHED = "llm_requests_finished_total"


def ratio(bad: str, total: str) -> str:
    """bad / total, 0 where `bad` has no series but `total` does, no sample where total is 0."""
    return f"({bad}\n  or 0 * {total})\n/\n{when_positive(total)}"


POD_GPU_RULES = (  # record name, GPU family, aggregation over the pod's GPUs
    ("pod:llm_gpus:count", "llm_gpu_up", "count"),
    ("pod:llm_gpu_utilization_ratio:avg", "llm_gpu_utilization_ratio", "avg"),
    ("pod:llm_gpu_dram_bandwidth_utilization_ratio:avg", "llm_gpu_dram_bandwidth_utilization_ratio", "avg"),
    ("pod:llm_gpu_power_watts:sum", "llm_gpu_power_watts", "sum"),
)


def pod_gpu_rules(cfg: dict) -> list[dict]:
    """Each engine pod's GPUs, whoever reads them: a sidecar's GPU series carry its own pod's labels;
    the DaemonSet's carry the holder's as exported_pod / exported_namespace (gpu_holder_label_prefix),
    which replace its own here. Kept only for pods with an engine target (llm_engine_up with a pod),
    so the DaemonSet's free GPUs (its own pod) and scrapes without pods (no Kubernetes) record nothing."""
    pod, prefix = cfg["pod_label"], cfg["gpu_holder_label_prefix"]
    holder = (*cfg["fleet_extra_labels"], pod)
    keys = ", ".join((*fleet_labels(cfg), pod))

    def as_holder(expr: str) -> str:
        for label in holder:
            expr = f'label_replace({expr}, "{label}", "$1", "{prefix}{label}", "(.+)")'
        return expr

    with_pod = pod + '!=""'
    engines = f"group by ({keys}) ({sel('llm_engine_up', with_pod, cfg=cfg)})"
    return [rec(name, f"{how} by ({keys}) (\n  {as_holder(sel(family, cfg=cfg))}\n)\nand on ({keys}) {engines}")
            for name, family, how in POD_GPU_RULES]


def groups(cfg: dict) -> list[dict]:
    w = cfg["rate_window"]
    n = nominal(w)
    avail = cfg["availability_slo"]
    bad = f'reason=~"{regex_of(avail["bad_reasons"])}"'
    aborts = f'reason=~"{regex_of(avail["abort_reasons"])}"'

    def fleet_sum_rate(series: str, window: str, *keep: str) -> str:
        return f"sum {by_fleet('model', *keep, cfg=cfg)} (rate({sel(series, cfg=cfg)}[{window}]))"

    def fleet_sum(series: str, *matchers: str) -> str:
        return f"sum {by_fleet('model', cfg=cfg)} ({series}{{{','.join(matchers)}}})" if matchers \
            else f"sum {by_fleet('model', cfg=cfg)} ({series})"

    rules: list[dict] = []
    for short in FLEET_HISTOGRAMS:
        metric = LATENCY_HISTOGRAMS[short]
        bucket = fleet_bucket_rule(metric, w)
        rules.append(rec(bucket, fleet_sum_rate(metric + "_bucket", w, "engine", "le")))
        for q in cfg["quantiles"]:
            rules.append(rec(fleet_quantile_rule(metric, q, w), quantile_of(q, bucket)))

    # Finished requests by reason, over every SLO window: the ratios below, the availability
    # good ratios and its traffic floor read these instead of the raw counters again.
    for window in slo_windows(cfg):
        rules.append(rec(finished_rate_rule(window), fleet_sum_rate(FINISHED, window, "reason")))
    finished = finished_rate_rule(w)
    for kind, matcher in (("error", bad), ("abort", aborts)):
        rules.append(rec(f"model:llm_requests_{kind}:ratio_rate{n}",
                         ratio(fleet_sum(finished, matcher), fleet_sum(finished))))
    # Per replica (target and model), in recording.py's style: everything but aggregate_away kept.
    for kind, matcher in (("error", bad), ("abort", aborts)):
        rules.append(rec(
            f"target_model:llm_requests_{kind}:ratio_rate{n}",
            ratio(f"sum {without('reason', cfg=cfg)} (rate({sel(FINISHED, matcher, cfg=cfg)}[{w}]))",
                  f"sum {without('reason', cfg=cfg)} (rate({sel(FINISHED, cfg=cfg)}[{w}]))")))
    for window in slo_windows(cfg):
        rate = finished_rate_rule(window)
        rules.append(rec(availability_good_ratio_rule(window),
                         f"1 - {ratio(fleet_sum(rate, bad), fleet_sum(rate))}"))

    rules += [
        rec(f"model:llm_generation_tokens:rate{n}", fleet_sum_rate("llm_generation_tokens_total", w)),
        rec(f"model:llm_prompt_tokens:rate{n}", fleet_sum_rate("llm_prompt_tokens_total", w)),
        rec("model:llm_requests_running:sum", fleet_sum(sel("llm_requests_running", cfg=cfg))),
        rec("model:llm_requests_waiting:sum", fleet_sum(sel("llm_requests_waiting", cfg=cfg))),
    ]

    # Capacity. llm_engine_up has no `model`: a replica is one (job, instance, target) that is up
    # and serves the model (its llm_requests_running, which every engine table maps, names it).
    # The join keeps cluster and namespace, so two clusters' "vllm-0" stay two replicas.
    replica = ", ".join((*fleet_labels(cfg), "job", "instance", "target"))
    rules += [
        rec(REPLICAS_UP,
            f"count {by_fleet('model', cfg=cfg)} (\n"
            f"  group by ({replica}, model) ({sel('llm_requests_running', cfg=cfg)})\n"
            f"  and on ({replica}) ({sel('llm_engine_up', cfg=cfg)} == 1)\n)"),
        rec(GPUS_UP, f"count {by_fleet(cfg=cfg)} ({sel('llm_gpu_up', cfg=cfg)} == 1)"),
        rec("model:llm_kv_cache_capacity_tokens:sum", fleet_sum(sel("llm_kv_cache_capacity_tokens", cfg=cfg))),
    ]
    rules += pod_gpu_rules(cfg)

    lookback, critical = cfg["fleet_capacity_lookback"], cfg["fleet_capacity_critical_ratio"]

    def most(rule: str) -> str:
        return f"max_over_time({rule}[{lookback}])"

    def now(rule: str) -> str:
        # A model (cluster) whose last replica (GPU) went has no count at all: 0 while the lookback
        # still remembers it, so losing everything alerts too.
        return f"({rule} or 0 * {most(rule)})"

    alerts = [
        alert(
            "LLMFleetReplicasLost", f"{now(REPLICAS_UP)}\n< {most(REPLICAS_UP)}", "warning",
            "A model has fewer replicas up than it had within the lookback.",
            f"{fleet_who(cfg)}: {{{{ $value }}}} replica(s) up, fewer than the most up within the last "
            f"{lookback}. A replica that died, was evicted or cannot start; or a deliberate scale-down, "
            f"which warns until the lookback forgets the old count.",
            cfg["fleet_lost_for"], cfg=cfg),
        alert(
            "LLMFleetCapacityHalved",
            f"{now(REPLICAS_UP)}\n<= {fmt_num(critical)} * {most(REPLICAS_UP)}", "critical",
            f"A model lost at least {fmt_pct(1 - critical)} of its replicas.",
            f"{fleet_who(cfg)}: {{{{ $value }}}} replica(s) up, at most {fmt_pct(critical)} of the most up within "
            f"the last {lookback}. The rest now carry the traffic of the lost ones: expect queueing and "
            f"latency SLO burn next.",
            cfg["fleet_halved_for"], cfg=cfg),
        alert(
            "LLMFleetGPUsLost", f"{now(GPUS_UP)}\n< {most(GPUS_UP)}", "warning",
            "Fewer GPUs are up than within the lookback.",
            f"{cluster_who(cfg)}: {{{{ $value }}}} GPU(s) up, fewer than the most up within the last {lookback}. "
            f"GPUs fell off the bus or their nodes or exporters went (LLMGPULost and LLMExporterDown "
            f"name which); or nodes were drained on purpose.",
            cfg["fleet_lost_for"], cfg=cfg),
    ]
    return [
        {"name": "llm-exporter.fleet.rules", "rules": rules},
        {"name": "llm-exporter.fleet.alerts", "rules": alerts},
    ]
