"""GPU faults through the real processes: the twin (`python -m exporter.simulator`) fails its GPUs
as NVML shows it (POST /sim/gpu/<index>/fault, /recover) and `llm-exporter run --gpu-backend sim`
answers as the NVML source does for the same NVML return codes (tests/test_gpu_nvml.py proves that
one on a fake pynvml in the test process): a lost GPU is `llm_gpu_up 0` with nothing else, the
diagnosis UNHEALTHY with fault `lost` and `doctor` exit 4, NVML re-initialised with a doubling
back-off, the GPU back at the re-initialisation after it returns; an unsupported field omitted and
said once; a failed library a source error by reason. Each step is checked from outside: /metrics,
/api/v1/diagnosis, `doctor --url` and the exporter's log."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Twin, TwinConfig
from exporter.simulator.gpu import FAILING_FIELDS, inject_fault, recover_faults
from exporter.sources.base import SourceError
from exporter.sources.gpu import sim as sim_backend
from exporter.sources.gpu.sim import SimGpuSource
from tests.support import background_process, exporter_run, free_port, stop_process, wait_until

INTERVAL = "250ms"
RETRY_S = 1.0  # --gpu-retry-interval: the back-off is 1, 2, 4 s
REINIT = "re-initialising the simulated NVML after a lost GPU"
# Per-GPU families the sim backend always serves for a GPU that answers (optional ones aside).
ALWAYS = {"llm_gpu_up", "llm_gpu_info", "llm_gpu_power_watts", "llm_gpu_temperature_celsius",
          "llm_gpu_utilization_ratio", "llm_gpu_memory_used_bytes", "llm_gpu_clock_event_active"}


# --- in process: the twin's fault model and the backend's state machine on a fake clock --------------

def test_every_field_of_a_gpu_object_can_fail_and_the_backend_knows_each() -> None:
    twin = Twin(TwinConfig(epoch=0.0))
    (gpu,) = twin.gpu_state()["gpus"]
    assert set(gpu) - {"index", "uuid", "name", "xid_errors"} == FAILING_FIELDS
    assert sim_backend._FIELDS == FAILING_FIELDS  # a field the twin can fail that the backend ignores is a bug


@pytest.mark.parametrize(("index", "kind", "kw", "error"), [
    (0, "melted", {}, ValueError), (0, "nvml_error", {"code": 0}, ValueError),
    (0, "nvml_error", {"code": True}, ValueError), (0, "lost", {"code": 15}, ValueError),
    (0, "unsupported_field", {}, ValueError), (0, "unsupported_field", {"field_name": "uuid"}, ValueError),
    (0, "unsupported_field", {"field_name": ["power_watts"]}, ValueError), (7, "lost", {}, LookupError)])
def test_a_bad_fault_is_refused_with_what_is_allowed(index, kind, kw, error) -> None:
    twin = Twin(TwinConfig(epoch=0.0))
    with pytest.raises(error):
        inject_fault(twin.gpu_models, index, kind, **kw)
    assert twin.gpu_state()["gpus"][0].get("nvml_error") is None


def test_the_backend_backs_off_as_nvml_and_keeps_an_absent_field_out_until_it_reinitialises() -> None:
    twin = Twin(TwinConfig(epoch=0.0, gpus=2))
    twin.fast_forward(5)
    now = [0.0]
    source = SimGpuSource(twin, retry_interval_s=1.0, clock=lambda: now[0])

    def at(t: float) -> dict[str, object]:
        now[0] = t
        data = asyncio.run(source.collect())
        up = {s.label("gpu"): s.value for s in data.samples if s.name == "llm_gpu_up"}
        power = {s.label("gpu") for s in data.samples if s.name == "llm_gpu_power_watts"}
        return {"up": up, "power": power, "state": data.attrs["state"], "lost": data.attrs["lost"]}

    assert at(0.0) == {"up": {"0": 1.0, "1": 1.0}, "power": {"0", "1"}, "state": "ok", "lost": ""}
    inject_fault(twin.gpu_models, 1, "lost")
    assert at(0.5) == {"up": {"0": 1.0, "1": 0.0}, "power": {"0"}, "state": "gpu_lost", "lost": "1"}
    assert source.inits == 1
    at(1.49)
    assert source.inits == 1  # not before the first retry (0.5 + 1)
    at(1.5)
    assert source.inits == 2  # re-initialised: still lost, the next retry 2 s later
    recover_faults(twin.gpu_models, 1)
    assert at(3.49)["up"] == {"0": 1.0, "1": 0.0}  # back on the twin, but not looked at before the retry
    assert at(3.5) == {"up": {"0": 1.0, "1": 1.0}, "power": {"0", "1"}, "state": "ok", "lost": ""}
    inject_fault(twin.gpu_models, 0, "unsupported_field", field_name="power_watts")
    assert at(4.0)["power"] == {"1"}
    recover_faults(twin.gpu_models, 0)
    assert at(5.0)["power"] == {"1"}  # absent for the generation, as NVML's
    inject_fault(twin.gpu_models, None, "nvml_error", code=9)  # the driver goes: every GPU lost ...
    assert at(6.0)["up"] == {"0": 0.0, "1": 0.0}
    with pytest.raises(SourceError) as failed:  # ... and the re-initialisation fails (back-off reset to 1 s)
        at(7.0)
    assert failed.value.reason == "driver_not_loaded"
    recover_faults(twin.gpu_models, None)
    with pytest.raises(SourceError):
        at(8.9)  # the failed init is not tried again before its retry (7 + 2)
    assert at(9.0) == {"up": {"0": 1.0, "1": 1.0}, "power": {"0", "1"}, "state": "ok", "lost": ""}


def test_a_twin_that_invents_gpus_every_cycle_cannot_grow_what_the_backend_remembers() -> None:
    """A hostile /sim/gpu: 1,200 new GPUs a cycle, a third lost, a third with every field
    unsupported, a third healthy. What the backend keeps and says once stays bounded."""
    healthy = Twin(TwinConfig(epoch=0.0)).gpu_state()["gpus"][0]
    now = [0.0]

    class Hostile:
        cycle = 0

        def gpu_state(self) -> dict:
            self.cycle += 1
            gpus = []
            for i in range(1200):
                index = self.cycle * 1200 + i
                if i % 3 == 0:
                    gpus.append({"index": index, "nvml_error": 15})
                elif i % 3 == 1:
                    gpus.append({**healthy, "index": index, "uuid": f"GPU-{index}",
                                 "nvml_errors": dict.fromkeys(FAILING_FIELDS, 3), **dict.fromkeys(FAILING_FIELDS)})
                else:
                    gpus.append({**healthy, "index": index, "uuid": f"GPU-{index}"})
            return {"gpus": gpus}

    source = SimGpuSource(Hostile(), retry_interval_s=1.0, clock=lambda: now[0])
    for cycle in range(5):  # before the first re-initialisation (1 s), which would clear the lost ones
        now[0] = cycle * 0.2
        data = asyncio.run(source.collect())
        assert sum(1 for s in data.samples if s.name == "llm_gpu_up") == 1200
    assert len(source._known) <= sim_backend.MAX_KNOWN_GPUS and len(source._lost) <= sim_backend.MAX_KNOWN_GPUS
    assert len(source._absent) <= sim_backend.MAX_KNOWN_GPUS and len(source._said) <= sim_backend.MAX_SAID_KEYS


# --- the real processes ------------------------------------------------------------------------------

def _families(base: str) -> dict[str, list]:
    response = httpx.get(base + "/metrics", timeout=5)
    response.raise_for_status()  # 503 before the first collection: not an exposition
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def _gpu_families(fams: dict[str, list], gpu: str) -> set[str]:
    return {name for name, samples in fams.items() if name.startswith("llm_gpu_")
            and any(s.labels.get("gpu") == gpu and "target" not in s.labels for s in samples)}


def _value(fams: dict[str, list], family: str, sample: str | None = None, **labels: str) -> float | None:
    for s in fams.get(family, ()):
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def _up(base: str, gpu: str) -> float | None:
    return _value(_families(base), "llm_gpu_up", gpu=gpu)


def _doctor(base: str) -> int:
    return subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base], capture_output=True,
                          timeout=30).returncode


def _log(stderr) -> list[tuple[float, str]]:
    """(time, message) of each line the exporter logged so far."""
    stderr.seek(0)
    out = []
    for line in stderr.read().decode().splitlines():
        if line.startswith("ts="):
            stamp = datetime.datetime.strptime(line[3:26], "%Y-%m-%d %H:%M:%S,%f")
            out.append((stamp.timestamp(), line))
    return out


def _post(url: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(url, content=json.dumps(body).encode() if body is not None else b"", timeout=5)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    def tolerant() -> bool:
        try:
            return check()
        except httpx.HTTPError:  # not listening yet
            return False

    assert wait_until(tolerant, timeout=timeout, interval=0.1), what


@pytest.mark.e2e
def test_run_through_gpu_loss_backoff_recovery_unsupported_field_and_driver_failure() -> None:
    twin_port = free_port()
    twin = f"http://127.0.0.1:{twin_port}"
    command = [sys.executable, "-m", "exporter.simulator", "--port", str(twin_port), "--scenario", "decode-heavy",
               "--gpus", "2"]
    with background_process(command, twin + "/health"), \
            exporter_run("--engine", f"{twin}/metrics,name=t", "--gpu-backend", "sim", "--sim-url", twin,
                         "--interval", INTERVAL, "--gpu-retry-interval", f"{RETRY_S:g}s",
                         "--log-level", "info") as (base, _process, stderr):
        # The control endpoint refuses what it cannot do, with one clear line.
        bad = _post(twin + "/sim/gpu/0/fault", {"kind": "melted"})
        assert bad.status_code == 400 and "lost" in bad.json()["error"]
        assert _post(twin + "/sim/gpu/9/fault", {"kind": "lost"}).status_code == 404
        assert httpx.get(twin + "/sim/gpu/0/fault", timeout=5).status_code == 405

        _wait(lambda: _up(base, "0") == 1.0 and _up(base, "1") == 1.0, 15, "both GPUs up")
        _wait(lambda: _doctor(base) != 3, 20, "a diagnosis")
        normal = _doctor(base)
        assert normal in (0, 1), normal
        before = _families(base)
        assert _gpu_families(before, "1") >= ALWAYS

        # 1. GPU 1 falls off the bus.
        assert _post(twin + "/sim/gpu/1/fault", {"kind": "lost"}).json()["code"] == 15
        _wait(lambda: _up(base, "1") == 0.0, 10, "GPU 1 down")
        fams = _families(base)
        assert _gpu_families(fams, "1") == {"llm_gpu_up"}  # nothing stale for the lost GPU
        assert _gpu_families(fams, "0") >= ALWAYS  # the other one still served
        up = next(s for s in fams["llm_gpu_up"] if s.labels["gpu"] == "1")
        was = next(s for s in before["llm_gpu_up"] if s.labels["gpu"] == "1")
        assert up.labels["uuid"] == was.labels["uuid"]  # under the identity last read
        assert _value(fams, "llm_exporter_source_up", source="gpu") == 1.0  # a lost GPU is no source error
        assert _value(fams, "llm_exporter_collect_errors", source="gpu") is None
        assert _value(fams, "llm_gpu_fault", gpu="1", fault="lost", target="t") == 1.0
        assert _value(fams, "llm_unhealthy_gpus", target="t") == 1.0
        diagnosis = httpx.get(base + "/api/v1/diagnosis", timeout=5).json()
        assert diagnosis["status"] == "unhealthy"
        target = diagnosis["targets"]["t"]
        assert target["status"] == "unhealthy"
        faults = [(f["gpu"], f["fault"], f["action"]) for f in target["gpu_faults"]]
        assert faults == [("1", "lost", "check")], target["gpu_faults"]
        assert "GPU 1" in target["unhealthy_because"][0] and diagnosis["gpu_faults_unassigned"] == []
        assert _doctor(base) == 4

        # 2. It stays lost: NVML re-initialised after 1 s, then 2 s later; it comes back while the
        # exporter waits 4 s for the third, and shows only then.
        _wait(lambda: sum(REINIT in m for _, m in _log(stderr)) >= 2, 15, "two re-initialisations")
        assert _post(twin + "/sim/gpu/1/recover").json()["gpus"] == [1]
        _wait(lambda: _up(base, "1") == 1.0, 15, "GPU 1 back")
        log = _log(stderr)
        lost_at = [t for t, m in log if "GPU 1 (" in m and "lost: NVMLError_GpuIsLost(15)" in m]
        reinits = [t for t, m in log if REINIT in m]
        assert len(lost_at) == 1, log  # said once, not every cycle or every re-initialisation
        assert len(reinits) == 3, log
        gaps = [b - a for a, b in zip([lost_at[0], *reinits], reinits, strict=False)]
        # Lower bounds only (a loaded machine makes a gap longer, never shorter): 1, 2, 4 s.
        assert [round(g, 1) >= 0.95 * RETRY_S * 2**i for i, g in enumerate(gaps)] == [True] * 3, gaps

        # 3. Recovered: its series back, the diagnosis as before, doctor back to its code.
        fams = _families(base)
        assert _gpu_families(fams, "1") >= ALWAYS
        assert _value(fams, "llm_unhealthy_gpus", target="t") == 0.0
        assert _value(fams, "llm_gpu_fault", gpu="1") is None
        diagnosis = httpx.get(base + "/api/v1/diagnosis", timeout=5).json()
        assert diagnosis["status"] != "unhealthy" and diagnosis["targets"]["t"]["gpu_faults"] == []
        assert _doctor(base) == normal

        # 4. A field becomes unsupported: omitted, said once, the GPU up; it stays out until NVML is
        # re-initialised, as the NVML source asks an absent field again only then.
        _post(twin + "/sim/gpu/0/fault", {"kind": "unsupported_field", "field": "power_watts"})
        _wait(lambda: _value(_families(base), "llm_gpu_power_watts", gpu="0") is None, 10, "power omitted")
        fams = _families(base)
        assert _value(fams, "llm_gpu_up", gpu="0") == 1.0 and _value(fams, "llm_gpu_power_watts", gpu="1") is not None
        _post(twin + "/sim/gpu/0/recover")
        cycles = _value(_families(base), "llm_exporter_collections")
        _wait(lambda: _value(_families(base), "llm_exporter_collections") >= cycles + 3, 10, "three more cycles")
        assert _value(_families(base), "llm_gpu_power_watts", gpu="0") is None

        # 5. The driver goes: every GPU lost, then the re-initialisation fails: a source error by reason,
        # and the GPUs stay lost in the diagnosis.
        _post(twin + "/sim/gpu/all/fault", {"kind": "nvml_error", "code": 9})
        _wait(lambda: _value(_families(base), "llm_exporter_source_up", source="gpu") == 0.0, 10, "source down")
        fams = _families(base)
        assert _value(fams, "llm_exporter_collect_errors", source="gpu", reason="driver_not_loaded") >= 1
        assert not fams.get("llm_gpu_up")  # as --gpu-backend nvml: an init failure has no GPU series
        # ... but the GPUs it read before count as lost: the diagnosis is unhealthy, not HEALTHY for
        # want of GPU series (gpu_faults.SOURCE_LOST_REASONS).
        diagnosis = httpx.get(base + "/api/v1/diagnosis", timeout=5).json()
        faults = sorted((f["gpu"], f["fault"]) for f in diagnosis["targets"]["t"]["gpu_faults"])
        assert diagnosis["status"] == "unhealthy" and faults == [("0", "lost"), ("1", "lost")], diagnosis
        assert _doctor(base) == 4
        _post(twin + "/sim/gpu/all/recover")
        _wait(lambda: _value(_families(base), "llm_exporter_source_up", source="gpu") == 1.0, 15, "source back")
        fams = _families(base)
        assert _up(base, "0") == 1.0 and _up(base, "1") == 1.0
        assert _value(fams, "llm_gpu_power_watts", gpu="0") is not None  # asked again after the re-init
        log = _log(stderr)
        assert sum("power_watts not available, series omitted" in m for _, m in log) == 1, log
        assert sum("source gpu failing: driver_not_loaded" in m for _, m in log) == 1, log
        stderr.seek(0)
        assert "Traceback" not in stderr.read().decode()


@pytest.mark.e2e
def test_demo_through_gpu_loss_and_recovery() -> None:
    """`llm-exporter demo` reads its twins in process: a fault posted to its twin's /sim/gpu shows
    the same way, and the GPU comes back at the re-initialisation after it recovers."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}", "--interval", INTERVAL,
               "--gpus", "2", "--no-probe", "--gpu-retry-interval", f"{RETRY_S:g}s"]
    with tempfile.TemporaryFile() as stdout:
        process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            _wait(lambda: _up(base, "1") == 1.0, 30, "the demo serving GPU 1")
            stdout.seek(0)
            found = re.search(r"twin 0 +(http://127\.0\.0\.1:[0-9]+)/metrics", stdout.read().decode())
            assert found, "the banner names the twin"
            twin = found.group(1)
            assert _post(twin + "/sim/gpu/1/fault", {"kind": "lost"}).json()["gpus"] == [1]
            _wait(lambda: _up(base, "1") == 0.0, 10, "GPU 1 down")
            fams = _families(base)
            assert _gpu_families(fams, "1") == {"llm_gpu_up"} and _gpu_families(fams, "0") >= ALWAYS
            assert _value(fams, "llm_gpu_fault", gpu="1", fault="lost", target="demo-0") == 1.0
            assert _value(fams, "llm_exporter_source_up", source="gpu") == 1.0
            assert httpx.get(base + "/api/v1/diagnosis", timeout=5).json()["status"] == "unhealthy"
            assert _doctor(base) == 4
            _post(twin + "/sim/gpu/1/recover")
            _wait(lambda: _up(base, "1") == 1.0, 15, "GPU 1 back")
            fams = _families(base)
            assert _gpu_families(fams, "1") >= ALWAYS and _value(fams, "llm_gpu_fault", gpu="1") is None
            assert _doctor(base) != 4
        finally:
            stop_process(process)
