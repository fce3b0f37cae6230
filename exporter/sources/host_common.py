"""What the host source's modules share: the options record, the once-per-change presence log
and the sample helper."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.settings import ConfigError
from exporter.snapshot import Sample, labels_of
from exporter.sources.host_match import LinearPattern, PatternError

log = logging.getLogger("exporter.sources.host")

POD_ID_GLOB = "[0-9a-f]" * 15
"""A name of 15 hex digits: the host end of a pod's interface under OVN-Kubernetes and
OpenShift SDN (a container id's start; kube-prometheus' node_exporter excludes `[a-f0-9]{15}`)."""
DEFAULT_NETWORK_EXCLUDE: tuple[str, ...] = (
    "lo", "veth*", "docker*", "br-*", "virbr*", "cali*", "cni*", "flannel*", "cilium_*", "lxc*",
    "vxlan*", "tunl*", "kube-ipvs*", "gke*", "eni*", "azv*", "weave", "datapath", "genev_sys_*",
    "ovn-k8s-*", "antrea-*", "kube-bridge", "kube-dummy-if", "nodelocaldns", "podman*", "lxdbr*",
    POD_ID_GLOB,
)
"""Network links not read by default: loopback, and the host-side ends, bridges and tunnels of
container networking (one interface per pod on a node; pods come and go): Docker and podman,
libvirt and LXD, Calico (cali*, tunl0, vxlan.calico), Flannel (flannel.1, cni0), Cilium
(cilium_*, lxc*), Weave (weave, vethwe-*, datapath), the AWS VPC CNI (eni*), GKE (gke*), Azure
CNI (azv*), OVN-Kubernetes (ovn-k8s-*, genev_sys_*, 15 hex digits), Antrea, kube-router and
NodeLocal DNSCache. Inside a pod its own interface is eth0 (a veth renamed), so a sidecar still
reads it."""

PRESENCE_LOG_INTERVAL_S = 60.0
MAX_PRESENCE_LINES = 10
"""Availability lines (a file gone, back again) logged per PRESENCE_LOG_INTERVAL_S: each is one
line per state change, and files that come and go by the thousand (a host's devices churning)
cost at most these, then one count of the rest."""
MAX_PRESENCE_KEYS = 512
"""Files and devices whose availability is remembered: the host files are a few dozen, two per
GPU. Past it the least recently seen is forgotten (a name gone for good)."""


class LogBudget:
    """At most `lines` lines per `interval_s`; the rest are counted, and the next line let through
    says how many were not logged."""

    def __init__(self, lines: int, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._lines = lines
        self._interval_s = interval_s
        self._clock = clock
        self._window_start = float("-inf")
        self._used = 0
        self._held_back = 0  # suppressed since the last line let through
        self.suppressed = 0  # since start

    def info(self, message: str, *args: object) -> None:
        self.log(logging.INFO, message, *args)

    def log(self, level: int, message: str, *args: object) -> None:
        now = self._clock()
        if now - self._window_start >= self._interval_s:
            self._window_start, self._used = now, 0
        if self._used >= self._lines:
            self._held_back += 1
            self.suppressed += 1
            return
        self._used += 1
        if self._held_back:
            message += f" ({self._held_back} similar line(s) not logged in the last {self._interval_s:g}s)"
            self._held_back = 0
        log.log(level, message, *args)


@dataclass(frozen=True, slots=True)
class HostOptions:
    """Where to read and what to look for. Engine selector precedence: pid file, then port, then
    name; with none set no engine series are exported."""

    proc_root: str = "/proc"
    sys_root: str = "/sys"
    engine_port: int | None = None
    engine_pidfile: str | None = None
    # A regex searched in comm and the command line's start, in linear time (host_match.py).
    engine_process_name: str | None = None
    engine_include_children: bool = True  # vLLM V1's EngineCore and TP workers are children
    # GPUs to report; None discovers NVIDIA GPUs (vendor 0x10de, class 0x0300/0x0302) in sysfs.
    gpu_pci_addresses: tuple[str, ...] | None = None
    # GPUs the engine uses, for the NUMA check; None means every reported GPU.
    engine_gpu_pci_addresses: tuple[str, ...] | None = None
    search_interval_s: float = 10.0  # how often to look again for an engine or GPUs not found
    # Network links (names or globs on the device label, `mlx5_0:1` for an RDMA port) that belong
    # to the engine; None: those on the engine's GPUs' NUMA nodes or PCI host bridges.
    engine_network_devices: tuple[str, ...] | None = None
    network_exclude: tuple[str, ...] = DEFAULT_NETWORK_EXCLUDE  # globs of links not read at all
    max_processes: int = 64
    max_threads: int = 4096  # per process; bounds per-thread state and cost

    def __post_init__(self) -> None:
        if self.engine_process_name is not None:
            self.name_pattern()
        if self.engine_port is not None and not 0 < self.engine_port < 65536:
            raise ValueError(f"engine_port out of range: {self.engine_port}")
        if self.max_processes < 1 or self.max_threads < 1:
            raise ValueError("max_processes and max_threads must be at least 1")

    def name_pattern(self) -> LinearPattern | None:
        """The compiled engine_process_name; ConfigError (exit 2, one line) when it is not a
        regex or needs backtracking."""
        if self.engine_process_name is None:
            return None
        try:
            return LinearPattern(self.engine_process_name)
        except PatternError as error:
            raise ConfigError("engine_process_name", self.engine_process_name, str(error)) from None

    @property
    def has_engine_selector(self) -> bool:
        return bool(self.engine_pidfile or self.engine_port is not None or self.engine_process_name)


class PresenceLog:
    """Logs a file or device going missing, and coming back, once per change (not every cycle),
    through a LogBudget; remembers at most MAX_PRESENCE_KEYS of them, the most recently seen."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._state: dict[str, bool] = {}  # least recently noted first
        self.budget = LogBudget(MAX_PRESENCE_LINES, PRESENCE_LOG_INTERVAL_S, clock)

    def __len__(self) -> int:
        return len(self._state)

    def note(self, key: str, present: bool) -> bool:
        state = self._state
        before = state.pop(key, None)
        state[key] = present
        if before is None and len(state) > MAX_PRESENCE_KEYS:
            del state[next(iter(state))]
        if before != present:
            if not present:
                self.budget.info("host: %s not available; its series are omitted", key)
            elif before is False:
                self.budget.info("host: %s available again", key)
        return present


def sample(name: str, value: float, **labels: str) -> Sample:
    # Most host samples have no label or one, already in order; sorting is for the rest.
    pairs = tuple(labels.items()) if len(labels) < 2 else labels_of(**labels)
    return Sample(name, pairs, float(value))




def cpu_summary(per_cpu: Sequence[float], cpus: int) -> list[Sample]:
    """The two CPU series every profile can afford beside cpu="all": the busiest core's share (a
    single-threaded bottleneck hides in the mean of 256 cores) and the number of CPUs read. The
    per-CPU series are for `--profile full` (exporter/catalog/families.csv)."""
    out = [Sample("llm_host_cpus", (), float(cpus))] if cpus else []
    if per_cpu:
        out.append(Sample("llm_host_cpu_busy_ratio", (("cpu", "busiest"),), max(per_cpu)))
    return out
