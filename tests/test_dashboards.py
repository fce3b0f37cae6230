"""dashboards/generate.py: `--check` passes, its failure modes, the dashboards' structure, and the
PromQL tokenizer the metric check relies on. The live proof (real Prometheus scraping the demo)
is in test_dashboards_live.py."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys

import pytest

from exporter import catalog, slo
from exporter.derive import bottleneck
from exporter.mixin.dashboards import fleet, generate, gpu_roofline, host, lib, overview
from exporter.mixin.dashboards.promql import PromqlSyntaxError, metric_names
from exporter.sources.engines.registry import KINDS, coverage
from tests.conftest import ROOT

DASHBOARDS = {name: json.loads(text) for name, text in generate.build_all().items()}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s", "__from", "__to",
                     "__all", "__name", "__dashboard", "__user", "__org",
                     # data links: the clicked row's fields and the dashboard's time range
                     "__data", "__url_time_range", "__field", "__value", "__series"}


def panels(dash: dict) -> list[dict]:
    return list(generate.iter_panels(dash))


# ------------------------------------------------------------------------------------------------
# --check
# ------------------------------------------------------------------------------------------------
def test_check_passes_on_the_committed_json():
    result = subprocess.run([sys.executable, "dashboards/generate.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"{len(generate.DASHBOARDS)} dashboards up to date" in result.stdout
    assert len(generate.DASHBOARDS) == 4


def test_check_reports_stale_missing_and_stray_files(tmp_path):
    for name in generate.DASHBOARDS:
        shutil.copy(ROOT / "dashboards" / name, tmp_path / name)
    assert generate.check(tmp_path) == []
    first, second = list(generate.DASHBOARDS)[:2]
    (tmp_path / first).write_text((tmp_path / first).read_text().replace('"schemaVersion": 39', '"schemaVersion": 38'))
    (tmp_path / second).unlink()
    (tmp_path / "hand-made.json").write_text("{}")
    (tmp_path / "generate.py").write_text("# sources are not outputs")
    problems = generate.check(tmp_path)
    assert any(p.startswith(f"{first}: differs") for p in problems), problems
    assert any(p.startswith(f"{second}: missing") for p in problems), problems
    assert any(p.startswith("hand-made.json: in dashboards/ but not produced") for p in problems), problems
    assert len(problems) == 3, problems


def test_check_rejects_metrics_neither_in_the_catalogue_nor_in_the_rules():
    dash = {"title": "D", "panels": [{"title": "P", "targets": [
        {"refId": "A", "expr": 'rate(llm_generation_tokens_total{job=~"$job"}[$__rate_interval])'},
        {"refId": "B", "expr": 'target_model:llm_generation_tokens:rate5m{model=~"$model"}'},
        {"refId": "C", "expr": 'sum by (gpu) (llm_gpu_made_up_ratio{gpu=~"$gpu"})'},
        {"refId": "D", "expr": 'target_model:not_a_rule:rate5m'},
        {"refId": "E", "expr": 'vector(1)'},
        {"refId": "F", "expr": 'llm_engine_up{target="unterminated}'},
    ]}]}
    problems = generate.undefined_metrics(dash, generate.recording_rules())
    assert problems == [
        "D / P / C: llm_gpu_made_up_ratio is neither a catalogue sample name nor a recording rule",
        "D / P / D: target_model:not_a_rule:rate5m is neither a catalogue sample name nor a recording rule",
        "D / P / E: query reads no metric",
        "D / P / F: unterminated string at 21: '\"unterminated}'",
    ]


def test_recording_rules_are_read_from_alerts_rules():
    rules = generate.recording_rules()
    assert "target_model:llm_time_to_first_token_seconds:p99_5m" in rules
    assert "target_model:llm_inter_token_latency_seconds:slo_good_ratio_rate1h" in rules
    assert not any(r.startswith("LLM") for r in rules)  # alerts are not recording rules


# ------------------------------------------------------------------------------------------------
# Structure
# ------------------------------------------------------------------------------------------------
@pytest.fixture(params=sorted(DASHBOARDS))
def dash(request) -> tuple[str, dict]:
    return request.param, DASHBOARDS[request.param]


def test_dashboard_header(dash):
    name, d = dash
    assert d["schemaVersion"] == 39
    assert d["uid"] == hashlib.md5(name.encode()).hexdigest()
    assert len(d["uid"]) <= 40
    assert d["id"] is None  # provisioning assigns ids
    assert d["title"].startswith("LLM Serving / ")
    assert "llm-exporter" in d["tags"]


def test_panel_ids_are_unique_and_refids_unique_per_panel(dash):
    _, d = dash
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), ids
    for p in panels(d):
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]


def test_grid_positions_fit_24_columns_and_do_not_overlap(dash):
    _, d = dash
    cells: dict[tuple[int, int], str] = {}
    for p in panels(d):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24, (p["title"], g)
        assert g["h"] >= 1 and g["y"] >= 0, (p["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_every_panel_has_a_description_and_a_datasource(dash):
    """Rows are layout, not panels; text panels run no query, so they need no datasource."""
    _, d = dash
    for p in panels(d):
        if p["type"] == "row":
            continue
        assert p.get("description", "").strip(), f"{p['title']}: no description"
        if p["type"] == "text":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{p['title']}: no query"
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]


def test_every_variable_used_is_defined_and_every_defined_one_used(dash):
    _, d = dash
    defined = [v["name"] for v in d["templating"]["list"]]
    assert len(defined) == len(set(defined))
    text = json.dumps(d["panels"]) + json.dumps(d["templating"])
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text)) | set(re.findall(r"\[\[(\w+)", text))
    assert used - BUILTIN_VARIABLES <= set(defined), used - BUILTIN_VARIABLES - set(defined)
    panel_text = json.dumps(d["panels"])
    for var in d["templating"]["list"]:
        if var["type"] == "adhoc":  # Grafana splices ad hoc filters into every query; no panel names them
            continue
        name = var["name"]
        assert re.search(r"\$\{?" + name + r"\b", panel_text), f"variable {name} defined but unused"
    # Variables only refer to variables defined before them (Grafana resolves them in order).
    for i, var in enumerate(d["templating"]["list"]):
        refs = set(re.findall(r"\$\{?(\w+)", json.dumps(var.get("query", "")))) - BUILTIN_VARIABLES
        assert refs <= set(defined[:i]) | {"datasource"}, (var["name"], refs)


def test_dashboards_have_the_variables_the_issue_asks_for(dash):
    name, d = dash
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert {"datasource", "cluster", "namespace", "job", "target", "model", "filter"} <= set(variables)
    if "gpu" in name:
        assert "gpu" in variables
    # cluster and namespace at All match series without the label (a Prometheus whose series carry the
    # cluster only as an external label): the All value is the regex .*, and the matchers are regex ones.
    for scope in ("cluster", "namespace"):
        var = variables[scope]
        assert var["includeAll"] and var["allValue"] == ".*" and var["multi"], var
        assert var["current"]["value"] == ["$__all"], var
        assert var["query"].startswith("label_values(llm_exporter_build_info"), var
    assert variables["cluster"]["query"] == "label_values(llm_exporter_build_info, cluster)"
    assert 'cluster=~"$cluster"' in variables["namespace"]["query"]
    adhoc = variables["filter"]
    assert adhoc["type"] == "adhoc" and adhoc["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # Every query variable after the scope is itself scoped by it (one cluster's jobs, instances, ...).
    for var in d["templating"]["list"]:
        if var["type"] == "query" and var["name"] not in ("cluster", "namespace"):
            assert 'cluster=~"$cluster", namespace=~"$namespace"' in var["query"], var["name"]


# The labels a recording rule's series carry, by its level (alerts/rules/*.yaml): per replica, per model
# over the fleet, per cluster.
RULE_LABELS = {
    "target_model": {"cluster", "namespace", "job", "instance", "target", "engine", "model"},
    "model": {"cluster", "namespace", "model", "engine"},
    "cluster": {"cluster", "namespace"},
    "pod": {"cluster", "namespace", "pod"},
}
FLEET_LEVELS = ("model", "cluster", "pod")


def series_labels(name: str) -> set[str]:
    """The labels that can scope the series of `name`: a recording rule's by its level, a catalogue family's
    own plus the target labels every scrape adds (job, instance) and a multi-cluster setup adds."""
    level = name.split(":")[0] if ":" in name else None
    if level is not None:
        return RULE_LABELS[level]
    fam = catalog.family_of(name)
    assert fam is not None, name
    return {*fam.labels, "job", "instance", "cluster", "namespace"}


def named_selectors(expr: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr)]


def test_every_selector_is_scoped_by_cluster_namespace_and_job():
    """Every metric selector is scoped: the selector dict, not ad-hoc matchers, decides what is read. The
    cluster and namespace scope applies everywhere; job (and the replica's instance/target) everywhere but on
    the fleet rules, which sum them away."""
    assert all(s.startswith(lib.scope()) for s in lib.selectors().values()), lib.selectors()
    count = 0
    for d in DASHBOARDS.values():
        for panel, t in generate.iter_exprs(d):
            for name, matchers in named_selectors(t["expr"]):
                count += 1
                assert 'cluster=~"$cluster", namespace=~"$namespace"' in matchers, (panel["title"], name)
                fleet_rule = name.split(":")[0] in FLEET_LEVELS
                assert ('job=~"$job"' in matchers) != fleet_rule, (panel["title"], name, matchers)
    assert count > 200


# ------------------------------------------------------------------------------------------------
# The PromQL tokenizer
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("expr", "names"), [
    ("up", {"up"}),
    ('llm_engine_up{job=~"$job", target=~"a|b"} == 0', {"llm_engine_up"}),
    ("rate(llm_x_total[5m])", {"llm_x_total"}),
    ('sum by (le, target) (rate(h_bucket{le="2.5"}[$__rate_interval]))', {"h_bucket"}),
    ("sum without (rank) (a) / ignoring (state) group_left (model) b", {"a", "b"}),
    ("max(a) by (gpu) > bool 0.5", {"a"}),
    ("a offset 5m and on (job, instance) b unless c or d", {"a", "b", "c", "d"}),
    ("histogram_quantile(0.99, target_model:x_bucket:rate5m)", {"target_model:x_bucket:rate5m"}),
    ("a[10m:1m] @ end()", {"a"}),
    ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
    ('{__name__="via_name", job="j"}', {"via_name"}),
    ("time() - last_ts", {"last_ts"}),
    ("vector(0) + 1e3 * 0x1F - Inf + NaN", set()),
    ("sum(x)\n# a comment naming not_a_metric\n+ y", {"x", "y"}),
    ("count_values(\"v\", a) / topk(3, b)", {"a", "b"}),
    ('a{l="}{[("}', {"a"}),
    ("${job_var} and x", {"x"}),
])
def test_tokenizer_finds_metric_names_only(expr, names):
    assert metric_names(expr) == names


@pytest.mark.parametrize("expr", ['a{l="x}', "rate(a[5m)", "a{b"])
def test_tokenizer_rejects_unbalanced_input(expr):
    with pytest.raises(PromqlSyntaxError):
        metric_names(expr)


def test_tokenizer_agrees_with_the_dashboards():
    """Every dashboard query reads at least one name, and only names the check knows about."""
    rules = generate.recording_rules()
    for d in DASHBOARDS.values():
        assert generate.undefined_metrics(d, rules) == []


# ------------------------------------------------------------------------------------------------
# Provisioning
# ------------------------------------------------------------------------------------------------
def test_grafana_provisioning_loads_the_mounted_dashboards_folder():
    import yaml

    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    providers = yaml.safe_load((provisioning / "dashboards" / "llm-exporter.yaml").read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    path = providers[0]["options"]["path"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    default = [d for d in datasources if d.get("isDefault")]
    assert len(default) == 1 and default[0]["type"] == "prometheus"
    compose = ROOT / "docker-compose.yml"
    if compose.exists():  # the compose file mounts dashboards/ itself: no copies of the JSON
        volumes = yaml.safe_load(compose.read_text())["services"]["grafana"]["volumes"]
        assert any(v.split(":")[:2] == ["./dashboards", path] for v in volumes), volumes
        assert any(v.split(":")[:2] == ["./deploy/grafana/provisioning", "/etc/grafana/provisioning"]
                   for v in volumes), volumes


def test_docs_list_every_panel():
    docs = (ROOT / "docs" / "dashboards.md").read_text()
    assert docs == generate.render_docs()
    for d in DASHBOARDS.values():
        for p in panels(d):
            if p["type"] != "row":
                assert f"| {p['title']} |" in docs, p["title"]


# ------------------------------------------------------------------------------------------------
# What the panels' queries mean: several engines, several exporters
# ------------------------------------------------------------------------------------------------
def all_panels() -> list[tuple[str, dict]]:
    return [(d["title"], p) for d in DASHBOARDS.values() for p in panels(d) if p["type"] != "row"]


def panel(title: str) -> dict:
    found = [p for _, p in all_panels() if p["title"] == title]
    assert len(found) == 1, (title, len(found))
    return found[0]


def line_values(p: dict) -> list[float]:
    return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def _skip(expr: str, i: int) -> int:
    """Index just past the string or bracketed block starting at expr[i]."""
    if expr[i] in "\"'`":
        j = i + 1
        while expr[j] != expr[i]:
            j += 2 if expr[j] == "\\" else 1
        return j + 1
    close = {"(": ")", "{": "}", "[": "]"}[expr[i]]
    depth, j = 0, i
    while True:
        if expr[j] in "\"'`":
            j = _skip(expr, j)
            continue
        if expr[j] == expr[i]:
            depth += 1
        elif expr[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1


def top_level(expr: str) -> tuple[list[tuple[int, int]], list[str]]:
    """The spans of expr's top-level parenthesised groups and its top-level words."""
    groups, words, i = [], [], 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`{[":
            i = _skip(expr, i)
        elif c == "(":
            end = _skip(expr, i)
            groups.append((i, end))
            i = end
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", expr[i:])
            assert m
            words.append((i, m.group(0)))
            i += m.end()
        else:
            i += 1
    return groups, words


LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def split_on(expr: str, keyword: str) -> list[str]:
    _, words = top_level(expr)
    cuts = [i for i, w in words if w == keyword]
    bounds = [0, *cuts, len(expr)]
    return [expr[a + (len(keyword) if k else 0):b] for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


def family_read(name: str) -> str:
    """The catalogue family a sample name or a recording rule (target_model:<sample>:<op>) reads."""
    sample = name.split(":")[1] if name.split(":")[0] in RULE_LABELS else name
    for candidate in (sample, sample + "_total"):
        fam = catalog.FAMILIES.get(candidate) or catalog.family_of(candidate)
        if fam is not None:
            return fam.name
    raise AssertionError(f"{name}: no family")


def has_data(expr: str, families: set[str]) -> bool:
    """Whether expr can return a series when exactly `families` are exported: `or` takes either side,
    everything else (functions, arithmetic, `and`) needs all of its parts; `unless` its left side."""
    alternatives = split_on(expr, "or")
    if len(alternatives) > 1:
        return any(has_data(a, families) for a in alternatives)
    expr = split_on(expr, "unless")[0]
    groups, words = top_level(expr)
    inner, rest, last = [], [], 0
    for start, end in groups:
        before = [(i, w) for i, w in words if i < start]
        if before and before[-1][1] in LABEL_LISTS and not expr[before[-1][0] + len(before[-1][1]):start].strip():
            continue  # a label list (`by (...)`, `on (...)`), not a sub-expression
        inner.append(expr[start + 1:end - 1])
        rest.append(expr[last:start] + "()")
        last = end
    rest.append(expr[last:])
    names = metric_names("".join(rest))
    return all(family_read(n) in families for n in names) and all(has_data(e, families) for e in inner)


def selectors(expr: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*\{([^}]*)\}", expr)]


def clauses(expr: str) -> list[tuple[str, set[str]]]:
    return [(m.group(1), {label.strip() for label in m.group(2).split(",") if label.strip()})
            for m in re.finditer(r"\b(by|on|without|ignoring)\s*\(([^)]*)\)", expr)]


def test_the_presence_evaluator_reads_or_as_either_side():
    assert has_data("sum by (a) (rate(llm_prefix_cache_hits_total{x=\"1\"}[5m]))", {"llm_prefix_cache_hits_total"})
    assert not has_data("(sum (rate(llm_prefix_cache_hits_total[5m])))\n/\n(sum (rate(llm_prefix_cache_queries_total"
                        "[5m])) > 0)", {"llm_prefix_cache_hits_total"})
    assert has_data("(a_b)/(llm_prefix_cache_queries_total > 0) or on (x) avg by (x) (llm_prefix_cache_hit_ratio)"
                    .replace("a_b", "llm_prefix_cache_hits_total"), {"llm_prefix_cache_hit_ratio"})
    assert has_data('max(label_replace(target_model:llm_inter_token_latency_seconds:p99_5m, "m", "v", "", ""))',
                    {"llm_inter_token_latency_seconds"})


def test_every_aggregation_and_legend_over_gpu_or_target_series_keeps_instance():
    """GPU 0 of every exporter, and the target `engine` of every Kubernetes sidecar, are different
    series: an aggregation that keeps gpu or target but drops instance merges them into one line,
    and a legend without instance shows them under one name."""
    for dash, p in all_panels():
        for t in p.get("targets", []):
            where = (dash, p["title"], t["refId"])
            for kind, labels in clauses(t["expr"]):
                if labels & {"gpu", "target"}:
                    assert "instance" in labels, (*where, kind, labels)
            legend = t["legendFormat"]
            if "{{gpu}}" in legend or "{{target}}" in legend:
                assert "{{instance}}" in legend, (*where, legend)
    peak = panel("Achieved vs peak HBM bandwidth")["targets"]
    assert all(("instance", {"instance"} <= labels) for _, labels in clauses(peak[1]["expr"]))


def test_every_query_scopes_all_its_selectors_alike():
    """Both sides of a binary operation read the same selection: a filter on one side only (KV pools
    of $target subtracted from every GPU of the exporter) mixes engines. A selector leaves out only the
    variables of labels its series do not carry (llm_bottleneck has no model, a fleet rule no instance)."""
    for dash, p in all_panels():
        for t in p.get("targets", []):
            found = [(name, set(re.findall(r"\$(\w+)", m))) for name, m in named_selectors(t["expr"])]
            used = set().union(*(v for _, v in found)) if found else set()
            for name, variables in found:
                expected = {v for v in used if v in series_labels(name)}
                assert expected <= variables, (dash, p["title"], t["refId"], name, expected - variables)


def test_the_selector_check_knows_what_each_series_carries():
    assert "model" not in series_labels("llm_bottleneck")
    assert series_labels("model:llm_requests_error:ratio_rate5m") == {"cluster", "namespace", "model", "engine"}
    assert {"job", "instance", "gpu", "cluster"} <= series_labels("llm_gpu_up")


def test_panels_that_ignore_a_variable_say_so():
    """A panel reading series that carry a target label without $target (GPU memory has no target, so
    the memory split is per exporter) says in its description which variables do not apply."""
    for dash, p in all_panels():
        exprs = [t["expr"] for t in p.get("targets", [])]
        families = {catalog.family_of(n) for e in exprs for n in metric_names(e)} - {None}
        used = {v for e in exprs for s in selectors(e) for v in re.findall(r"\$(\w+)", s)}
        for label in ("target", "model"):
            if any(label in f.labels for f in families) and label not in used:
                assert f"${label}" in p["description"], (dash, p["title"], label)
    memory = panel("Where device memory goes: KV pool vs weights and the rest")
    assert "$job and $instance apply" in " ".join(memory["description"].split())


def outer_aggregations(expr: str) -> list[tuple[str, set[str]]]:
    """The top-level operands of expr (split on arithmetic and comparison operators, outer parentheses
    removed), each as (aggregation, by labels); ("", set()) for a number, ("?", ...) for anything else."""
    expr = expr.strip()
    groups, words = top_level(expr)
    if len(groups) == 1 and groups[0] == (0, len(expr)):
        return outer_aggregations(expr[1:-1])
    depth_zero = list(expr)
    for start, end in groups:
        depth_zero[start:end] = ["("] + [" "] * (end - start - 2) + [")"]
    flat = "".join(depth_zero)
    cuts = [m.start() for m in re.finditer(r"(?<![=!<>])[-+*/<>](?!=)", flat)]
    bounds = [-1, *cuts, len(expr)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        operand = expr[a + 1:b].strip()
        if re.fullmatch(r"[0-9.]+", operand):
            out.append(("", set()))
            continue
        if operand.startswith("(") and operand.endswith(")") and _skip(operand, 0) == len(operand):
            out += outer_aggregations(operand[1:-1])
            continue
        m = re.match(r"(sum|avg|max|min|count)\s*(?:by\s*\(([^)]*)\))?\s*\(", operand)
        if m and _skip(operand, m.end() - 1) == len(operand):
            out.append((m.group(1), {x.strip() for x in (m.group(2) or "").split(",") if x.strip()}))
        else:
            out.append(("?", set()))
    return out


def test_stacked_panels_stack_the_parts_of_one_target():
    """A stack adds its series up, so it may only stack the parts of one whole: each stacked panel is
    repeated per $target and every query aggregates instance, target and model away (one series per
    part). Stacking N targets' shares reaches N; stacking two exporters' means adds latencies."""
    stacked = [(dash, p) for dash, p in all_panels() if p["type"] == "timeseries"
               and p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] != "none"]
    assert len(stacked) >= 3
    for dash, p in stacked:
        operands = [op for t in p["targets"] for op in outer_aggregations(t["expr"])]
        if all(agg == "count" for agg, _ in operands):
            pass  # a count of the fleet's replicas by one label (the verdict mix): its parts add up to the fleet
        else:
            assert p.get("repeat") == "target" and p["repeatDirection"] == "h", (dash, p["title"])
            assert p["gridPos"]["w"] == 24 and p["gridPos"]["x"] == 0, (dash, p["title"])
        for t in p["targets"]:
            operands = outer_aggregations(t["expr"])
            for agg, labels in operands:
                assert agg != "?", (dash, p["title"], t["refId"], t["expr"])
                assert not labels & {"instance", "target", "model", "gpu"}, (dash, p["title"], t["refId"], labels)
            assert not re.search(r"\{\{(instance|target|model|gpu)\}\}", t["legendFormat"]), (p["title"], t)


def test_stack_check_reads_the_outer_aggregation():
    assert outer_aggregations("avg by (phase) (x{a=\"1\"})") == [("avg", {"phase"})]
    assert outer_aggregations("(sum (rate(a[5m])))\n/\n(sum (rate(b[5m])) > 0)") == [
        ("sum", set()), ("sum", set()), ("", set())]
    assert outer_aggregations("x{a=~\"$b\"}") == [("?", set())]
    assert outer_aggregations("sum by (instance, reason) (x) or y")[0][0] == "?"


# The thresholds the verdict code uses, computed here from exporter/derive/bottleneck.py.
HBM_ROOF = bottleneck.HBM_LOW + bottleneck.ROOF_MIN * (bottleneck.HBM_HIGH - bottleneck.HBM_LOW)
MFU_ROOF = bottleneck.MFU_LOW + bottleneck.ROOF_MIN * (bottleneck.MFU_HIGH - bottleneck.MFU_LOW)


def score(resource: str, **signals: float) -> float:
    return bottleneck.scores(bottleneck.Signals(**signals))[resource]  # type: ignore[arg-type]


def percentages(text: str) -> set[float]:
    return {round(float(m) / 100, 4) for m in re.findall(r"(\d+(?:\.\d+)?)%", text)}


def decimals(text: str) -> set[float]:
    return {float(m) for m in re.findall(r"(?<![\d.])(0\.\d+)", text)}


@pytest.mark.parametrize(("title", "signal", "resource", "low", "line", "high", "minimum"), [
    ("HBM bandwidth efficiency (share of peak)", "hbm_gpm", "memory_bandwidth",
     bottleneck.HBM_LOW, HBM_ROOF, bottleneck.HBM_HIGH, bottleneck.ROOF_MIN),
    ("Prefill MFU", "mfu", "compute", bottleneck.MFU_LOW, MFU_ROOF, bottleneck.MFU_HIGH, bottleneck.ROOF_MIN),
    ("Engine process: busiest thread and cores used", "busiest_thread", "host_cpu", 0.70, 0.85, 0.95,
     bottleneck.CONSTRAINT_MIN),
])
def test_verdict_lines_sit_where_the_verdict_code_changes(title, signal, resource, low, line, high, minimum):
    """The dashed lines are where the score starts to rise and where it reaches the minimum a roof (or
    a constraint) needs to be the verdict; the description's numbers are exactly those."""
    p = panel(title)
    assert line_values(p) == pytest.approx([low, line]), (title, line_values(p))
    assert score(resource, **{signal: low}) == 0 < score(resource, **{signal: low + 0.01})
    assert score(resource, **{signal: line}) >= minimum > score(resource, **{signal: line - 0.002})
    assert score(resource, **{signal: high}) == 1 > score(resource, **{signal: high - 0.01})
    text = " ".join(p["description"].split())
    assert percentages(text) == {round(v, 4) for v in (low, line, high)}, (title, text)
    assert {bottleneck.ROOF_MIN, bottleneck.CONSTRAINT_MIN} & decimals(text) >= {minimum}, text


def test_busiest_thread_caveats_match_the_verdict_code():
    text = " ".join(panel("Engine process: busiest thread and cores used")["description"].split())
    assert "halved while a roof (compute or HBM) scores 0.8 or more" in text
    assert "raised by 0.15 once above 0.3" in text
    roof_at_08 = bottleneck.HBM_LOW + 0.8 * (bottleneck.HBM_HIGH - bottleneck.HBM_LOW)
    plain = score("host_cpu", busiest_thread=0.9)
    assert score("host_cpu", busiest_thread=0.9, hbm_gpm=roof_at_08) == pytest.approx(plain / 2, abs=1e-4)
    assert score("host_cpu", busiest_thread=0.9, hbm_gpm=roof_at_08 - 0.01) == plain
    assert score("host_cpu", busiest_thread=0.9, numa_mismatch=True) == pytest.approx(plain + 0.15)
    assert score("host_cpu", busiest_thread=0.7 + 0.25 * 0.29, numa_mismatch=True) < 0.3


def test_score_panels_draw_the_verdict_minimums():
    for title in ("Evidence: score per resource", "Host CPU bottleneck score vs decode tokens/s"):
        p = panel(title)
        text = " ".join(p["description"].split())
        assert set(line_values(p)) <= {bottleneck.ROOF_MIN, bottleneck.CONSTRAINT_MIN}, title
        assert bottleneck.CONSTRAINT_MIN in line_values(p)
        assert decimals(text) == set(line_values(p)), (title, text)


# Which engine feeds which family (the alias tables), and the panels that must show every engine
# that exports what they read.
ENGINE_FAMILIES = {kind: set(coverage(kind)) for kind in KINDS}
# How the descriptions name them.
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "llamacpp": "llama.cpp", "triton": "Triton",
                "trtllm": "trtllm-serve", "lmdeploy": "LMDeploy", "nim": "NIM"}
COVERED_PANELS = {
    "Prefix cache hit ratio": {"llm_prefix_cache_queries_total", "llm_prefix_cache_hits_total",
                               "llm_prefix_cache_hit_ratio"},
    "TBT p99 (5m)": {"llm_inter_token_latency_seconds", "llm_time_per_output_token_seconds"},
    "Time between tokens (p50/p95/p99, 5m)": {"llm_inter_token_latency_seconds",
                                              "llm_time_per_output_token_seconds"},
    "Time-between-tokens distribution ($engine)": {"llm_inter_token_latency_seconds",
                                                   "llm_time_per_output_token_seconds"},
    "Finished requests by reason ($target)": {"llm_requests_finished_total", "llm_requests_total",
                                              "llm_e2e_request_latency_seconds"},
}


@pytest.mark.parametrize("title", sorted(COVERED_PANELS))
def test_panels_show_every_engine_that_exports_their_data(title):
    assert set(ENGINE_NAMES) == set(KINDS)
    """SGLang and trtllm-serve report the prefix cache as a hit-ratio gauge, TGI and trtllm-serve time
    between tokens as TPOT, SGLang and LMDeploy requests without a finish reason: the panel falls back
    to those, per engine target, instead of staying blank."""
    p = panel(title)
    shown = []
    for kind, families in ENGINE_FAMILIES.items():
        if families & COVERED_PANELS[title]:
            assert all(has_data(t["expr"], families) for t in p["targets"]), (title, kind)
            shown.append(kind)
    assert len(shown) >= 3, shown
    for kind in shown:
        assert ENGINE_NAMES[kind] in p["description"], (title, kind)


def test_cost_description_states_the_formula_the_exporter_applies():
    help_text = " ".join(catalog.family_of("llm_cost_per_million_tokens").help.split())
    formula = re.search(r"= (.*?);", help_text).group(1)
    assert "/ 3600" in formula
    p = panel(f"Cost per 1M generated tokens ({overview.CURRENCY})")
    text = " ".join(p["description"].split())
    # The price flag carries no currency: title and unit say the cost is in the price's own.
    assert "--gpu-price-per-hour" in p["title"] and "--gpu-price-per-hour" in p["fieldConfig"]["defaults"]["unit"]
    assert formula.lower() in text.lower(), (formula, text)


@pytest.mark.parametrize("spec", slo.SLOS, ids=lambda s: s.key)
def test_burn_rate_panel_shows_every_alert_pair(spec):
    """Each multi-window alert pair (exporter/slo.py BURN_RATES, which the alert rules read) can be read
    from the panel: both of its windows are plotted (as recording rules that exist) and its factor is a
    line."""
    burn_panels = [p for _, p in all_panels() if "burn rate" in p["title"]
                   and any(f"{spec.metric}:slo_good_ratio" in t["expr"] for t in p["targets"])]
    assert len(burn_panels) == 1, [p["title"] for p in burn_panels]
    p = burn_panels[0]
    rules = generate.recording_rules()
    windows = {}
    for t in p["targets"]:
        names = metric_names(t["expr"])
        assert len(names) == 1 and names <= rules, names
        m = re.fullmatch(rf"target_model:{spec.metric}:slo_good_ratio_rate(\w+)", names.pop())
        assert m, t["expr"]
        windows[m.group(1)] = t["legendFormat"]
        assert t["legendFormat"].startswith(m.group(1) + " "), t["legendFormat"]
    text = " ".join(p["description"].split())
    for br in slo.BURN_RATES:
        assert {br.long, br.short} <= set(windows), (br, sorted(windows))
        assert br.factor in line_values(p), br
        assert f"{br.factor:g}x over both {br.long} and {br.short}" in text, br


@pytest.mark.parametrize("module", [fleet, overview, gpu_roofline, host], ids=lambda m: m.__name__)
def test_a_dashboard_is_its_row_functions_in_order(module):
    """Each dashboard module lists its rows once (ROWS); the JSON has exactly those row headers in that
    order, each followed by that row's panels, so a panel added to a row function lands in that row."""
    rows = [build_row() for build_row in module.ROWS]
    assert all(isinstance(r, lib.Row) and r.panels for r in rows), module.__name__
    assert all(r.title for r in rows[1:]), "only the first row may be a header without a title"
    panels = module.build()["panels"]
    expected = []
    for r in rows:
        if r.title is not None:
            expected.append(("row", r.title))
        expected.extend((p.body["type"], p.title) for p in r.panels)
    assert [(p["type"], p["title"]) for p in panels] == expected


def test_panel_titles_are_unique_within_a_dashboard():
    for name, builder in generate.DASHBOARDS.items():
        titles = [p["title"] for p in builder()["panels"]]
        assert len(titles) == len(set(titles)), (name, sorted(t for t in titles if titles.count(t) > 1))


def test_dashboards_draw_the_thresholds_the_alerts_fire_on():
    """exporter/slo.py is read by the alert rules and the panels alike: the TTFT p99 stat turns red at the
    TTFT SLO threshold, the KV usage stat at the KV alert's ratio."""
    def steps(title: str) -> list:
        p = next(p for _, p in all_panels() if p["title"] == title)
        return [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert slo.TTFT.threshold_seconds in steps(f"TTFT p99 ({slo.RATE_WINDOW})")
    assert slo.SATURATION.kv_cache_usage_ratio in steps("KV cache usage (max)")


# ------------------------------------------------------------------------------------------------
# The fleet view (issue 29): fleet tiles, the fleet board, heatmaps per engine, "No traffic", units
# ------------------------------------------------------------------------------------------------
FLEET_BOARD = DASHBOARDS[fleet.FILENAME]
OVERVIEW = DASHBOARDS[overview.FILENAME]


def board_panel(d: dict, title: str) -> dict:
    found = [p for p in panels(d) if p["title"] == title]
    assert len(found) == 1, (title, [p["title"] for p in panels(d)])
    return found[0]


@pytest.mark.parametrize("title", ["TTFT p99 (5m)", "TBT p99 (5m)"])
def test_overview_latency_tiles_are_the_fleet_p99_not_the_worst_replica(title):
    """The tiles read the per-model rules (the quantile of all replicas' requests together) and reduce
    over models only: never the max over per-replica quantiles (target_model:...:p99)."""
    p = board_panel(OVERVIEW, title)
    (t,) = p["targets"]
    names = metric_names(t["expr"])
    assert any(n.startswith("model:") and n.endswith(":p99_5m") for n in names), names
    assert not any(n.startswith("target_model:") for n in names), names
    assert re.match(r"max by \(model\) \(", t["expr"]), t["expr"]
    assert p["fieldConfig"]["defaults"]["noValue"] == "No traffic"
    assert generate.recording_rules() >= {n for n in names if ":" in n}


def heatmap_panels() -> list[tuple[str, dict]]:
    return [(d["title"], p) for d in DASHBOARDS.values() for p in panels(d) if p["type"] == "heatmap"]


def test_no_heatmap_sums_buckets_across_engines():
    """Engines' bucket bounds differ: every heatmap repeats per $engine and each of its bucket selectors is
    scoped to that one engine, so `sum by (le)` only ever adds buckets of one layout."""
    found = heatmap_panels()
    assert {p["title"] for _, p in found} >= {
        "TTFT distribution ($engine)", "Time-between-tokens distribution ($engine)",
        "End-to-end latency distribution ($engine)", "Prompt length distribution ($engine)",
        "Output length distribution ($engine)"}
    for dash, p in found:
        assert p.get("repeat") == "engine", (dash, p["title"])
        for t in p["targets"]:
            assert t["format"] == "heatmap"
            buckets = [(n, m) for n, m in named_selectors(t["expr"]) if n.endswith("_bucket")]
            assert buckets, (dash, p["title"])
            for name, matchers in buckets:
                assert 'engine=~"$engine"' in matchers, (dash, p["title"], name)


def test_the_heatmap_check_would_catch_a_mixed_layout():
    mixed = overview.TM.rate("llm_time_to_first_token_seconds_bucket")
    assert not any('engine=~"$engine"' in m for _, m in named_selectors(f"sum by (le) ({mixed})"))


RATIO_OR_MEAN_RULE = re.compile(r":(slo_good_ratio_rate|good_ratio_rate|ratio_rate|mean|gap_mean)\w*$")


def test_slo_ratio_and_mean_tiles_say_no_traffic():
    """A ratio or mean over no requests has no value (the rules return nothing rather than NaN): every panel
    reading such a rule says "No traffic" then, instead of "No data" or NaN."""
    readers = [(dash, p) for dash, p in all_panels() if any(
        RATIO_OR_MEAN_RULE.search(n) for t in p.get("targets", []) for n in metric_names(t["expr"]))]
    assert len(readers) >= 8
    for dash, p in readers:
        assert p["fieldConfig"]["defaults"].get("noValue") == "No traffic", (dash, p["title"])
    for title in ("TTFT SLO attainment (5m)", "TBT SLO attainment (5m)", "TTFT p99 (5m)", "TBT p99 (5m)"):
        defaults = board_panel(OVERVIEW, title)["fieldConfig"]["defaults"]
        assert defaults["noValue"] == "No traffic", title
        assert {"type": "special", "options": {"match": "nan", "result": {"text": "No traffic"}}} in \
            defaults["mappings"], title


def test_units_rates_scale_and_preemptions_are_a_rate():
    preempt = board_panel(OVERVIEW, "Preemptions per second (5m)")
    assert preempt["fieldConfig"]["defaults"]["unit"] == "si:/s"
    units = [p["fieldConfig"]["defaults"]["unit"] for d in DASHBOARDS.values() for p in panels(d)
             if p["type"] != "row" and "fieldConfig" in p]
    assert not any("suffix: tok/s" in u or u == "suffix:tok/s" for u in units)
    assert board_panel(OVERVIEW, "Decode tokens/s")["fieldConfig"]["defaults"]["unit"] == "si:tok/s"


def test_overview_has_the_new_panels():
    titles = {p["title"] for p in panels(OVERVIEW)}
    assert {"Error and abort ratio per target (5m)", "Error and abort ratio per model, fleet (5m)",
            "Speculative decoding: acceptance ratio and length",
            "Speculative decoding: draft and accepted tokens/s (5m)", "Tokens per engine step (5m)",
            "Mean prompt and output length (5m)"} <= titles
    spec = board_panel(OVERVIEW, "Speculative decoding: acceptance ratio and length")
    reads = set().union(*(metric_names(t["expr"]) for t in spec["targets"]))
    assert {"llm_spec_decode_acceptance_ratio", "llm_spec_decode_acceptance_length"} <= reads
    per_step = board_panel(OVERVIEW, "Tokens per engine step (5m)")
    reads = set().union(*(metric_names(t["expr"]) for t in per_step["targets"]))
    assert {"llm_iteration_tokens_sum", "llm_decode_steps_per_second"} <= reads


def test_overview_links_to_the_fleet_board_and_back():
    def linked(d: dict) -> set[str]:
        return {link["url"] for link in d["links"] if link["type"] == "link"}
    assert f"/d/{FLEET_BOARD['uid']}" in linked(OVERVIEW)
    assert f"/d/{OVERVIEW['uid']}" in linked(FLEET_BOARD)
    for d in (OVERVIEW, FLEET_BOARD):
        for link in d["links"]:
            assert link["includeVars"] and link["keepTime"], link


def test_fleet_board_rows():
    rows = [p["title"] for p in FLEET_BOARD["panels"] if p["type"] == "row"]
    assert rows == ["Per model", "Instances", "Outliers", "Verdict mix", "Workload shape", "Capacity", "Routing"]
    summary = board_panel(FLEET_BOARD, "Models: fleet latency, traffic and errors (5m)")
    reads = set().union(*(metric_names(t["expr"]) for t in summary["targets"]))
    assert {"model:llm_time_to_first_token_seconds:p99_5m", "model:llm_inter_token_latency_seconds:p99_5m",
            "model:llm_requests_finished:rate5m", "model:llm_requests_error:ratio_rate5m",
            "model:llm_requests_abort:ratio_rate5m", "model:llm_generation_tokens:rate5m",
            "model:llm_replicas_up:count"} <= reads
    capacity = set().union(*(metric_names(t["expr"]) for p in panels(FLEET_BOARD) if p["title"] in (
        "Replicas up per model", "GPUs up per cluster", "KV cache capacity per model") for t in p["targets"]))
    assert capacity == {"model:llm_replicas_up:count", "cluster:llm_gpus_up:count",
                        "model:llm_kv_cache_capacity_tokens:sum"}
    mix = board_panel(FLEET_BOARD, "Replicas by bottleneck verdict")
    assert [t["expr"] for t in mix["targets"]] == [f"count by (resource) ({fleet.T.sel('llm_bottleneck')} == 1)"]
    outliers = [p for p in panels(FLEET_BOARD) if p["title"].startswith(("Slowest", "Fullest", "Lowest"))]
    assert sorted(t["expr"].split("(", 1)[0] for p in outliers for t in p["targets"]) == [
        "bottomk", "topk", "topk", "topk"]


def merged_labels(expr: str) -> set[str] | None:
    """The `by` labels of expr's outermost aggregation (None when it has none)."""
    m = re.match(r"\s*(?:max|sum|min|group|count)\s+by\s*\(([^)]*)\)", expr)
    return {x.strip() for x in m.group(1).split(",")} if m else None


def test_fleet_instance_table_is_one_row_per_replica_with_links():
    """Every query of the instance table returns one series per (cluster, namespace, instance, target, model),
    so Grafana's merge joins them into one row per replica; instant table queries; the verdict from
    llm_bottleneck == 1 shown by name; each cell links to the replica's own boards with its instance,
    target and model."""
    p = board_panel(FLEET_BOARD, "Instances: one row per replica")
    assert p["type"] == "table"
    assert [tr["id"] for tr in p["transformations"]] == ["merge", "organize"]
    replica = set(fleet.REPLICA)
    for t in p["targets"]:
        assert t["instant"] and t["format"] == "table"
        assert merged_labels(t["expr"]) == replica, t["expr"]
    assert "llm_bottleneck" in metric_names(p["targets"][0]["expr"])
    assert "== 1" in p["targets"][0]["expr"]
    renamed = p["transformations"][1]["options"]["renameByName"]
    assert set(renamed.values()) == {"verdict", "TTFT p99", "TBT p99", "KV usage", "waiting", "tok/s",
                                     "error ratio"}
    verdict = next(o for o in p["fieldConfig"]["overrides"] if o["matcher"]["options"] == "verdict")
    mapping = next(x["value"] for x in verdict["properties"] if x["id"] == "mappings")[0]["options"]
    assert {v["text"] for v in mapping.values()} == set(overview.RESOURCES)
    links = p["fieldConfig"]["defaults"]["links"]
    targets = {lib.uid_for(m.FILENAME) for m in (overview, gpu_roofline, host)}
    assert {re.match(r"/d/(\w+)\?", link["url"]).group(1) for link in links} == targets
    for link in links:
        for var in ("instance", "target", "model"):
            assert f"var-{var}=${{__data.fields.{var}}}" in link["url"], link
        assert "${__url_time_range}" in link["url"] and "${cluster:queryparam}" in link["url"]
    for o in (q for q in panels(FLEET_BOARD) if q["title"].startswith(("Slowest", "Fullest", "Lowest"))):
        assert o["fieldConfig"]["defaults"]["links"] == links, o["title"]


def test_fleet_summary_table_rows_are_one_per_model():
    p = board_panel(FLEET_BOARD, "Models: fleet latency, traffic and errors (5m)")
    for t in p["targets"]:
        assert merged_labels(t["expr"]) == {"cluster", "namespace", "model"}, t["expr"]
        assert all(n.startswith("model:") for n in metric_names(t["expr"]) if ":" in n), t["expr"]


def test_scenarios_name_real_panels():
    """`llm-exporter demo --scenario X` tells the user which panels (or rows) show its signature: they exist."""
    from exporter.simulator.scenarios import SCENARIOS

    titles = {p["title"] for d in DASHBOARDS.values() for p in panels(d)}
    for name, scenario in SCENARIOS.items():
        if scenario.expect is not None:
            assert set(scenario.expect.panels) <= titles, (name, set(scenario.expect.panels) - titles)


def test_availability_burn_panel_shows_every_alert_pair():
    """The availability SLO (exporter/slo.py AVAILABILITY, which its alert reads) per model over the fleet:
    every burn pair's two windows read the fleet rule, and every factor is a line; on both boards."""
    rules = generate.recording_rules()
    for d in (OVERVIEW, FLEET_BOARD):
        p = board_panel(d, "Availability error budget burn rate per model")
        windows = set()
        for t in p["targets"]:
            (name,) = metric_names(t["expr"])
            assert name in rules, name
            m = re.fullmatch(r"model:llm_requests_availability:good_ratio_rate(\w+)", name)
            assert m and t["legendFormat"].startswith(m.group(1) + " "), name
            windows.add(m.group(1))
        for br in slo.BURN_RATES:
            assert {br.long, br.short} <= windows, br
            assert br.factor in line_values(p), br
        assert slo.AVAILABILITY.alert in p["description"]
    # The error-ratio cells turn orange above the budget and red at the fastest page's burn.
    budget = 1 - slo.AVAILABILITY.objective
    assert [s["value"] for s in overview.error_steps()["steps"]][1:] == pytest.approx(
        [budget, budget * max(br.factor for br in slo.BURN_RATES)])
