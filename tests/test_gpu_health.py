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
