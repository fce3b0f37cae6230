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

from dashboards import generate
from dashboards.promql import PromqlSyntaxError, metric_names
from tests.conftest import ROOT

DASHBOARDS = {name: json.loads(text) for name, text in generate.build_all().items()}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s", "__from", "__to",
                     "__all", "__name", "__dashboard", "__user", "__org"}


def panels(dash: dict) -> list[dict]:
    return list(generate.iter_panels(dash))


# ------------------------------------------------------------------------------------------------
# --check
# ------------------------------------------------------------------------------------------------
def test_check_passes_on_the_committed_json():
    result = subprocess.run([sys.executable, "dashboards/generate.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "3 dashboards up to date" in result.stdout


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
    for name in defined:
        assert re.search(r"\$\{?" + name + r"\b", panel_text), f"variable {name} defined but unused"
    # Variables only refer to variables defined before them (Grafana resolves them in order).
    for i, var in enumerate(d["templating"]["list"]):
        refs = set(re.findall(r"\$\{?(\w+)", json.dumps(var.get("query", "")))) - BUILTIN_VARIABLES
        assert refs <= set(defined[:i]) | {"datasource"}, (var["name"], refs)


def test_dashboards_have_the_variables_the_issue_asks_for(dash):
    name, d = dash
    defined = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "job", "target", "model"} <= defined
    if "gpu" in name:
        assert "gpu" in defined


def test_every_query_selects_by_job():
    """Every metric selector is scoped: the selector dict, not ad-hoc matchers, decides what is read."""
    for d in DASHBOARDS.values():
        for panel, t in generate.iter_exprs(d):
            for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", t["expr"]):
                assert 'job=~"$job"' in m.group(2), (panel["title"], m.group(0))


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
