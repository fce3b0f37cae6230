"""The host source: CPU, load, memory, NUMA, PSI, the GPUs' PCIe links and the network links
(NICs, RDMA ports) from sysfs, and the engine process, read straight from /proc and /sys under
configurable roots (node_exporter's --path.procfs/--path.sysfs) so the tests run on fixture trees.

A missing file omits its series, never a made-up zero; it is logged once when it goes missing and
once when it comes back, and the source stays up. Rates (CPU busy, busiest thread, link utilization) need two
reads: the first cycle omits them. Parsers live in host_proc.py, sysfs readers in host_pci.py,
the process finder in host_process.py, the engine's cross-cycle state in host_engine.py, the
network links in host_net.py, the fds kept open between cycles in host_files.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from exporter.snapshot import Sample
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.host_common import HostOptions, PresenceLog, cpu_summary
from exporter.sources.host_common import sample as _sample
from exporter.sources.host_engine import EngineTracker
from exporter.sources.host_files import HeldFiles
from exporter.sources.host_net import NetworkTracker
from exporter.sources.host_pci import (
    LinkCapability,
    NumaNode,
    PciLink,
    capability_of,
    discover_gpus,
    read_numa_nodes,
    read_pci_link,
)
from exporter.sources.host_proc import (
    CpuTicks,
    busy_ratios,
    parse_loadavg,
    parse_meminfo,
    parse_pressure,
    parse_stat_cpus,
    parse_uptime,
)

__all__ = ["HostOptions", "HostSource"]

PSI_RESOURCES = ("cpu", "memory", "io")
MEMINFO_KEYS = ("MemTotal", "MemAvailable")
T = TypeVar("T")


class HostSource:
    """Source "host". `collect` runs the blocking reads in a worker thread."""

    name = "host"
    kind = SourceKind.HOST
    timeout_s: float | None = None

    def __init__(self, options: HostOptions | None = None, *, clock: Callable[[], float] = time.monotonic):
        self._opts = options or HostOptions()
        # Schedules searches and rereads (engine, tree, thread window, GPUs, link capability);
        # rates use /proc's own counters.
        self._clock = clock
        self._lock = threading.Lock()  # a timed-out collect may still run when the next starts
        self._presence = PresenceLog()
        self._files = HeldFiles()
        self._prev_cpus: dict[str, CpuTicks] = {}
        self._gpus: tuple[str, ...] = ()
        self._next_gpu_search = float("-inf")
        # What each reported GPU's slot offers (max speed and width, NUMA node): read again only
        # every search interval, unlike the current speed and width.
        self._capabilities: dict[str, LinkCapability] = {}
        self._next_capability_read = float("-inf")
        self._engine = EngineTracker(self._opts, clock, self._presence, self._files.read)
        self._network = NetworkTracker(self._opts, clock, self._presence)

    @property
    def options(self) -> HostOptions:
        return self._opts

    @property
    def engine(self) -> EngineTracker:
        return self._engine

    @property
    def network(self) -> NetworkTracker:
        return self._network

    @property
    def held_files(self) -> frozenset[str]:
        """Paths of the files kept open between cycles."""
        return self._files.held | self._engine.held_files | self._network.held_files

    def engine_pids(self) -> frozenset[int]:
        """Pids of the engine process tree found in the last cycle (empty when not found), for
        the GPU source to attribute GPU memory to the engine."""
        return self._engine.pids

    async def collect(self) -> SourceData:
        return await asyncio.to_thread(self.collect_sync)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Closes the files kept open; a later collect opens them again."""
        with self._lock:
            self._files.close()
            self._engine.close()
            self._network.close()

    def collect_sync(self) -> SourceData:
        """One cycle, blocking; `collect` runs it off the event loop."""
        if not os.path.isdir(self._opts.proc_root):
            raise SourceError("procfs_missing", f"proc root {self._opts.proc_root} is not a directory")
        with self._lock:
            try:
                samples, links = self._collect_locked()
            finally:
                self._files.close_unread()  # what this cycle did not read: a gone pid, a gone GPU
        attrs = {"gpu_pci_addresses": ",".join(link.address for link in links),
                 "network_devices": ",".join(link.device for link in self._network.links),
                 # availability lines not logged since start (over the PresenceLog's budget)
                 "log_lines_suppressed": str(self._presence.budget.suppressed)}
        return SourceData(samples=tuple(samples), attrs=attrs)

    def _collect_locked(self) -> tuple[list[Sample], tuple[PciLink, ...]]:
        nodes = read_numa_nodes(self._opts.sys_root, self._files.read)
        self._presence.note("NUMA nodes in sysfs", bool(nodes))
        links = self._read_links()
        samples = [
            *self._cpu(),
            *self._load(),
            *self._memory(),
            *self._numa(nodes),
            *self._pressure(),
            *self._gpu_links(links),
            *self._network.samples(links),
        ]
        if self._opts.has_engine_selector:
            uptime = self._read(parse_uptime, "uptime")
            samples += self._engine.samples(nodes, links, uptime)
        return samples, links

    # --- host ------------------------------------------------------------------------------

    def _read(self, parser: Callable[[str], T], *parts: str) -> T | None:
        """Reads and parses one /proc file; None (series omitted, logged once) when the file is
        missing or does not parse, so one odd file never fails the whole source."""
        path = os.path.join(self._opts.proc_root, *parts)
        text = self._files.read(path)
        if not self._presence.note(path, text is not None) or text is None:  # (the note is False when None)
            return None
        try:
            parsed = parser(text)
        except (ValueError, IndexError, KeyError):
            parsed = None
        self._presence.note(f"{path} (parsed)", parsed is not None)
        return parsed

    def _cpu(self) -> list[Sample]:
        current = self._read(parse_stat_cpus, "stat")
        if current is None:
            self._prev_cpus = {}  # the next read starts a fresh delta, not one across the gap
            return []
        ratios = busy_ratios(self._prev_cpus, current)
        self._prev_cpus = current
        # One sample per CPU, a few hundred on a GPU server: the one-label tuple is built here
        # rather than sorted by labels_of.
        out = [Sample("llm_host_cpu_busy_ratio", (("cpu", cpu),), r) for cpu, r in ratios.items()]
        per_cpu = [r for cpu, r in ratios.items() if cpu != "all"]
        return out + cpu_summary(per_cpu, cpus=len(current) - ("all" in current))

    def _load(self) -> list[Sample]:
        load = self._read(parse_loadavg, "loadavg")
        if load is None:
            return []
        l1, l5, l15 = load
        return [_sample("llm_host_load1", l1), _sample("llm_host_load5", l5), _sample("llm_host_load15", l15)]

    def _memory(self) -> list[Sample]:
        info = self._read(_host_meminfo, "meminfo")
        if info is None:
            return []
        out = []
        if "MemTotal" in info:
            out.append(_sample("llm_host_memory_total_bytes", info["MemTotal"]))
        if "MemAvailable" in info:  # absent before Linux 3.14
            out.append(_sample("llm_host_memory_available_bytes", info["MemAvailable"]))
        return out

    def _numa(self, nodes: tuple[NumaNode, ...]) -> list[Sample]:
        out = []
        for n in nodes:
            if n.total_bytes is not None:
                out.append(_sample("llm_host_numa_memory_total_bytes", n.total_bytes, node=str(n.node)))
            if n.free_bytes is not None:
                out.append(_sample("llm_host_numa_memory_free_bytes", n.free_bytes, node=str(n.node)))
        return out

    def _pressure(self) -> list[Sample]:
        out = []
        for resource in PSI_RESOURCES:
            psi = self._read(parse_pressure, "pressure", resource)
            if psi is None:
                continue
            for window, value in (("10s", psi.avg10), ("60s", psi.avg60), ("300s", psi.avg300)):
                labels = (("resource", resource), ("window", window))  # in label order: no sort
                out.append(Sample("llm_host_pressure_waiting_ratio", labels, value))
            out.append(_sample("llm_host_pressure_waiting_seconds_total", psi.total_seconds, resource=resource))
        return out

    # --- GPUs' PCI devices -----------------------------------------------------------------

    def _gpu_addresses(self) -> tuple[str, ...]:
        if self._opts.gpu_pci_addresses is not None:
            return self._opts.gpu_pci_addresses
        # Discovery lists every PCI device, so it runs once and again only when a GPU vanished
        # or, while none is found, every search interval.
        now = self._clock()
        if not self._gpus and now >= self._next_gpu_search:
            self._gpus = discover_gpus(self._opts.sys_root)
            self._next_gpu_search = now + self._opts.search_interval_s
        return self._gpus

    def _read_links(self) -> tuple[PciLink, ...]:
        now = self._clock()
        known = self._capabilities
        if now >= self._next_capability_read:
            known = {}  # read every GPU's capability again this cycle
            self._next_capability_read = now + self._opts.search_interval_s
        links = []
        for address in self._gpu_addresses():
            link = read_pci_link(self._opts.sys_root, address, self._files.read, known.get(address))
            self._presence.note(f"PCI device {address}", link is not None)
            if link is None:
                self._gpus, self._next_gpu_search = (), float("-inf")  # rediscover next cycle
                continue
            links.append(link)
        self._capabilities = {link.address: capability_of(link) for link in links}  # GPUs still there
        return tuple(links)

    def _gpu_links(self, links: tuple[PciLink, ...]) -> list[Sample]:
        out = []
        for link in links:
            pairs = (
                ("llm_host_gpu_pcie_link_speed_gts", "current", link.current_speed_gts),
                ("llm_host_gpu_pcie_link_speed_gts", "max", link.max_speed_gts),
                ("llm_host_gpu_pcie_link_width", "current", link.current_width),
                ("llm_host_gpu_pcie_link_width", "max", link.max_width),
            )
            for name, state, value in pairs:
                if value is not None:
                    out.append(_sample(name, value, pci=link.address, state=state))
            if link.numa_node is not None:
                out.append(_sample("llm_host_gpu_numa_node", link.numa_node, pci=link.address))
        return out


def _host_meminfo(text: str) -> dict[str, int]:
    return parse_meminfo(text, MEMINFO_KEYS)
