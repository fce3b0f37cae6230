"""What the host source's modules share: the options record, the once-per-change presence log
and the sample helper."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from exporter.settings import ConfigError
from exporter.snapshot import Sample, labels_of
from exporter.sources.host_match import LinearPattern, PatternError

log = logging.getLogger("exporter.sources.host")

DEFAULT_NETWORK_EXCLUDE: tuple[str, ...] = (
    "lo", "veth*", "docker*", "br-*", "virbr*", "cali*", "cni*", "flannel*", "cilium_*", "lxc*",
    "vxlan*", "tunl*", "kube-ipvs*",
)
"""Network links not read by default: loopback, and the host-side ends and bridges of container
networking (one veth per pod on a node). Inside a pod its own interface is eth0 (a veth renamed),
so a sidecar still reads it."""


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


def sample(name: str, value: float, **labels: str) -> Sample:
    # Most host samples have no label or one, already in order; sorting is for the rest.
    pairs = tuple(labels.items()) if len(labels) < 2 else labels_of(**labels)
    return Sample(name, pairs, float(value))


