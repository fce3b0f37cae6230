"""SimGpuSource: the simulated GPU backend speaks the NVML source's families and labels."""

from __future__ import annotations

import asyncio
import http.server
import json
import time

import pytest

from exporter.catalog import FAMILIES, family_of
from exporter.simulator import Twin, TwinConfig
from exporter.simulator.gpu import CLOCK_EVENT_REASONS
from exporter.sources.base import SourceError
from exporter.sources.gpu.sim import MAX_SIM_GPU_BYTES, SimGpuSource
from tests.support import free_port, send_body, serve_in_background

EXPECTED = {
    "llm_gpu_up", "llm_gpu_info", "llm_gpu_utilization_ratio", "llm_gpu_memory_used_bytes",
    "llm_gpu_memory_total_bytes", "llm_gpu_power_watts", "llm_gpu_power_limit_watts", "llm_gpu_energy_joules_total",
    "llm_gpu_temperature_celsius", "llm_gpu_sm_clock_hertz", "llm_gpu_sm_clock_max_hertz",
    "llm_gpu_memory_clock_hertz", "llm_gpu_clock_event_active", "llm_gpu_pcie_link_generation",
    "llm_gpu_pcie_link_width", "llm_gpu_pcie_tx_bytes_per_second", "llm_gpu_pcie_rx_bytes_per_second",
    "llm_gpu_nvlink_tx_bytes_per_second", "llm_gpu_nvlink_rx_bytes_per_second",
    "llm_gpu_dram_bandwidth_utilization_ratio", "llm_gpu_sm_active_ratio", "llm_gpu_tensor_active_ratio",
}


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
