"""GPU health in the diagnosis (issue 39 item 1): a GPU fault makes the target and the exporter
UNHEALTHY before any bottleneck, names the GPU, the event, when and the action, and goes when it
is over. Unit level on the Deriver with snapshots of a GPU source's families; the real process
(`llm-exporter demo --scenario faults`, doctor, the status page, /api/v1/diagnosis, /metrics) at
the end of the file."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from exporter.config import Config
from exporter.derive import Deriver
from exporter.doctor import EXIT_UNHEALTHY
from exporter.snapshot import Sample, Snapshot, SourceKind, SourceResult, labels_of
from exporter.specs.gpu_faults import FAULT_WINDOW_S, XIDS
from tests.support import free_port, stop_process, wait_until

ENGINE = labels_of(target="a", engine="vllm", model="m")


def gpu_labels(gpu: str) -> tuple:
    return labels_of(gpu=gpu, uuid=f"GPU-{gpu}", name="NVIDIA H100 80GB HBM3")


def gpu_samples(gpu: str, up: float = 1.0, ecc: float = 0.0, xids: dict[str, float] | None = None,
                pending: float = 0.0, failed: float = 0.0, uncorrectable: float = 0.0,
                recovery: float | None = 0.0) -> list[Sample]:
    g = gpu_labels(gpu)
    out = [Sample("llm_gpu_up", g, up)]
    for code, count in (xids or {}).items():
        out.append(Sample("llm_gpu_xid_errors_total", labels_of(**dict(g), xid=code), count))
    if up == 0.0:
        return out  # a lost GPU: only up and the exporter's own XID counts
    out += [Sample("llm_gpu_utilization_ratio", g, 0.9),
            Sample("llm_gpu_ecc_errors_total", labels_of(**dict(g), type="corrected"), 3.0),
            Sample("llm_gpu_ecc_errors_total", labels_of(**dict(g), type="uncorrected"), ecc)]
    for state, value in (("correctable", 0.0), ("uncorrectable", uncorrectable), ("pending", pending),
                         ("failed", failed)):
        out.append(Sample("llm_gpu_remapped_rows", labels_of(**dict(g), state=state), value))
    if recovery is not None:
        out.append(Sample("llm_gpu_recovery_action", g, recovery))
    return out


def snapshot(t: float, gpus: list[list[Sample]], targets: tuple[str, ...] = ("a",)) -> Snapshot:
    results = {}
    for target in targets:
        labels = labels_of(target=target, engine="vllm", model="m")
        engine = (Sample("llm_requests_running", labels, 4.0), Sample("llm_generation_tokens_total", labels, 100.0 * t))
        results[f"engine:{target}"] = SourceResult(f"engine:{target}", True, 0.0, t, engine,
                                                   attrs={"target": target, "engine": "vllm", "model": "m"},
                                                   kind=SourceKind.ENGINE)
    results["gpu"] = SourceResult("gpu", True, 0.0, t, tuple(s for g in gpus for s in g), kind=SourceKind.GPU)
    return Snapshot(t, results)


def faults_of(deriver: Deriver, target: str = "a") -> list[str]:
    return [f["fault"] for f in deriver.diagnosis()["targets"][target]["gpu_faults"]]


def test_a_healthy_gpu_is_not_unhealthy_and_the_metric_says_zero():
    deriver = Deriver(Config())
    out = deriver(snapshot(1.0, [gpu_samples("0")]), None)
    d = deriver.diagnosis()
    assert d["status"] != "unhealthy" and faults_of(deriver) == []
    assert [s.value for s in out if s.name == "llm_unhealthy_gpus"] == [0.0]
    assert not [s for s in out if s.name == "llm_gpu_fault"]


def test_an_uncorrected_ecc_count_at_first_sight_is_a_fault_for_the_window_then_goes():
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0", ecc=2.0)]), None)
    d = deriver.diagnosis()
    assert d["status"] == "unhealthy" and d["targets"]["a"]["status"] == "unhealthy"
    (fault,) = d["targets"]["a"]["gpu_faults"]
    assert (fault["gpu"], fault["uuid"], fault["fault"], fault["action"]) == ("0", "GPU-0", "ecc_uncorrected",
                                                                               "reset_gpu")
    assert fault["since"] == 1000.0 and "GPU 0" in fault["words"] and "reset" in fault["words"]
    assert fault["words"] in d["targets"]["a"]["evidence"]  # the evidence names it too, first
    assert d["targets"]["a"]["evidence"][0] == fault["words"]
    # Still there within the window; gone after it with no new error.
    deriver(snapshot(1000.0 + FAULT_WINDOW_S - 1, [gpu_samples("0", ecc=2.0)]), None)
    assert faults_of(deriver) == ["ecc_uncorrected"]
    deriver(snapshot(1000.0 + FAULT_WINDOW_S + 1, [gpu_samples("0", ecc=2.0)]), None)
    assert faults_of(deriver) == [] and deriver.diagnosis()["status"] != "unhealthy"
    # A new error brings it back, dated now, counting only the new one.
    deriver(snapshot(5000.0, [gpu_samples("0", ecc=3.0)]), None)
    (fault,) = deriver.diagnosis()["targets"]["a"]["gpu_faults"]
    assert (fault["since"], fault["count"]) == (5000.0, 1.0)
    # A reset clears the volatile count: no fault from the drop.
    deriver(snapshot(5000.0 + FAULT_WINDOW_S + 5, [gpu_samples("0", ecc=0.0)]), None)
    assert faults_of(deriver) == []


@pytest.mark.parametrize("xid", [x for x in XIDS])
def test_each_xid_in_the_table_is_a_fault_exactly_when_its_action_is_not_none(xid):
    deriver = Deriver(Config())
    deriver(snapshot(1.0, [gpu_samples("0")]), None)
    deriver(snapshot(2.0, [gpu_samples("0", xids={str(xid.code): 1.0})]), None)
    faults = deriver.diagnosis()["targets"]["a"]["gpu_faults"]
    if xid.action.name == "none":
        assert faults == []
    else:
        (fault,) = faults
        assert fault["fault"] == f"xid_{xid.code}" and fault["action"] == xid.action.name
        assert f"XID {xid.code}" in fault["words"]


def test_an_unknown_or_folded_xid_code_is_counted_but_not_a_fault():
    deriver = Deriver(Config())
    deriver(snapshot(1.0, [gpu_samples("0", xids={"999": 1.0, "other": 4.0})]), None)
    assert faults_of(deriver) == []


@pytest.mark.parametrize(("kwargs", "fault", "action"), [
    ({"pending": 1.0}, "remap_pending", "reset_gpu"),
    ({"failed": 1.0}, "remap_failed", "rma"),
    ({"recovery": 2.0}, "recovery_action", "reboot_node"),
    ({"recovery": 3.0}, "recovery_action", "drain_p2p"),
    ({"recovery": 42.0}, "recovery_action", "code_42"),
])
def test_standing_states_hold_while_they_last(kwargs, fault, action):
    deriver = Deriver(Config())
    deriver(snapshot(10.0, [gpu_samples("0", **kwargs)]), None)
    deriver(snapshot(10.0 + 3 * FAULT_WINDOW_S, [gpu_samples("0", **kwargs)]), None)
    (found,) = deriver.diagnosis()["targets"]["a"]["gpu_faults"]
    assert (found["fault"], found["action"], found["since"]) == (fault, action, 10.0)
    deriver(snapshot(20.0 + 3 * FAULT_WINDOW_S, [gpu_samples("0")]), None)
    assert faults_of(deriver) == []


def test_a_lost_gpu_is_a_fault_of_the_only_target_and_its_verdict_still_shows():
    deriver = Deriver(Config())
    deriver(snapshot(1.0, [gpu_samples("0"), gpu_samples("1")]), None)
    out = deriver(snapshot(2.0, [gpu_samples("0"), gpu_samples("1", up=0.0, xids={"79": 1.0})]), None)
    d = deriver.diagnosis()
    assert sorted(faults_of(deriver)) == ["lost", "xid_79"]
    assert {f["gpu"] for f in d["targets"]["a"]["gpu_faults"]} == {"1"}
    assert [s.value for s in out if s.name == "llm_unhealthy_gpus"] == [1.0]
    assert d["status"] == "unhealthy"


def test_faults_follow_the_gpu_assignment_and_an_unassigned_gpu_is_listed_apart():
    config = Config(target_gpus={"a": ["0"], "b": ["1"]})
    deriver = Deriver(config)
    gpus = [gpu_samples("0"), gpu_samples("1", pending=1.0), gpu_samples("2", failed=1.0)]
    deriver(snapshot(1.0, gpus, targets=("a", "b")), None)
    d = deriver.diagnosis()
    assert d["targets"]["a"]["gpu_faults"] == [] and d["targets"]["a"]["status"] != "unhealthy"
    assert [f["fault"] for f in d["targets"]["b"]["gpu_faults"]] == ["remap_pending"]
    assert [(f["gpu"], f["fault"]) for f in d["gpu_faults_unassigned"]] == [("2", "remap_failed")]
    assert d["status"] == "unhealthy"


def test_doctor_renders_unhealthy_first_and_exits_4(capsys):
    from exporter.doctor import exit_code, render_report

    deriver = Deriver(Config())
    deriver(snapshot(1.0, [gpu_samples("0", ecc=1.0, pending=1.0)]), None)
    deriver(snapshot(2.0, [gpu_samples("0", ecc=1.0, pending=1.0)]), None)
    d = deriver.diagnosis()
    assert exit_code(d) == EXIT_UNHEALTHY == 4
    import io
    out = io.StringIO()
    render_report(d, "test", out)
    text = out.getvalue()
    assert "status: UNHEALTHY" in text
    assert text.index("UNHEALTHY: GPU 0") < text.index("bottleneck:")


# --- the real process ------------------------------------------------------------------------------

def test_the_faults_demo_is_unhealthy_in_doctor_the_status_page_the_api_and_metrics(tmp_path):
    """`llm-exporter demo --scenario faults`: the XID 48 / uncorrected ECC / pending remap / recovery
    action the scenario schedules (12 simulated seconds in, at --speed 4 three real seconds) make it
    UNHEALTHY everywhere a user looks, naming GPU 0 and the events."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen([sys.executable, "-m", "exporter.cli", "demo", "--scenario", "faults", "--speed", "4",
                             "--no-probe", "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def unhealthy() -> bool:
            try:
                return httpx.get(base + "/api/v1/diagnosis", timeout=2).json().get("status") == "unhealthy"
            except (httpx.HTTPError, ValueError):
                return False
        assert wait_until(unhealthy, timeout=90), (tmp_path / "demo.log").read_text(errors="replace")[-2000:]
        diagnosis = httpx.get(base + "/api/v1/diagnosis", timeout=5).json()
        target = diagnosis["targets"]["demo-0"]
        faults = {f["fault"] for f in target["gpu_faults"]}
        assert {"ecc_uncorrected", "xid_48", "remap_pending", "recovery_action"} <= faults, faults
        assert target["verdict"]  # the bottleneck still shows below
        doctor = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base],
                                capture_output=True, text=True, timeout=60)
        assert doctor.returncode == EXIT_UNHEALTHY, doctor.stdout + doctor.stderr
        assert "status: UNHEALTHY" in doctor.stdout
        assert "GPU 0" in doctor.stdout and "XID 48" in doctor.stdout and "reset the GPU" in doctor.stdout
        assert doctor.stdout.index("UNHEALTHY: GPU 0") < doctor.stdout.index("bottleneck:")
        page = httpx.get(base + "/", timeout=5).text
        assert 'id="overall">unhealthy' in page and 'class="faults"' in page and "XID 48" in page
        assert page.index('class="faults"') < page.index("Bottleneck:")
        metrics = httpx.get(base + "/metrics", timeout=5).text
        assert 'llm_unhealthy_gpus{engine="vllm",target="demo-0"} 1.0' in metrics
        assert 'fault="xid_48"' in metrics
    finally:
        stop_process(demo, timeout=20)
        log.close()


def test_the_docs_list_the_xids_the_table_says_need_service():
    import pathlib

    needs = ", ".join(str(x.code) for x in XIDS if x.action.name != "none")
    for doc in ("docs/diagnosis.md", "docs/alerts.md"):
        text = " ".join(pathlib.Path(doc).read_text().split())
        assert needs.rsplit(", ", 1)[0] + " and " + needs.rsplit(", ", 1)[1] in text or needs in text, doc


# --- what `make mutation` left alive in exporter/derive/health.py ----------------------------------

RESET_WORDS = "drain the engine, then reset the GPU (nvidia-smi -r) or reboot; RMA if it recurs"


def fault_json(deriver: Deriver, target: str = "a") -> list[dict]:
    return deriver.diagnosis()["targets"][target]["gpu_faults"]


def test_every_fault_field_and_its_words_over_the_cycles_of_a_failing_gpu():
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0", ecc=2.0, xids={"48": 1.0}, pending=1.0, recovery=2.0),
                              gpu_samples("1")]), None)
    def expected(fault: str, what: str, action: str, count: float, runbook: str, words: str) -> dict:
        since = "last" if count else "since"
        return {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "fault": fault, "what": what,
                "action": action, "since": 1000.0, "count": count, "runbook": f"docs/runbooks.md#{runbook}",
                "words": f"GPU 0 (GPU-0): {what}, {since} 1970-01-01 00:16:40 UTC (0 s ago): {words} "
                         f"(docs/runbooks.md#{runbook})"}

    assert fault_json(deriver) == [
        expected("xid_48", "XID 48 (double-bit ECC error): 1 in the last 1h", "reset_gpu", 1.0,
                 "llmgpuxidcritical", RESET_WORDS),
        expected("ecc_uncorrected", "uncorrected (double-bit) ECC errors: 2 in the last 1h", "reset_gpu", 2.0,
                 "llmgpuuncorrectableeccerrors", RESET_WORDS),
        expected("remap_pending", "a memory row remap waits for a GPU reset", "reset_gpu", 0.0,
                 "llmgpurowremappending", RESET_WORDS),
        expected("recovery_action", "the driver asks for recovery action reboot_node (2)", "reboot_node", 0.0,
                 "llmgpurecoveryactionrequired", "drain the node and reboot it; RMA if it recurs")]
    # 150 s on the ECC count grows by 3 (5 in the window, dated now); XID 48 and the states keep
    # their times, now "2 min ago".
    out = deriver(snapshot(1150.0, [gpu_samples("0", ecc=5.0, xids={"48": 1.0}, pending=1.0, recovery=2.0),
                                    gpu_samples("1")]), None)
    by_fault = {f["fault"]: f for f in fault_json(deriver)}
    assert (by_fault["ecc_uncorrected"]["count"], by_fault["ecc_uncorrected"]["since"]) == (5.0, 1150.0)
    assert by_fault["ecc_uncorrected"]["what"] == "uncorrected (double-bit) ECC errors: 5 in the last 1h"
    assert "(0 s ago)" in by_fault["ecc_uncorrected"]["words"]
    assert by_fault["xid_48"]["since"] == by_fault["remap_pending"]["since"] == 1000.0
    assert ", since 1970-01-01 00:16:40 UTC (2 min ago): " in by_fault["remap_pending"]["words"]
    assert [s.value for s in out if s.name == "llm_unhealthy_gpus"] == [1.0]
    # 119 s after the growth is still counted in seconds; the ECC count cleared by a reset is no fault.
    deriver(snapshot(1269.0, [gpu_samples("0", ecc=0.0, xids={"48": 1.0}), gpu_samples("1")]), None)
    assert faults_of(deriver) == ["xid_48"] and "(4 min ago)" in fault_json(deriver)[0]["words"]  # 269 s
    # Exactly one window after XID 48 it still holds; a second later it is over.
    deriver(snapshot(1000.0 + FAULT_WINDOW_S, [gpu_samples("0", xids={"48": 1.0}), gpu_samples("1")]), None)
    assert faults_of(deriver) == ["xid_48"]
    deriver(snapshot(1001.0 + FAULT_WINDOW_S, [gpu_samples("0", xids={"48": 1.0}), gpu_samples("1")]), None)
    assert faults_of(deriver) == []
    # It grows again: a new fault counting only the new error.
    deriver(snapshot(1002.0 + FAULT_WINDOW_S, [gpu_samples("0", xids={"48": 2.0}), gpu_samples("1")]), None)
    assert [(f["fault"], f["count"]) for f in fault_json(deriver)] == [("xid_48", 1.0)]


def test_seconds_ago_until_two_minutes_then_minutes():
    from exporter.derive.health import Fault
    from exporter.specs.gpu_faults import RESET_GPU

    fault = Fault("3", "", "H100", "remap_pending", "w", RESET_GPU, 1000.0, 0.0, "R")
    assert fault.words(1119.4) == (f"GPU 3: w, since 1970-01-01 00:16:40 UTC (119 s ago): {RESET_WORDS} "
                                   "(docs/runbooks.md#r)")
    assert "(2 min ago)" in fault.words(1120.0) and "(0 s ago)" in fault.words(990.0)  # a clock step back: 0
    assert "(50 min ago)" in fault.words(4000.0)
    assert fault._replace(count=2.0).json(1000.0)["words"].startswith("GPU 3: w, last ")


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"failed": 1.0}, [("remap_failed", "a memory row remap failed: no spare rows left", "rma",
                        "docs/runbooks.md#llmgpurowremapfailure")]),
    ({"uncorrectable": 1.0}, [("remap_uncorrectable", "a memory row remapped after an uncorrectable error: 1 in the "
                               "last 1h", "reset_gpu", "docs/runbooks.md#llmgpurowremappending")]),
    ({"recovery": 7.0}, [("recovery_action", "the driver asks for recovery action system_reboot (7)",
                          "system_reboot", "docs/runbooks.md#llmgpurecoveryactionrequired")]),
    ({"recovery": 9.0}, [("recovery_action", "the driver asks for recovery action code_9 (9)", "code_9",
                          "docs/runbooks.md#llmgpurecoveryactionrequired")]),
    ({"recovery": None}, []),
    ({"xids": {"94": 1.0, "31": 2.0, "999": 4.0}}, [
        ("xid_94", "XID 94 (contained ECC error: the process that hit it was stopped): 1 in the last 1h",
         "restart_engine", "docs/runbooks.md#llmgpuxidwarning")]),
])
def test_each_fault_family_s_words_action_and_runbook(kwargs, expected):
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0", **kwargs)]), None)
    assert [(f["fault"], f["what"], f["action"], f["runbook"]) for f in fault_json(deriver)] == expected
    if kwargs.get("recovery") == 9.0:  # a code no table knows: the driver's own instruction
        assert ": drain the engine and do what the driver asks (docs/" in fault_json(deriver)[0]["words"]


def test_a_count_that_grows_within_the_window_adds_to_what_it_held_late_in_a_long_uptime():
    deriver = Deriver(Config())
    start = 5_000_000.0  # a node up for weeks: the window is measured between cycles, not from 0
    deriver(snapshot(start, [gpu_samples("0", ecc=1.0)]), None)
    deriver(snapshot(start + 60.0, [gpu_samples("0", ecc=3.0)]), None)
    assert [(f["fault"], f["count"]) for f in fault_json(deriver)] == [("ecc_uncorrected", 3.0)]


def test_a_gpu_away_exactly_the_forget_time_is_remembered():
    from exporter.derive import health
    from exporter.derive.settings import derive_settings

    away = health.HealthState(derive_settings(Config())).forget_after_s
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0", ecc=1.0)]), None)
    deriver(snapshot(1000.0 + away, []), None)
    deriver(snapshot(1001.0 + away, [gpu_samples("0", ecc=1.0)]), None)
    assert faults_of(deriver) == []  # its count was remembered: no growth, and the old one is past the window


def test_lost_gpus_belong_to_their_target_only():
    lost = gpu_samples("1", up=0.0)
    # Two targets, GPUs assigned by target_gpus: the lost GPU 1 is b's only.
    deriver = Deriver(Config(target_gpus={"a": ["0"], "b": ["1"]}))
    deriver(snapshot(1000.0, [gpu_samples("0"), lost], targets=("a", "b")), None)
    assert faults_of(deriver, "a") == [] and faults_of(deriver, "b") == ["lost"]
    assert deriver.diagnosis()["targets"]["b"]["numbers"]["unhealthy_gpus"] == 1
    lost_fault = fault_json(deriver, "b")[0]
    assert (lost_fault["what"], lost_fault["action"], lost_fault["runbook"]) == (
        "lost: the GPU source cannot read it (llm_gpu_up 0)", "check", "docs/runbooks.md#llmgpulost")
    # Two targets without an assignment: each is shown against every GPU, the lost one included.
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0"), lost], targets=("a", "b")), None)
    assert faults_of(deriver, "a") == faults_of(deriver, "b") == ["lost"]
    # A target with only a lost GPU still has a health figure (1 GPU, 1 unhealthy).
    deriver = Deriver(Config())
    out = deriver(snapshot(1000.0, [lost]), None)
    assert [s.value for s in out if s.name == "llm_unhealthy_gpus"] == [1.0]
    assert [(dict(s.labels), s.value) for s in out if s.name == "llm_gpu_fault"] == [(
        {"action": "check", "engine": "vllm", "fault": "lost", "gpu": "1", "target": "a", "uuid": "GPU-1"}, 1.0)]


def test_health_state_forgets_a_gpu_gone_longer_than_the_window_and_bounds_its_counters():
    from exporter.derive import health
    from exporter.derive.settings import derive_settings

    state = health.HealthState(derive_settings(Config()))
    assert state.forget_after_s >= FAULT_WINDOW_S
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0", ecc=1.0)]), None)
    # Back after more than the window away: its old count is not remembered, so it is first sight again.
    deriver(snapshot(1000.0 + 2 * FAULT_WINDOW_S, []), None)
    deriver(snapshot(1001.0 + 2 * FAULT_WINDOW_S, [gpu_samples("0", ecc=1.0)]), None)
    assert faults_of(deriver) == ["ecc_uncorrected"]
    many = {str(code): 1.0 for code in range(1, 200)}
    deriver = Deriver(Config())
    deriver(snapshot(1000.0, [gpu_samples("0", xids=many)]), None)
    assert len(faults_of(deriver)) <= health.MAX_COUNTERS_PER_GPU
