"""The simulated host (`--host-backend sim`): what the digital twin's host model says /proc and /sys
would show on its machine, exported under the same families and labels as HostSource.

Reads one twin, in process (anything with `host_state() -> dict`, such as exporter.simulator.Twin)
or over HTTP (`GET <twin url>/sim/host`, with the engine scrape's client: bounded time and size,
no redirects or environment). The twin is the engine, so the engine process is always "found";
the NUMA mismatch goes through the same rule as HostSource's (host_process.numa_mismatch), and the
network links' utilization through the same rate code (host_net.ByteRates, kept across cycles). With
several twins on one demo host, the first one's host is shown: the engine the exporter would be
the sidecar of (docs/simulator.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from exporter.catalog.base import MAX_VALUE
from exporter.httpclient import HttpClient, get_json_object
from exporter.redact import redact_url
from exporter.snapshot import Sample
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.host_common import cpu_summary, sample
from exporter.sources.host_net import (
    COUNTERS,
    KINDS,
    MAX_DEVICE_NAME,
    MAX_NETWORK_LINKS,
    ByteRates,
    LinkReading,
    network_samples,
    valid_name,
)
from exporter.sources.host_pci import NumaNode
from exporter.sources.host_proc import parse_cpulist
from exporter.sources.host_process import numa_mismatch

__all__ = ["SimHostSource", "samples_from_host_state"]

# A /sim/host document is a few KB (one number per CPU); this bounds a wrong URL's page.
MAX_SIM_HOST_BYTES = 1024 * 1024
PSI_RESOURCES = ("cpu", "memory", "io")
PSI_WINDOWS = (("avg10", "10s"), ("avg60", "60s"), ("avg300", "300s"))


class HostStateProvider(Protocol):
    def host_state(self) -> Mapping[str, Any]: ...


MAX_COUNTER = MAX_VALUE  # the catalogue's domain of every value (1e18)


def network_readings(links: Any) -> list[LinkReading]:
    """The twin's `network` list, validated: at most MAX_NETWORK_LINKS links with distinct device
    names a label can carry, a known kind, finite non-negative counters, a positive rate or null.
    Raises ValueError/TypeError/KeyError otherwise (the source then fails with reason parse)."""
    if not isinstance(links, list):
        raise TypeError("network is not a list")
    if len(links) > MAX_NETWORK_LINKS:
        raise ValueError(f"network lists {len(links)} links, more than {MAX_NETWORK_LINKS}")
    out = []
    seen = set()
    for link in links:
        device = link["device"]
        if not isinstance(device, str) or not valid_name(device) or device in seen:
            raise ValueError(f"network device {str(device)[:MAX_DEVICE_NAME]!r} is not a valid, distinct name")
        seen.add(device)
        kind = link["kind"]
        if kind not in KINDS:
            raise ValueError(f"network kind {str(kind)[:20]!r} is not one of {', '.join(KINDS)}")
        up, engine, node = link["up"], link["engine"], link.get("numa_node")
        if not isinstance(up, bool) or not isinstance(engine, bool):
            raise TypeError("network up and engine must be true or false")
        if node is not None and (isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < 4096):
            raise ValueError("network numa_node must be a node number or null")
        speed = link.get("speed_bytes_per_s")
        if speed is not None:
            speed = _finite(speed, "speed_bytes_per_s", 1e15)
            if speed <= 0:
                raise ValueError("network speed_bytes_per_s must be positive or null")
        counters = {key: int(_finite(link[key], key, MAX_COUNTER)) for key in COUNTERS}
        out.append(LinkReading(device, kind, node, engine, up, speed, counters))
    return out


def _finite(value: Any, key: str, ceiling: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"network {key} is not a number")
    number = float(value)
    if not math.isfinite(number) or not 0 <= number <= ceiling:
        raise ValueError(f"network {key} out of range")
    return number


def samples_from_host_state(state: Mapping[str, Any], rates: ByteRates | None = None,
                            now: float | None = None) -> tuple[list[Sample], tuple[str, ...]]:
    """The samples for one /sim/host document and the GPUs' PCI addresses. Raises
    KeyError/TypeError/ValueError when the document is malformed (the caller reports that as a
    parse failure). `rates` carries the links' byte counts from the last document (the
    utilization needs two); `now` is the document's time in seconds (default: its twin_time_s)."""
    out: list[Sample] = []
    cpus = [float(b) for b in state["cpus"]]
    out.extend(Sample("llm_host_cpu_busy_ratio", (("cpu", str(i)),), b) for i, b in enumerate(cpus))
    out.append(Sample("llm_host_cpu_busy_ratio", (("cpu", "all"),), float(state["cpu_all"])))
    out.extend(cpu_summary(cpus, cpus=len(cpus)))
    l1, l5, l15 = (float(v) for v in state["load"])
    out += [sample("llm_host_load1", l1), sample("llm_host_load5", l5), sample("llm_host_load15", l15)]
    out.append(sample("llm_host_memory_total_bytes", float(state["memory_total_bytes"])))
    out.append(sample("llm_host_memory_available_bytes", float(state["memory_available_bytes"])))
    nodes = []
    for n in state["numa_nodes"]:
        node = int(n["node"])
        nodes.append(NumaNode(node=node, cpus=parse_cpulist(str(n["cpus"])), total_bytes=int(n["memory_total_bytes"]),
                              free_bytes=int(n["memory_free_bytes"])))
        out.append(sample("llm_host_numa_memory_total_bytes", float(n["memory_total_bytes"]), node=str(node)))
        out.append(sample("llm_host_numa_memory_free_bytes", float(n["memory_free_bytes"]), node=str(node)))
    pressure = state["pressure"]
    for resource in PSI_RESOURCES:
        psi = pressure[resource]
        for key, window in PSI_WINDOWS:
            out.append(Sample("llm_host_pressure_waiting_ratio", (("resource", resource), ("window", window)),
                              float(psi[key])))
        out.append(sample("llm_host_pressure_waiting_seconds_total", float(psi["total_seconds"]), resource=resource))
    addresses = []
    gpu_nodes: dict[str, int] = {}
    for g in state["gpus"]:
        pci = str(g["pci"])
        addresses.append(pci)
        for name, state_name, key in (
            ("llm_host_gpu_pcie_link_speed_gts", "current", "current_link_speed_gts"),
            ("llm_host_gpu_pcie_link_speed_gts", "max", "max_link_speed_gts"),
            ("llm_host_gpu_pcie_link_width", "current", "current_link_width"),
            ("llm_host_gpu_pcie_link_width", "max", "max_link_width"),
        ):
            out.append(sample(name, float(g[key]), pci=pci, state=state_name))
        if g.get("numa_node") is not None:
            gpu_nodes[pci] = int(g["numa_node"])
            out.append(sample("llm_host_gpu_numa_node", float(g["numa_node"]), pci=pci))
    engine = state["engine"]
    out.append(sample("llm_engine_process_found", 1))
    out.append(sample("llm_engine_process_cpu_seconds_total", float(engine["cpu_seconds_total"])))
    out.append(sample("llm_engine_process_busiest_thread_cpu_ratio", float(engine["busiest_thread_cpu_ratio"])))
    out.append(sample("llm_engine_process_threads", float(engine["threads"])))
    out.append(sample("llm_engine_process_resident_memory_bytes", float(engine["resident_memory_bytes"])))
    used = engine.get("gpu_pci_addresses")
    wanted = [gpu_nodes[p] for p in (used if used is not None else addresses) if p in gpu_nodes]
    mismatch = numa_mismatch(parse_cpulist(str(engine["cpus_allowed"])), parse_cpulist(str(state["online_cpus"])),
                             tuple(nodes), wanted)
    if mismatch is not None:
        out.append(sample("llm_engine_numa_mismatch", int(mismatch)))
    if state.get("network") is not None:
        readings = network_readings(state["network"])
        if now is None:
            now = float(state.get("twin_time_s", 0.0))
        out += network_samples(readings, rates if rates is not None else ByteRates(), now)
    return out, tuple(addresses)


class SimHostSource:
    """Source "host" backed by a twin: a twin object or a twin base URL. `fetch_timeout_s`
    bounds the GET; the collection as a whole is bounded by the interval."""

    name = "host"
    kind = SourceKind.HOST
    timeout_s: float | None = None

    def __init__(self, target: HostStateProvider | str, *, fetch_timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.fetch_timeout_s = fetch_timeout_s
        self._client: HttpClient | None = None
        self._clock = clock  # the utilization's time base when the twin sends no twin_time_s
        self._rates = ByteRates()  # the links' byte counts of the last document

    def engine_pids(self) -> frozenset[int]:
        """The twin's engine has no pid on this machine (HostSource's interface, for the GPU source)."""
        return frozenset()

    def _endpoint(self, url: str) -> str:
        return url.rstrip("/") + "/sim/host"

    async def _fetch(self, url: str) -> Mapping[str, Any]:
        endpoint = self._endpoint(url)
        shown = redact_url(endpoint)  # error messages reach logs and /api/v1/snapshot
        if self._client is None:
            try:
                self._client = HttpClient(endpoint, timeout_s=self.fetch_timeout_s,
                                          headers={"Accept": "application/json"})
            except ValueError as e:
                raise SourceError("connection", str(e)) from None
        return await get_json_object(self._client, shown, MAX_SIM_HOST_BYTES)

    async def collect(self) -> SourceData:
        target = self.target
        state = await self._fetch(target) if isinstance(target, str) else target.host_state()
        try:
            twin_time = state.get("twin_time_s")
            now = float(twin_time) if isinstance(twin_time, int | float) and not isinstance(twin_time, bool) \
                else self._clock()
            samples, addresses = samples_from_host_state(state, self._rates, now)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            where = f" from {redact_url(self._endpoint(target))}" if isinstance(target, str) else ""
            raise SourceError("parse", f"malformed twin host state{where}: {e!r}") from None
        return SourceData(tuple(samples), {"backend": "sim", "gpu_pci_addresses": ",".join(addresses)})

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
