"""SimGpuSource: the simulated GPU backend speaks the NVML source's families and labels."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import time
from pathlib import Path

import pytest

from exporter.catalog import FAMILIES, family_of
from exporter.simulator import Twin, TwinConfig
from exporter.simulator.gpu import CLOCK_EVENT_REASONS, GpuFault
from exporter.sources.base import SourceError
from exporter.sources.gpu.sim import MAX_SIM_GPU_BYTES, SimGpuSource
from tests.support import free_port, send_body, serve_in_background

EXPECTED = {
    "llm_gpu_up", "llm_gpu_info", "llm_gpu_utilization_ratio", "llm_gpu_memory_utilization_ratio",
    "llm_gpu_memory_used_bytes", "llm_gpu_memory_total_bytes", "llm_gpu_memory_reserved_bytes",
    "llm_gpu_engine_memory_used_bytes", "llm_gpu_power_watts", "llm_gpu_power_limit_watts",
    "llm_gpu_energy_joules_total", "llm_gpu_temperature_celsius", "llm_gpu_memory_temperature_celsius",
    "llm_gpu_sm_clock_hertz", "llm_gpu_sm_clock_max_hertz", "llm_gpu_memory_clock_hertz",
    "llm_gpu_clock_event_active", "llm_gpu_pcie_link_generation", "llm_gpu_pcie_link_width",
    "llm_gpu_pcie_replay_errors_total", "llm_gpu_pcie_tx_bytes_per_second", "llm_gpu_pcie_rx_bytes_per_second",
    "llm_gpu_nvlink_tx_bytes_per_second", "llm_gpu_nvlink_rx_bytes_per_second", "llm_gpu_ecc_errors_total",
    "llm_gpu_remapped_rows", "llm_gpu_dram_bandwidth_utilization_ratio", "llm_gpu_sm_active_ratio",
    "llm_gpu_sm_occupancy_ratio", "llm_gpu_tensor_active_ratio",
}
GOLDEN = Path(__file__).parent / "golden" / "gpu"
MiB = 1 << 20


def _collect(source: SimGpuSource):
    async def go():
        try:
            return await source.collect()
        finally:
            await source.close()

    return asyncio.run(go())


def _twin(**kw) -> Twin:
    twin = Twin(TwinConfig(epoch=0.0, **kw))
    twin.fast_forward(20)
    return twin


def test_every_sample_belongs_to_a_catalogued_family_with_its_labels() -> None:
    data = _collect(SimGpuSource(_twin(gpus=2)))
    names = {s.name for s in data.samples}
    assert names >= EXPECTED
    for s in data.samples:
        fam = family_of(s.name)
        assert fam is not None, f"{s.name} is not in exporter.catalog"
        assert fam.name.startswith("llm_gpu_")
        assert {k for k, _ in s.labels} == set(fam.labels), s.name
    assert {s.label("gpu") for s in data.samples} == {"0", "1"}
    assert data.attrs["backend"] == "sim" and data.attrs["gpus"] == "2"


def test_values_follow_the_twin() -> None:
    twin = _twin(scenario="decode-heavy")
    data = _collect(SimGpuSource(twin))
    by = {(s.name, s.label("reason"), s.label("state")): s.value for s in data.samples}
    gpu = twin.gpu_state()["gpus"][0]
    assert by[("llm_gpu_utilization_ratio", "", "")] == pytest.approx(gpu["utilization_ratio"])
    assert by[("llm_gpu_dram_bandwidth_utilization_ratio", "", "")] > 0.3
    assert by[("llm_gpu_power_watts", "", "")] > 0.3 * twin.hw.gpu.tdp_watts
    assert by[("llm_gpu_memory_used_bytes", "", "")] > 0.85 * by[("llm_gpu_memory_total_bytes", "", "")]
    reasons = {s.label("reason") for s in data.samples if s.name == "llm_gpu_clock_event_active"}
    assert reasons == set(CLOCK_EVENT_REASONS)
    assert by[("llm_gpu_clock_event_active", "gpu_idle", "")] == 0.0
    assert by[("llm_gpu_pcie_link_generation", "", "max")] == 5


def _shapes(samples) -> set[tuple[str, tuple[str, ...], str]]:
    """(family, label names, value of the one extra label) of each series: what a dashboard selects on."""
    out = set()
    for name, labels in samples:
        extra = "".join(v for k, v in labels if k in ("reason", "state", "type", "xid"))
        out.add((name, tuple(sorted(k for k, _ in labels)), extra))
    return out


def _golden_series(path: Path) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    series = []
    for line in path.read_text().splitlines():
        m = re.match(r"^(llm_gpu_\w+)\{([^}]*)\}", line)
        if m:
            series.append((m.group(1), tuple(re.findall(r'(\w+)="([^"]*)"', m.group(2)))))
    return series


def test_an_h100_twin_emits_what_the_nvml_source_emits_for_an_h100() -> None:
    """Family for family, label for label, against the NVML source's golden output for a busy H100
    (tests/golden/gpu/h100__busy.metrics): no panel can have data on one backend and not the other."""
    data = _collect(SimGpuSource(_twin(gpu="NVIDIA H100 80GB HBM3")))
    sim = _shapes((s.name, s.labels) for s in data.samples)
    nvml = _shapes(_golden_series(GOLDEN / "h100__busy.metrics"))
    assert sim == nvml, {"only sim": sim - nvml, "only nvml": nvml - sim}


def test_memory_and_activity_fields_follow_the_engine() -> None:
    twin = _twin(scenario="decode-heavy")
    by = {(s.name, s.label("type") + s.label("state")): s.value for s in _collect(SimGpuSource(twin)).samples}
    total, used = by[("llm_gpu_memory_total_bytes", "")], by[("llm_gpu_memory_used_bytes", "")]
    reserved = by[("llm_gpu_memory_reserved_bytes", "")]
    assert 200 * MiB < reserved < 1024 * MiB  # a few hundred MiB for the driver and firmware
    assert used + reserved <= total
    assert by[("llm_gpu_engine_memory_used_bytes", "")] == used  # the engine holds what it preallocated
    # Memory busy share: at least the achieved bandwidth share (memory streams below its peak), at
    # most the time any kernel ran.
    busy, dram = by[("llm_gpu_memory_utilization_ratio", "")], by[("llm_gpu_dram_bandwidth_utilization_ratio", "")]
    assert dram < busy <= by[("llm_gpu_utilization_ratio", "")]
    assert 0.1 < by[("llm_gpu_sm_occupancy_ratio", "")] < by[("llm_gpu_sm_active_ratio", "")]
    assert abs(by[("llm_gpu_memory_temperature_celsius", "")] - by[("llm_gpu_temperature_celsius", "")]) < 10
    # A healthy card: every error counter present, at 0, and no XID series.
    for key in (("llm_gpu_ecc_errors_total", "corrected"), ("llm_gpu_ecc_errors_total", "uncorrected"),
                ("llm_gpu_pcie_replay_errors_total", ""), ("llm_gpu_remapped_rows", "correctable"),
                ("llm_gpu_remapped_rows", "uncorrectable"), ("llm_gpu_remapped_rows", "pending"),
                ("llm_gpu_remapped_rows", "failed")):
        assert by[key] == 0.0, key
    assert not any(name == "llm_gpu_xid_errors_total" for name, _ in by)


def test_a_gddr_card_has_no_memory_sensor_and_no_row_remapping() -> None:
    """As the NVML source on an L4 (tests/golden/gpu/l4__busy.metrics): ECC yes, HBM sensor and
    remapped rows no."""
    names = {s.name for s in _collect(SimGpuSource(_twin(gpu="NVIDIA L4", model="qwen2.5-7b"))).samples}
    assert "llm_gpu_memory_temperature_celsius" not in names
    assert "llm_gpu_remapped_rows" not in names
    assert {"llm_gpu_ecc_errors_total", "llm_gpu_pcie_replay_errors_total", "llm_gpu_memory_reserved_bytes"} <= names


def _errors(twin: Twin) -> dict[tuple[str, str], float]:
    return {(s.name, s.label("type") + s.label("state") + s.label("xid")): s.value
            for s in _collect(SimGpuSource(twin)).samples
            if s.name in ("llm_gpu_xid_errors_total", "llm_gpu_ecc_errors_total", "llm_gpu_remapped_rows",
                          "llm_gpu_pcie_replay_errors_total")}


def test_the_faults_scenario_injects_xid_ecc_row_remap_and_replays_early() -> None:
    """Within 25 s of twin time (so within 30 s of `llm-exporter demo --scenario faults`): a warning
    XID (13, twice), a critical one (48, the double-bit ECC event) with the uncorrected ECC error it
    reports, a pending row remap (XID 63) and PCIe replays; traffic keeps flowing."""
    twin = Twin(TwinConfig(scenario="faults", epoch=0.0))
    twin.fast_forward(3)
    assert _errors(twin)[("llm_gpu_ecc_errors_total", "uncorrected")] == 0
    assert not any(name == "llm_gpu_xid_errors_total" for name, _ in _errors(twin))
    twin.fast_forward(22)
    errors = _errors(twin)
    assert {k[1]: v for k, v in errors.items() if k[0] == "llm_gpu_xid_errors_total"} == {"13": 2, "48": 1, "63": 1}
    assert errors[("llm_gpu_ecc_errors_total", "uncorrected")] == 1
    assert errors[("llm_gpu_ecc_errors_total", "corrected")] == 5
    assert errors[("llm_gpu_remapped_rows", "pending")] == 1
    assert errors[("llm_gpu_remapped_rows", "uncorrectable")] == 1
    assert errors[("llm_gpu_remapped_rows", "failed")] == 0
    assert errors[("llm_gpu_pcie_replay_errors_total", "")] > 100  # 20/s from 8 s on, while the link carries traffic
    assert twin.engine.counters.finished > 0
    # The card keeps its counters across a scenario switch and an engine restart, as a real GPU does.
    replays = errors[("llm_gpu_pcie_replay_errors_total", "")]
    twin.set_scenario("decode-heavy")
    twin.restart()
    twin.fast_forward(30)
    after = _errors(twin)
    assert {k: v for k, v in after.items() if k[0] != "llm_gpu_pcie_replay_errors_total"} == \
        {k: v for k, v in errors.items() if k[0] != "llm_gpu_pcie_replay_errors_total"}
    assert after[("llm_gpu_pcie_replay_errors_total", "")] == replays  # the healthy scenario's link replays nothing


def test_faults_are_timed_from_the_switch_into_the_scenario() -> None:
    twin = Twin(TwinConfig(scenario="decode-heavy", epoch=0.0))
    twin.fast_forward(60)
    twin.set_scenario("faults")
    twin.fast_forward(5)
    assert not any(name == "llm_gpu_xid_errors_total" for name, _ in _errors(twin))
    twin.fast_forward(10)
    assert _errors(twin)[("llm_gpu_xid_errors_total", "48")] == 1


def _health(twin: Twin) -> dict[tuple[str, str], float]:
    return {(s.name, s.label("gpu")): s.value for s in _collect(SimGpuSource(twin)).samples
            if s.name == "llm_gpu_recovery_action" or s.name.startswith("llm_gpu_fabric_")}


def test_the_faults_scenario_ends_with_the_driver_asking_for_a_gpu_reset() -> None:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: none on a healthy card, gpu_reset (1) once the row remap
    is pending at 12 s; it stays until the GPU is reset, which the twin never does."""
    twin = Twin(TwinConfig(scenario="faults", epoch=0.0))  # an H100 SXM: in an NVSwitch fabric
    twin.fast_forward(11)
    assert _health(twin) == {("llm_gpu_recovery_action", "0"): 0.0, ("llm_gpu_fabric_state", "0"): 3.0,
                             ("llm_gpu_fabric_status", "0"): 0.0, ("llm_gpu_fabric_health", "0"): 1.0}
    twin.fast_forward(2)
    assert _health(twin)[("llm_gpu_recovery_action", "0")] == 1.0
    twin.set_scenario("decode-heavy")
    twin.fast_forward(30)
    assert _health(twin)[("llm_gpu_recovery_action", "0")] == 1.0


def test_a_gpu_fault_can_take_one_gpu_out_of_the_nvlink_fabric() -> None:
    """A fabric fault on one GPU of a TP group: its state and health change, its status (only
    meaningful once registration completed) goes away, the other GPU is untouched."""
    twin = _twin(gpus=2)
    twin.gpu.set_faults((GpuFault(1.0, gpu=1, fabric_state="in_progress", fabric_health="limited_capacity"),))
    twin.fast_forward(2)
    health = _health(twin)
    assert health[("llm_gpu_fabric_state", "1")] == 2.0 and health[("llm_gpu_fabric_health", "1")] == 3.0
    assert ("llm_gpu_fabric_status", "1") not in health
    assert health[("llm_gpu_fabric_state", "0")] == 3.0 and health[("llm_gpu_fabric_status", "0")] == 0.0
    with pytest.raises(ValueError, match="not one of"):
        GpuFault(1.0, recovery_action="reboot_please")


@pytest.mark.parametrize("gpu", ["NVIDIA L4", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB"])
def test_gpus_outside_an_nvswitch_fabric_have_a_recovery_action_but_no_fabric_series(gpu: str) -> None:
    health = _health(_twin(gpu=gpu, model="qwen2.5-7b"))
    assert health == {("llm_gpu_recovery_action", "0"): 0.0}


def test_no_nvlink_series_for_a_gpu_without_nvlink() -> None:
    data = _collect(SimGpuSource(_twin(gpu="NVIDIA L4", model="qwen2.5-7b")))
    names = {s.name for s in data.samples}
    assert "llm_gpu_nvlink_tx_bytes_per_second" not in names
    assert "llm_gpu_power_watts" in names


def test_from_twin_url_and_failures() -> None:
    """Over real loopback HTTP: a twin's document is read; each way a /sim/gpu answer can be wrong
    is a failure with its reason, not an exception or a made-up GPU."""
    doc = json.dumps(_twin().gpu_state()).encode()
    pages = {"/ok/sim/gpu": (200, doc), "/bad/sim/gpu": (200, b"[1, 2]"),
             "/garbled/sim/gpu": (200, b'{"gpus": [{"index": 0}]}'), "/binary/sim/gpu": (200, b"\xff\xfe{"),
             "/huge/sim/gpu": (200, b" " * (MAX_SIM_GPU_BYTES + 1) + b"{}")}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            status, body = pages.get(self.path, (503, b"no\n"))
            send_body(self, body, status, "application/json")

        def log_message(self, *args: object) -> None:
            return

    server, base = serve_in_background(Handler)
    try:
        data = _collect(SimGpuSource(base + "/ok/"))
        assert {s.name for s in data.samples} >= {"llm_gpu_up", "llm_gpu_power_watts"}
        down = f"http://127.0.0.1:{free_port()}"
        for url, reason in ((base + "/bad", "parse"), (base + "/garbled", "parse"), (base + "/binary", "parse"),
                            (base + "/huge", "too_large"), (down, "connection"), (base + "/err", "http_status")):
            with pytest.raises(SourceError) as exc:
                _collect(SimGpuSource(url))
            assert exc.value.reason == reason, url
            assert "/sim/gpu" in exc.value.message, exc.value.message  # which twin failed
    finally:
        server.shutdown()
        server.server_close()


def test_a_twin_url_that_answers_too_late_is_a_timeout() -> None:
    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            time.sleep(1.0)
            send_body(self, b"{}", 200, "application/json")

        def log_message(self, *args: object) -> None:
            return

    server, base = serve_in_background(Slow)
    try:
        with pytest.raises(SourceError) as exc:
            _collect(SimGpuSource(base, fetch_timeout_s=0.2))
        assert exc.value.reason == "timeout"
    finally:
        server.shutdown()
        server.server_close()


def test_catalog_has_the_gpu_families() -> None:
    assert set(FAMILIES) >= EXPECTED


def test_demo_process_serves_recovery_action_and_fabric_state_with_their_help() -> None:
    """`llm-exporter demo --scenario faults` as a user runs it: on /metrics, the H100 SXM's fabric
    is registered and healthy from the start, and the recovery action turns to gpu_reset (1) when
    the scenario's row remap becomes pending (12 s of twin time, real time in the demo)."""
    import os
    import signal
    import subprocess
    import sys

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.support import wait_until

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}", "--interval", "500ms",
         "--scenario", "faults", "--gpus", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    families: dict[str, object] = {}

    def health() -> dict[tuple[str, str], float]:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        except httpx.HTTPError:
            return {}
        if response.status_code != 200:  # 503 until the first collection
            return {}
        text = response.text
        found = {}
        for fam in text_string_to_metric_families(text):
            if fam.name == "llm_gpu_recovery_action" or fam.name.startswith("llm_gpu_fabric_"):
                families[fam.name] = fam
                found.update({(s.name, s.labels["gpu"]): s.value for s in fam.samples})
        return found

    try:
        assert wait_until(lambda: health().get(("llm_gpu_fabric_state", "1")) == 3.0, timeout=60), health()
        seen = health()
        assert seen[("llm_gpu_fabric_health", "0")] == 1.0 and seen[("llm_gpu_fabric_status", "0")] == 0.0
        # GPU 0 of the TP group takes the faults; GPU 1 stays healthy.
        assert wait_until(lambda: health().get(("llm_gpu_recovery_action", "0")) == 1.0, timeout=90), health()
        assert health()[("llm_gpu_recovery_action", "1")] == 0.0
        assert "1 gpu_reset" in families["llm_gpu_recovery_action"].documentation
        assert families["llm_gpu_fabric_state"].type == "gauge"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
    assert process.returncode == 0, process.stderr.read()
