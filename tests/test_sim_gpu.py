"""SimGpuSource: the simulated GPU backend speaks the NVML source's families and labels."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from exporter.catalog import FAMILIES, family_of
from exporter.simulator import Twin, TwinConfig
from exporter.simulator.gpu import CLOCK_EVENT_REASONS
from exporter.sources.base import SourceError
from exporter.sources.gpu.sim import SimGpuSource

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
    twin = _twin()
    doc = json.dumps(twin.gpu_state())

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "ok":
            assert request.url.path == "/sim/gpu"
            return httpx.Response(200, text=doc)
        if request.url.host == "bad":
            return httpx.Response(200, text="[1, 2]")
        if request.url.host == "garbled":
            return httpx.Response(200, text='{"gpus": [{"index": 0}]}')
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(503)

    def client() -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(handler))

    data = _collect(SimGpuSource("http://ok:8000/", client=client()))
    assert {s.name for s in data.samples} >= {"llm_gpu_up", "llm_gpu_power_watts"}
    for host, reason in (("bad", "parse"), ("garbled", "parse"), ("down", "connection"), ("err", "http_status")):
        with pytest.raises(SourceError) as exc:
            _collect(SimGpuSource(f"http://{host}:8000", client=client()))
        assert exc.value.reason == reason


def test_catalog_has_the_gpu_families() -> None:
    assert set(FAMILIES) >= EXPECTED
