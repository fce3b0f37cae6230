"""`llm-exporter mixin --out DIR [--config FILE]` (exporter/mixin): the default config writes the shipped
rules, Alertmanager config and dashboards byte for byte; a renamed cluster label reaches every rule,
panel, variable, inhibition and grouping; a bad config file is refused with exit 2 and a hint.

promtool is required (`make debs`), as in tests/test_alerts.py: a missing tool fails, never skips.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest
import yaml

from exporter.cli import run
from exporter.mixin import config as mixin_config
from exporter.mixin.dashboards import generate as boards
from exporter.mixin.dashboards.promql import label_names
from tests.conftest import ROOT

# Where each output of `mixin --out DIR` is shipped in the checkout.
SHIPPED = {
    "alertmanager.yml": ROOT / "deploy" / "alertmanager" / "alertmanager.yml",
    "prometheusrule.yaml": ROOT / "deploy" / "kubernetes" / "cluster" / "prometheusrule.yaml",
    **{f"rules/{p.name}": p for p in (ROOT / "alerts" / "rules").glob("*.yaml")},
    **{f"dashboards/{p.name}": p for p in (ROOT / "dashboards").glob("*.json")},
}


def mixin(capsys, out: pathlib.Path, *config: str, tmp: pathlib.Path | None = None) -> tuple[int, str]:
    argv = ["mixin", "--out", str(out)]
    if config:
        assert tmp is not None
        path = tmp / "mixin.yaml"
        path.write_text("\n".join(config) + "\n")
        argv += ["--config", str(path)]
    code = run(argv, {})
    return code, capsys.readouterr().err


def written(out: pathlib.Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found on PATH; install the Debian package `prometheus` (`make debs`)")
    return path


def test_the_default_config_writes_the_shipped_files_byte_for_byte(tmp_path, capsys):
    code, err = mixin(capsys, tmp_path)
    assert code == 0, err
    files = written(tmp_path)
    assert sorted(files) == sorted(SHIPPED), "mixin --out writes a file the checkout does not ship, or misses one"
    differ = [name for name, text in files.items() if SHIPPED[name].read_text() != text]
    assert not differ, f"differ from the shipped copies: {differ}"


def test_promtool_unit_tests_pass_on_the_default_output(tmp_path, capsys):
    """alerts/tests/*.yaml name ../rules/<area>.yaml: copied beside the output's rules/, they test it."""
    assert mixin(capsys, tmp_path / "out")[0] == 0
    tests = tmp_path / "out" / "tests"
    tests.mkdir()
    cases = sorted((ROOT / "alerts" / "tests").glob("fleet*.yaml")) + sorted(
        (ROOT / "alerts" / "tests").glob("slo*.yaml"))
    assert cases
    for case in cases:
        shutil.copy(case, tests / case.name)
    result = subprocess.run([promtool(), "test", "rules", *sorted(tests.glob("*.yaml"))], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def _rules(out: pathlib.Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(file, rule, expression) of every rule of the output, and every annotation."""
    exprs, annotations = [], []
    for path in sorted((out / "rules").glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                exprs.append((path.name, rule.get("alert") or rule["record"], rule["expr"]))
                annotations += rule.get("annotations", {}).values()
    return exprs, annotations


def test_a_renamed_cluster_label_reaches_every_rule_panel_and_variable(tmp_path, capsys):
    code, err = mixin(capsys, tmp_path / "out", "cluster_label: k8s_cluster", tmp=tmp_path)
    assert code == 0, err
    out = tmp_path / "out"
    # Rules: no expression matches or groups by `cluster`; the fleet rules keep k8s_cluster instead, and the
    # annotations name the cluster from it.
    exprs, templates = _rules(out)
    stale = [(f, n) for f, n, expr in exprs if "cluster" in label_names(expr)]
    assert not stale, f"rules still use the cluster label: {stale}"
    fleet_rules = [n for f, n, expr in exprs if f == "fleet.yaml" and "k8s_cluster" in label_names(expr)]
    assert "model:llm_replicas_up:count" in fleet_rules and "LLMAvailabilityErrorBudgetBurn" in [
        n for f, n, expr in exprs if "k8s_cluster" in label_names(expr)]
    assert not [t for t in templates if "$labels.cluster " in t]
    assert any("$labels.k8s_cluster" in t for t in templates)
    # Alertmanager groups and inhibits by it.
    am = yaml.safe_load((out / "alertmanager.yml").read_text())
    assert am["route"]["group_by"] == ["alertname", "k8s_cluster", "namespace", "target", "model"]
    burn = [r for r in am["inhibit_rules"] if any("long=" in m for m in r["source_matchers"])]
    assert burn and all("k8s_cluster" in r["equal"] and "cluster" not in r["equal"] for r in burn)
    # Dashboards: every panel query, every variable query and every legend.
    panels = 0
    for path in sorted((out / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        for panel, target in boards.iter_exprs(dash):
            panels += 1
            labels = label_names(target["expr"])
            assert "cluster" not in labels, (path.name, panel["title"], target["expr"])
            assert "k8s_cluster" in labels or "cluster:" in target["expr"] or not labels, (path.name, panel["title"])
            assert "{{cluster}}" not in target.get("legendFormat", ""), (path.name, panel["title"])
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        # The variable keeps its name ($cluster in links and bookmarks) and reads the configured label.
        assert variables["cluster"]["query"] == "label_values(llm_exporter_build_info, k8s_cluster)"
        for var in variables.values():
            if var.get("type") == "query":
                assert 'cluster=~"$cluster"' not in var["query"].replace("k8s_cluster", ""), var["query"]
    assert panels > 100
    # The rules are valid Prometheus rules.
    result = subprocess.run([promtool(), "check", "rules", *sorted((out / "rules").glob("*.yaml"))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_boards_use_the_cluster_label_where_the_renamed_ones_do_not():
    """The check above could pass on a board that never scoped by cluster at all: the default boards do."""
    dash = json.loads(boards.build_all()["llm-serving-fleet.json"])
    assert sum("cluster" in label_names(t["expr"]) for _, t in boards.iter_exprs(dash)) > 10


def _steps(dash: dict, title_start: str) -> list[float]:
    panel = next(p for p in boards.iter_panels(dash) if p["title"].startswith(title_start))
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def test_overrides_reach_thresholds_selector_and_disabled_alerts(tmp_path, capsys):
    code, err = mixin(capsys, tmp_path / "out", "exporter_selector: 'job=\"llm\"'", "ttft_p99_seconds: 7",
                      "disabled_alerts: [LLMFleetGPUsLost]", "alertmanager: {pager_url: 'https://pager.example/x'}",
                      "slos: {ttft: {threshold_seconds: 5}}", "kv_cache_usage_ratio: 0.9", tmp=tmp_path)
    assert code == 0, err
    out = tmp_path / "out"
    # The rules and the boards of one config agree: the TTFT SLO's bucket and the board's red line move
    # together, as do the KV cache alert and its gauge's red line.
    assert 'le=~"5|5\\\\.0"' in (out / "rules" / "recording.yaml").read_text()
    overview = json.loads((out / "dashboards" / "llm-serving-overview.json").read_text())
    assert _steps(overview, "TTFT p99") == [4.0, 5]
    default = json.loads(boards.build_all()["llm-serving-overview.json"])
    assert _steps(default, "TTFT p99") == [2.0, 2.5]
    assert "0.9" in (out / "rules" / "saturation.yaml").read_text()
    assert _steps(overview, "KV cache usage")[-1] == 0.9 != _steps(default, "KV cache usage")[-1]
    text = "".join((out / "rules" / name).read_text() for name in ("latency.yaml", "fleet.yaml"))
    assert 'job="llm"' in text and 'job="llm-exporter"' not in text
    assert "> 7\n" in (out / "rules" / "latency.yaml").read_text()
    assert "LLMFleetGPUsLost" not in text and "LLMFleetReplicasLost" in text
    am = yaml.safe_load((out / "alertmanager.yml").read_text())
    assert am["receivers"][0]["webhook_configs"][0]["url"] == "https://pager.example/x"
    assert am["route"]["group_wait"] == mixin_config.CONFIG["alertmanager"]["group_wait"]  # the rest kept


@pytest.mark.parametrize(("lines", "message"), [
    (["clustr_label: x"], "clustr_label: unknown key; did you mean cluster_label"),
    (["alertmanager: {pager_ulr: x}"], "alertmanager.pager_ulr: unknown key; did you mean pager_url"),
    (["cluster_label: k8s-cluster"], "cluster_label: 'k8s-cluster' is not a label name"),
    (["tail_for: soon"], "tail_for: expected a Prometheus duration"),
    (["ttft_p99_seconds: fast"], "ttft_p99_seconds: expected a number"),
    (["ttft_p99_seconds: .nan"], "ttft_p99_seconds: expected a finite number"),
    (["burn_rates: [{severity: critical}]"], "burn_rates[0]: expected a mapping of severity, long, short"),
    (["zzzzzzzzzz: 1"], "zzzzzzzzzz: unknown key; exporter/mixin/config.py lists the keys"),
    (["disabled_alerts: LLMEngineDown"], "disabled_alerts: expected a list"),
    (["- cluster_label"], "expected a mapping of keys"),
    (["cluster_label: a", "cluster_label: b"], "duplicate key 'cluster_label'"),
])
def test_a_bad_config_file_exits_2_naming_the_key(tmp_path, capsys, lines, message):
    code, err = mixin(capsys, tmp_path / "out", *lines, tmp=tmp_path)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists(), "nothing is written from a refused config"


def test_a_config_that_removes_a_series_a_panel_reads_is_refused(tmp_path, capsys):
    # The boards draw p99 tiles: without 0.99 among the quantiles no rule records target_model:...:p99_5m,
    # and shipping those boards would show nothing.
    code, err = mixin(capsys, tmp_path / "out", "quantiles: [0.5, 0.95]", tmp=tmp_path)
    assert code == 2 and "neither a catalogue sample name nor a recording rule" in err and "p99_5m" in err, err
    assert not (tmp_path / "out").exists()


def test_a_changed_rate_window_reaches_the_rules_and_the_boards_that_read_them(tmp_path, capsys):
    code, err = mixin(capsys, tmp_path / "out", "rate_window: 10m", tmp=tmp_path)
    assert code == 0, err
    overview = (tmp_path / "out" / "dashboards" / "llm-serving-overview.json").read_text()
    assert ":p99_10m" in overview and ":p99_5m" not in overview
    assert "TTFT p99 (10m)" in overview
    assert "record: target_model:llm_time_to_first_token_seconds:p99_10m" in (
        tmp_path / "out" / "rules" / "recording.yaml").read_text()


def test_label_names_reads_matchers_and_label_lists_only():
    expr = ('sum by (cluster, model) (rate(x:y{job="a", ns!~"by (z)"}[5m]))\n'
            '* on (instance) group_left (kind) max without (le) (z{__name__="q"}) > 1e5')
    assert label_names(expr) == {"cluster", "model", "job", "ns", "instance", "kind", "le"}
    assert label_names("cluster:llm_gpus_up:count") == set()
