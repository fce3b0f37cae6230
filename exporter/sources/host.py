"""The host source: CPU, load, memory, NUMA, PSI, the GPUs' PCIe links from sysfs, and the engine
process, read straight from /proc and /sys under configurable roots (node_exporter's
--path.procfs/--path.sysfs) so the tests run on fixture trees.

A missing file omits its series, never a made-up zero; it is logged once when it goes missing and
once when it comes back, and the source stays up. Rates (CPU busy, busiest thread) need two
cycles: the first cycle omits them. Parsers live in host_proc.py, sysfs readers in host_pci.py,
the engine process finder in host_process.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.snapshot import Sample, labels_of
from exporter.sources.base import SourceData, SourceError
from exporter.sources.host_pci import (
    NumaNode,
    PciLink,
    discover_gpus,
    read_numa_nodes,
    read_online_cpus,
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
    read_text,
)
from exporter.sources.host_process import (
    ProcessId,
    ProcessScan,
    ThreadKey,
    busiest_thread_ratio,
    find_by_name,
    find_by_pidfile,
    find_by_port,
    identity,
    numa_mismatch,
    rescan_tree,
    scan_tree,
)

log = logging.getLogger(__name__)

PSI_RESOURCES = ("cpu", "memory", "io")


@dataclass(frozen=True, slots=True)
class HostOptions:
    """Where to read and what to look for. Engine selector precedence: pid file, then port, then
    name; with none set no engine series are exported."""

    proc_root: str = "/proc"
    sys_root: str = "/sys"
    engine_port: int | None = None
    engine_pidfile: str | None = None
    engine_process_name: str | None = None  # re.search on comm and command line
    engine_include_children: bool = True  # vLLM V1's EngineCore and TP workers are children
    # GPUs to report; None discovers NVIDIA GPUs (vendor 0x10de, class 0x0300/0x0302) in sysfs.
    gpu_pci_addresses: tuple[str, ...] | None = None
    # GPUs the engine uses, for the NUMA check; None means every reported GPU.
    engine_gpu_pci_addresses: tuple[str, ...] | None = None
    search_interval_s: float = 10.0  # how often to look again for an engine or GPUs not found
    max_processes: int = 64
    max_threads: int = 4096  # per process; bounds per-thread state and cost

    def __post_init__(self) -> None:
        if self.engine_process_name is not None:
            try:
                re.compile(self.engine_process_name)
            except re.error as exc:
                raise ValueError(f"engine_process_name is not a valid regex: {exc}") from exc
        if self.engine_port is not None and not 0 < self.engine_port < 65536:
            raise ValueError(f"engine_port out of range: {self.engine_port}")

    @property
    def has_engine_selector(self) -> bool:
        return bool(self.engine_pidfile or self.engine_port is not None or self.engine_process_name)


class _PresenceLog:
    """Logs a file or device going missing, and coming back, once per change (not every cycle)."""

    def __init__(self) -> None:
        self._state: dict[str, bool] = {}

    def note(self, key: str, present: bool) -> bool:
        before = self._state.get(key)
        if before != present:
            self._state[key] = present
            if not present:
                log.info("host: %s not available; its series are omitted", key)
            elif before is False:
                log.info("host: %s available again", key)
        return present


def _sample(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, labels_of(**labels), float(value))


class HostSource:
    """Source "host". `collect` runs the blocking reads in a worker thread."""

    name = "host"

    def __init__(self, options: HostOptions | None = None, *, clock: Callable[[], float] = time.monotonic):
        self._opts = options or HostOptions()
        self._clock = clock
        self._lock = threading.Lock()  # a timed-out collect may still run when the next starts
        self._presence = _PresenceLog()
        self._clk_tck = os.sysconf("SC_CLK_TCK")
        self._name_re = re.compile(self._opts.engine_process_name) if self._opts.engine_process_name else None
        self._prev_cpus: dict[str, CpuTicks] = {}
        self._gpus: tuple[str, ...] = ()
        self._next_gpu_search = float("-inf")
        self._engine: ProcessId | None = None
        self._next_engine_search = float("-inf")
        self._prev_threads: dict[ThreadKey, int] = {}
        self._prev_uptime: float | None = None
        self._engine_pids: frozenset[int] = frozenset()
        self._tree: tuple[int, ...] = ()  # root first, then descendants breadth first
        self._next_tree_refresh = float("-inf")

    @property
    def options(self) -> HostOptions:
        return self._opts

    def engine_pids(self) -> frozenset[int]:
        """Pids of the engine process tree found in the last cycle (empty when not found), for
        the GPU source to attribute GPU memory to the engine."""
        return self._engine_pids

    async def collect(self) -> SourceData:
        return await asyncio.to_thread(self.collect_sync)

    async def close(self) -> None:
        return None

    def collect_sync(self) -> SourceData:
        if not os.path.isdir(self._opts.proc_root):
            raise SourceError("procfs_missing", f"proc root {self._opts.proc_root} is not a directory")
        with self._lock:
            nodes = read_numa_nodes(self._opts.sys_root)
            self._presence.note("NUMA nodes in sysfs", bool(nodes))
            links = self._read_links()
            samples = [
                *self._cpu(),
                *self._load(),
                *self._memory(),
                *self._numa(nodes),
                *self._pressure(),
                *self._gpu_links(links),
                *self._engine_samples(nodes, links),
            ]
        attrs = {"gpu_pci_addresses": ",".join(link.address for link in links)}
        return SourceData(samples=tuple(samples), attrs=attrs)

    # --- host ------------------------------------------------------------------------------

    def _read(self, *parts: str) -> str | None:
        path = os.path.join(self._opts.proc_root, *parts)
        text = read_text(path)
        self._presence.note(path, text is not None)
        return text

    def _cpu(self) -> list[Sample]:
        text = self._read("stat")
        if text is None:
            self._prev_cpus = {}  # the next read starts a fresh delta, not one across the gap
            return []
        current = parse_stat_cpus(text)
        ratios = busy_ratios(self._prev_cpus, current)
        self._prev_cpus = current
        return [_sample("llm_host_cpu_busy_ratio", r, cpu=cpu) for cpu, r in ratios.items()]

    def _load(self) -> list[Sample]:
        text = self._read("loadavg")
        if text is None:
            return []
        l1, l5, l15 = parse_loadavg(text)
        return [_sample("llm_host_load1", l1), _sample("llm_host_load5", l5), _sample("llm_host_load15", l15)]

    def _memory(self) -> list[Sample]:
        text = self._read("meminfo")
        if text is None:
            return []
        info = parse_meminfo(text)
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
            text = self._read("pressure", resource)
            psi = parse_pressure(text) if text is not None else None
            if psi is None:
                continue
            for window, value in (("10s", psi.avg10), ("60s", psi.avg60), ("300s", psi.avg300)):
                out.append(_sample("llm_host_pressure_waiting_ratio", value, resource=resource, window=window))
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
        links = []
        for address in self._gpu_addresses():
            link = read_pci_link(self._opts.sys_root, address)
            self._presence.note(f"PCI device {address}", link is not None)
            if link is None:
                self._gpus = ()  # rediscover next cycle
                continue
            links.append(link)
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

    # --- engine process --------------------------------------------------------------------

    def _locate_engine(self) -> int | None:
        opts = self._opts
        if opts.engine_pidfile:
            # Re-read every cycle: it is one small file and a restarted engine rewrites it.
            return self._adopt(find_by_pidfile(opts.proc_root, opts.engine_pidfile))
        if self._engine is not None:
            if identity(opts.proc_root, self._engine.pid) == self._engine:
                return self._engine.pid
            self._adopt(None)
            self._next_engine_search = float("-inf")  # it just went away: look again now
        now = self._clock()
        if now < self._next_engine_search:
            return None
        # Searching walks every process (and, by port, every fd), so it is rate limited.
        self._next_engine_search = now + opts.search_interval_s
        if opts.engine_port is not None:
            pid = find_by_port(opts.proc_root, opts.engine_port)
        else:
            assert self._name_re is not None
            pid = find_by_name(opts.proc_root, self._name_re, exclude=(os.getpid(), os.getppid()))
        return self._adopt(pid)

    def _adopt(self, pid: int | None) -> int | None:
        found = identity(self._opts.proc_root, pid) if pid is not None else None
        if found != self._engine:
            self._prev_threads = {}  # another process: its threads share nothing with the old one
            self._prev_uptime = None
        self._engine = found
        return found.pid if found is not None else None

    def _engine_samples(self, nodes: tuple[NumaNode, ...], links: tuple[PciLink, ...]) -> list[Sample]:
        if not self._opts.has_engine_selector:
            return []
        root = self._locate_engine()
        scans = self._scan_engine_tree(root) if root is not None else []
        self._presence.note("engine process", bool(scans))
        self._engine_pids = frozenset(s.pid for s in scans)
        if not scans:
            self._prev_threads, self._prev_uptime = {}, None
            return [_sample("llm_engine_process_found", 0)]
        counted = scans if self._opts.engine_include_children else scans[:1]
        out = [
            _sample("llm_engine_process_found", 1),
            _sample(
                "llm_engine_process_cpu_seconds_total",
                sum(s.stat.utime + s.stat.stime for s in counted) / self._clk_tck,
            ),
        ]
        out += self._sum_status(counted)
        out += self._busiest_thread(counted)
        mismatch = self._numa_mismatch(scans[0], nodes, links)
        if mismatch is not None:
            out.append(_sample("llm_engine_numa_mismatch", int(mismatch)))
        return out

    def _scan_engine_tree(self, root: int) -> list[ProcessScan]:
        # Walking the tree reads one children file per thread, which doubles the cost of a cycle;
        # the tree changes rarely (workers start with the engine), so it is walked again only
        # every search interval, for a new root, or when a known process went away.
        opts = self._opts
        now = self._clock()
        if self._tree and self._tree[0] == root and now < self._next_tree_refresh:
            scans, intact = rescan_tree(opts.proc_root, self._tree, opts.max_threads)
            if not intact:
                self._next_tree_refresh = float("-inf")
            return scans
        scans = scan_tree(opts.proc_root, root, opts.max_processes, opts.max_threads)
        self._tree = tuple(s.pid for s in scans)
        self._next_tree_refresh = now + opts.search_interval_s
        return scans

    @staticmethod
    def _sum_status(scans: list[ProcessScan]) -> list[Sample]:
        # A sum over part of the tree would understate; omit the family unless every process
        # gave the field.
        out = []
        threads = [s.status.threads if s.status else None for s in scans]
        if None not in threads:
            out.append(_sample("llm_engine_process_threads", sum(t for t in threads if t is not None)))
        rss = [s.status.rss_bytes if s.status else None for s in scans]
        if None not in rss:
            out.append(_sample("llm_engine_process_resident_memory_bytes", sum(r for r in rss if r is not None)))
        return out

    def _busiest_thread(self, scans: list[ProcessScan]) -> list[Sample]:
        current: dict[ThreadKey, int] = {}
        for s in scans:
            current.update(s.thread_ticks)
        # /proc/uptime is the kernel's own clock for the same tick accounting, and fixture trees
        # can set it; threads that vanished drop out because only the current map is kept.
        text = self._read("uptime")
        uptime = parse_uptime(text) if text is not None else None
        ratio = None
        if uptime is not None and self._prev_uptime is not None:
            ratio = busiest_thread_ratio(self._prev_threads, current, uptime - self._prev_uptime, self._clk_tck)
        self._prev_threads, self._prev_uptime = current, uptime
        return [_sample("llm_engine_process_busiest_thread_cpu_ratio", ratio)] if ratio is not None else []

    def _numa_mismatch(
        self, root: ProcessScan, nodes: tuple[NumaNode, ...], links: tuple[PciLink, ...]
    ) -> bool | None:
        # The root process's affinity decides: engines that pin at all pin the main process, and
        # children inherit it unless they set their own.
        wanted = self._opts.engine_gpu_pci_addresses
        gpu_nodes = [
            link.numa_node
            for link in links
            if link.numa_node is not None and (wanted is None or link.address in wanted)
        ]
        allowed = root.status.cpus_allowed if root.status else None
        return numa_mismatch(allowed, read_online_cpus(self._opts.sys_root), nodes, gpu_nodes)
