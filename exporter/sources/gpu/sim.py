"""Simulated GPUs (`--gpu-backend sim`): what the digital twin's step-by-step model implies,
exported under the same families and labels as the NVML source.

Reads one or more twins, in process (anything with `gpu_state() -> dict`, such as
exporter.simulator.Twin) or over HTTP (`GET <twin url>/sim/gpu`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from exporter.config import redact_url
from exporter.snapshot import Labels, Sample, make_labels
from exporter.sources.base import SourceData, SourceError

SIM_DRIVER_VERSION = "sim"

# /sim/gpu field -> family (a plain gauge or counter per GPU).
_SCALARS: tuple[tuple[str, str], ...] = (
    ("utilization_ratio", "llm_gpu_utilization_ratio"),
    ("memory_used_bytes", "llm_gpu_memory_used_bytes"),
    ("memory_total_bytes", "llm_gpu_memory_total_bytes"),
    ("power_watts", "llm_gpu_power_watts"),
    ("power_limit_watts", "llm_gpu_power_limit_watts"),
    ("energy_joules_total", "llm_gpu_energy_joules_total"),
    ("temperature_celsius", "llm_gpu_temperature_celsius"),
    ("sm_clock_hertz", "llm_gpu_sm_clock_hertz"),
    ("sm_clock_max_hertz", "llm_gpu_sm_clock_max_hertz"),
    ("memory_clock_hertz", "llm_gpu_memory_clock_hertz"),
    ("memory_clock_max_hertz", "llm_gpu_memory_clock_max_hertz"),
    ("dram_bandwidth_utilization_ratio", "llm_gpu_dram_bandwidth_utilization_ratio"),
    ("sm_active_ratio", "llm_gpu_sm_active_ratio"),
    ("tensor_active_ratio", "llm_gpu_tensor_active_ratio"),
)


class GpuStateProvider(Protocol):
    def gpu_state(self) -> Mapping[str, Any]: ...


def _pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10 & 0xFF:02X}:00.0"


def samples_from_state(state: Mapping[str, Any]) -> list[Sample]:
    """Samples for every GPU in one /sim/gpu document. Raises KeyError/TypeError/ValueError when
    the document is malformed (the caller reports that as a parse failure)."""
    out: list[Sample] = []
    for g in state["gpus"]:
        base: Labels = make_labels({"gpu": str(int(g["index"])), "uuid": str(g["uuid"]), "name": str(g["name"])})
        out.append(Sample("llm_gpu_up", base, 1.0))
        out.append(Sample("llm_gpu_info", make_labels(base + (
            ("driver_version", SIM_DRIVER_VERSION), ("cuda_version", SIM_DRIVER_VERSION),
            ("pci_bus_id", _pci_bus_id(int(g["index"]))), ("mig_mode", "disabled"))), 1.0))
        for key, family in _SCALARS:
            out.append(Sample(family, base, float(g[key])))
        for reason, active in g["clock_event_reasons"].items():
            out.append(Sample("llm_gpu_clock_event_active", make_labels(base + (("reason", reason),)),
                              float(active)))
        pcie = g["pcie"]
        for state_name, gen_key, width_key in (("current", "gen_current", "width_current"),
                                               ("max", "gen_max", "width_max")):
            lab = make_labels(base + (("state", state_name),))
            out.append(Sample("llm_gpu_pcie_link_generation", lab, float(pcie[gen_key])))
            out.append(Sample("llm_gpu_pcie_link_width", lab, float(pcie[width_key])))
        out.append(Sample("llm_gpu_pcie_tx_bytes_per_second", base, float(pcie["tx_bytes_per_second"])))
        out.append(Sample("llm_gpu_pcie_rx_bytes_per_second", base, float(pcie["rx_bytes_per_second"])))
        nvlink = g.get("nvlink")
        if nvlink:  # a GPU without NVLink gets no NVLink series, not a made-up zero
            out.append(Sample("llm_gpu_nvlink_tx_bytes_per_second", base, float(nvlink["tx_bytes_per_second"])))
            out.append(Sample("llm_gpu_nvlink_rx_bytes_per_second", base, float(nvlink["rx_bytes_per_second"])))
    return out


class SimGpuSource:
    """Source "gpu" backed by twins. `targets`: twin objects and/or twin base URLs."""

    def __init__(self, targets: Sequence[GpuStateProvider | str] | GpuStateProvider | str, *,
                 timeout_s: float = 2.0, name: str = "gpu", client: httpx.AsyncClient | None = None) -> None:
        if isinstance(targets, str) or hasattr(targets, "gpu_state"):
            targets = [targets]  # type: ignore[list-item]
        self.targets: list[GpuStateProvider | str] = list(targets)  # type: ignore[arg-type]
        if not self.targets:
            raise ValueError("SimGpuSource needs at least one twin or twin URL")
        self.name = name
        self.timeout_s = timeout_s
        self._client = client
        self._own_client = client is None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        return self._client

    async def _fetch(self, url: str) -> Mapping[str, Any]:
        endpoint = url.rstrip("/") + "/sim/gpu"
        shown = redact_url(endpoint)  # error messages reach logs and /api/v1/snapshot
        try:
            resp = await self._http().get(endpoint, timeout=self.timeout_s)
        except httpx.TimeoutException as e:
            raise SourceError("timeout", f"{shown}: no answer within {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise SourceError("connection", f"{shown}: {type(e).__name__}") from e
        if resp.status_code != 200:
            raise SourceError("http_status", f"{shown}: HTTP {resp.status_code}")
        try:
            doc = resp.json()
        except ValueError as e:
            raise SourceError("parse", f"{shown}: not JSON: {e}") from e
        if not isinstance(doc, dict):
            raise SourceError("parse", f"{shown}: expected a JSON object")
        return doc

    async def collect(self) -> SourceData:
        samples: list[Sample] = []
        names: list[str] = []
        uuids: list[str] = []
        for target in self.targets:
            state = await self._fetch(target) if isinstance(target, str) else target.gpu_state()
            try:
                samples.extend(samples_from_state(state))
                names.extend(str(g["name"]) for g in state["gpus"])
                uuids.extend(str(g["uuid"]) for g in state["gpus"])
            except (KeyError, TypeError, ValueError) as e:
                raise SourceError("parse", f"malformed twin GPU state: {e!r}") from e
        attrs = {
            "backend": "sim",
            "gpus": str(len(names)),
            "names": ",".join(names),
            "uuids": ",".join(uuids),
            "state": "ok",
            "driver_version": SIM_DRIVER_VERSION,
            "cuda_version": SIM_DRIVER_VERSION,
        }
        return SourceData(tuple(samples), attrs)

    async def close(self) -> None:
        if self._client is not None and self._own_client:
            await self._client.aclose()
        self._client = None
