"""Simulated GPUs (`--gpu-backend sim`): what the digital twin's step-by-step model implies,
exported under the same families and labels as the NVML source.

Reads one or more twins, in process (anything with `gpu_state() -> dict`, such as
exporter.simulator.Twin) or over HTTP (`GET <twin url>/sim/gpu`, with the engine scrape's client:
bounded time and size, no redirects or environment).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from exporter.redact import redact_url
from exporter.snapshot import Labels, Sample, make_labels
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.engines.http import HttpClient, get_json_object

SIM_DRIVER_VERSION = "sim"
# A /sim/gpu document is about 1.5 KB per GPU; this holds hundreds and bounds a wrong URL's page.
MAX_SIM_GPU_BYTES = 1024 * 1024

# /sim/gpu field -> family (a plain gauge or counter per GPU).
_SCALARS: tuple[tuple[str, str], ...] = (
    ("utilization_ratio", "llm_gpu_utilization_ratio"),
    ("memory_utilization_ratio", "llm_gpu_memory_utilization_ratio"),
    ("memory_used_bytes", "llm_gpu_memory_used_bytes"),
    ("memory_total_bytes", "llm_gpu_memory_total_bytes"),
    ("memory_reserved_bytes", "llm_gpu_memory_reserved_bytes"),
    ("power_watts", "llm_gpu_power_watts"),
    ("power_limit_watts", "llm_gpu_power_limit_watts"),
    ("power_default_limit_watts", "llm_gpu_power_default_limit_watts"),
    ("energy_joules_total", "llm_gpu_energy_joules_total"),
    ("temperature_celsius", "llm_gpu_temperature_celsius"),
    ("sm_clock_hertz", "llm_gpu_sm_clock_hertz"),
    ("sm_clock_max_hertz", "llm_gpu_sm_clock_max_hertz"),
    ("memory_clock_hertz", "llm_gpu_memory_clock_hertz"),
    ("memory_clock_max_hertz", "llm_gpu_memory_clock_max_hertz"),
    ("dram_bandwidth_utilization_ratio", "llm_gpu_dram_bandwidth_utilization_ratio"),
    ("sm_active_ratio", "llm_gpu_sm_active_ratio"),
    ("sm_occupancy_ratio", "llm_gpu_sm_occupancy_ratio"),
    ("tensor_active_ratio", "llm_gpu_tensor_active_ratio"),
    ("pcie_replay_errors_total", "llm_gpu_pcie_replay_errors_total"),
)
# Fields a card may not have (null in /sim/gpu): omitted then, as the NVML source omits them.
_OPTIONAL_SCALARS: tuple[tuple[str, str], ...] = (
    ("memory_temperature_celsius", "llm_gpu_memory_temperature_celsius"),  # GDDR cards: no sensor
)
_REMAPPED_STATES = ("correctable", "uncorrectable", "pending", "failed")


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
        for key, family in _OPTIONAL_SCALARS:
            if g.get(key) is not None:
                out.append(Sample(family, base, float(g[key])))
        # As NVML with no engine PIDs configured: the memory of every compute process on the GPU.
        processes = g["processes"]
        if processes:
            out.append(Sample("llm_gpu_engine_memory_used_bytes", base,
                              float(sum(float(p["used_gpu_memory_bytes"]) for p in processes))))
        ecc = g.get("ecc_errors")
        if ecc is not None:  # None: ECC off
            for kind in ("corrected", "uncorrected"):
                out.append(Sample("llm_gpu_ecc_errors_total", make_labels(base + (("type", kind),)), float(ecc[kind])))
        rows = g.get("remapped_rows")
        if rows is not None:  # None: no row remapping (GDDR cards)
            for state_name in _REMAPPED_STATES:
                out.append(Sample("llm_gpu_remapped_rows", make_labels(base + (("state", state_name),)),
                                  float(rows[state_name])))
        # A code's series appears with its first event, as the NVML source's do.
        for code, count in g["xid_errors"].items():
            out.append(Sample("llm_gpu_xid_errors_total", make_labels(base + (("xid", str(code)),)), float(count)))
        # Absent keys or nulls: a driver that does not report them, a GPU outside an NVSwitch fabric.
        if g.get("recovery_action") is not None:
            out.append(Sample("llm_gpu_recovery_action", base, float(g["recovery_action"])))
        fabric = g.get("fabric")
        if fabric:
            for key, family in (("state", "llm_gpu_fabric_state"), ("status", "llm_gpu_fabric_status"),
                                ("health", "llm_gpu_fabric_health")):
                if fabric.get(key) is not None:
                    out.append(Sample(family, base, float(fabric[key])))
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
    """Source "gpu" backed by twins. `targets`: twin objects and/or twin base URLs.
    `fetch_timeout_s` bounds each GET; the collection as a whole is bounded by the interval."""

    kind = SourceKind.GPU
    timeout_s: float | None = None

    def __init__(self, targets: Sequence[GpuStateProvider | str] | GpuStateProvider | str, *,
                 fetch_timeout_s: float = 2.0, name: str = "gpu") -> None:
        if isinstance(targets, str) or hasattr(targets, "gpu_state"):
            targets = [targets]  # type: ignore[list-item]
        self.targets: list[GpuStateProvider | str] = list(targets)  # type: ignore[arg-type]
        if not self.targets:
            raise ValueError("SimGpuSource needs at least one twin or twin URL")
        self.name = name
        self.fetch_timeout_s = fetch_timeout_s
        self._clients: dict[str, HttpClient] = {}

    async def _fetch(self, url: str) -> Mapping[str, Any]:
        endpoint = url.rstrip("/") + "/sim/gpu"
        shown = redact_url(endpoint)  # error messages reach logs and /api/v1/snapshot
        client = self._clients.get(url)
        if client is None:
            try:
                client = self._clients[url] = HttpClient(endpoint, timeout_s=self.fetch_timeout_s,
                                                         headers={"Accept": "application/json"})
            except ValueError as e:
                raise SourceError("connection", str(e)) from None
        return await get_json_object(client, shown, MAX_SIM_GPU_BYTES)

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
                where = f" from {redact_url(target.rstrip('/') + '/sim/gpu')}" if isinstance(target, str) else ""
                raise SourceError("parse", f"malformed twin GPU state{where}: {e!r}") from None
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
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()
