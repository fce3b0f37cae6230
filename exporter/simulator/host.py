"""What the host source would read on the twin's machine: per-CPU busy, load, memory, NUMA nodes,
PSI, the GPUs' PCI devices, and the engine process (CPU time, its two modelled threads, threads,
RSS, CPU affinity), integrated slice by slice from the engine's CPU work.

The engine process has two threads that do the CPU work the engine model counts: the API server
(HTTP, tokenizer, detokenizer: `Activity.frontend_cpu_s`) and the engine core (scheduler, input
preparation: `Activity.engine_cpu_s`). Each runs on one CPU of the engine's affinity (the engine
core on the first, the API server on the second when there is one), so a thread at its limit
shows as one CPU at 100% and a busiest-thread ratio near 1, whatever the other CPUs do.

Served as `GET /sim/host` (exporter/simulator/server.py) and read by `--host-backend sim`
(exporter/sources/host_sim.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from exporter.simulator.engine import HostConfig

GiB = 1 << 30
# PCIe generation -> link speed in GT/s, as sysfs writes it.
PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PSI_WINDOWS = (("avg10", 10.0), ("avg60", 60.0), ("avg300", 300.0))
LOAD_WINDOWS = (60.0, 300.0, 900.0)  # the kernel's 1, 5 and 15 minute averages
THREAD_TAU_S = 2.5  # smoothing of the per-thread and per-CPU ratios: about the real source's 5 s window


@dataclass(frozen=True, slots=True)
class HostTopology:
    """A two-socket GPU server: `nodes` NUMA nodes of `cpus_per_node` CPUs and
    `memory_per_node_bytes` each; GPU index i sits on node (i // gpus_per_node) % nodes."""

    nodes: int = 2
    cpus_per_node: int = 16
    memory_per_node_bytes: int = 256 * GiB
    gpus_per_node: int = 4
    background_busy: float = 0.02  # per CPU: kernel threads, daemons, the exporter itself
    background_tasks: float = 0.3  # runnable tasks outside the engine, for the load average
    os_memory_bytes: int = 6 * GiB  # kernel, daemons; split evenly over the nodes
    engine_base_rss_bytes: int = int(2.5 * GiB)  # API server and engine core (Python, tokenizer)
    engine_rss_per_gpu_bytes: int = int(1.5 * GiB)  # host side of each GPU: CUDA context, pinned buffers
    engine_base_threads: int = 48
    engine_threads_per_gpu: int = 24

    @property
    def cpus(self) -> int:
        return self.nodes * self.cpus_per_node

    def node_cpus(self, node: int) -> range:
        return range(node * self.cpus_per_node, (node + 1) * self.cpus_per_node)

    def gpu_node(self, index: int) -> int:
        return (index // self.gpus_per_node) % self.nodes


def pci_address(index: int) -> str:
    """The sysfs address of NVML GPU `index`: the bus that SimGpuSource reports in pci_bus_id
    (`00000000:18:00.0` there, `0000:18:00.0` in sysfs)."""
    return f"0000:{0x18 + index * 0x10 & 0xFF:02x}:00.0"


def cpulist(cpus: list[int] | tuple[int, ...] | range) -> str:
    """Kernel cpulist text ("0-3,8")."""
    out: list[str] = []
    items = sorted(cpus)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def _ema(old: float, new: float, dt: float, tau: float) -> float:
    return old + (new - old) * (1.0 - math.exp(-dt / tau))


class HostModel:
    """Integrated by `update` each slice; `state` is the /sim/host document."""

    def __init__(self, topology: HostTopology, host: HostConfig, *, gpu_indices: tuple[int, ...],
                 numa_mismatch: bool = False, page_cache_bytes: float = 0.0) -> None:
        self.topology = topology
        self.gpu_indices = gpu_indices
        self.numa_mismatch = numa_mismatch
        self.page_cache_bytes = page_cache_bytes  # the model's weight files, read at start
        self.engine_thread = 0.0  # CPU share of each modelled thread, smoothed
        self.api_thread = 0.0
        self.speed = 1.0
        self.pressure = {"cpu": 0.0, "memory": 0.0, "io": 0.0}
        self.psi_avg = {r: dict.fromkeys((w for w, _ in PSI_WINDOWS), 0.0) for r in self.pressure}
        self.psi_total_s = dict.fromkeys(self.pressure, 0.0)
        self.load = [topology.background_tasks] * len(LOAD_WINDOWS)
        self.set_host(host)

    def set_host(self, host: HostConfig) -> None:
        """The scenario's CPU budget decides the engine's affinity: a cpuset of ceil(budget) CPUs
        when `host.pinned` or with the NUMA mismatch, else every CPU (a quota, not a cpuset)."""
        topo = self.topology
        self.host = host
        gpu_node = topo.gpu_node(self.gpu_indices[0]) if self.gpu_indices else 0
        first = self.gpu_indices[0] % topo.gpus_per_node if self.gpu_indices else 0
        # Each engine of a demo host starts on its own CPUs of its GPUs' node.
        offset = first * max(1, topo.cpus_per_node // topo.gpus_per_node)
        node = (gpu_node + 1) % topo.nodes if self.numa_mismatch and topo.nodes > 1 else gpu_node
        if host.pinned or self.numa_mismatch:
            n = max(1, min(topo.cpus_per_node, math.ceil(host.cpu_budget_cores)))
            base = topo.node_cpus(node)
            self.allowed = tuple(sorted(base[(offset + k) % len(base)] for k in range(n)))
            self.placement = self.allowed
        else:
            self.allowed = tuple(range(topo.cpus))
            base = topo.node_cpus(node)
            self.placement = (base[offset % len(base)], base[(offset + 1) % len(base)])
        self.engine_node = node

    @property
    def engine_cpu(self) -> int:
        return self.placement[0]

    @property
    def api_cpu(self) -> int:
        return self.placement[1] if len(self.placement) > 1 else self.placement[0]

    def update(self, dt: float, engine_cpu_s: float, frontend_cpu_s: float, speed: float) -> None:
        """One slice: `engine_cpu_s` and `frontend_cpu_s` CPU seconds used by the two threads in
        `dt` seconds, `speed` the share of their demand the CPU budget gave them."""
        if dt <= 0:
            return
        topo = self.topology
        self.speed = speed
        self.engine_thread = _ema(self.engine_thread, min(1.0, engine_cpu_s / dt), dt, THREAD_TAU_S)
        self.api_thread = _ema(self.api_thread, min(1.0, frontend_cpu_s / dt), dt, THREAD_TAU_S)
        # A task waits for a CPU while the budget is oversubscribed (PSI "some"); nothing in the
        # twin stalls on memory or I/O.
        waiting = 1.0 - speed if speed < 1.0 else 0.0
        self.pressure["cpu"] = waiting
        for resource, now in self.pressure.items():
            self.psi_total_s[resource] += now * dt
            for window, tau in PSI_WINDOWS:
                self.psi_avg[resource][window] = _ema(self.psi_avg[resource][window], now, dt, tau)
        # Runnable = running or waiting for a CPU: each thread's demand, at most one task each.
        runnable = topo.background_tasks + sum(
            min(1.0, used / dt / max(speed, 1e-6)) for used in (engine_cpu_s, frontend_cpu_s))
        self.load = [_ema(old, runnable, dt, tau) for old, tau in zip(self.load, LOAD_WINDOWS, strict=True)]

    def cpu_busy(self) -> list[float]:
        topo = self.topology
        busy = [topo.background_busy] * topo.cpus
        busy[self.engine_cpu] += self.engine_thread
        busy[self.api_cpu] += self.api_thread
        return [min(1.0, b) for b in busy]

    def engine_rss_bytes(self, gpus: int) -> int:
        return self.topology.engine_base_rss_bytes + self.topology.engine_rss_per_gpu_bytes * gpus

    def state(self, *, engine_cpu_seconds: float, pcie_links: list[dict[str, Any]]) -> dict[str, Any]:
        """`engine_cpu_seconds`: the engine process's CPU time since it started; `pcie_links`:
        each GPU's link as GpuModel.pcie_link gives it, in `gpu_indices` order."""
        topo = self.topology
        busy = self.cpu_busy()
        gpus = len(self.gpu_indices)
        rss = self.engine_rss_bytes(gpus)
        os_per_node = topo.os_memory_bytes / topo.nodes
        nodes = []
        for n in range(topo.nodes):
            used = os_per_node + ((rss + self.page_cache_bytes) if n == self.engine_node else 0.0)
            nodes.append({"node": n, "cpus": cpulist(topo.node_cpus(n)),
                          "memory_total_bytes": topo.memory_per_node_bytes,
                          "memory_free_bytes": int(max(0.0, topo.memory_per_node_bytes - used))})
        total = topo.memory_per_node_bytes * topo.nodes
        threads = {"engine_core": round(self.engine_thread, 6), "api_server": round(self.api_thread, 6)}
        busiest = max(threads, key=lambda k: threads[k])
        return {
            "cpus": [round(b, 6) for b in busy],
            "cpu_all": round(sum(busy) / len(busy), 6),
            "online_cpus": cpulist(range(topo.cpus)),
            "load": [round(v, 4) for v in self.load],
            # Page cache (the weight files) is available memory, but not free on its node.
            "memory_total_bytes": total,
            "memory_available_bytes": int(total - topo.os_memory_bytes - rss),
            "numa_nodes": nodes,
            "pressure": {r: {**{w: round(v, 6) for w, v in self.psi_avg[r].items()},
                             "total_seconds": round(self.psi_total_s[r], 6)} for r in self.pressure},
            "gpus": [{"pci": pci_address(index), "index": index, "numa_node": topo.gpu_node(index),
                      "current_link_speed_gts": PCIE_GTS[int(link["gen_current"])],
                      "max_link_speed_gts": PCIE_GTS[int(link["gen_max"])],
                      "current_link_width": int(link["width_current"]),
                      "max_link_width": int(link["width_max"])}
                     for index, link in zip(self.gpu_indices, pcie_links, strict=True)],
            "engine": {
                "cpu_seconds_total": round(engine_cpu_seconds, 6),
                "threads": topo.engine_base_threads + topo.engine_threads_per_gpu * gpus,
                "thread_cpu_ratios": threads,
                "busiest_thread": busiest,
                "busiest_thread_cpu_ratio": threads[busiest],
                "resident_memory_bytes": rss,
                "cpus_allowed": cpulist(self.allowed),
                "engine_core_cpu": self.engine_cpu,
                "api_server_cpu": self.api_cpu,
                "gpu_pci_addresses": [pci_address(i) for i in self.gpu_indices],
            },
        }
