"""The proof that every dashboard panel shows data: the real Prometheus server (Debian package)
scrapes `llm-exporter demo` with alerts/rules/*.yaml loaded, and every panel query, variables
substituted, is evaluated through Prometheus's HTTP API (/api/v1/query).

Two demos run side by side, scraped by one Prometheus as two instances of job "llm-exporter"
(the job the recording rules select):

- decode-heavy: `llm-exporter demo --scenario decode-heavy`, exactly as a user runs it; the
  normal panels (decode at the HBM roof, KV cache partly used).
- kv-pressure: the same demo command with `--speed SPEED`, the twin's clock running SPEED times
  faster than real time. At real time the KV cache of the
  kv-pressure twin takes minutes to fill; sped up it saturates in about 15 s: KV usage 1,
  preemptions counted, a growing queue, verdict kv_capacity, so the saturated panels are
  exercised too. The exporter, its scrape and Prometheus all run in real time.

Two more demos serve the SGLang and TGI expositions (decode-heavy, real time): engines without
vLLM's prefix-cache counters, inter-token-latency histogram or finish reasons. Only the panels that
fall back to what those engines export are evaluated for them.

One more runs `--scenario faults` (real time): the simulated GPU's XID events, uncorrected ECC error,
pending row remap and PCIe replays, which a healthy GPU never shows, for the fault panels and the
hardware alerts.

All five exporters name their engine target `demo-0`, as the Kubernetes sidecar names every target
`engine`: with $instance at All, the per-GPU and per-target panels must keep the exporters apart and
the stacked panels must stack one target's parts, not the exporters' series on top of each other.

Rate windows: the recording rules use 5m (and up to 3d) windows. The test neither waits 5
minutes nor rewrites the rules: rate()/increase() return a value as soon as two samples fall in
the window, and with scrape_interval and evaluation_interval at 1 s every rule has data a few
seconds after the first scrapes. Grafana's $__rate_interval becomes 15s, $__interval 1s, $__range
1m. The test polls until every query has data (or the deadline passes), so it takes as long as
the slowest panel needs (about 20-40 s), not a fixed sleep.

"Has data" means at least one series with a finite value (histogram_quantile over no requests is
NaN, which Grafana draws as nothing). Queries that legitimately have no data in the demo are in
NO_DATA with the reason; a strict entry must stay empty, so the list cannot silently go stale.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import pytest

from exporter.catalog.derived import RESOURCES
from exporter.mixin.dashboards import generate
from tests import routers
from tests.conftest import ROOT
from tests.support import free_port, free_ports, wait_until

SPEED = 8.0
DEADLINE_S = 75.0
SCENARIOS = ("decode-heavy", "kv-pressure")
# Engine formats other than vLLM's, each one more demo (decode-heavy, real time).
FORMATS = ("sglang", "tgi")
FAULTS = "faults"  # one more demo, `--scenario faults` at real time
PD = "pd-transfer"  # one more: a prefill/decode pair over a slow KV link (demo-0 is its decode instance)
PD_ONLY = ("KV transfer time vs TTFT (p50/p99, 5m)", "Requests waiting for KV transfer",
           "KV transfer throughput and failures (5m)")

# (dashboard title, panel title, refId) -> (reason, strict). strict: the query must return nothing
# here (what the simulator does not model); not strict: depends on the machine running the test.
NO_DATA: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("LLM Serving / GPU and roofline", "XID errors in the time range", "A"):
        ("a healthy GPU has no XID events, and an XID series appears with its first event (as from NVML); "
         "test_fault_panels_and_alerts_show_the_faults_scenario checks this panel", True),
    ("LLM Serving / Overview", "Probe errors by reason", "A"):
        ("the panel draws reasons with errors only (> 0); the demo's probes succeed, unless the machine is "
         "so loaded that one times out", False),
    **{("LLM Serving / Overview", title, ref): (
        "prefill/decode disaggregation only: test_pd_and_network_panels_show_the_pd_transfer_scenario checks "
        "them on its demo", True) for title, refs in ((PD_ONLY[0], "ABC"), (PD_ONLY[1], "A"), (PD_ONLY[2], "AB"))
        for ref in refs if (title, ref) != (PD_ONLY[0], "C")},
    ("LLM Serving / Host", "Network link utilization", "A"): (
        "the twin's single-node hosts have only a management link, not the engine's: the PD test checks the "
        "engine's RDMA port", True),
    **{("LLM Serving / Overview", title, ref): (
        "the twin does not simulate speculative decoding (no draft model): the families are absent, as from an "
        "engine without it", True)
       for title in ("Speculative decoding: acceptance ratio and length",
                     "Speculative decoding: draft and accepted tokens/s (5m)") for ref in "AB"},
    ("LLM Serving / Fleet", "GPU busy per engine pod", "A"):
        ("the pod label of a Kubernetes scrape: the demo's Prometheus scrapes exporters without pods; the fleet "
         "tier (namespace and pod labels) and alerts/tests/fleet-test.yaml (both Kubernetes layouts) check it",
         True),
    ("LLM Serving / Host", "Collection errors by reason", "A"):
        ("llm_exporter_collect_errors_total appears only after a failed collection; the demo's sources "
         "do not fail", False),
    **{("LLM Serving / Fleet", title, ref): (routers.NO_ROUTER, True)
       for title, refs in routers.ROUTING_ROW.items() for ref in refs},
}

@dataclass
class Stack:
    prometheus: str
    instances: dict[str, str]  # scenario or engine format -> instance label (host:port of its exporter)
    models: dict[str, str]
    started: float = 0.0  # time.monotonic() when the demos were launched

    def time_range(self) -> str:
        """$__range of a dashboard opened on the whole demo, from its launch (the faults happen in its
        first 25 s; a fixed 1m range lost them whenever the tests before took over a minute)."""
        return f"{max(60, int(time.monotonic() - self.started) + 15)}s"


def _stop(process: subprocess.Popen, sig: int) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _query(prometheus: str, expr: str) -> list[dict]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body.get("status") == "success", f"{expr}\n-> {body.get('errorType')}: {body.get('error')}"
    result = body["data"]["result"]
    if body["data"]["resultType"] == "scalar":
        return [{"metric": {}, "value": result}]
    return result


def _has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not found on PATH; `make debs` installs the Debian package. This test never skips.")
    tmp = tmp_path_factory.mktemp("prometheus")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ports = free_ports((*SCENARIOS, *FORMATS, FAULTS, PD))
    started = time.monotonic()
    processes: list[tuple[subprocess.Popen, int]] = []
    try:
        for name, port in ports.items():
            scenario = name if name in (*SCENARIOS, FAULTS, PD) else "decode-heavy"
            # Every family, so every panel of every board is checked here; tests/test_profiles.py checks
            # that a smaller profile's panels read only what it writes.
            args = ["demo", "--listen", f"127.0.0.1:{port}", "--interval", "1s", "--scenario", scenario,
                    "--profile", "full"]
            if name in FORMATS:
                args += ["--engine-format", name]
            elif scenario in (*SCENARIOS, PD) and scenario != "decode-heavy":
                args += ["--speed", str(SPEED)]
            processes.append((subprocess.Popen([sys.executable, "-m", "exporter.cli", *args], cwd=ROOT, env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
                              signal.SIGINT))
        prom_port = free_port()
        rule_files = sorted(str(p) for p in (ROOT / "alerts" / "rules").glob("*.yaml"))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": rule_files,
            "scrape_configs": [{"job_name": "llm-exporter", "static_configs": [
                {"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]}],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        processes.append((subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), signal.SIGTERM))
        prometheus = f"http://127.0.0.1:{prom_port}"

        def ready() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{prometheus}/-/ready", timeout=2).status_code == 200
            return False

        assert wait_until(ready, timeout=30, interval=0.2), "prometheus did not become ready"
        for process, _ in processes:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
        instances = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
        models: dict[str, str] = {}

        def scraped() -> bool:
            for scenario, instance in instances.items():
                result = _query(prometheus, f'llm_requests_running{{job="llm-exporter", instance="{instance}"}}')
                if not result:
                    return False
                models[scenario] = result[0]["metric"].get("model", "")
            return True

        assert wait_until(scraped, timeout=30, interval=0.5), "Prometheus never scraped both demos"
        yield Stack(prometheus, instances, models, started)
    finally:
        for process, sig in reversed(processes):
            _stop(process, sig)


def substitute(expr: str, *, instance: str, model: str, time_range: str = "1m") -> str:
    """Grafana's variable interpolation with the demo's concrete values."""
    # cluster, namespace and engine at All (".*"): one Prometheus, whose series carry no cluster label.
    values = {"job": "llm-exporter", "instance": instance, "target": "demo-0", "model": model, "gpu": "0",
              "cluster": ".*", "namespace": ".*", "engine": ".*",
              "__rate_interval": "15s", "__interval": "1s", "__range": time_range, "datasource": "prometheus"}

    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"no test value for variable ${name} in {expr}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def all_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard title, panel title, refId, expr) for every panel query."""
    out = []
    for text in generate.build_all().values():
        d = json.loads(text)
        for panel, t in generate.iter_exprs(d):
            out.append((d["title"], panel["title"], t["refId"], t["expr"]))
    return out


def test_no_data_list_names_real_panel_queries():
    known = {q[:3] for q in all_queries()}
    assert set(NO_DATA) <= known, set(NO_DATA) - known


@pytest.mark.timeout(150)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_panel_query_returns_data(stack: Stack, scenario: str):
    instance, model = stack.instances[scenario], stack.models[scenario]
    queries = [(key := q[:3], substitute(q[3], instance=instance, model=model)) for q in all_queries()]
    pending = {key: expr for key, expr in queries if key not in NO_DATA}
    deadline = time.monotonic() + DEADLINE_S
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            if _has_data(_query(stack.prometheus, expr)):
                del pending[key]
        if pending:
            time.sleep(1.0)
    missing = "\n".join(f"  {' / '.join(k)}:\n    {e}" for k, e in pending.items())
    assert not pending, f"panel queries without data after {DEADLINE_S:.0f} s:\n{missing}"
    for key, expr in queries:
        if key in NO_DATA:
            result = _query(stack.prometheus, expr)  # still a valid query
            reason, strict = NO_DATA[key]
            if strict:
                assert not _has_data(result), f"{' / '.join(key)} has data now; remove it from NO_DATA ({reason})"


def _panel_expr(title: str, ref: str = "A") -> str:
    matches = [q[3] for q in all_queries() if q[1] == title and q[2] == ref]
    assert len(matches) == 1, title
    return matches[0]


def _value(stack: Stack, scenario: str, title: str, ref: str = "A") -> float | None:
    expr = substitute(_panel_expr(title, ref), instance=stack.instances[scenario], model=stack.models[scenario])
    values = [float(r["value"][1]) for r in _query(stack.prometheus, expr)]
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else None


@pytest.mark.timeout(150)
def test_saturation_panels_tell_the_two_scenarios_apart(stack: Stack):
    """The panels read as their descriptions say: kv-pressure fills the KV cache, preempts, queues
    and gets the kv_capacity verdict; decode-heavy does none of that."""
    verdict = "Bottleneck verdict over time"
    kv_code = RESOURCES.index("kv_capacity") + 1

    def saturated() -> bool:
        return ((_value(stack, "kv-pressure", "KV cache usage (max)") or 0) > 0.9
                and (_value(stack, "kv-pressure", "Preemptions per second (5m)") or 0) > 0
                and (_value(stack, "kv-pressure", "Requests waiting") or 0) > 0
                and _value(stack, "kv-pressure", verdict) == kv_code)

    assert wait_until(saturated, timeout=DEADLINE_S, interval=1.0), {
        title: _value(stack, "kv-pressure", title)
        for title in ("KV cache usage (max)", "Preemptions per second (5m)", "Requests waiting", verdict)}
    assert (_value(stack, "decode-heavy", "KV cache usage (max)") or 0) < 0.9
    assert _value(stack, "decode-heavy", "Preemptions per second (5m)") == 0
    assert _value(stack, "decode-heavy", verdict) != kv_code


def _series(stack: Stack, title: str, ref: str = "A", *, instance: str, model: str = ".*") -> list[dict]:
    expr = substitute(_panel_expr(title, ref), instance=instance, model=model, time_range=stack.time_range())
    return [r for r in _query(stack.prometheus, expr) if math.isfinite(float(r["value"][1]))]


def _eventually(predicate, what: str) -> None:
    assert wait_until(predicate, timeout=DEADLINE_S, interval=1.0), what


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("engine_format", "title", "expect"), [
    ("sglang", "Prefix cache hit ratio", {}),
    ("sglang", "Finished requests by reason ($target)", {"reason": "unreported"}),
    ("sglang", "Time between tokens (p50/p95/p99, 5m)", {"measure": "TPOT"}),
    ("tgi", "Finished requests by reason ($target)", {}),
    ("tgi", "TBT p99 (5m)", {}),
    ("tgi", "Time between tokens (p50/p95/p99, 5m)", {"measure": "TPOT"}),
    ("tgi", "Time-between-tokens distribution ($engine)", {}),
])
def test_fallback_panels_show_engines_without_the_vllm_families(stack: Stack, engine_format: str, title: str,
                                                                 expect: dict[str, str]):
    """SGLang has no prefix-cache queries counter (its hit-rate gauge is read instead) and no finish
    reasons (llm_requests_total, as reason "unreported"); TGI has no inter-token latency histogram (its
    time per output token is read, measure="TPOT")."""
    instance = stack.instances[engine_format]

    def shown() -> bool:
        series = _series(stack, title, instance=instance)
        return bool(series) and all(r["metric"].get(k) == v for r in series for k, v in expect.items())

    _eventually(shown, f"{engine_format} / {title}: {_series(stack, title, instance=instance)}")


@pytest.mark.timeout(150)
def test_exporters_with_the_same_target_name_stay_apart(stack: Stack):
    """Every exporter calls its target demo-0 and its GPU 0. With $instance at All the roofline keeps one
    achieved and one peak line per exporter's GPU, the per-target panels one series per exporter, and a
    stacked panel (repeated per target) one series per part: the exporters are combined, not stacked."""
    every = "|".join(stack.instances.values())
    roofline = {stack.instances[s] for s in SCENARIOS}  # the vLLM demos have a model shape and a GPU spec

    def apart() -> bool:
        achieved = _series(stack, "Achieved vs peak HBM bandwidth", "A", instance=every)
        peak = _series(stack, "Achieved vs peak HBM bandwidth", "B", instance=every)
        return ({r["metric"]["instance"] for r in achieved} >= roofline
                and {r["metric"]["instance"] for r in peak} >= roofline)

    _eventually(apart, "the roofline merges the exporters' GPU 0")
    peak = _series(stack, "Achieved vs peak HBM bandwidth", "B", instance=every)
    assert len(peak) == len({(r["metric"]["instance"], r["metric"]["gpu"]) for r in peak})
    verdicts = _series(stack, "Bottleneck verdict over time", instance=every)
    assert len({r["metric"]["instance"] for r in verdicts}) == len(verdicts) >= 2
    for title, parts in (("Share of engine time: prefill vs decode ($target)", "phase"),
                         ("Finished requests by reason ($target)", "reason")):
        _eventually(lambda title=title: bool(_series(stack, title, instance=every)), title)
        for t in [q for q in all_queries() if q[1] == title]:
            series = _series(stack, title, t[2], instance=every)
            keys = [r["metric"].get(parts) for r in series]
            assert len(keys) == len(set(keys)), (title, [r["metric"] for r in series])
            assert not any({"instance", "target"} & set(r["metric"]) for r in series), title
    phases = _series(stack, "Share of engine time: prefill vs decode ($target)", instance=every)
    assert sum(float(r["value"][1]) for r in phases) == pytest.approx(1.0, abs=0.01)


@pytest.mark.timeout(150)
def test_pd_and_network_panels_show_the_pd_transfer_scenario(stack: Stack):
    """The decode instance of a prefill/decode pair (sped up): its KV transfer time sits near its TTFT,
    requests wait for their KV, KV bytes move, the engine's RDMA port is busy on the host board, and the
    verdict is interconnect."""
    instance, model = stack.instances[PD], stack.models[PD]
    code = RESOURCES.index("interconnect") + 1

    def shown() -> dict[str, float | None]:
        values = {f"{t} {r}": _value(stack, PD, t, r) for t, refs in ((PD_ONLY[0], "ABC"), (PD_ONLY[1], "A"),
                                                                      (PD_ONLY[2], "A")) for r in refs}
        link = _series(stack, "Network link utilization", "A", instance=instance, model=model)
        values["engine link"] = max((float(r["value"][1]) for r in link), default=None)
        values["verdict"] = _value(stack, PD, "Bottleneck verdict over time")
        return values

    def ok() -> bool:
        v = shown()
        return (all(x is not None and x > 0 for k, x in v.items() if k != "verdict")
                and v["verdict"] == code and v[f"{PD_ONLY[0]} A"] > 0.3 * v[f"{PD_ONLY[0]} C"])

    assert wait_until(ok, timeout=DEADLINE_S, interval=1.0), shown()
    rows = _series(stack, "Network links: state and rate", "A", instance=instance, model=model)
    assert {(r["metric"]["device"], r["metric"]["kind"], r["metric"]["engine"]) for r in rows} >= {
        ("mlx5_0:1", "roce", "true"), ("eth0", "ethernet", "false")}


@pytest.mark.timeout(150)
def test_fault_panels_and_alerts_show_the_faults_scenario(stack: Stack):
    """`--scenario faults` injects its errors within its first 25 s: the XID table lists a warning and a
    critical code, the ECC panel an uncorrected error and a pending row remap, PCIe replays have a rate,
    the recovery-action timeline shows the driver asking for a GPU reset (1) on that exporter only, and
    the hardware alerts fire for that exporter only (the healthy demos keep every counter at 0)."""
    instance = stack.instances[FAULTS]
    ecc = "ECC errors, row remapping and PCIe replays"
    recovery = "Recovery action and NVLink fabric state"

    def labelled(title: str, ref: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in _series(stack, title, ref, instance=instance)}

    def firing(inst: str) -> set[str]:
        return {r["metric"]["alertname"] for r in _query(
            stack.prometheus, f'ALERTS{{alertstate="firing", instance="{inst}", alertname=~"LLMGPU.*"}}')}

    alerts = {"LLMGPUXidWarning", "LLMGPUXidCritical", "LLMGPUUncorrectableECCErrors"}

    def shown() -> bool:
        xids = labelled("XID errors in the time range", "A", "xid")
        # Each code counted: XID 48's one event created its series, which increase() alone reads as 0.
        return (xids.get("13", 0) >= 1 and xids.get("48", 0) >= 1
                and labelled(ecc, "A", "type").get("uncorrected", 0) >= 1
                and labelled(ecc, "B", "state").get("pending", 0) == 1
                and max(labelled(ecc, "C", "gpu").values(), default=0) > 0
                and labelled(recovery, "A", "gpu").get("0") == 1
                and firing(instance) >= alerts)

    if not wait_until(shown, timeout=DEADLINE_S, interval=1.0):
        panels = {f"{title} {ref}": _series(stack, title, ref, instance=instance)
                  for title, ref in (("XID errors in the time range", "A"), (ecc, "A"), (ecc, "B"), (ecc, "C"))}
        pytest.fail(f"faults not shown: {panels}, alerts firing {firing(instance)}")
    healthy = stack.instances["decode-heavy"]
    assert not firing(healthy) & alerts
    actions = {r["metric"]["gpu"]: float(r["value"][1])
               for r in _series(stack, recovery, "A", instance=healthy)}
    assert actions and set(actions.values()) == {0.0}, actions
    assert {float(r["value"][1]) for r in _series(stack, ecc, "A", instance=healthy)} == {0.0}


@pytest.mark.timeout(150)
def test_fleet_instance_table_joins_every_replica(stack: Stack):
    """The fleet board's instance table with every variable at All: the verdict column lists every exporter
    the stack runs, each with a verdict Grafana's mapping names, and every other column's rows carry exactly
    the replica labels of a verdict row, so Grafana's merge joins them into one row per replica."""
    from exporter.mixin.dashboards import fleet

    title = "Instances: one row per replica"
    every = "|".join(stack.instances.values())
    refs = [q[2] for q in all_queries() if q[1] == title]
    assert refs == list("ABCDEFG")

    def key(r: dict) -> tuple[str, ...]:
        return tuple(r["metric"].get(label, "") for label in fleet.REPLICA)

    def listed() -> bool:
        rows = _series(stack, title, "A", instance=every)
        return {r["metric"]["instance"] for r in rows} >= set(stack.instances.values())

    _eventually(listed, f"{title}: {_series(stack, title, 'A', instance=every)}")
    verdicts = _series(stack, title, "A", instance=every)
    assert len({key(r) for r in verdicts}) == len(verdicts)
    assert {float(r["value"][1]) for r in verdicts} <= set(range(1, len(RESOURCES) + 1))
    # A label the replica's series lack (no cluster on one Prometheus, no model from some engines) is absent
    # from every column alike.
    labels = {key(r): set(r["metric"]) for r in verdicts}
    assert all(labels.values()) and all(ls <= set(fleet.REPLICA) for ls in labels.values()), labels
    for ref in refs[1:]:
        rows = _series(stack, title, ref, instance=every)
        assert {key(r) for r in rows} <= set(labels), (ref, [r["metric"] for r in rows])
        assert all(set(r["metric"]) == labels[key(r)] for r in rows), (ref, [r["metric"] for r in rows])
    # The fleet tiles: one value per model, whatever the number of replicas behind it.
    tile = _series(stack, "TTFT p99 (5m)", instance=every)
    assert tile and len(tile) == len({r["metric"]["model"] for r in tile})
