"""The alerting rules in alerts/: generated files current, promtool and amtool happy, every metric a
rule reads exported by the catalogue, every alert annotated, tested and documented in docs/runbooks.md.

promtool (Debian `prometheus`) and amtool (Debian `prometheus-alertmanager`) are required: `make test`
installs them. A missing tool fails these tests; it never skips them.
"""

from __future__ import annotations

import concurrent.futures
import functools
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from alerts import generate, hardware, lib
from exporter import catalog, slo
from exporter.config import Config

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
RULE_FILES = sorted((ALERTS / "rules").glob("*.yaml"))
TEST_FILES = sorted((ALERTS / "tests").glob("*.yaml"))
PROMETHEUSRULE = ROOT / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
INSTALL_HINT = {
    "promtool": "the Debian package `prometheus` (`make test` installs it: `make debs`)",
    "amtool": "the Debian package `prometheus-alertmanager` (`make test` installs it: `make debs`)",
}




def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH; install {INSTALL_HINT[name]}. These tests never skip.")
    return path


def run(*args: str | pathlib.Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def rules() -> list[dict]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def alert_rules() -> list[dict]:
    return [r for r in rules() if "alert" in r]


def recording_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


# ----------------------------------------------------------------------------------------------
# Generated files and the Prometheus / Alertmanager tools
# ----------------------------------------------------------------------------------------------
def test_generated_files_are_current():
    result = run(sys.executable, ALERTS / "generate.py", "--check")
    assert result.returncode == 0, result.stderr


def test_rule_files_are_one_per_area():
    assert [p.stem for p in RULE_FILES] == sorted(generate.AREAS)


def test_each_area_module_builds_only_its_own_groups():
    for area, groups in generate.build().items():
        names = [g["name"] for g in groups]
        if area == "recording":
            assert names and all(n.endswith(".rules") for n in names), names
        else:
            assert names == [f"llm-exporter.{area}.alerts"], names


def test_time_scale_renders_scaled_windows_into_out(tmp_path):
    result = run(sys.executable, ALERTS / "generate.py", "--time-scale", "0.01", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    recording = (tmp_path / "rules" / "recording.yaml").read_text()
    assert "target_model:llm_prompt_tokens:rate3s" in recording and "rate5m" not in recording
    assert sorted(p.stem for p in (tmp_path / "rules").glob("*.yaml")) == sorted(generate.AREAS)
    assert (tmp_path / "alertmanager.yml").exists()


def test_slo_thresholds_are_declared_once_for_exporter_alerts_and_dashboards():
    """exporter/slo.py is the one declaration: the exporter's defaults and the alerts CONFIG agree
    with it, and it is a leaf module any layer may import."""
    slos = generate.CONFIG["slos"]
    assert Config().slo_ttft_s == slo.TTFT.threshold_seconds == slos["ttft"]["threshold_seconds"]
    assert Config().slo_tbt_s == slo.TBT.threshold_seconds == slos["tbt"]["threshold_seconds"]
    assert [br["factor"] for br in generate.CONFIG["burn_rates"]] == [br.factor for br in slo.BURN_RATES]
    imports = re.findall(r"^(?:from|import) (\S+)", (ROOT / "exporter" / "slo.py").read_text(), re.M)
    assert not [m for m in imports if m.startswith("exporter")], imports


def test_promtool_check_rules(tmp_path):
    promtool = tool("promtool")
    spec = tmp_path / "prometheusrule-spec.yaml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(PROMETHEUSRULE.read_text())["spec"]))
    result = run(promtool, "check", "rules", *RULE_FILES, spec)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests():
    """`promtool test rules alerts/tests/*.yaml`, one process per file, in parallel."""
    promtool = tool("promtool")
    assert TEST_FILES, "no alerts/tests/*.yaml"
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(TEST_FILES)) as pool:
        results = list(pool.map(lambda f: (f, run(promtool, "test", "rules", f, timeout=120)), TEST_FILES))
    failed = [f"{f.name}:\n{r.stdout}{r.stderr}" for f, r in results if r.returncode != 0]
    assert not failed, "\n".join(failed)


# Unit tests of rules rendered with a non-default CONFIG: (test file, CONFIG overrides). The test
# file is copied next to the rendered rule files, which it names without a directory.
VARIANTS = {
    "daemonset": (ALERTS / "tests" / "variants" / "daemonset-test.yaml",
                  {"gpu_join_labels": ("job", "kubernetes_node")}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_promtool_unit_tests_of_config_variants(variant, tmp_path):
    promtool = tool("promtool")
    test_file, overrides = VARIANTS[variant]
    for area, groups in generate.build({**generate.CONFIG, **overrides}).items():
        (tmp_path / f"{area}.yaml").write_text(generate.HEADER + generate.dump({"groups": groups}))
    shutil.copy(test_file, tmp_path / test_file.name)
    result = run(promtool, "test", "rules", tmp_path / test_file.name, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_monitor_labels_the_node_for_the_daemonset_join():
    """docs/alerts.md: the DaemonSet layout joins GPU and engine series on ("job", "kubernetes_node"), so
    every PodMonitor and ServiceMonitor (node exporters and sidecars alike) must set `node`."""
    relabel = {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
               "targetLabel": "kubernetes_node"}
    monitors = []
    for path in sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("PodMonitor", "ServiceMonitor"):
                monitors.append(path.relative_to(ROOT))
                for endpoint in doc["spec"].get("podMetricsEndpoints") or doc["spec"]["endpoints"]:
                    assert relabel in endpoint.get("relabelings", []), f"{path}: no `node` relabeling"
    assert len(monitors) >= 3, monitors


def test_amtool_check_config():
    amtool = tool("amtool")
    result = run(amtool, "check-config", ALERTMANAGER)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheusrule_holds_the_same_groups_as_the_rule_files():
    pr = yaml.safe_load(PROMETHEUSRULE.read_text())
    assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["kind"] == "PrometheusRule"
    groups = [g for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]]
    assert sorted(pr["spec"]["groups"], key=lambda g: g["name"]) == sorted(groups, key=lambda g: g["name"])


# ----------------------------------------------------------------------------------------------
# Metric names against the catalogue
# ----------------------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)(?![\w:])
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[{}(),=<>+\-*/%^])
  | (?P<space>\s+)
    """,
    re.VERBOSE,
)
KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2", "by", "without", "on",
            "ignoring", "group_left", "group_right"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
               "bottomk", "topk", "quantile"}
# Series that Prometheus itself writes for every target.
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"job", "instance"}


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot tokenize {expr[pos:pos + 20]!r} in {expr!r}")
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names in its matchers) for every vector selector in `expr`.

    Skips strings (label values), range and duration literals, function and aggregator names,
    keywords, and the label lists of by/without/on/ignoring/group_*."""
    toks = tokens(expr)
    found: list[tuple[str, set[str]]] = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and text in LABEL_LIST_KEYWORDS and nxt == "(":
            i = toks.index(("op", ")"), i) + 1  # skip the label list
            continue
        if (kind == "ident" and text not in KEYWORDS and nxt != "("
                and not (text in AGGREGATORS and nxt in LABEL_LIST_KEYWORDS)):
            labels: set[str] = set()
            if nxt == "{":
                j = i + 2
                while toks[j][1] != "}":
                    if toks[j][0] == "ident":
                        labels.add(toks[j][1])
                    j += 1
                i = j
            found.append((text, labels))
        elif kind == "op" and text == "{":  # a selector without a name: {__name__=...}
            raise AssertionError(f"nameless selector in {expr!r}")
        i += 1
    return found


def test_tokenizer_skips_label_values_functions_keywords_and_label_lists():
    expr = ('sum without (rank, le) (rate(llm_ttft_bucket{job="llm-exporter",le=~"1|1\\\\.0"}[5m])) > 0\n'
            'and on (job, instance) group by (job, instance) (up{job="x"} offset 1h) '
            'unless ignoring (state) absent(llm_exporter_build_info) / 1e3 > bool 2')
    assert selectors(expr) == [("llm_ttft_bucket", {"job", "le"}), ("up", {"job"}),
                               ("llm_exporter_build_info", set())]


def test_every_metric_in_a_rule_is_in_the_catalogue_and_docs_or_a_recording_rule():
    recorded = recording_names()
    metrics_md = (ROOT / "docs" / "metrics.md").read_text()
    problems = []
    for rule in rules():
        name = rule.get("alert") or rule.get("record")
        for metric, labels in selectors(rule["expr"]):
            if metric in recorded or metric in PROMETHEUS_SERIES:
                continue
            family = catalog.family_of(metric)
            if family is None:
                problems.append(f"{name}: {metric} is neither in exporter.catalog "
                                "nor a recording rule in alerts/")
                continue
            if f"`{family.name}`" not in metrics_md:
                problems.append(f"{name}: {family.name} is not documented in docs/metrics.md "
                                "(run `make docs`)")
            allowed = set(family.labels) | TARGET_LABELS | ({"le"} if metric.endswith("_bucket") else set())
            if labels - allowed:
                problems.append(f"{name}: {metric} has no label(s) {sorted(labels - allowed)} "
                                f"(catalogue: {family.labels})")
    assert not problems, "\n".join(problems)


def test_recording_rule_names_follow_level_metric_operations():
    for name in recording_names():
        level, metric, ops = name.split(":")
        assert level == "target_model" and metric.startswith("llm_") and ops, name
        base = metric.removesuffix("_bucket").removesuffix("_count")
        assert base in catalog.FAMILIES or base + "_total" in catalog.FAMILIES, name


# ----------------------------------------------------------------------------------------------
# Alerts: labels, annotations, runbooks, tests
# ----------------------------------------------------------------------------------------------
def _anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_severity_annotations_and_a_runbook_section():
    anchors = {_anchor(h) for h in re.findall(r"^#{1,4} (.+)$", RUNBOOKS.read_text(), re.M)}
    problems = []
    for rule in alert_rules():
        name = rule["alert"]
        if not re.fullmatch(r"LLM[A-Z][A-Za-z0-9]+", name):
            problems.append(f"{name}: not CamelCase with the LLM prefix")
        if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            problems.append(f"{name}: severity must be critical, warning or info")
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key):
                problems.append(f"{name}: no {key}")
        url = ann.get("runbook_url", "")
        expected = generate.CONFIG["runbook_url"].format(anchor=name.lower())
        if url != expected:
            problems.append(f"{name}: runbook_url {url} != {expected}")
        if name.lower() not in anchors:
            problems.append(f"{name}: docs/runbooks.md has no section `## {name}`")
    assert not problems, "\n".join(problems)


def test_every_alert_is_in_docs_and_no_runbook_is_orphaned():
    names = {r["alert"] for r in alert_rules()}
    sections = set(re.findall(r"^## (LLM\w+)\s*$", RUNBOOKS.read_text(), re.M))
    assert sections == names
    alerts_md = (ROOT / "docs" / "alerts.md").read_text()
    missing = sorted(n for n in names if n not in alerts_md)
    assert not missing, f"docs/alerts.md does not list {missing}"


@functools.cache
def _test_cases() -> list[tuple[pathlib.Path, dict]]:
    return [(path, case) for path in TEST_FILES for case in yaml.safe_load(path.read_text())["tests"]]


def test_unit_test_files_have_a_header_and_named_cases():
    for path in [*TEST_FILES, *(f for f, _ in VARIANTS.values())]:
        assert path.read_text().startswith("# "), f"{path.name}: no header comment explaining its scenarios"
    for path, case in _test_cases():
        assert case.get("name"), f"{path.name}: a test case without `name:`"


def test_every_alert_has_a_firing_and_a_quiet_case():
    firing, quiet = set(), set()
    for _, case in _test_cases():
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert not names - firing, f"no firing case for {sorted(names - firing)}"
    assert not names - quiet, f"no non-firing case for {sorted(names - quiet)}"


def test_xid_lists_are_disjoint_and_the_generator_refuses_overlap():
    cfg = generate.CONFIG
    assert not set(cfg["xid_critical"]) & set(cfg["xid_warning"])
    with pytest.raises(ValueError, match="both"):
        hardware.groups({**cfg, "xid_warning": (*cfg["xid_warning"], cfg["xid_critical"][0])})


@pytest.mark.parametrize(("seconds", "matcher"), [
    (2.5, 'le="2.5"'),
    (0.1, 'le="0.1"'),
    (1.0, 'le=~"1|1\\\\.0"'),
])
def test_le_matcher_matches_every_spelling_of_the_bound(seconds, matcher):
    assert lib.le_matcher(seconds) == matcher


def test_slo_thresholds_are_vllm_v1_bucket_bounds():
    vllm_v1 = {
        "llm_time_to_first_token_seconds": {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                            1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0},
        "llm_inter_token_latency_seconds": {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                            1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0},
    }
    for spec in generate.CONFIG["slos"].values():
        assert spec["threshold_seconds"] in vllm_v1[spec["metric"]], spec


def test_alertmanager_routes_by_severity_and_inhibits_known_alerts():
    am = yaml.safe_load(ALERTMANAGER.read_text())
    routes = {tuple(r["matchers"]): r["receiver"] for r in am["route"]["routes"]}
    assert routes == {('severity="critical"',): "pager", ('severity="warning"',): "ticket",
                      ('severity="info"',): "null"}
    assert am["route"]["group_by"] == ["alertname", "target", "model"]
    names = {r["alert"] for r in alert_rules()}
    for rule in am["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            m = re.fullmatch(r'alertname(=~?)"(.+)"', matcher)
            assert m, matcher
            listed = set(m.group(2).split("|")) if m.group(1) == "=~" else {m.group(2)}
            assert listed <= names, f"inhibit rule names unknown alerts {sorted(listed - names)}"
    sources = {rule["source_matchers"][0] for rule in am["inhibit_rules"]}
    assert {'alertname="LLMEngineDown"', 'alertname="LLMGPULost"', 'alertname="LLMGPUXidCritical"'} <= sources
