"""A small builder library for classic Grafana dashboard JSON (schemaVersion 39).

Plain dicts, no dependency: the JSON model Grafana 10.4 to 13 imports through file provisioning
and the kube-prometheus-stack sidecar. vLLM's tools/generate_grafana_dashboards.py is the model:
a selector-scoped `Promql` helper, panel builders whose descriptions say how to read the panel,
and a layout helper that computes gridPos so nobody edits coordinates by hand.

Every selector is built in `selectors()` from the mixin's one config (exporter/mixin/config.py, the
monitoring mixins' `_config`), which names the fleet labels: change the scoping of all dashboards
there. SLO thresholds and the saturation lines come from the same config (SETTINGS, slo_view(),
burn_rates(); its defaults from exporter/slo.py), which the alert rules read too, so the dashboards
draw the same lines the alerts fire on.

A dashboard module is a list of row functions (ROWS), each returning one Row: its title and its
panels, each panel declared once; `layout(ROWS)` places them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.mixin.alerts.lib import fmt_num
from exporter.mixin.config import CONFIG, fleet_labels

SCHEMA_VERSION = 39
TAGS = ("llm-exporter",)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# ----------------------------------------------------------------------------------------------
# The config in effect, and the selectors built from it: the one place that scopes every query.
# ----------------------------------------------------------------------------------------------
# The mixin's config (exporter/mixin/config.py, which the rules read too) names the fleet labels. A
# build runs under one (`with configured(cfg):`, generate.build_all); the module-level label tuples
# (fleet(...)) and the Promql scopes read it when a query is written, not at import.
_ACTIVE: list[Mapping] = [CONFIG]


@contextlib.contextmanager
def configured(cfg: Mapping) -> Iterator[None]:
    """Build the dashboards under `cfg` within the block."""
    _ACTIVE.append(cfg)
    try:
        yield
    finally:
        _ACTIVE.pop()


def active() -> Mapping:
    return _ACTIVE[-1]


def cluster_label() -> str:
    return str(active()["cluster_label"])


# The Grafana variable of each fleet label: `$cluster` whatever the cluster label is called (links and
# bookmarks keep working), the others by their own name.
def fleet_variables() -> tuple[tuple[str, str], ...]:
    """(variable, label) for each fleet label, the cluster's first."""
    return (("cluster", cluster_label()), *((label, label) for label in active()["fleet_extra_labels"]))


class FleetLabels(Sequence[str]):
    """The fleet labels of the config in effect, then `extra`: a query's grouping of one replica, one
    model, one exporter. Read when iterated, so a module-level REPLICA = fleet("instance", ...) follows
    the config that a build runs under."""

    def __init__(self, *extra: str) -> None:
        self.extra = extra

    def _labels(self) -> tuple[str, ...]:
        return (*fleet_labels(active()), *self.extra)

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels())

    def __len__(self) -> int:
        return len(self._labels())

    def __getitem__(self, index):
        return self._labels()[index]

    def by(self, *more: str) -> str:
        return f"by ({', '.join((*self, *more))})"

    def on(self) -> str:
        return f"on ({', '.join(self)})"


class ConfigView:
    """Attribute reads of one mapping of the config in effect: `TTFT.threshold_seconds` with TTFT =
    ConfigView("slos", "ttft") reads CONFIG["slos"]["ttft"]["threshold_seconds"] when the panel is built,
    so the boards draw the thresholds and SLOs the rules of the same config fire on. `fixed` attributes
    are the view's own (an SLO's key)."""

    def __init__(self, *path: str, **fixed: object) -> None:
        self._path = path
        self._fixed = fixed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._fixed:
            return self._fixed[name]
        node: Any = active()
        for key in self._path:
            node = node[key]
        try:
            return node[name]
        except KeyError:
            raise AttributeError(f"{'.'.join(self._path) or 'the config'} has no {name}") from None


class ConfigText:
    """A text setting of the config in effect, read when a query or title formats it: WINDOW =
    ConfigText("rate_window") writes `rate{WINDOW}` as the rule name the same config's rules record."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        return str(active()[self.key])

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


# The thresholds an alert fires on and a panel draws (kv_cache_usage_ratio, queue_min_waiting,
# headroom_min_sequences, slo_period, probe_gap_seconds, ...): the config's top level.
SETTINGS = ConfigView()


def slo_view(key: str) -> ConfigView:
    """A latency SLO of the config in effect (metric, objective, threshold_seconds, alert)."""
    return ConfigView("slos", key, key=key)


def burn_rates() -> list[dict]:
    """The burn-rate pairs of the config in effect (severity, long, short, factor, for)."""
    return list(active()["burn_rates"])


def fleet(*extra: str) -> FleetLabels:
    return FleetLabels(*extra)


def scope() -> str:
    """Every selector starts with the fleet scope. A series without these labels (a Prometheus that
    scrapes one cluster and adds `cluster` only as an external label, on remote write) still matches
    at "All": the variables' allValue is ".*", and `cluster=~".*"` matches an absent label."""
    return ", ".join(f'{label}=~"${variable}"' for variable, label in fleet_variables())


def selectors() -> dict[str, str]:
    scoped = scope()
    return {
        # Every llm_* series comes from the exporter's scrape job; instance is one exporter (sidecar).
        "exporter": f'{scoped}, job=~"$job", instance=~"$instance"',
        # Engine and derived series of the chosen engine targets.
        "target": f'{scoped}, job=~"$job", instance=~"$instance", target=~"$target"',
        # ... and models (engine families, derived families with (target, model), recording rules).
        "target_model": f'{scoped}, job=~"$job", instance=~"$instance", target=~"$target", model=~"$model"',
        # ... and one engine kind (heatmaps: engines' bucket bounds differ, so buckets are summed per engine only).
        "target_model_engine": f'{scoped}, job=~"$job", instance=~"$instance", target=~"$target", '
                               'model=~"$model", engine=~"$engine"',
        # Per-GPU series (no target label: GPUs belong to the exporter that reads them).
        "gpu": f'{scoped}, job=~"$job", instance=~"$instance", gpu=~"$gpu"',
        # Derived per-GPU series that also name their target (roofline).
        "target_gpu": f'{scoped}, job=~"$job", instance=~"$instance", target=~"$target", gpu=~"$gpu"',
        # Fleet recording rules per model (`model:...`): summed over replicas, so no job, instance or target.
        "model": f'{scoped}, model=~"$model"',
        # Fleet recording rules per cluster (`cluster:...`, by cluster and the exporters' namespace).
        "cluster": scoped,
    }


RATE = "$__rate_interval"
# Grafana's custom SI units: 1200 reads "1.2 ktok/s", 3e6 "3 Mtok/s" ("suffix:" would never scale).
TOKENS_PER_S = "si:tok/s"
TOKENS = "si:tok"


class Promql:
    """PromQL with one selector spliced in: Promql("target_model").sel("llm_requests_running")."""

    def __init__(self, scope: str) -> None:
        if scope not in selectors():
            raise KeyError(scope)
        self.scope = scope

    @property
    def matchers(self) -> str:
        return selectors()[self.scope]

    def sel(self, metric: str, *extra: str) -> str:
        return f"{metric}{{{', '.join((self.matchers, *extra))}}}"

    def rate(self, metric: str, *extra: str, window: str | ConfigText = RATE) -> str:
        return f"rate({self.sel(metric, *extra)}[{window}])"

    def sum_rate(self, metric: str, *extra: str, by: Sequence[str] = (), window: str | ConfigText = RATE) -> str:
        return f"sum{by_clause(by)} ({self.rate(metric, *extra, window=window)})"

    def quantile(self, q: float, histogram: str, by: Sequence[str] = ("instance", "target", "model")) -> str:
        return (f"histogram_quantile({q}, sum by ({', '.join((*by, 'le'))}) "
                f"({self.rate(histogram + '_bucket')}))")


def by_clause(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def divide(numerator: str, denominator: str) -> str:
    """numerator / denominator, with the denominator's zeros dropped (no NaN or Inf series)."""
    return f"({numerator})\n/\n({denominator} > 0)"


# ----------------------------------------------------------------------------------------------
# Targets, thresholds, mappings
# ----------------------------------------------------------------------------------------------
def target(expr: str, legend: str = "", *, instant: bool = False, fmt: str = "time_series") -> dict:
    """One Prometheus query; refIds are assigned by the panel builder.
    A legend names the cluster as `{{cluster}}`; the configured cluster label is written instead."""
    legend = legend.replace("{{cluster}}", f"{{{{{cluster_label()}}}}}")
    return {"expr": expr, "legendFormat": legend, "instant": instant, "format": fmt}


def right_axis(name_regex: str, unit: str) -> dict:
    """An override that puts the series matching `name_regex` on a right axis in `unit`."""
    return {"matcher": {"id": "byRegexp", "options": name_regex},
            "properties": [{"id": "custom.axisPlacement", "value": "right"}, {"id": "unit", "value": unit}]}


def thresholds(*steps: tuple[float | None, str]) -> dict:
    """thresholds((None, "green"), (0.9, "orange"), (0.98, "red"))."""
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


def value_map(pairs: Iterable[tuple[float, str, str]]) -> list[dict]:
    """[(value, text, color)] -> a Grafana value mapping."""
    options = {fmt_num(v): {"color": color, "index": i, "text": text}
               for i, (v, text, color) in enumerate(pairs)}
    return [{"type": "value", "options": options}]


# ----------------------------------------------------------------------------------------------
# Panels: each builder returns a panel dict without id/gridPos; the Layout places it.
# ----------------------------------------------------------------------------------------------
@dataclass
class Panel:
    """A panel and its size in grid units (24 columns; height in 30 px rows)."""

    body: dict
    w: int = 12
    h: int = 8

    @property
    def title(self) -> str:
        return self.body["title"]


def _base(kind: str, title: str, description: str, targets: Sequence[dict], *, unit: str = "short",
          decimals: int | None = None, minimum: float | None = None, maximum: float | None = None,
          steps: dict | None = None, mappings: list | None = None, custom: dict | None = None,
          options: dict | None = None, overrides: list | None = None, color: dict | None = None,
          no_value: str | None = None, links: Sequence[dict] = ()) -> dict:
    if not description.strip():
        raise ValueError(f"panel {title!r} needs a description that says how to read it")
    defaults: dict[str, Any] = {"unit": unit, "mappings": mappings or []}
    defaults["thresholds"] = steps or thresholds((None, "green"))
    if decimals is not None:
        defaults["decimals"] = decimals
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    if custom is not None:
        defaults["custom"] = custom
    defaults["color"] = color or {"mode": "palette-classic"}
    if no_value is not None:
        # Shown instead of "No data" when the query returns nothing, and instead of NaN (a 0/0 ratio from
        # rules evaluated before they stopped dividing by zero) through the mapping.
        defaults["noValue"] = no_value
        defaults["mappings"] = [*defaults["mappings"],
                                {"type": "special", "options": {"match": "nan", "result": {"text": no_value}}}]
    if links:
        defaults["links"] = list(links)
    refs = []
    for i, t in enumerate(targets):
        refs.append({
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": t["expr"],
            "format": t["format"],
            "instant": t["instant"],
            "legendFormat": t["legendFormat"] or "__auto",
            "range": not t["instant"],
            "refId": chr(ord("A") + i),
        })
    return {
        "type": kind,
        "title": title,
        "description": description.strip(),
        "datasource": DATASOURCE,
        "targets": refs,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }


def _legend(placement: str = "bottom", calcs: Sequence[str] = ()) -> dict:
    return {"calcs": list(calcs), "displayMode": "table" if calcs else "list", "placement": placement,
            "showLegend": True}


def timeseries(title: str, description: str, targets: Sequence[dict], *, unit: str = "short",
               w: int = 12, h: int = 8, minimum: float | None = None, maximum: float | None = None,
               steps: dict | None = None, threshold_style: str = "off", stack: bool = False,
               fill: int = 10, bars: bool = False, decimals: int | None = None, overrides: list | None = None,
               legend_calcs: Sequence[str] = ("mean", "max", "lastNotNull"), log_scale: bool = False,
               no_value: str | None = None, links: Sequence[dict] = ()) -> Panel:
    custom = {
        "axisBorderShow": False, "axisCenteredZero": False, "axisColorMode": "text", "axisLabel": "",
        "axisPlacement": "auto", "barAlignment": 0, "drawStyle": "bars" if bars else "line",
        "fillOpacity": 80 if bars else fill, "gradientMode": "none",
        "hideFrom": {"legend": False, "tooltip": False, "viz": False}, "insertNulls": False,
        "lineInterpolation": "linear", "lineWidth": 1, "pointSize": 4,
        "scaleDistribution": {"type": "log", "log": 10} if log_scale else {"type": "linear"},
        "showPoints": "never", "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
        # "off", "line", "dashed", "area", "line+area", "dashed+area": how thresholds are drawn.
        "thresholdsStyle": {"mode": threshold_style},
    }
    body = _base("timeseries", title, description, targets, unit=unit, minimum=minimum, maximum=maximum,
                 steps=steps, custom=custom, decimals=decimals, overrides=overrides, no_value=no_value,
                 links=links,
                 options={"legend": _legend(calcs=legend_calcs), "tooltip": {"mode": "multi", "sort": "desc"}})
    return Panel(body, w, h)


def stat(title: str, description: str, targets: Sequence[dict], *, unit: str = "short", w: int = 4,
         h: int = 4, steps: dict | None = None, decimals: int | None = None, mappings: list | None = None,
         text_mode: str = "value_and_name", color_mode: str = "value", reduce: str = "lastNotNull",
         minimum: float | None = None, maximum: float | None = None, graph: bool = True,
         no_value: str | None = None) -> Panel:
    body = _base("stat", title, description, targets, unit=unit, steps=steps, decimals=decimals,
                 mappings=mappings, minimum=minimum, maximum=maximum, no_value=no_value,
                 color={"mode": "thresholds"},
                 options={"colorMode": color_mode, "graphMode": "area" if graph else "none",
                          "justifyMode": "auto", "orientation": "auto", "textMode": text_mode,
                          "wideLayout": True, "showPercentChange": False,
                          "reduceOptions": {"calcs": [reduce], "fields": "", "values": False}})
    return Panel(body, w, h)


def state_timeline(title: str, description: str, targets: Sequence[dict], *, mappings: list | None = None,
                   w: int = 24, h: int = 6, unit: str = "short", steps: dict | None = None,
                   color: dict | None = None, minimum: float | None = None, maximum: float | None = None,
                   merge: bool = True, show_values: str = "auto") -> Panel:
    body = _base("state-timeline", title, description, targets, unit=unit, mappings=mappings, steps=steps,
                 color=color or {"mode": "thresholds"}, minimum=minimum, maximum=maximum,
                 custom={"fillOpacity": 80, "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                         "lineWidth": 0},
                 options={"alignValue": "left", "mergeValues": merge, "rowHeight": 0.9,
                          "showValue": show_values, "legend": _legend(), "tooltip": {"mode": "single", "sort": "none"}})
    return Panel(body, w, h)


def heatmap(title: str, description: str, targets: Sequence[dict], *, unit: str = "s", w: int = 12,
            h: int = 8) -> Panel:
    """A heatmap of a Prometheus histogram: targets should be `sum by (le) (rate(x_bucket[..]))`
    with format "heatmap", so Grafana draws the buckets as they are (no re-bucketing)."""
    targets = [{**t, "format": "heatmap", "legendFormat": t["legendFormat"] or "{{le}}"} for t in targets]
    body = _base("heatmap", title, description, targets, unit=unit,
                 custom={"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                         "scaleDistribution": {"type": "linear"}},
                 options={"calculate": False, "cellGap": 1, "color": {"exponent": 0.5, "fill": "dark-orange",
                                                                       "mode": "scheme", "reverse": False,
                                                                       "scale": "exponential",
                                                                       "scheme": "Oranges", "steps": 64},
                          "exemplars": {"color": "rgba(255,0,255,0.7)"}, "filterValues": {"le": 1e-9},
                          "legend": {"show": True}, "rowsFrame": {"layout": "auto"},
                          "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": False},
                          "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit}})
    return Panel(body, w, h)


def table(title: str, description: str, targets: Sequence[dict], *, w: int = 12, h: int = 8,
          rename: dict[str, str] | None = None, exclude: Sequence[str] = ("Time",), unit: str = "short",
          overrides: list | None = None, steps: dict | None = None, mappings: list | None = None,
          links: Sequence[dict] = (), order: Sequence[str] = (), sort_by: str | None = None,
          no_value: str | None = None) -> Panel:
    """Instant queries formatted as tables and merged on their labels into one row per series: every
    query must return the same label set, or its rows stay apart. `order` puts those columns first,
    in that order (the names before renaming: a label or "Value #A"); `sort_by` sorts the rows by a
    column (its name after renaming), highest first."""
    targets = [{**t, "instant": True, "format": "table"} for t in targets]
    body = _base("table", title, description, targets, unit=unit, overrides=overrides, steps=steps,
                 mappings=mappings, links=links, no_value=no_value,
                 custom={"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False})
    body["options"] = {"cellHeight": "sm", "footer": {"countRows": False, "fields": "", "reducer": ["sum"],
                                                      "show": False}, "showHeader": True}
    if sort_by is not None:
        body["options"]["sortBy"] = [{"desc": True, "displayName": sort_by}]
    body["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {name: True for name in exclude},
                                       "indexByName": {name: i for i, name in enumerate(order)},
                                       "renameByName": rename or {}}},
    ]
    return Panel(body, w, h)


def text(title: str, description: str, content: str, *, w: int = 24, h: int = 4) -> Panel:
    """Markdown text. No query, so no datasource."""
    body = {"type": "text", "title": title, "description": description.strip(),
            "options": {"mode": "markdown", "content": content.strip(),
                        "code": {"language": "plaintext", "showLineNumbers": False, "showMiniMap": False}}}
    return Panel(body, w, h)


def repeat_per(panel: Panel, variable: str, *, max_per_row: int = 4) -> Panel:
    """One copy of the panel per selected value of `variable` (Grafana's panel repeat), side by side.

    Grafana sizes horizontal copies from the full row (24 / values, at most max_per_row per row), so
    the panel must be a full-width one; put the variable in the title so each copy names its value."""
    if panel.w != 24:
        raise ValueError(f"{panel.title}: a repeated panel is full width (24), not {panel.w}")
    if f"${variable}" not in panel.title:
        raise ValueError(f"{panel.title}: a panel repeated per ${variable} names it in its title")
    panel.body.update({"repeat": variable, "repeatDirection": "h", "maxPerRow": max_per_row})
    return panel


def color_override(name_regex: str, color: str, *, dashed: bool = False) -> dict:
    """Fix the color (and optionally a dashed line) of series whose display name matches."""
    props: list[dict] = [{"id": "color", "value": {"fixedColor": color, "mode": "fixed"}}]
    if dashed:
        props.append({"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}})
    return {"matcher": {"id": "byRegexp", "options": name_regex}, "properties": props}


# ----------------------------------------------------------------------------------------------
# Layout: rows of panels placed left to right, wrapping at 24 columns.
# ----------------------------------------------------------------------------------------------
@dataclass
class Layout:
    panels: list[dict] = field(default_factory=list)
    x: int = 0
    y: int = 0
    row_h: int = 0
    next_id: int = 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x, self.row_h = 0, 0

    def row(self, title: str) -> Layout:
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self.next_id, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.next_id += 1
        self.y += 1
        return self

    def add(self, *panels: Panel) -> Layout:
        for p in panels:
            if not 1 <= p.w <= 24:
                raise ValueError(f"{p.title}: width {p.w} outside 1..24")
            if self.x + p.w > 24:
                self._newline()
            self.panels.append({"id": self.next_id, "gridPos": {"h": p.h, "w": p.w, "x": self.x, "y": self.y},
                                **p.body})
            self.next_id += 1
            self.x += p.w
            self.row_h = max(self.row_h, p.h)
        return self


@dataclass(frozen=True)
class Row:
    """One dashboard row: its title (None: panels above the first row header) and its panels, placed
    left to right and wrapping at 24 columns."""

    title: str | None
    panels: tuple[Panel, ...]


def row(title: str | None, *panels: Panel) -> Row:
    return Row(title, panels)


RowBuilder = Callable[[], Row]


def layout(rows: Iterable[RowBuilder]) -> Layout:
    """The dashboard's panels, row by row, from its row functions in order."""
    lay = Layout()
    for build_row in rows:
        r = build_row()
        if r.title is not None:
            lay.row(r.title)
        lay.add(*r.panels)
    return lay


# ----------------------------------------------------------------------------------------------
# Variables
# ----------------------------------------------------------------------------------------------
def datasource_variable() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False}


def query_variable(name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True,
                   all_value: str | None = ".*", default_all: bool = True) -> dict:
    var = {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        # The string form of a Prometheus variable query: every Grafana from 7 to 13 reads it (the
        # object form's fields changed across versions).
        "definition": query, "query": query,
        "refresh": 2, "sort": 1, "regex": "", "hide": 0, "multi": multi, "includeAll": include_all,
        "options": [], "skipUrlSync": False,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if default_all and include_all else {},
    }
    if include_all and all_value is not None:
        var["allValue"] = all_value
    return var


def fleet_label_variables() -> list[dict]:
    """One variable per fleet label ($cluster, $namespace), each scoped by the ones before it."""
    out: list[dict] = []
    before: list[str] = []
    for variable, label in fleet_variables():
        matchers = f"{{{', '.join(before)}}}" if before else ""
        out.append(query_variable(variable, variable.capitalize(),
                                  f"label_values(llm_exporter_build_info{matchers}, {label})"))
        before.append(f'{label}=~"${variable}"')
    return out


def job_variable() -> dict:
    return query_variable("job", "Job", f"label_values(llm_exporter_build_info{{{scope()}}}, job)")


def instance_variable() -> dict:
    return query_variable("instance", "Exporter",
                          f'label_values(llm_exporter_build_info{{{scope()}, job=~"$job"}}, instance)')


def target_variable() -> dict:
    return query_variable("target", "Engine target",
                          f'label_values(llm_engine_up{{{selectors()["exporter"]}}}, target)')


def model_variable() -> dict:
    return query_variable("model", "Model", f'label_values(llm_requests_running{{{selectors()["target"]}}}, model)')


def engine_variable() -> dict:
    """The engine kinds (vllm, sglang, ...): panels that must not mix bucket layouts repeat per engine."""
    return query_variable("engine", "Engine", f'label_values(llm_engine_up{{{selectors()["target"]}}}, engine)')


def gpu_variable() -> dict:
    return query_variable("gpu", "GPU", f'label_values(llm_gpu_up{{{selectors()["exporter"]}}}, gpu)')


def adhoc_variable() -> dict:
    """Grafana's ad hoc filters: label matchers the user adds at will, which Grafana splices into every
    query of this datasource (a tenant label, a node, a pod); no panel names it."""
    return {"name": "filter", "label": "Filter", "type": "adhoc", "datasource": DATASOURCE, "filters": [],
            "hide": 0, "skipUrlSync": False}


def standard_variables(*, gpu: bool = False, engine: bool = False) -> list[dict]:
    out = [datasource_variable(), *fleet_label_variables(), job_variable(), instance_variable(),
           target_variable(), model_variable()]
    if engine:
        out.append(engine_variable())
    if gpu:
        out.append(gpu_variable())
    out.append(adhoc_variable())
    return out


# ----------------------------------------------------------------------------------------------
# Dashboard
# ----------------------------------------------------------------------------------------------
# Each board's file name (its UID is the name's MD5), by module: declared here so that boards link to
# each other (the Fleet board and the Overview link both ways) without importing each other.
FILENAMES = {"fleet": "llm-serving-fleet.json", "overview": "llm-serving-overview.json",
             "gpu_roofline": "llm-serving-gpu-roofline.json", "host": "llm-serving-host.json"}


def uid_for(filename: str) -> str:
    """Stable UID from the file name (the mixins' md5(filename)), so links and bookmarks survive."""
    return hashlib.md5(filename.encode()).hexdigest()


def dashboard_link(title: str, filename: str, tooltip: str) -> dict:
    """A link in the dashboard's header to another of ours, keeping the time range and the variables."""
    return {"asDropdown": False, "icon": "dashboard", "includeVars": True, "keepTime": True, "tags": [],
            "targetBlank": False, "title": title, "tooltip": tooltip, "type": "link",
            "url": f"/d/{uid_for(filename)}"}


def dashboard(filename: str, title: str, description: str, layout: Layout, variables: list[dict],
              *, refresh: str = "30s", time_from: str = "now-1h", links: Sequence[dict] = ()) -> dict:
    return {
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": False, "icon": "external link", "includeVars": True, "keepTime": True,
                   "tags": list(TAGS), "targetBlank": False, "title": "LLM Serving", "tooltip": "",
                   "type": "dashboards", "url": ""}, *links],
        "panels": layout.panels,
        "refresh": refresh,
        "schemaVersion": SCHEMA_VERSION,
        "tags": list(TAGS),
        "templating": {"list": variables},
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid_for(filename),
        "version": 1,
        "weekStart": "",
    }


# Grafana value mappings shared by the dashboards.
BOOL_UP = value_map([(0, "down", "red"), (1, "up", "green")])
BOOL_ACTIVE = value_map([(0, "off", "transparent"), (1, "active", "red")])
