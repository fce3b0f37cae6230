"""LLM Serving / Overview: where the bottleneck is, latency against the SLO, throughput, KV cache, cost."""

from __future__ import annotations

from exporter import slo
from exporter.catalog.derived import RESOURCES
from exporter.derive.bottleneck import HOLD_CYCLES
from exporter.mixin.alerts.lib import fmt_num
from exporter.mixin.dashboards import verdict
from exporter.mixin.dashboards.lib import (
    FILENAMES,
    SETTINGS,
    TOKENS,
    TOKENS_PER_S,
    ConfigText,
    ConfigView,
    Panel,
    Promql,
    Row,
    RowBuilder,
    burn_rates,
    color_override,
    dashboard,
    dashboard_link,
    divide,
    fleet,
    heatmap,
    layout,
    repeat_per,
    right_axis,
    row,
    slo_view,
    standard_variables,
    stat,
    state_timeline,
    table,
    target,
    thresholds,
    timeseries,
    value_map,
)

FILENAME = FILENAMES["overview"]
TITLE = "LLM Serving / Overview"

T = Promql("target")
TM = Promql("target_model")
TME = Promql("target_model_engine")
M = Promql("model")

TTFT = slo_view("ttft")
TBT = slo_view("tbt")
WINDOW = ConfigText("rate_window")  # the recording rules' window, e.g. 5m
ITL = "llm_inter_token_latency_seconds"
TPOT = "llm_time_per_output_token_seconds"
# One engine's series: the labels fallbacks (`or on (...)`) match on, so a fallback fills in per
# engine target, not for the whole selection.
ENGINE = fleet("instance", "target", "model")


def burn_windows() -> list[str]:
    """The burn-rate windows of the config's alert pairs, shortest first."""
    return sorted({w for br in burn_rates() for w in (br["short"], br["long"])}, key=slo.duration_seconds)


BURN_COLORS = ("yellow", "orange", "red", "dark-red")  # the pairs' factors, lowest first

# One colour per verdict, grouped by kind: idle grey, headroom green (healthy, serving), roofs
# blue/purple, constraints warm.
RESOURCE_COLORS = {
    "idle": "text", "headroom": "green", "compute": "blue", "memory_bandwidth": "purple", "kv_capacity": "red",
    "scheduler": "light-red", "host_cpu": "orange", "interconnect": "yellow", "power_thermal": "dark-red",
    "routing": "dark-orange",
}


def rule(name: str, *extra: str) -> str:
    """A per-(target, model) recording rule from alerts/rules/recording.yaml, scoped like the rest."""
    return TM.sel(f"target_model:{name}", *extra)


def fleet_rule(name: str, *extra: str) -> str:
    """A per-model recording rule (`model:...`, summed over every replica of the model in a cluster and
    namespace, engines kept apart): the fleet's numbers, not any one replica's."""
    return M.sel(f"model:{name}", *extra)


# The fleet recording rules' labels: one series per model and engine kind in each cluster and namespace.
FLEET = fleet("model", "engine")
NO_TRAFFIC = "No traffic"
# Events per second that Grafana scales (1.2 k/s), for counters read as rates.
PER_S = "si:/s"
# --gpu-price-per-hour is a bare number: the cost is in whatever currency the price was given in.
CURRENCY = "currency of --gpu-price-per-hour"


def verdict_code_expr() -> str:
    """One value per target: the index (1-based) of the resource whose llm_bottleneck is 1, so a
    state timeline shows one row per target whose colour and text is the verdict."""
    terms = []
    for i, resource in enumerate(RESOURCES, start=1):
        matcher = 'resource="' + resource + '"'
        terms.append(f"{T.sel('llm_bottleneck', matcher)} * {i}")
    return f"sum {fleet('instance', 'target').by()} (\n  " + "\n  or ".join(terms) + "\n)"


QUANTILES = tuple(round(q * 100) for q in slo.QUANTILES)  # the recording rules' quantiles: 50, 95, 99


def quantile_targets(metric: str) -> list[dict]:
    return [target(rule(f"{metric}:p{q}_{WINDOW}"), f"p{q} {{{{target}}}} {{{{model}}}} ({{{{instance}}}})")
            for q in QUANTILES]


def labelled(expr: str, label: str, value: str) -> str:
    """expr with a constant label added (label_replace from the empty label, which always matches)."""
    return f'label_replace(\n  {expr},\n  "{label}", "{value}", "", ""\n)'


def tbt_quantile(q: int) -> str:
    """The q-th percentile time between tokens of each engine: inter-token latency (ITL, per gap) from the
    recording rule where the engine exports it, else the engine's time per output token (TPOT, each
    request's mean gap) over the same window. `measure` says which."""
    itl = rule(f"{ITL}:p{q}_{WINDOW}")
    tpot = (f"histogram_quantile({q / 100:g}, sum by ({', '.join((*ENGINE, 'le'))}) "
            f"({TM.rate(TPOT + '_bucket', window=WINDOW)}))")
    return f"{labelled(itl, 'measure', 'ITL')}\nor {ENGINE.on()}\n{labelled(tpot, 'measure', 'TPOT')}"


def fleet_tbt_quantile(q: int) -> str:
    """The fleet's q-th percentile time between tokens per model and engine kind: the ITL rule over all
    replicas' summed buckets, else (engines without ITL: TGI, trtllm-serve) the TPOT buckets summed the same
    way, per engine kind, so bucket layouts never mix."""
    itl = fleet_rule(f"{ITL}:p{q}_{WINDOW}")
    tpot = (f"histogram_quantile({q / 100:g}, sum by ({', '.join((*FLEET, 'le'))}) "
            f"({TM.rate(TPOT + '_bucket', window=WINDOW)}))")
    return (f"{labelled(itl, 'measure', 'ITL')}\nor on ({', '.join(FLEET)})\n"
            f"{labelled(tpot, 'measure', 'TPOT')}")


def engine_heatmap(title: str, description: str, histogram: str, *, unit: str, fallback: str | None = None) -> Panel:
    """One heatmap per engine kind ($engine repeats it): engines' bucket bounds differ (vLLM's TTFT buckets are
    not SGLang's), and summing buckets of different layouts per `le` draws cells that are no distribution at
    all (negative ones once the cumulative counts are differenced). `fallback` is a histogram read, per
    engine target, where the target lacks `histogram`."""
    expr = TME.rate(histogram + "_bucket")
    if fallback is not None:
        expr = f"\n  {expr}\n  or {ENGINE.on()}\n  {TME.rate(fallback + '_bucket')}\n"
    return repeat_per(heatmap(title, description, [target(f"sum by (le) ({expr})")], unit=unit, w=24, h=7),
                      "engine", max_per_row=3)


NO_REASON = "unreported"


def finished_by_reason() -> str:
    """Finished requests/s by reason over the selection (one repeated panel per target): the finish-reason
    counter where the engine has it, else llm_requests_total, else the e2e latency histogram's count, each
    engine target (instance, target, model) taking the first it has."""
    with_reason = f"sum by ({', '.join((*ENGINE, 'reason'))}) ({TM.rate('llm_requests_finished_total')})"
    fallbacks = [labelled(f"sum {ENGINE.by()} ({TM.rate(name)})", "reason", NO_REASON)
                 for name in ("llm_requests_total", "llm_e2e_request_latency_seconds_count")]
    return "sum by (reason) (\n" + f"\nor {ENGINE.on()}\n".join((with_reason, *fallbacks)) + "\n)"


def burn(metric: str, window: str, objective: float) -> str:
    return f"(1 - {rule(f'{metric}:slo_good_ratio_rate{window}')}) / {round(1 - objective, 10)}"


def burn_pairs() -> tuple[str, list[float]]:
    """The alert pairs in words (highest factor first) and their factors (the panel's lines, lowest first)."""
    pairs = sorted(burn_rates(), key=lambda br: -br["factor"])
    said = "; ".join(
        f"{br['severity']}: above {fmt_num(br['factor'])}x over both {br['long']} and {br['short']} "
        f"(budget gone in {slo.budget_lasts(SETTINGS.slo_period, br['factor'])})" for br in pairs)
    factors = sorted({br["factor"] for br in pairs})
    assert len(factors) <= len(BURN_COLORS), "one colour per burn-rate factor"
    return said, factors


AVAILABILITY = ConfigView("availability_slo")
AVAILABILITY_RULE = "llm_requests_availability:good_ratio_rate"


def availability_burn_panel(w: int) -> Panel:
    """The availability SLO's burn rate per model over the fleet, over every window its alert pairs read."""
    said, factors = burn_pairs()
    budget, period = round(1 - AVAILABILITY.objective, 10), SETTINGS.slo_period
    return timeseries("Availability error budget burn rate per model", f"""
How fast each model's fleet spends the availability SLO's {period} error budget ({AVAILABILITY.objective:.1%}
of finished requests not failed by the server: bad = reason {' or '.join(AVAILABILITY.bad_reasons)}; client
aborts do not count), over each window an alert reads ({', '.join(burn_windows())}): (1 - good ratio) / {budget:g};
1 = exactly on budget. One series per model and cluster, all replicas together, so one breach is one page
({AVAILABILITY.alert}): a pair fires when both of its windows burn above its factor (the dashed lines); {said}.
""", [target(f"(1 - {fleet_rule(AVAILABILITY_RULE + win)}) / {budget:g}", f"{win} {{{{model}}}} {{{{cluster}}}}")
      for win in burn_windows()],
        unit="suffix:x", w=w, h=8, minimum=0, threshold_style="dashed", no_value=NO_TRAFFIC,
        steps=thresholds((None, "transparent"), *zip(factors, BURN_COLORS, strict=False)))


def error_steps() -> dict:
    """Error-ratio colours: green within the availability budget, orange above it, red where the fastest
    page burns (the budget times its factor)."""
    return thresholds((None, "green"), (round(1 - AVAILABILITY.objective, 10), "orange"),
                      (round((1 - AVAILABILITY.objective) * max(br["factor"] for br in burn_rates()), 10), "red"))


def burn_panel(spec: ConfigView, w: int) -> Panel:
    name = spec.key.upper()
    said, factors = burn_pairs()
    return timeseries(f"{name} error budget burn rate", f"""
How fast the {name} SLO ({spec.objective:.0%} within {spec.threshold_seconds} s) spends its
{SETTINGS.slo_period} error budget, over each window an alert reads ({', '.join(burn_windows())}): 1 = exactly on
budget. An alert pair fires when both of its windows burn above its factor (the dashed lines) with enough
traffic; {said}. Read a pair as its two lines both above their line.
""", [target(burn(spec.metric, win, spec.objective), f"{win} {{{{target}}}} {{{{model}}}} ({{{{instance}}}})")
      for win in burn_windows()],
        unit="suffix:x", w=w, h=8, minimum=0, threshold_style="dashed", no_value=NO_TRAFFIC,
        steps=thresholds((None, "transparent"), *zip(factors, BURN_COLORS, strict=False)))


def now_row() -> Row:
    return row("Now",
        stat("Bottleneck now", """
The resource that limits each engine target now (llm_bottleneck == 1). idle: no work at all; headroom: the
engine serves and no resource is near its limit (healthy; llm_kv_cache_headroom_sequences and the roof scores
say how much more load fits). compute and memory_bandwidth are roofs: a loaded, healthy engine sits on one
(prefill on compute, decode on HBM bandwidth). kv_capacity, scheduler, host_cpu, interconnect and
power_thermal are constraints: the fix is elsewhere than a faster GPU.
""", [target(f'{T.sel("llm_bottleneck")} == 1', "{{target}} ({{instance}}): {{resource}}")],
             w=6, text_mode="name", color_mode="none", graph=False),
        stat("Engine targets up", """
Engine targets whose /metrics the exporter scraped and parsed this cycle, out of all configured
(llm_engine_up). A target that is down has no latency or throughput series at all.
""", [target(f'sum({T.sel("llm_engine_up")})', "up"), target(f'count({T.sel("llm_engine_up")})', "configured")],
             w=3, graph=False),
        stat("Decode tokens/s", f"""
Output tokens generated per second over {WINDOW}, all selected targets. Tokens/s is a system-level result:
batching raises it, usually at the cost of TTFT and time between tokens.
""", [target(f'sum({rule(f"llm_generation_tokens:rate{WINDOW}")})', "tokens/s")], unit=TOKENS_PER_S, w=3),
        stat(f"TTFT p99 ({WINDOW})", f"""
The fleet's p99 time to first token over {WINDOW}, per model: the quantile of all its replicas' requests
together (model:...:p99_{WINDOW}, from the buckets summed over replicas, per engine kind; the worst cluster or
engine kind when several are selected). One slow replica serving a request a minute barely moves it, as it
barely moves what users see; the fleet board's outlier tables name such a replica. Red at the SLO threshold
({TTFT.threshold_seconds} s): beyond it the SLO's error budget is being spent.
""", [target(f'max by (model) ({fleet_rule(f"llm_time_to_first_token_seconds:p99_{WINDOW}")})', "{{model}}")],
             unit="s", w=3, no_value=NO_TRAFFIC,
             steps=thresholds((None, "green"), (TTFT.threshold_seconds * 0.8, "orange"),
                              (TTFT.threshold_seconds, "red"))),
        stat(f"TBT p99 ({WINDOW})", f"""
The fleet's p99 time between tokens over {WINDOW}, per model (all its replicas' token gaps together, per
engine kind; the worst cluster or engine kind when several are selected): inter-token latency (vLLM, SGLang,
LMDeploy, NIM), else time per output token (TGI, trtllm-serve: each request's mean gap, so its tail is lower
than the gaps'). Red at the SLO threshold ({TBT.threshold_seconds} s): the stream visibly stutters for readers.
""", [target(f"max by (model) (\n{fleet_tbt_quantile(99)}\n)", "{{model}}")], unit="s", w=3,
             no_value=NO_TRAFFIC,
             steps=thresholds((None, "green"), (TBT.threshold_seconds * 0.8, "orange"),
                              (TBT.threshold_seconds, "red"))),
        stat("KV cache usage (max)", f"""
Fullest KV cache among the selected targets. The KV cache, not the weights, decides how many requests fit:
near 1 new sequences wait or preempt running ones. Red at the alert threshold
({SETTINGS.kv_cache_usage_ratio:.0%}).
""", [target(f'max({rule("llm_kv_cache_usage_ratio:max")})', "KV usage")], unit="percentunit", w=3,
             minimum=0, maximum=1,
             steps=thresholds((None, "green"), (0.9, "orange"), (SETTINGS.kv_cache_usage_ratio, "red"))),
        stat("Requests waiting", """
Requests queued and not yet scheduled, all selected targets. A queue that grows while the running batch stays
flat means the engine is at its batch or KV limit; TTFT grows with it.
""", [target(f'sum({rule("llm_requests_waiting:sum")})', "waiting")], w=3, decimals=0,
             steps=thresholds((None, "green"), (1, "orange"), (SETTINGS.queue_min_waiting, "red"))),
    )


def verdict_row() -> Row:
    verdict_map = value_map([(i, r, RESOURCE_COLORS[r]) for i, r in enumerate(RESOURCES, start=1)])
    return row("Bottleneck verdict and its evidence",
        state_timeline("Bottleneck verdict over time", f"""
One row per engine target; the colour is the verdict (llm_bottleneck). The diagnosis order (docs/diagnosis.md):
is there load (idle: none; headroom: serving with nothing near a limit), then is prefill or
decode slow, then compute, HBM bandwidth, KV capacity, CPU, interconnect, power/thermal. The verdict has
hysteresis ({HOLD_CYCLES} cycles to change), so short blips do not flap it.
"The most expensive mistake is upgrading a part that was never the bottleneck."
""", [target(verdict_code_expr(), "{{target}} ({{instance}})")], mappings=verdict_map, w=24, h=5,
        steps=thresholds((None, "text"))),
        timeseries("Evidence: score per resource", f"""
How strongly the evidence points at each resource (llm_bottleneck_score, 0..1; formulas in
docs/diagnosis.md). A constraint (kv_capacity, host_cpu, interconnect, power_thermal) becomes the verdict at
{verdict.CONSTRAINT_MIN} (red line); a roof (compute, memory_bandwidth) at {verdict.ROOF_MIN} (blue line) when no
constraint does; headroom (1 - 2 x the highest other score while serving) is the verdict when neither does.
Two high roofs at once usually mean a mix of prefill and decode; a constraint next to a high roof is the thing
holding the GPU off its roof.
""", [target(T.sel("llm_bottleneck_score"), "{{target}} ({{instance}}) {{resource}}")], unit="percentunit",
            minimum=0, maximum=1, w=12, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.ROOF_MIN, "blue"), (verdict.CONSTRAINT_MIN, "red"))),
        table("Evidence now", """
The scores and the verdict right now, one row per target and resource. Read the highest score first, then
the verdict column (1 = the verdict). GET /api/v1/diagnosis on the exporter says the same in words, with
remedies.
""", [target(T.sel("llm_bottleneck_score")), target(T.sel("llm_bottleneck"))], w=12,
            exclude=("Time", "__name__", "job"),
            rename={"Value #A": "score", "Value #B": "verdict (1 = this one)"}),
    )


def latency_row() -> Row:
    return row("Latency against the SLO",
        timeseries(f"Time to first token (p50/p95/p99, {WINDOW})", f"""
TTFT = queueing + prefill of the prompt. It grows with prompt length (prefill is compute-bound), with the
waiting queue, and when long prefills are batched with other requests. The red line is the SLO threshold
({TTFT.threshold_seconds} s for {TTFT.objective:.0%} of requests). Online chat cares about TTFT and its
tail; offline batch jobs about total tokens/s.
""", quantile_targets("llm_time_to_first_token_seconds"), unit="s", w=8, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (TTFT.threshold_seconds, "red"))),
        timeseries(f"Time between tokens (p50/p95/p99, {WINDOW})", f"""
TBT = one decode step. Each step reads all weights plus the KV cache of every running sequence, so it is
mostly bound by HBM bandwidth and grows with batch size and context length. measure=ITL is the inter-token
latency histogram, per gap (vLLM, SGLang, LMDeploy, NIM); engines without it show measure=TPOT, the time per
output token histogram, one observation per request of its mean gap (TGI, trtllm-serve): its tail is lower,
since a request's slow gaps are averaged with its fast ones. The red line is the SLO threshold
({TBT.threshold_seconds} s for {TBT.objective:.0%} of gaps; the SLO and its alerts read ITL only).
""", [target(tbt_quantile(q), f"p{q} {{{{measure}}}} {{{{target}}}} {{{{model}}}} ({{{{instance}}}})")
      for q in QUANTILES], unit="s", w=8, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (TBT.threshold_seconds, "red"))),
        timeseries(f"End-to-end latency (p50/p95/p99, {WINDOW})", """
Request latency from arrival to the last token: TTFT + output tokens x TBT. Long answers dominate it, so
compare it with the output length before blaming the engine.
""", quantile_targets("llm_e2e_request_latency_seconds"), unit="s", w=8),
        repeat_per(
        timeseries(f"Where a request's time goes: $target (mean, {WINDOW})", f"""
One panel per engine target: mean queue, prefill and decode time per request, stacked, so the top of the stack
is about the mean request latency. A growing queue share means capacity (batch or KV) is the limit, a prefill
share long prompts, a decode share long answers or slow steps. Each part is sum of the histogram's _sum rate /
sum of its _count rate over {WINDOW}: the mean over all requests of the target, so exporters that report the same
target name (the Kubernetes sidecar names every target "engine") are averaged together, weighted by requests;
pick one $instance to see one. Queue time: vLLM, SGLang, TGI, trtllm-serve, LMDeploy; prefill and decode time:
vLLM, trtllm-serve, LMDeploy.
""", [target(divide(TM.sum_rate(f"{phase}_sum", window=WINDOW), TM.sum_rate(f"{phase}_count", window=WINDOW)),
             name)
      for name, phase in (("queue", "llm_request_queue_time_seconds"), ("prefill", "llm_request_prefill_time_seconds"),
                          ("decode", "llm_request_decode_time_seconds"))],
            unit="s", w=24, h=7, stack=True, fill=40, legend_calcs=("mean", "lastNotNull"), no_value=NO_TRAFFIC),
        "target"),
        engine_heatmap("TTFT distribution ($engine)", """
One heatmap per engine kind: requests per second in each TTFT bucket (the engine's own bucket bounds, which
differ between engines, so they are never summed together). Two bands usually mean two kinds of traffic
(short chat and long RAG prompts) and deserve separate SLOs or routing.
""", "llm_time_to_first_token_seconds", unit="s"),
        engine_heatmap("Time-between-tokens distribution ($engine)", """
One heatmap per engine kind: token gaps per second in each inter-token-latency bucket (vLLM, SGLang, LMDeploy,
NIM); for an engine target without that histogram, requests per second in each time-per-output-token bucket
instead (TGI, trtllm-serve: one observation per request, its mean gap). A second band well above the main one
is decode steps that also carried a prefill (no chunked prefill) or preemption recompute.
""", ITL, unit="s", fallback=TPOT),
        engine_heatmap("End-to-end latency distribution ($engine)", """
One heatmap per engine kind: finished requests per second in each end-to-end latency bucket (arrival to last
token). Its bands follow the output lengths more than the engine: compare with the output length
distribution below before blaming the engine.
""", "llm_e2e_request_latency_seconds", unit="s"),
    )


def slo_row() -> Row:
    return row("SLO attainment and error budget",
        stat(f"TTFT SLO attainment ({WINDOW})", f"""
Share of requests with TTFT <= {TTFT.threshold_seconds} s over {WINDOW} (bucket le = threshold / count).
Red below the objective ({TTFT.objective:.2%}).
""", [target(rule(f"llm_time_to_first_token_seconds:slo_good_ratio_rate{WINDOW}"),
              "{{target}} {{model}} ({{instance}})")],
             unit="percentunit", w=4, h=8, decimals=2, minimum=0, maximum=1, no_value=NO_TRAFFIC,
             steps=thresholds((None, "red"), (TTFT.objective, "green"))),
        stat(f"TBT SLO attainment ({WINDOW})", f"""
Share of token gaps <= {TBT.threshold_seconds} s over {WINDOW}. Red below the objective
({TBT.objective:.2%}). Like the SLO alerts it reads the inter-token latency histogram (vLLM, SGLang,
LMDeploy, NIM); engines with only time per output token (TGI, trtllm-serve) have no TBT SLO.
""", [target(rule(f"llm_inter_token_latency_seconds:slo_good_ratio_rate{WINDOW}"),
              "{{target}} {{model}} ({{instance}})")],
             unit="percentunit", w=4, h=8, decimals=2, minimum=0, maximum=1, no_value=NO_TRAFFIC,
             steps=thresholds((None, "red"), (TBT.objective, "green"))),
        burn_panel(TTFT, w=8),
        burn_panel(TBT, w=8),
        timeseries("SLO attainment in the exporter's window", """
The same good-event shares computed by the exporter over its sliding window (--quantile-window), with the
bucket bound it used. Available without Prometheus recording rules; the two agree, across an engine restart too
(both count the requests before it until they leave the window, as rate() does). A gap in the line means no
recent traffic (nothing finished in the window), not 0%. TBT, as in the recording rules, is the inter-token
latency histogram: none for TGI, trtllm-serve and SGLang (whose only per-gap histogram weights tokens).
""", [target(TM.sel("llm_ttft_slo_attainment_ratio"), "TTFT <= {{bound}}s {{target}} ({{instance}})"),
      target(TM.sel("llm_tbt_slo_attainment_ratio"), "TBT <= {{bound}}s {{target}} ({{instance}})")],
            unit="percentunit", w=12, decimals=3, maximum=1, no_value=NO_TRAFFIC),
        timeseries("p99 tails in the exporter's window", """
TTFT, TBT and end-to-end p99 computed by the exporter from its own window of the engine histograms
(llm_*_window_seconds). They match histogram_quantile over the same window and need no recording rules.
TBT is from the inter-token latency histogram only (none for TGI and trtllm-serve).
""", [target(TM.sel("llm_ttft_window_seconds", 'q="0.99"'), "TTFT p99 {{target}} ({{instance}})"),
      target(TM.sel("llm_tbt_window_seconds", 'q="0.99"'), "TBT p99 {{target}} ({{instance}})"),
      target(TM.sel("llm_e2e_window_seconds", 'q="0.99"'), "E2E p99 {{target}} ({{instance}})")],
            unit="s", w=12, log_scale=True),
    )


def throughput_row() -> Row:
    return row("Throughput and load",
        timeseries("Prefill vs decode tokens/s", f"""
Prompt tokens processed (prefill) and output tokens generated (decode) per second. Prefill is mostly
compute-bound and fast per token; decode produces one token per sequence per step and is mostly bound by
HBM bandwidth. Solid: the exporter's short window; dashed: the {WINDOW} recording rules.
""", [target(TM.sel("llm_prefill_tokens_per_second"), "prefill {{target}} ({{instance}})"),
      target(TM.sel("llm_decode_tokens_per_second"), "decode {{target}} ({{instance}})"),
      target(rule(f"llm_prompt_tokens:rate{WINDOW}"), f"prefill {WINDOW} {{{{target}}}} ({{{{instance}}}})"),
      target(rule(f"llm_generation_tokens:rate{WINDOW}"), f"decode {WINDOW} {{{{target}}}} ({{{{instance}}}})")],
            unit=TOKENS_PER_S, w=8,
            overrides=[color_override(f"^prefill {WINDOW}.*", "blue", dashed=True),
                       color_override(f"^decode {WINDOW}.*", "green", dashed=True),
                       color_override("^prefill [^0-9].*", "blue"), color_override("^decode [^0-9].*", "green")]),
        timeseries("Requests running and waiting", """
Running = the batch the engine steps together; waiting = admitted but not scheduled. Batching raises total
tokens/s (one weight read serves every running sequence) but raises TBT and, with a queue, TTFT. Mean batch
size is the exporter's average of running over its window.
""", [target(rule("llm_requests_running:sum"), "running {{target}} ({{instance}})"),
      target(rule("llm_requests_waiting:sum"), "waiting {{target}} ({{instance}})"),
      target(TM.sel("llm_mean_batch_size"), "mean batch {{target}} ({{instance}})")], unit="short", w=8,
            overrides=[color_override("^waiting.*", "orange")]),
        timeseries(f"Preemptions per second ({WINDOW})", """
Sequences preempted (vLLM) or retracted (SGLang) per second because the KV cache ran out (a rate over the
window, not a count). Each one is
recomputed or swapped later: tokens/s is wasted and tail latency jumps. Anything above 0 means the KV cache,
not compute, caps concurrency.
""", [target(rule(f"llm_preemptions:rate{WINDOW}"), "{{target}} {{model}} ({{instance}})")], unit=PER_S, w=8,
            minimum=0, threshold_style="area", steps=thresholds((None, "transparent"), (1e-9, "red"))),
        repeat_per(
        timeseries("Share of engine time: prefill vs decode ($target)", """
One panel per engine target: which phase the engine spends its time in (llm_phase_time_ratio), prefill and
decode stacked to 1. Exporters that report the same target name (the Kubernetes sidecar names every target
"engine") are averaged, each exporter weighing the same; pick one $instance to see one. Decode-dominated
engines are bandwidth-bound: look at HBM efficiency on the GPU dashboard. Prefill-dominated ones are
compute-bound: look at MFU and tensor activity.
""", [target(f"avg by (phase) ({TM.sel('llm_phase_time_ratio')})", "{{phase}}")], unit="percentunit", w=24,
            h=7, stack=True, fill=60, minimum=0, maximum=1, legend_calcs=("mean", "lastNotNull")), "target"),
        repeat_per(
        timeseries("Finished requests by reason ($target)", f"""
One panel per engine target: requests finished per second by reason, stacked to the target's total: stop
(natural end), length (hit max tokens), abort (client gave up, often a symptom of high TTFT), error, other.
A rising abort share is a latency problem seen by users. Reasons come from llm_requests_finished_total (vLLM,
TGI, Triton, trtllm-serve, NIM). Engines that count requests without a reason show them as
reason="{NO_REASON}": llm_requests_total (SGLang), else the count of the end-to-end latency histogram, one
per finished request (LMDeploy). Exporters that report the same target name are added up.
""", [target(finished_by_reason(), "{{reason}}")], unit="reqps", w=24, h=7, stack=True, fill=40,
            legend_calcs=("mean", "lastNotNull"),
            overrides=[color_override("^abort.*", "orange"), color_override("^error.*", "red"),
                       color_override(f"^{NO_REASON}$", "text")]), "target"),
    )


def ratio_rule_targets(scope: str) -> list[dict]:
    """The error and abort ratios of finished requests: per engine target (`target_model:`) or per model over
    the fleet (`model:`), from the recording rules (0 at zero traffic would be a lie; they return nothing)."""
    if scope == "target":
        who = "{{target}} {{model}} ({{instance}})"
        return [target(rule(f"llm_requests_{kind}:ratio_rate{WINDOW}"), f"{kind} {who}") for kind in ("error", "abort")]
    return [target(fleet_rule(f"llm_requests_{kind}:ratio_rate{WINDOW}"), f"{kind} {{{{model}}}} {{{{cluster}}}}")
            for kind in ("error", "abort")]


def outcomes_row() -> Row:
    return row("Request outcomes",
        timeseries(f"Error and abort ratio per target ({WINDOW})", f"""
Share of finished requests that ended in an error (the engine failed them) or an abort (the client gave up,
usually after waiting too long), per engine target over {WINDOW}: the finish-reason counter's error or abort
rate / all finished (llm_requests_finished_total: vLLM, TGI, Triton, trtllm-serve, NIM; engines without
finish reasons have no line). Errors are the engine's fault; aborts are latency seen by users: compare them
with TTFT. No line at all means no finished requests in the window, not 0%.
""", ratio_rule_targets("target"), unit="percentunit", w=8, minimum=0, no_value=NO_TRAFFIC,
            overrides=[color_override("^error.*", "red"), color_override("^abort.*", "orange")]),
        timeseries(f"Error and abort ratio per model, fleet ({WINDOW})", """
The same shares over every replica of each model together (model:... rules, per cluster): what the
availability SLO counts. One broken replica among many shows here diluted by its share of the traffic; the
per-target panel and the fleet board's instance table name it.
""", ratio_rule_targets("model"), unit="percentunit", w=8, minimum=0, no_value=NO_TRAFFIC,
            overrides=[color_override("^error.*", "red"), color_override("^abort.*", "orange")]),
        availability_burn_panel(w=8),
    )


def length_heatmaps() -> tuple[Panel, Panel]:
    """Prompt and output length distributions, one heatmap per engine kind (used by the fleet board too)."""
    return (
        engine_heatmap("Prompt length distribution ($engine)", """
One heatmap per engine kind: finished requests per second in each prompt-length bucket (tokens; the
engine's own bounds). Prompt length drives prefill work and TTFT: a new band of long prompts (RAG, long
system prompts) explains a TTFT rise that no engine setting caused. vLLM, SGLang, TGI, LMDeploy, NIM.
""", "llm_request_prompt_tokens", unit=TOKENS),
        engine_heatmap("Output length distribution ($engine)", """
One heatmap per engine kind: finished requests per second in each output-length bucket (tokens generated).
Output length drives decode time and end-to-end latency, and how long each request holds its KV cache:
longer answers at the same request rate fill the KV cache. vLLM, SGLang, TGI, LMDeploy, NIM.
""", "llm_request_generation_tokens", unit=TOKENS),
    )


def workload_row() -> Row:
    mean = [target(divide(TM.sum_rate(f"llm_request_{kind}_tokens_sum", by=ENGINE, window=WINDOW),
                          TM.sum_rate(f"llm_request_{kind}_tokens_count", by=ENGINE, window=WINDOW)),
                   f"{kind} {{{{target}}}} {{{{model}}}} ({{{{instance}}}})") for kind in ("prompt", "generation")]
    return row("Workload shape",
        timeseries(f"Mean prompt and output length ({WINDOW})", f"""
Mean tokens per finished request over {WINDOW}: prompt (prefill) and generation (output), from the length
histograms' _sum / _count. Compare a latency change with these first: longer prompts raise TTFT, longer
outputs raise end-to-end latency, both fill the KV cache, with no change in the engine.
""", mean, unit=TOKENS, w=24, minimum=0, no_value=NO_TRAFFIC,
            overrides=[color_override("^generation.*", "green")]),
        *length_heatmaps(),
    )


def decoding_row() -> Row:
    accepted = TM.sum_rate("llm_spec_decode_accepted_tokens_total", by=ENGINE, window=WINDOW)
    drafted = TM.sum_rate("llm_spec_decode_draft_tokens_total", by=ENGINE, window=WINDOW)
    drafts = TM.sum_rate("llm_spec_decode_drafts_total", by=ENGINE, window=WINDOW)
    length = (f"1 + {divide(accepted, drafts)}\nor {ENGINE.on()}\n"
              f"avg {ENGINE.by()} ({TM.sel('llm_spec_decode_acceptance_length')})")
    per_step = divide(TM.sum_rate("llm_iteration_tokens_sum", by=ENGINE, window=WINDOW),
                      TM.sum_rate("llm_iteration_tokens_count", by=ENGINE, window=WINDOW))
    decode_per_step = divide(f"sum {ENGINE.by()} ({TM.sel('llm_decode_tokens_per_second')})",
                             f"sum {ENGINE.by()} ({TM.sel('llm_decode_steps_per_second')})")
    return row("Speculative decoding and batch shape",
        timeseries("Speculative decoding: acceptance ratio and length", """
Acceptance ratio (left axis): draft tokens the target model accepted / draft tokens proposed, over the
exporter's window (llm_spec_decode_acceptance_ratio; vLLM, llama.cpp, trtllm-serve, LMDeploy). Under about
0.5 the draft model costs more than it saves and decoding gets slower (LLMSpecDecodeLowAcceptance).
Acceptance length (right axis): tokens a request gains per verification step, 1 + accepted / drafts where the
engine counts both (vLLM, llama.cpp, LMDeploy), else the engine's own mean (SGLang, trtllm-serve).
Empty without speculative decoding.
""", [target(TM.sel("llm_spec_decode_acceptance_ratio"), "ratio {{target}} {{model}} ({{instance}})"),
      target(length, "length {{target}} {{model}} ({{instance}})")],
            unit="percentunit", w=8, minimum=0, overrides=[right_axis("^length.*", TOKENS)]),
        timeseries(f"Speculative decoding: draft and accepted tokens/s ({WINDOW})", f"""
Draft tokens proposed and accepted per second over {WINDOW} (vLLM, llama.cpp, trtllm-serve, LMDeploy). The
gap between the lines is verification work spent on rejected drafts; accepted tokens are output the target
model did not have to step for one by one. Empty without speculative decoding.
""", [target(drafted, "drafted {{target}} {{model}} ({{instance}})"),
      target(accepted, "accepted {{target}} {{model}} ({{instance}})")],
            unit=TOKENS_PER_S, w=8, minimum=0, overrides=[color_override("^accepted.*", "green")]),
        timeseries(f"Tokens per engine step ({WINDOW})", f"""
How much work each forward pass carries. all tokens: prefill + decode tokens per engine step, the mean of the
iteration-tokens histogram over {WINDOW} (vLLM): chunked prefill fills steps up to the token budget, a pure
decode step carries one token per running sequence. decode: decode tokens/s / engine steps/s from the
exporter: where the engine counts its steps (llama.cpp) tokens per step, else the mean batch (steps are then
derived from it). Few tokens per step on a busy engine means small batches: the GPU re-reads the weights
for little work.
""", [target(per_step, "all tokens {{target}} {{model}} ({{instance}})"),
      target(decode_per_step, "decode {{target}} {{model}} ({{instance}})")],
            unit=TOKENS, w=8, minimum=0, no_value=NO_TRAFFIC),
    )


def kv_cache_row() -> Row:
    return row("KV cache",
        timeseries("KV cache usage", f"""
Fraction of the KV cache in use (max over ranks). KV bytes per token = 2 x layers x kv_heads x head_dim x
bytes per element, so long contexts fill it long before the batch limit. Above
{SETTINGS.kv_cache_usage_ratio:.0%} for long the engine waits or preempts.
""", [target(rule("llm_kv_cache_usage_ratio:max"), "{{target}} {{model}} ({{instance}})")], unit="percentunit",
            w=8, minimum=0,
            maximum=1, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (0.9, "orange"), (SETTINGS.kv_cache_usage_ratio, "red"))),
        timeseries("KV cache used vs capacity", """
KV cache in bytes: used and the pool the engine allocated at start (capacity tokens x bytes per token).
An 80-layer, 8-KV-head, 128-dim FP16 model needs 320 KiB per token, about 31 GiB per 100K tokens: the pool
size, not the weights, decides how many requests fit.
""", [target(TM.sel("llm_kv_cache_used_bytes"), "used {{target}} ({{instance}})"),
      target(TM.sel("llm_kv_cache_capacity_bytes"), "capacity {{target}} ({{instance}})")],
            unit="bytes", w=8, minimum=0, overrides=[color_override("^capacity.*", "red", dashed=True)]),
        timeseries("KV headroom: sequences that still fit", """
How many more sequences of the current mean context fit in the free KV cache. Near 0 with requests waiting
means new requests queue for memory, not for compute; raising batch limits cannot help.
""", [target(TM.sel("llm_kv_cache_headroom_sequences"), "{{target}} {{model}} ({{instance}})")], unit="short", w=8,
            minimum=0, decimals=0, threshold_style="dashed",
            steps=thresholds((None, "red"), (SETTINGS.headroom_min_sequences, "transparent"))),
        timeseries("Prefix cache hit ratio", """
Share of prompt tokens found in a prefix cache: hits / queries, the rates of llm_prefix_cache_hits_total
(summed over its `tier`: device, host, storage, external) and llm_prefix_cache_queries_total (vLLM; SGLang and
trtllm-serve from their cached and prompt token counters, once the first hit has been counted; llama.cpp from
prompt_tokens_cached_total and prompt_tokens_total). \
Engines with only a hit-rate gauge (LMDeploy, whose prompt counter is not a query count): llm_prefix_cache_hit_ratio
(mean over ranks), over whatever window the engine computes it. \
Hits skip prefill work entirely: a high ratio lowers TTFT and prefill compute; a drop after a deploy often
means the shared system prompt changed.
""", [target(divide(f"sum {ENGINE.by()} ({TM.rate('llm_prefix_cache_hits_total')})",
                    f"sum {ENGINE.by()} ({TM.rate('llm_prefix_cache_queries_total')})")
             + f"\nor {ENGINE.on()}\navg {ENGINE.by()} ({TM.sel('llm_prefix_cache_hit_ratio')})",
             "{{target}} {{model}} ({{instance}})")], unit="percentunit", w=12, minimum=0, maximum=1),
        stat("KV cache bytes per token", """
2 (K and V) x layers x KV heads x head dim x bytes per element, from the model shape. GQA/MQA shrink it by
using fewer KV heads; KV-cache quantization halves it again. Absent when the model shape is unknown.
""", [target(TM.sel("llm_kv_cache_bytes_per_token"), "{{model}}")], unit="bytes", w=12, graph=False),
    )


def pd_row() -> Row:
    return row("Prefill/decode disaggregation (KV transfer)",
        timeseries(f"KV transfer time vs TTFT (p50/p99, {WINDOW})", f"""
For prefill/decode disaggregated serving (SGLang PD, vLLM NIXL or Mooncake connectors, Dynamo, llm-d): the time
a request's KV cache takes to cross from the prefill to the decode instance, next to TTFT. On a decode
instance TTFT includes the transfer, so a transfer median near the TTFT median means the network, not the GPU,
sets the first token. The verdict calls interconnect from a median share of
{verdict.pct(verdict.KV_SHARE_VERDICT)} of TTFT. Empty for engines that are not disaggregated.
""", [target(TM.quantile(0.5, "llm_kv_transfer_seconds"), "transfer p50 {{target}} ({{instance}})"),
      target(TM.quantile(0.99, "llm_kv_transfer_seconds"), "transfer p99 {{target}} ({{instance}})"),
      target(TM.quantile(0.5, "llm_time_to_first_token_seconds"), "TTFT p50 {{target}} ({{instance}})")],
            unit="s", w=8, overrides=[color_override("^TTFT.*", "red", dashed=True)]),
        timeseries("Requests waiting for KV transfer", f"""
Requests whose KV cache is being bootstrapped or transferred between instances (SGLang's bootstrap and
transfer queues, vLLM's KV-fetch stages), next to the scheduler's own waiting queue. A transfer queue that
stands (mean {verdict.KV_QUEUE_VERDICT:g} or more) is the interconnect verdict: the decode instance has room
but its KV has not arrived. These requests are load: an instance with only them is not idle.
""", [target(TM.sel("llm_requests_waiting_kv_transfer"), "KV transfer {{target}} ({{instance}})"),
      target(TM.sel("llm_requests_waiting"), "scheduler queue {{target}} ({{instance}})")],
            unit="short", w=8, minimum=0, threshold_style="dashed",
            steps=thresholds((None, "transparent"), (verdict.KV_QUEUE_VERDICT, "orange"))),
        timeseries(f"KV transfer throughput and failures ({WINDOW})", """
Bytes of KV cache moved per second (the transfer-size histogram's sum) and failed transfers per second (right
axis). Compare the bytes with the link's rate on the Host dashboard's network row; failures mean requests
retried or aborted.
""", [target(TM.sum_rate("llm_kv_transfer_bytes_sum", by=ENGINE, window=WINDOW), "bytes/s {{target}} ({{instance}})"),
      target(TM.sum_rate("llm_kv_transfer_failures_total", by=ENGINE, window=WINDOW),
             "failures/s {{target}} ({{instance}})")],
            unit="Bps", w=8, minimum=0, overrides=[right_axis("^failures.*", "short")]),
    )


def cost_row() -> Row:
    return row("Efficiency and cost",
        timeseries("Energy per generated token", """
GPU energy per output token: GPU energy rate of the target's GPUs / decode tokens/s. Larger batches share
each step's energy across more tokens, so it falls with batch size until latency limits stop you.
""", [target(TM.sel("llm_energy_joules_per_token"), "{{target}} {{model}} ({{instance}})")], unit="joule", w=12,
            minimum=0),
        timeseries(f"Cost per 1M generated tokens ({CURRENCY})", """
Price per GPU-hour x GPUs / 3600 / decode tokens/s x 1e6 (the hourly price of the target's GPUs per second,
over the tokens generated in that second, for a million tokens), in the currency of --gpu-price-per-hour
(absent when no price is configured). Compare it across batch limits and quantization settings, not across
time of day.
""", [target(TM.sel("llm_cost_per_million_tokens"), "{{target}} {{model}} ({{instance}})")],
            unit=f"suffix: per 1M tok ({CURRENCY})", w=12, decimals=3, minimum=0),
    )


PROBE_WHO = "{{target}} {{model}} ({{instance}})"


def probe_quantile(histogram: str, q: float = 0.95) -> str:
    """The probe's q-quantile per engine over the recording rules' window (the engine's side is the
    recording rule over the same window, so the two are read alike)."""
    return (f"histogram_quantile({q:g}, sum by ({', '.join((*ENGINE, 'le'))}) "
            f"({TM.rate(histogram + '_bucket', window=WINDOW)}))")


def probe_row() -> Row:
    gap_s, gap_x = SETTINGS.probe_gap_seconds, SETTINGS.probe_gap_factor
    return row("Client probe",
        timeseries(f"Time to first token: client against server (p95, {WINDOW})", """
Only with `llm-exporter run --probe`: the exporter sends a small streaming request to the engine's OpenAI API
every few seconds and times it as a client. client = the probe's TTFT, from the request leaving the exporter to
the first text chunk; server = the engine's own TTFT histogram over all its requests. The client line sitting
well above the server line is time spent in front of the engine (network, proxy, gateway queue, TLS, the API
server); both rising together is the engine itself (queue, prefill). Under load the server's requests have
longer prompts than the probe's, so its line can be the higher one.
""", [target(probe_quantile("llm_probe_time_to_first_token_seconds"), f"client {PROBE_WHO}"),
      target(rule(f"llm_time_to_first_token_seconds:p95_{WINDOW}"), f"server {PROBE_WHO}")],
            unit="s", w=12, minimum=0),
        timeseries(f"TTFT gap: client minus server (mean, {WINDOW})", f"""
The probe's mean TTFT minus the engine's own mean TTFT over the same {WINDOW} (the recording rule
target_model:llm_probe_time_to_first_token_seconds:gap_mean{WINDOW}): what a client waits for beyond what the
engine measures.
Near zero on loopback. The red line is where LLMProbeLatencyGap starts to look ({gap_s:g} s, and the
client's mean more than {gap_x:g}x the server's). Negative values mean the engine's other requests are
slower than the probe's short one (longer prompts), not a negative network.
""", [target(rule(f"llm_probe_time_to_first_token_seconds:gap_mean{WINDOW}"), PROBE_WHO)], unit="s", w=12,
            no_value=NO_TRAFFIC,
            threshold_style="dashed", steps=thresholds((None, "transparent"), (gap_s, "red"))),
        timeseries(f"Probe inter-token latency and end-to-end (p95, {WINDOW})", """
Client-side gaps between the probe's text chunks (ITL) and its whole request (e2e), p95. An ITL well above the
engine's own (the latency row) with a flat TTFT gap points at something buffering the stream (a proxy that
collects chunks, Nagle, a slow reader); a growing e2e with a flat ITL is a longer answer or a longer TTFT.
""", [target(probe_quantile("llm_probe_inter_token_latency_seconds"), f"ITL {PROBE_WHO}"),
      target(probe_quantile("llm_probe_e2e_request_latency_seconds"), f"e2e {PROBE_WHO}")],
            unit="s", w=8, minimum=0),
        timeseries(f"Probe success ratio ({WINDOW})", """
Share of the probe's requests that succeeded: 1 - failed / finished over the window. Below 1 means clients of
the API see errors too, whatever the engine's /metrics says; LLMProbeFailing fires when more than half fail.
""", [target(f"1 - (\n{TM.sum_rate('llm_probe_errors_total', by=ENGINE, window=WINDOW)}\n)\n/\n"
             f"({TM.sum_rate('llm_probe_requests_total', by=ENGINE, window=WINDOW)} > 0)", PROBE_WHO)],
            unit="percentunit", w=8, minimum=0, maximum=1, decimals=2),
        timeseries("Probe errors by reason", """
Failed probe requests per second, by reason: timeout, dns, connection, tls, http_status (any answer but 200,
redirects included), too_large, protocol, stream_error (an error object mid-stream), empty, credentials.
The runbook of LLMProbeFailing says what each means.
""", [target(f"sum by (instance, target, reason) ({TM.rate('llm_probe_errors_total')}) > 0",
             "{{reason}} {{target}} ({{instance}})")], unit="reqps", w=8, minimum=0),
    )


ROWS: tuple[RowBuilder, ...] = (now_row, verdict_row, latency_row, slo_row, outcomes_row, throughput_row,
                                workload_row, decoding_row, kv_cache_row, pd_row, cost_row, probe_row)


def build() -> dict:
    return dashboard(FILENAME, TITLE, "Where the bottleneck is, latency against the SLO, throughput, KV cache "
                     "and cost, per engine target (llm-exporter).", layout(ROWS), standard_variables(engine=True),
                     links=[dashboard_link("Fleet view", FILENAMES["fleet"],
                                           "Every replica of every model across clusters: summary, instance table, "
                                           "outliers")])
