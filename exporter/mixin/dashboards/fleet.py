"""LLM Serving / Fleet: every replica of every model across clusters. A per-model summary from the fleet
recording rules (`model:...`: quantiles of all replicas' requests together, not the worst replica's),
an instance table with one row per replica (its verdict, latency, KV cache, queue, tokens/s and error
ratio) whose cells open that replica's own boards, the outliers, the verdict mix, the workload's shape
and the capacity over time."""

from __future__ import annotations

from exporter.catalog.derived import RESOURCES
from exporter.mixin.dashboards import gpu_roofline, host, overview
from exporter.mixin.dashboards.lib import (
    FILENAMES,
    SETTINGS,
    TOKENS,
    TOKENS_PER_S,
    Panel,
    Promql,
    Row,
    RowBuilder,
    color_override,
    dashboard,
    dashboard_link,
    fleet,
    fleet_variables,
    layout,
    right_axis,
    row,
    slo_view,
    standard_variables,
    table,
    target,
    thresholds,
    timeseries,
    uid_for,
    value_map,
)
from exporter.mixin.dashboards.overview import (
    FLEET,
    NO_TRAFFIC,
    RESOURCE_COLORS,
    WINDOW,
    availability_burn_panel,
    error_steps,
    fleet_rule,
    fleet_tbt_quantile,
    length_heatmaps,
    rule,
    tbt_quantile,
)

FILENAME = FILENAMES["fleet"]
TITLE = "LLM Serving / Fleet"

T = Promql("target")
E = Promql("exporter")  # router series: their `target` is a router target, not one of $target's engines
TM = Promql("target_model")
C = Promql("cluster")

TTFT, TBT = slo_view("ttft"), slo_view("tbt")
# One replica: an engine target of one exporter, serving one model, in one cluster and namespace. Every
# query of the instance table returns exactly these labels, so Grafana's merge joins them into one row.
REPLICA = fleet("instance", "target", "model")
# One model's fleet in one cluster and namespace: the summary table's row.
MODEL = fleet("model")
OUTLIERS = 5  # rows of each outlier table
VERDICT_MAP = value_map([(i, r, RESOURCE_COLORS[r]) for i, r in enumerate(RESOURCES, start=1)])


def replica_links() -> list[dict]:
    """Data links from a row (or series) naming one replica into its own boards, with the board's time range
    and scope kept and the replica's instance, target and model set from the row."""
    row_vars = ("var-instance=${__data.fields.instance}&var-target=${__data.fields.target}"
                "&var-model=${__data.fields.model}")
    fleet_vars = "".join(f"&${{{variable}:queryparam}}" for variable, _ in fleet_variables())
    keep = f"${{__url_time_range}}&${{datasource:queryparam}}{fleet_vars}&${{job:queryparam}}"
    return [{"title": f"{title} of ${{__data.fields.target}} (${{__data.fields.instance}})",
             "url": f"/d/{uid_for(module.FILENAME)}?{keep}&{row_vars}", "targetBlank": False}
            for title, module in (("Overview", overview), ("GPU and roofline", gpu_roofline), ("Host", host))]


def column(name: str, unit: str, *, steps: dict | None = None, mappings: list | None = None,
           cell: str | None = None, decimals: int | None = None) -> dict:
    """A table column's override: its unit, and optionally coloured cells by thresholds or a mapping."""
    props: list[dict] = [{"id": "unit", "value": unit}]
    if steps is not None:
        props.append({"id": "thresholds", "value": steps})
    if mappings is not None:
        props.append({"id": "mappings", "value": mappings})
    if cell is not None:
        props.append({"id": "custom.cellOptions", "value": {"type": cell}})
    if decimals is not None:
        props.append({"id": "decimals", "value": decimals})
    return {"matcher": {"id": "byName", "options": name}, "properties": props}


def verdict_per_replica() -> str:
    """The verdict (index in RESOURCES, 1-based, of the resource whose llm_bottleneck == 1) of each replica.
    llm_bottleneck is per engine target, without a model: it is joined onto the target's models (from
    llm_requests_running), so the row has the same labels as the others."""
    matchers = {r: 'resource="' + r + '"' for r in RESOURCES}
    terms = "\n  or ".join(f"(({T.sel('llm_bottleneck', matchers[r])} == 1) * {i})"
                           for i, r in enumerate(RESOURCES, start=1))
    verdict = f"max {fleet('instance', 'target').by()} (\n  {terms}\n)"
    models = f"group {REPLICA.by()} ({TM.sel('llm_requests_running')})"
    return f"{models}\n* {fleet('instance', 'target').on()} group_left ()\n{verdict}"


def per_replica(expr: str, op: str = "max") -> str:
    """expr reduced to one value per replica (ranks, engines and job away), so the table's queries join."""
    return f"{op} {REPLICA.by()} (\n{expr}\n)"



def summary_row() -> Row:
    q = f"p99_{WINDOW}"
    return row("Per model",
        table(f"Models: fleet latency, traffic and errors ({WINDOW})", f"""
One row per model in each cluster and namespace, over all its replicas: TTFT and TBT p99 of all their
requests together (the model:... recording rules sum the replicas' buckets per engine kind, then take the
quantile; the worst engine kind when a model runs on several), finished requests/s, the error and abort
shares of finished requests, output tokens/s, replicas up and requests waiting. A fleet p99 near the SLO
({TTFT.threshold_seconds} s TTFT, {TBT.threshold_seconds} s TBT) is a fleet problem; a fine fleet p99 with one
bad replica in the instance table below is that replica's. "No traffic": nothing finished in the window.
""", [target(f"max {MODEL.by()} ({fleet_rule(f'llm_time_to_first_token_seconds:{q}')})"),
      target(f"max {MODEL.by()} (\n{fleet_tbt_quantile(99)}\n)"),
      target(f"sum {MODEL.by()} ({fleet_rule(f'llm_requests_finished:rate{WINDOW}')})"),
      target(f"max {MODEL.by()} ({fleet_rule(f'llm_requests_error:ratio_rate{WINDOW}')})"),
      target(f"max {MODEL.by()} ({fleet_rule(f'llm_requests_abort:ratio_rate{WINDOW}')})"),
      target(f"sum {MODEL.by()} ({fleet_rule(f'llm_generation_tokens:rate{WINDOW}')})"),
      target(f"sum {MODEL.by()} ({fleet_rule('llm_replicas_up:count')})"),
      target(f"sum {MODEL.by()} ({fleet_rule('llm_requests_waiting:sum')})")],
            w=24, h=7, order=MODEL, sort_by="req/s", no_value=NO_TRAFFIC,
            rename={"Value #A": "TTFT p99", "Value #B": "TBT p99", "Value #C": "req/s", "Value #D": "error ratio",
                    "Value #E": "abort ratio", "Value #F": "tok/s", "Value #G": "replicas", "Value #H": "waiting"},
            overrides=[
                column("TTFT p99", "s", cell="color-text", steps=thresholds(
                    (None, "green"), (TTFT.threshold_seconds * 0.8, "orange"), (TTFT.threshold_seconds, "red"))),
                column("TBT p99", "s", cell="color-text", steps=thresholds(
                    (None, "green"), (TBT.threshold_seconds * 0.8, "orange"), (TBT.threshold_seconds, "red"))),
                column("req/s", "reqps"), column("tok/s", TOKENS_PER_S),
                column("error ratio", "percentunit", cell="color-text", steps=error_steps(), decimals=2),
                column("abort ratio", "percentunit", cell="color-text", steps=error_steps(), decimals=2),
                column("replicas", "short", decimals=0), column("waiting", "short", decimals=0)]),
        timeseries(f"Fleet TTFT and TBT p99 per model ({WINDOW})", f"""
The fleet's p99 per model over time (model:... rules: all replicas' requests in one distribution, per engine
kind). The red line is the TTFT SLO threshold ({TTFT.threshold_seconds} s); TBT's is {TBT.threshold_seconds} s.
measure says whether TBT is inter-token latency (ITL) or time per output token (TPOT, engines without ITL).
""", [target(fleet_rule(f"llm_time_to_first_token_seconds:{q}"), "TTFT {{model}} {{engine}} {{cluster}}"),
      target(fleet_tbt_quantile(99), "TBT ({{measure}}) {{model}} {{engine}} {{cluster}}")],
            unit="s", w=8, minimum=0, threshold_style="dashed", no_value=NO_TRAFFIC,
            steps=thresholds((None, "transparent"), (TTFT.threshold_seconds, "red"))),
        timeseries(f"Fleet requests/s and error ratio per model ({WINDOW})", """
Finished requests per second per model over all replicas (left), and the share that ended in an error
(right axis). A drop in requests with a flat error share is less traffic; a rising error share with steady
traffic is a failing replica or model: the instance table's error column finds it.
""", [target(f"sum {MODEL.by()} ({fleet_rule(f'llm_requests_finished:rate{WINDOW}')})",
             "req/s {{model}} {{cluster}}"),
      target(fleet_rule(f"llm_requests_error:ratio_rate{WINDOW}"), "errors {{model}} {{cluster}}")],
            unit="reqps", w=8, minimum=0, no_value=NO_TRAFFIC,
            overrides=[right_axis("^errors.*", "percentunit"), color_override("^errors.*", "red")]),
        availability_burn_panel(w=8),
    )


def instance_row() -> Row:
    q = f"p99_{WINDOW}"
    return row("Instances",
        table("Instances: one row per replica", f"""
One row per replica (cluster, namespace, exporter instance, engine target, model): its bottleneck verdict now
(llm_bottleneck == 1), TTFT and TBT p99 over {WINDOW}, KV cache usage, requests waiting, output tokens/s and the
error share of finished requests. Click a cell for that replica's Overview, GPU or Host board. Sort by a column
to find the odd one: a replica whose verdict or latency differs from its model's others is the one to open.
"No traffic" in a latency or error cell: no request finished there in the window.
""", [target(verdict_per_replica()),
      target(per_replica(rule(f"llm_time_to_first_token_seconds:{q}"))),
      target(per_replica(tbt_quantile(99))),
      target(per_replica(rule("llm_kv_cache_usage_ratio:max"))),
      target(per_replica(rule("llm_requests_waiting:sum"), "sum")),
      target(per_replica(rule(f"llm_generation_tokens:rate{WINDOW}"), "sum")),
      target(per_replica(rule(f"llm_requests_error:ratio_rate{WINDOW}")))],
            w=24, h=12, order=REPLICA, sort_by="TTFT p99", links=replica_links(), no_value=NO_TRAFFIC,
            rename={"Value #A": "verdict", "Value #B": "TTFT p99", "Value #C": "TBT p99", "Value #D": "KV usage",
                    "Value #E": "waiting", "Value #F": "tok/s", "Value #G": "error ratio"},
            overrides=[
                column("verdict", "short", mappings=VERDICT_MAP, cell="color-background"),
                column("TTFT p99", "s", cell="color-text", steps=thresholds(
                    (None, "green"), (TTFT.threshold_seconds * 0.8, "orange"), (TTFT.threshold_seconds, "red"))),
                column("TBT p99", "s", cell="color-text", steps=thresholds(
                    (None, "green"), (TBT.threshold_seconds * 0.8, "orange"), (TBT.threshold_seconds, "red"))),
                column("KV usage", "percentunit", cell="color-text", steps=thresholds(
                    (None, "green"), (0.9, "orange"), (SETTINGS.kv_cache_usage_ratio, "red"))),
                column("waiting", "short", decimals=0), column("tok/s", TOKENS_PER_S),
                column("error ratio", "percentunit", cell="color-text", steps=error_steps(), decimals=2)]),
    )


def outlier_table(title: str, description: str, expr: str, value: str, unit: str) -> Panel:
    return table(title, description, [target(expr)], w=6, h=7, order=REPLICA, sort_by=value, no_value=NO_TRAFFIC,
                 exclude=("Time", "__name__", "job", "engine"), rename={"Value": value},
                 links=replica_links(), overrides=[column(value, unit)])


def outliers_row() -> Row:
    q = f"p99_{WINDOW}"
    return row("Outliers",
        outlier_table(f"Slowest TTFT p99 ({WINDOW})", f"""
The {OUTLIERS} replicas with the highest TTFT p99 over {WINDOW} (its own requests only). A replica far above its
model's fleet p99 (the summary above) with little traffic is one sick pod; many near it is the fleet.
Click a row for its boards.
""", f"topk({OUTLIERS}, {per_replica(rule(f'llm_time_to_first_token_seconds:{q}'))})", "TTFT p99", "s"),
        outlier_table(f"Slowest TBT p99 ({WINDOW})", f"""
The {OUTLIERS} replicas with the highest time between tokens p99 over {WINDOW} (ITL, else TPOT). Slow decode
on one replica with normal load points at its GPU (clocks, throttling, a bad link): open its GPU board.
""", f"topk({OUTLIERS}, {per_replica(tbt_quantile(99))})", "TBT p99", "s"),
        outlier_table("Fullest KV cache", f"""
The {OUTLIERS} replicas with the fullest KV cache now. Above {SETTINGS.kv_cache_usage_ratio:.0%} requests
wait or are preempted there; if the others have room, the router sends this replica more or longer requests
than its share.
""", f"topk({OUTLIERS}, {per_replica(rule('llm_kv_cache_usage_ratio:max'))})", "KV usage", "percentunit"),
        outlier_table(f"Lowest output tokens/s ({WINDOW})", f"""
The {OUTLIERS} replicas generating the fewest output tokens per second over {WINDOW}. 0 on a replica whose
model has traffic elsewhere means the router does not send it work (not ready, drained) or it is stuck.
""", f"bottomk({OUTLIERS}, {per_replica(rule(f'llm_generation_tokens:rate{WINDOW}'), 'sum')})", "tok/s",
            TOKENS_PER_S),
    )


def verdict_row() -> Row:
    return row("Verdict mix",
        timeseries("Replicas by bottleneck verdict", """
How many replicas have each verdict (count by resource of llm_bottleneck == 1) over time, stacked to the
number of replicas with a verdict. A fleet mostly on memory_bandwidth (decode) or compute (prefill) is
loaded and healthy; a growing kv_capacity or scheduler share is the fleet running out of room; idle and
headroom together are the capacity that could serve more.
""", [target(f"count by (resource) ({T.sel('llm_bottleneck')} == 1)", "{{resource}}")],
            unit="short", w=16, minimum=0, stack=True, fill=60, decimals=0, legend_calcs=("lastNotNull", "max"),
            overrides=[color_override(f"^{r}$", color) for r, color in RESOURCE_COLORS.items()]),
        table("Verdicts now", """
The same count right now, one row per verdict: how many replicas each resource limits.
""", [target(f"count by (resource) ({T.sel('llm_bottleneck')} == 1)")], w=8, h=8,
            rename={"Value": "replicas"}, sort_by="replicas"),
    )


def workload_row() -> Row:
    quantiles = [target(f"histogram_quantile({p / 100:g}, sum by ({', '.join((*FLEET, 'le'))}) "
                        f"({TM.rate(f'llm_request_{kind}_tokens_bucket', window=WINDOW)}))",
                        f"{kind} p{p} {{{{model}}}} {{{{engine}}}} {{{{cluster}}}}")
                 for kind in ("prompt", "generation") for p in (50, 99)]
    return row("Workload shape",
        timeseries(f"Prompt and output length per model, p50 and p99 ({WINDOW})", f"""
Median and p99 length of the requests each model's fleet finished over {WINDOW}, from the length histograms
summed over replicas per engine kind: prompt (prefill work, TTFT) and generation (decode time, KV held per
request). A latency change with a length change is the workload, not the engines.
""", quantiles, unit=TOKENS, w=24, minimum=0, no_value=NO_TRAFFIC,
            overrides=[color_override("^generation.*", "green")]),
        *length_heatmaps(),
    )


def capacity_row() -> Row:
    return row("Capacity",
        timeseries("Replicas up per model", """
Replicas of each model whose engine target was scraped and parsed (model:llm_replicas_up:count), per cluster.
A step down while the others still run is capacity lost (LLMFleetReplicasLost); the exporter's own absence is
a different alert.
""", [target(fleet_rule("llm_replicas_up:count"), "{{model}} {{cluster}} {{namespace}}")],
            unit="short", w=8, minimum=0, decimals=0),
        timeseries("GPUs up per cluster", """
GPUs read through NVML (cluster:llm_gpus_up:count), per cluster and the exporters' namespace. $model does
not apply: GPUs belong to nodes, not to a model. A drop without a replica drop is a GPU lost under a running
engine (XID 79, a fallen-off bus): check the GPU board's health row.
""", [target(C.sel("cluster:llm_gpus_up:count"), "GPUs {{cluster}} {{namespace}}")],
            unit="short", w=8, minimum=0, decimals=0),
        timeseries("GPU busy per engine pod", """
Each engine pod's GPUs, busy share averaged over them (pod:llm_gpu_utilization_ratio:avg), whichever exporter
reads them: a sidecar watching its engine's GPUs, or the node's DaemonSet, which names the pod holding each GPU
(docs/deploy.md, "DaemonSet"). A pod missing here has no GPU series of its own: its sidecar runs without GPUs
and no DaemonSet maps them. One pod busy while its neighbours idle is load the router sends unevenly.
""", [target(C.sel("pod:llm_gpu_utilization_ratio:avg"), "{{cluster}} {{namespace}}/{{pod}}")],
            unit="percentunit", w=8, minimum=0, maximum=1),
        timeseries("KV cache capacity per model", """
Tokens of KV cache the model's replicas allocated, summed (model:llm_kv_cache_capacity_tokens:sum). It is
what bounds concurrent context across the fleet: replicas lost, or restarted with a smaller pool, shrink it.
""", [target(fleet_rule("llm_kv_cache_capacity_tokens:sum"), "{{model}} {{cluster}} {{namespace}}")],
            unit=TOKENS, w=8, minimum=0),
        timeseries(f"Fleet load: running, waiting and tokens/s ({WINDOW})", """
Requests running and waiting over every replica of each model (left) and output tokens/s (right axis),
against the capacity above: more waiting with the same replicas is a fleet that needs more of them.
""", [target(fleet_rule("llm_requests_running:sum"), "running {{model}} {{cluster}}"),
      target(fleet_rule("llm_requests_waiting:sum"), "waiting {{model}} {{cluster}}"),
      target(fleet_rule(f"llm_generation_tokens:rate{WINDOW}"), "tok/s {{model}} {{cluster}}")],
            unit="short", w=24, minimum=0,
            overrides=[right_axis("^tok/s.*", TOKENS_PER_S), color_override("^waiting.*", "orange")]),
    )


ROUTER_SCOPE = ("$target and $model do not apply: a router's `target` is the router target (--router), and its "
                "series name no model.")


def routing_row() -> Row:
    router = "{{target}} {{router}} ({{instance}})"
    breaker_open = 'state="open"'
    latency = [target(E.quantile(q, hist, by=("instance", "target", "router")), f"{name} p{round(q * 100)} {router}")
               for hist, name in (("llm_router_time_to_first_token_seconds", "router TTFT"),
                                  ("llm_router_request_duration_seconds", "router latency")) for q in (0.5, 0.99)]
    return row("Routing",
        timeseries("Share of each router's requests per backend", """
Each backend's share of the requests its router sent over the exporter's rate window
(llm_router_backend_share_ratio, from --router targets: vllm-router, sglang-router, Dynamo, the inference
extension's picker). Even load is 1/N each; one backend far above the others is a policy following a hot
prefix or session (cache-aware, consistent hashing), and the routing verdict names it when that replica
then misses its SLO while another idles.
""" + ROUTER_SCOPE, [target(E.sel("llm_router_backend_share_ratio"), "{{backend}} via {{target}} ({{instance}})")],
            unit="percentunit", w=8, minimum=0, maximum=1),
        timeseries("Load skew per router", """
The busiest backend's request rate over the mean of the backends in rotation (llm_router_load_skew): 1 is
even, N is all traffic on one of N. From 1.5 the routing verdict may name the skew (docs/diagnosis.md).
""" + ROUTER_SCOPE, [target(E.sel("llm_router_load_skew"), router)],
            unit="short", w=8, minimum=1, decimals=2, steps=thresholds((None, "green"), (1.5, "orange")),
            threshold_style="dashed"),
        timeseries("Backends taken out", """
Backends each router does not send to (llm_router_backends_out: health check failing or circuit breaker
open), against those it has registered (llm_router_backends). A backend out is LLMRouterBackendOut.
""" + ROUTER_SCOPE, [target(E.sel("llm_router_backends_out"), "out {{target}} ({{instance}})"),
      target(E.sel("llm_router_backends"), "registered {{target}} ({{instance}})")],
            unit="short", w=8, minimum=0, decimals=0, overrides=[color_override("^out.*", "red")]),
        timeseries("Router latency and time before the engine", """
The router's own TTFT (where it has one: the SGLang gateway's gRPC router, Dynamo, the picker) and request
latency quantiles, with the median time a request spends before the engine
(llm_router_pre_engine_seconds: the router's median minus its backends' engines' median, where this exporter
reads both). A large gap is the router's queue, retries or the network, which the engines never see.
""" + ROUTER_SCOPE, [*latency, target(E.sel("llm_router_pre_engine_seconds"), f"before the engine {router}")],
            unit="s", w=12, minimum=0, overrides=[color_override("^before the engine.*", "orange", dashed=True)]),
        timeseries("Breakers open and backends unhealthy", """
Per backend: 1 while its circuit breaker is open (llm_router_backend_breaker_state{state="open"}) or its
health check fails (1 - llm_router_backend_up). Empty while every backend is in rotation.
""" + ROUTER_SCOPE, [target(f"max by (instance, target, backend) "
                            f"({E.sel('llm_router_backend_breaker_state', breaker_open)}) == 1",
             "breaker open {{backend}} via {{target}} ({{instance}})"),
      target(f"1 - {E.sel('llm_router_backend_up')} == 1", "unhealthy {{backend}} via {{target}} ({{instance}})")],
            unit="short", w=6, minimum=0, maximum=1, decimals=0),
        timeseries("Retries and errors per router", """
Retries per second and errors per second by cause (llm_router_errors_total: no_backend, backend, timeout,
rejected, client, other). Errors over 5% of requests (client errors aside) is LLMRouterErrors.
""" + ROUTER_SCOPE, [target(f"sum by (instance, target) ({E.rate('llm_router_retries_total')})",
                            "retries {{target}} ({{instance}})"),
      target(f"sum by (instance, target, cause) ({E.rate('llm_router_errors_total')})",
             "errors {{cause}} {{target}} ({{instance}})")],
            unit="reqps", w=6, minimum=0),
    )


ROWS: tuple[RowBuilder, ...] = (summary_row, instance_row, outliers_row, verdict_row, workload_row, capacity_row,
                                routing_row)


def build() -> dict:
    return dashboard(FILENAME, TITLE, "Every replica of every model across clusters: per-model summary, instance "
                     "table with links to each replica's boards, outliers, verdict mix, workload shape, capacity "
                     "(llm-exporter).", layout(ROWS), standard_variables(engine=True),
                     links=[dashboard_link("Overview", overview.FILENAME, "The per-target board")])
