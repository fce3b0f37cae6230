"""The alerting rules in alerts/: generated files current, promtool and amtool happy, every metric a
rule reads exported by the catalogue, every alert annotated, tested and documented in docs/runbooks.md.

promtool (Debian `prometheus`) and amtool (Debian `prometheus-alertmanager`) are required: `make test`
installs them. A missing tool fails these tests; it never skips them.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from exporter import catalog, slo
from exporter.config import Config
from exporter.mixin.alerts import generate, hardware, lib
from exporter.mixin.alerts.alertmanager import alert_names_by_area

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
MODULES = ROOT / "exporter" / "mixin" / "alerts"  # the rule builders, one module per area
RULE_FILES = sorted((ALERTS / "rules").glob("*.yaml"))
TEST_FILES = sorted((ALERTS / "tests").glob("*.yaml"))
PROMETHEUSRULE = ROOT / "deploy" / "kubernetes" / "cluster" / "prometheusrule.yaml"
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
        elif area == "scaling":  # recording rules only: what a scaler reads (docs/scaling.md)
            assert names == ["llm-exporter.scaling.rules"], names
        elif area == "fleet":  # its per-model rules, then the alerts on them
            assert names == ["llm-exporter.fleet.rules", "llm-exporter.fleet.alerts"], names
        else:
            assert names == [f"llm-exporter.{area}.alerts"], names


def test_time_scale_scales_every_duration_and_keeps_rule_names_and_descriptions_readable(tmp_path):
    result = run(sys.executable, ALERTS / "generate.py", "--time-scale", "0.02", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.stem for p in (tmp_path / "rules").glob("*.yaml")) == sorted(generate.AREAS)
    scaled = [r for p in sorted((tmp_path / "rules").glob("*.yaml")) for g in yaml.safe_load(p.read_text())["groups"]
              for r in g["rules"]]
    nominal = rules()
    # Recording-rule names keep the nominal window (the dashboards query them by that name); their
    # ranges are scaled: rate5m records over [6s].
    assert [r.get("record") for r in scaled] == [r.get("record") for r in nominal]
    recording = (tmp_path / "rules" / "recording.yaml").read_text()
    assert "target_model:llm_prompt_tokens:rate5m" in recording and "[6s]" in recording and "[5m]" not in recording
    for before, after in zip(nominal, scaled, strict=True):
        for key in ("for", "keep_firing_for"):
            if key in before:  # every `for` scaled, none left literal (LLMGPURowRemapPending kept 15m)
                want = slo.prometheus_duration(slo.duration_seconds(before[key]) * 0.02)
                assert after[key] == want, (before.get("alert"), key, after[key], want)
        ranges = re.findall(r"\[(\w+)(?::\w*)?\]|offset (\w+)", after["expr"])
        for found in (a or b for a, b in ranges):
            assert slo.duration_seconds(found) <= 0.02 * 6 * 86400 + 1, (after.get("alert"), found)
        text = " ".join(after.get("annotations", {}).values())
        assert not re.search(r"\b\d{4,}s\b", text), text  # "over 51840s"
        assert not re.search(r"\b1 (hours|days|minutes)\b", text), text  # "the budget lasts 1 hours"
    fast = next(r for r in scaled if r.get("labels", {}).get("long") == "1m12s")
    description = fast["annotations"]["description"]
    assert "over 1m12s (and over 6s)" in description and "At 14.4x the budget lasts 1 hour." in description
    am = yaml.safe_load((tmp_path / "alertmanager.yml").read_text())
    assert am["route"]["group_interval"] == "6s"
    # The burn inhibitions name the pairs by the scaled `long` label the scaled alerts carry.
    longs = {m for r in am["inhibit_rules"] for m in r["source_matchers"] + r["target_matchers"]
             if m.startswith("long=")}
    assert longs == {'long="1m12s"', 'long="7m12s"', 'long="28m48s"', 'long="1h26m24s"'}, longs


def test_min_window_floors_scaled_windows_and_leaves_every_for_and_timer_scaled():
    """A stack scraped every 2 s renders its windows at least 10 s long (tests/fullstack.py LiveEngine),
    while `for`, keep_firing_for and Alertmanager's timers stay exactly scaled."""
    plain, floored = (generate.scale_durations(generate.CONFIG, 0.02, min_window_s=m) for m in (1.0, 10.0))
    fast = floored["burn_rates"][0]
    assert (fast["long"], fast["short"], fast["for"]) == ("1m12s", "10s", "2s"), fast
    assert (floored["rate_window"], floored["kv_cache_window"], floored["slowdown_window"]) == ("10s", "12s", "10s")
    assert floored["alertmanager"]["group_interval"] == plain["alertmanager"]["group_interval"] == "6s"
    assert floored["kv_cache_for"] == plain["kv_cache_for"] == "6s"
    assert plain["rate_window"] == plain["burn_rates"][0]["short"] == "6s"
    recording = generate.build(floored)["recording"]
    exprs = " ".join(r["expr"] for g in recording for r in g["rules"])
    assert "[10s]" in exprs and "[6s]" not in exprs


def test_area_modules_write_no_duration_literally():
    """Every duration a rule uses comes from CONFIG, so --time-scale reaches it."""
    modules = sorted(MODULES.glob("*.py"))
    assert {p.stem for p in modules} >= set(generate.AREAS), "the area modules moved"
    for path in modules:
        if path.name == "generate.py":
            continue
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        literal = [d for d in re.findall(r"""["'\[](\d+[smhdw])["'\]]""", code) if slo.duration_seconds(d) > 0]
        assert not literal, f"{path.name} writes durations {literal}: declare them in exporter/mixin/config.py"


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
    "cluster-label": (ALERTS / "tests" / "variants" / "cluster-label-test.yaml", {"cluster_label": "k8s_cluster"}),
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
# Labels the scrape adds (job, instance) or the Prometheus does (the fleet labels: external_labels,
# Kubernetes target labels), which a selector may match although no family declares them.
# Labels a scrape adds: Prometheus's own, the cluster's external label, Kubernetes' namespace and pod.
TARGET_LABELS = {"job", "instance", generate.CONFIG["cluster_label"], *generate.CONFIG["fleet_extra_labels"],
                 generate.CONFIG["pod_label"]}


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


# Recording-rule metrics that are no family but say what they count: the fleet's replicas and GPUs
# up, and the finished requests' error, abort and availability (exporter/mixin/alerts/fleet.py); the
# finished requests and the replicas they need at the SLO's max rate (exporter/mixin/alerts/scaling.py).
FLEET_METRICS = {"llm_replicas_up": "llm_engine_up", "llm_gpus_up": "llm_gpu_up", "llm_gpus": "llm_gpu_up",
                 "llm_requests_error": "llm_requests_finished_total",
                 "llm_requests_abort": "llm_requests_finished_total",
                 "llm_requests_availability": "llm_requests_finished_total",
                 "llm_requests": "llm_requests_finished_total",
                 "llm_replicas_needed": "llm_slo_max_request_rate"}


def test_recording_rule_names_follow_level_metric_operations():
    """level:metric:operations, the level saying what the rule keeps: target_model (every label but
    aggregate_away), model (cluster, namespace, model: the fleet), cluster (cluster, namespace), pod
    (cluster, namespace, pod: an engine pod's GPUs)."""
    for name in recording_names():
        level, metric, ops = name.split(":")
        assert level in ("target_model", "model", "cluster", "pod") and metric.startswith("llm_") and ops, name
        base = FLEET_METRICS.get(metric, metric.removesuffix("_bucket").removesuffix("_count"))
        assert base in catalog.FAMILIES or base + "_total" in catalog.FAMILIES, name
    for metric, family in FLEET_METRICS.items():
        assert family in catalog.FAMILIES, (metric, family)


def test_fleet_rules_aggregate_by_cluster_namespace_model_and_never_divide_by_zero():
    """Every model:/cluster: rule names what it keeps (`by (cluster, namespace, ...)`, never a
    `without` that lets scrape labels leak), and every division's denominator is kept above 0."""
    fleet = [r for r in rules() if "record" in r and r["record"].split(":")[0] in ("model", "cluster", "pod")]
    assert len(fleet) > 20, fleet
    for rule in fleet:
        if "sum" in rule["expr"] or "count" in rule["expr"]:
            assert "without" not in rule["expr"], rule
            assert re.search(r"(sum|count) by \(cluster, namespace[,)]", rule["expr"]), rule
    for rule in (r for r in rules() if "record" in r):
        for denominator in re.findall(r"\n/\n(.*)", rule["expr"], re.S):
            assert denominator.startswith("((") and denominator.rstrip().endswith(") > 0)"), rule


def test_availability_reasons_are_finish_reasons():
    from exporter.catalog.engine import FINISH_REASONS
    a = slo.AVAILABILITY
    assert set(a.bad_reasons) <= set(FINISH_REASONS) and set(a.abort_reasons) <= set(FINISH_REASONS)
    assert not set(a.bad_reasons) & set(a.abort_reasons)


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
    # A fleet alert has no `target`: it groups by alertname, cluster, namespace and model, one
    # notification per cluster's breach of a model.
    assert am["route"]["group_by"] == ["alertname", "cluster", "namespace", "target", "model"]
    names = {r["alert"] for r in alert_rules()}
    for rule in am["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            if matcher.startswith("long="):  # which burn-rate pair of an SLO (exporter/mixin/alerts/alertmanager.py)
                assert matcher[len('long="'):-1] in {br["long"] for br in generate.CONFIG["burn_rates"]}, matcher
                continue
            m = re.fullmatch(r'alertname(=~?)"(.+)"', matcher)
            assert m, matcher
            listed = set(m.group(2).split("|")) if m.group(1) == "=~" else {m.group(2)}
            assert listed <= names, f"inhibit rule names unknown alerts {sorted(listed - names)}"
    sources = {rule["source_matchers"][0] for rule in am["inhibit_rules"]}
    assert 'alertname="LLMGPUXidCritical"' in sources


def test_no_inhibition_can_mute_an_alert_that_notified_before_it():
    """Alertmanager drops the resolve of an alert that resolves while inhibited (alertmanager#2754), so
    a KV-full ticket opened before the engine died stayed open forever once LLMEngineDown inhibited it.
    An engine's latency, SLO, saturation and probe alerts are inhibited only by a longer burn pair of
    the same alert (one group: the group's resolve closes the page)."""
    am = yaml.safe_load(ALERTMANAGER.read_text())
    engine_alerts = {n for area, names in alert_names_by_area(generate.build()).items()
                     if area in ("slo", "latency", "saturation", "probe") for n in names}
    assert "LLMKVCacheNearlyFull" in engine_alerts and "LLMProbeFailing" in engine_alerts
    for rule in am["inhibit_rules"]:
        targets = {n for m in rule["target_matchers"] if m.startswith("alertname")
                   for n in re.fullmatch(r'alertname=~?"(.+)"', m).group(1).split("|")}
        if targets & engine_alerts:
            assert rule["source_matchers"][0] in {f'alertname="{n}"' for n in targets}, rule
            assert any(m.startswith("long=") for m in rule["source_matchers"]), rule
    # Nor do alerts with a `for` whose cause fires others first: an engine down, a lost GPU (its
    # XID 79 page comes a minute earlier and resolves while the GPU stays lost). A critical XID mutes
    # only the ECC alert of the same event (both without `for`), not the warning XIDs.
    sources = {rule["source_matchers"][0] for rule in am["inhibit_rules"]}
    for source in ("LLMEngineDown", "LLMEngineNotStarted", "LLMGPULost"):
        assert f'alertname="{source}"' not in sources, source
    xid = [r for r in am["inhibit_rules"] if r["source_matchers"] == ['alertname="LLMGPUXidCritical"']]
    assert [r["target_matchers"] for r in xid] == [['alertname="LLMGPUUncorrectableECCErrors"']], xid


def test_a_real_alertmanager_pages_once_per_slo_breach_with_the_longer_burn_pair_inhibiting_the_shorter(tmp_path):
    """The generated config in a real Alertmanager, alerts pushed with amtool as Prometheus would:
    the fast pair pages; when the slow pair fires it takes over the page and the fast pair and the
    ticket pair of the same SLO and target are shown suppressed; another target's page is not."""
    from tests.fullstack import WebhookReceiver
    from tests.support import free_port, wait_until

    amtool = tool("amtool")
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert binary, "prometheus-alertmanager not found on PATH; `make debs` installs it. This test never skips."
    receiver = WebhookReceiver()
    cfg = {**generate.CONFIG, "alertmanager": {**generate.CONFIG["alertmanager"], "group_wait": "1s",
                                                "group_interval": "1s", "pager_url": receiver.url + "/pager",
                                                "ticket_url": receiver.url + "/ticket"}}
    (tmp_path / "am.yml").write_text(generate.dump(generate.alertmanager(generate.build(cfg), cfg)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([binary, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path}",
                                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                                "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    burn = generate.CONFIG["slos"]["ttft"]["alert"]
    fast, slow, medium, ticket = generate.CONFIG["burn_rates"]

    def add(pair: dict, target: str = "vllm-a") -> None:
        result = run(amtool, "alert", "add", f"--alertmanager.url={url}", f"alertname={burn}",
                     f"severity={pair['severity']}", "slo=ttft", f"long={pair['long']}", f"short={pair['short']}",
                     "job=llm-exporter", "instance=node-1:9480", f"target={target}", "model=llama-70b")
        assert result.returncode == 0, result.stderr

    def states(target: str = "vllm-a") -> dict[str, str]:
        result = run(amtool, "alert", "query", f"--alertmanager.url={url}", "--active", "--inhibited", "-o", "json",
                     f"alertname={burn}", f"target={target}")
        assert result.returncode == 0, result.stderr
        return {a["labels"]["long"]: a["status"]["state"] for a in json.loads(result.stdout)}

    def add_fleet(name: str, pair: dict, cluster: str) -> None:
        result = run(amtool, "alert", "add", f"--alertmanager.url={url}", f"alertname={name}",
                     f"severity={pair['severity']}", "slo=availability", f"long={pair['long']}",
                     f"short={pair['short']}", f"cluster={cluster}", "namespace=serving", "model=llama-70b")
        assert result.returncode == 0, result.stderr

    def fleet_states(name: str, cluster: str) -> dict[str, str]:
        result = run(amtool, "alert", "query", f"--alertmanager.url={url}", "--active", "--inhibited", "-o", "json",
                     f"alertname={name}", f"cluster={cluster}")
        assert result.returncode == 0, result.stderr
        return {a["labels"]["long"]: a["status"]["state"] for a in json.loads(result.stdout)}

    try:
        assert wait_until(lambda: run(amtool, "config", "show", f"--alertmanager.url={url}").returncode == 0,
                          timeout=20, interval=0.2), "Alertmanager did not start"
        add(fast)
        assert wait_until(lambda: receiver.alerts(burn, status="firing", long=fast["long"]), timeout=10)
        add(slow)
        add(medium)
        add(ticket)
        assert wait_until(lambda: states() == {fast["long"]: "suppressed", slow["long"]: "active",
                                               medium["long"]: "suppressed", ticket["long"]: "suppressed"},
                          timeout=10), states()
        add(fast, target="vllm-b")  # same SLO, another target: its own page
        assert wait_until(lambda: states("vllm-b") == {fast["long"]: "active"}, timeout=10), states("vllm-b")
        assert wait_until(lambda: receiver.alerts(burn, status="firing", target="vllm-b"), timeout=10)
        # The availability SLO's fleet alerts carry no job, instance or target: cluster a's slow pair
        # mutes its own fast pair, never cluster b's (cluster is in the inhibitions' `equal`), and
        # cluster b pages in its own group.
        avail = generate.CONFIG["availability_slo"]["alert"]
        add_fleet(avail, fast, "a")
        add_fleet(avail, slow, "a")
        add_fleet(avail, fast, "b")
        assert wait_until(lambda: fleet_states(avail, "a") == {fast["long"]: "suppressed", slow["long"]: "active"},
                          timeout=10), fleet_states(avail, "a")
        assert wait_until(lambda: fleet_states(avail, "b") == {fast["long"]: "active"}, timeout=10), \
            fleet_states(avail, "b")
        assert wait_until(lambda: receiver.alerts(avail, status="firing", cluster="b"), timeout=10)
        # The ticket pair is shown suppressed; that it never goes out is checked by ordering, not by
        # waiting: a sentinel in its own group (same route and group labels, a `long` that no
        # inhibition names) makes Alertmanager flush that group after the ticket pair joined it,
        # and a flush sends every alert of the group that is not muted.
        add({**ticket, "long": "sentinel"})
        assert wait_until(lambda: receiver.alerts(burn, long="sentinel"), timeout=10), receiver.notifications
        tickets = [n for n in receiver.notified(burn, target="vllm-a") if n.receiver == "/ticket"]
        assert tickets and all(n.alerts == (("sentinel", "firing"),) for n in tickets), \
            f"the ticket pair went out while its SLO pages: {tickets}"
        assert [r.labels["long"] for r in receiver.alerts() if r.receiver == "/ticket"] == ["sentinel"] * len(tickets)
        pages = [r for r in receiver.alerts(burn, target="vllm-a") if r.labels["long"] == slow["long"]]
        assert pages, "the slow pair's page did not arrive"
    finally:
        process.terminate()
        process.wait(timeout=10)
        receiver.close()


# ----------------------------------------------------------------------------------------------
# In process: what `make mutation` (slo) found that only the --check subprocess above looked at
# ----------------------------------------------------------------------------------------------
def test_generated_files_are_what_the_generator_builds_in_this_process():
    """test_generated_files_are_current runs the generator in a child process, where a mutation
    tool's coverage cannot see it: the same comparison in process, file by file."""
    for path, text in generate.render().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} differs from alerts/generate.py's output"


def test_burn_alerts_keep_firing_for_their_short_window_only_when_configured():
    def keep(cfg: dict) -> dict[tuple[str, str], str | None]:
        burns = [r for g in generate.build(cfg)["slo"] for r in g["rules"] if r.get("alert", "").endswith("Burn")]
        return {(r["alert"], r["labels"]["long"]): r.get("keep_firing_for") for r in burns}

    on, off = keep(generate.CONFIG), keep({**generate.CONFIG, "burn_keep_firing": False})
    shorts = {br["long"]: br["short"] for br in generate.CONFIG["burn_rates"]}
    assert on and all(v == shorts[long] for (_, long), v in on.items())
    assert off.keys() == on.keys() and set(off.values()) == {None}


@pytest.mark.parametrize(("seconds", "words"), [
    (30 * 86400, "30 days"), (72 * 3600, "3 days"), (5.25 * 86400, "5.2 days"),  # 72 h and up: days
    (50 * 3600, "50 hours"), (3600, "1 hour"), (1.25 * 3600, "1.2 hours"),
    (60, "1 minute"), (225, "3.8 minutes"), (90, "1.5 minutes"),
    (1, "1 second"), (2.25, "2.2 seconds"), (30, "30 seconds"),
])
def test_human_duration_words(seconds, words):
    assert slo.human_duration(seconds) == words


def test_burn_budget_and_duration_helpers():
    # The alert descriptions' "At 14.4x the budget lasts 50 hours" over a 30-day period.
    assert [slo.budget_lasts("30d", f) for f in (14.4, 6, 3, 1)] == ["50 hours", "5 days", "10 days", "30 days"]
    assert slo.prometheus_duration(0.2) == "1s" and slo.prometheus_duration(9 * 86400) == "9d"
    assert slo.prometheus_duration(5184) == "1h26m24s"
    with pytest.raises(ValueError, match="unsupported duration '5x'"):
        slo.duration_seconds("5x")
    assert slo.latency_text(0.999, "tbt") == "999 ms"


def test_slo_rules_follow_a_configured_selector_labels_and_runbook():
    # A site's own selector, aggregation, fleet labels and runbook reach every SLO rule, not the defaults.
    cfg = {**generate.CONFIG, "exporter_selector": 'job="site-llm"', "aggregate_away": ("pod",),
           "cluster_label": "region", "fleet_extra_labels": (), "runbook_url": "https://runbooks.example/{anchor}"}
    rules = [r for g in generate.build(cfg)["slo"] for r in g["rules"]]
    bound = [r for r in rules if r["alert"] == "LLMSLOThresholdNotABucketBound"]
    assert bound and all(r["expr"].count('{job="site-llm"') == 2 and "without (pod)" in r["expr"]
                         and "without (pod, le)" in r["expr"] for r in bound)
    avail = [r for r in rules if r["alert"] == "LLMAvailabilityErrorBudgetBurn"]
    assert avail and all("sum by (region, model)" in r["expr"] for r in avail)
    assert all(r["annotations"]["runbook_url"] == f"https://runbooks.example/{r['alert'].lower()}" for r in rules)
