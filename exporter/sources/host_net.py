"""Network links for the host source: NICs from /sys/class/net and RDMA ports from
/sys/class/infiniband, read the way node_exporter's netclass/netdev and infiniband collectors read
them (kernel Documentation/ABI/testing/sysfs-class-net, sysfs-class-net-statistics,
Documentation/ABI/stable/sysfs-class-infiniband).

Two phases, like the GPUs: `discover_links` lists the links (every search interval: names, kind,
NUMA node, PCI root, engine membership, link rate), `read_link` reads one link's state and
counters every cycle through the held files. `network_samples` turns readings into samples, with
the utilization from `ByteRates`; the simulated host (host_sim.py) goes through the same two.

Bounded: at most MAX_NETWORK_ENTRIES directory entries looked at per class directory, at most
MAX_NETWORK_LINKS links read, every attribute at most MAX_ATTR_BYTES (a sysfs attribute is one
page), names at most MAX_DEVICE_NAME characters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import socket
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.snapshot import Sample
from exporter.sources.host_common import HostOptions, PresenceLog, log
from exporter.sources.host_files import HeldFiles
from exporter.sources.host_pci import PciLink, parse_int, parse_numa_node, pci_devices_dir
from exporter.sources.host_proc import Reader

MAX_NETWORK_LINKS = 64
"""Links read per cycle, NICs and RDMA ports together: physical NICs and RDMA ports first, then
virtual interfaces, each by name. A GPU server has a few dozen at most; a host's hundreds of pod
veths are excluded by name before the cap."""
MAX_NETWORK_ENTRIES = 4096
"""Entries of /sys/class/net (or /sys/class/infiniband, or one device's ports/) looked at per
discovery; the rest are not listed at all."""
MAX_CLASSIFIED = 512
"""Candidates (after the name filter) whose device link is resolved per discovery."""
MAX_DEVICE_NAME = 64  # IB_DEVICE_NAME_MAX; netdev names are at most 15 (IFNAMSIZ - 1)
MAX_ATTR_BYTES = 4096  # a sysfs attribute is at most one page
MAX_HELD_NETWORK_FILES = 128
"""fds held open for the per-cycle network reads (with the host source's 256 others, 384 fds,
well under the 1024 soft limit minus the HTTP server's 512 connections); beyond it, plain reads."""
NETWORK_LOG_INTERVAL_S = 60.0
"""Links appearing, going away, or with files that cannot be read are logged as one summary line
with counts, at most this often (the first change after a quiet spell at once): pods' interfaces
come and go by the hundred, and a line per interface and file was about 9 lines per pod."""
MAX_LOGGED_NAMES = 5  # names quoted per kind of change in that line; the rest are counted

KINDS = ("ethernet", "infiniband", "roce")
DIRECTIONS = ("receive", "transmit")
COUNTERS = tuple(f"{d}_{c}" for d in DIRECTIONS for c in ("bytes", "packets", "errors", "drops"))
COUNTER_FAMILIES = {key: f"llm_host_network_{key}_total" for key in COUNTERS}

ARPHRD_INFINIBAND = 32  # IPoIB netdevs (ib0)
ARPHRD_LOOPBACK = 772
IB_STATE_ACTIVE = 4
IB_WORD_BYTES = 4  # port_rcv_data / port_xmit_data count 32-bit words

# counter key -> file under statistics/ (netdevs)
NETDEV_FILES = {
    "receive_bytes": "rx_bytes", "transmit_bytes": "tx_bytes",
    "receive_packets": "rx_packets", "transmit_packets": "tx_packets",
    "receive_errors": "rx_errors", "transmit_errors": "tx_errors",
    "receive_drops": "rx_dropped", "transmit_drops": "tx_dropped",
}
# counter key -> (file under the port's directory, scale). receive_drops comes from mlx5's
# hw_counters/out_of_buffer where the driver has it, else it is absent.
IB_FILES = {
    "receive_bytes": ("counters/port_rcv_data", IB_WORD_BYTES),
    "transmit_bytes": ("counters/port_xmit_data", IB_WORD_BYTES),
    "receive_packets": ("counters/port_rcv_packets", 1),
    "transmit_packets": ("counters/port_xmit_packets", 1),
    "receive_errors": ("counters/port_rcv_errors", 1),
    "transmit_errors": ("counters/port_xmit_constraint_errors", 1),
    "receive_drops": ("hw_counters/out_of_buffer", 1),
    "transmit_drops": ("counters/port_xmit_discards", 1),
}


@dataclass(frozen=True, slots=True)
class NetLink:
    """One link as discovered: where its files are and what does not change between cycles."""

    device: str  # the label: interface name, or <ibdev>:<port>
    kind: str
    path: str  # /sys/class/net/<if> or /sys/class/infiniband/<dev>/ports/<n>
    rdma: bool
    virtual: bool  # no PCI (or other bus) device behind it
    numa_node: int | None
    pci_root: str | None  # "pci0000:17": the host bridge the device hangs off
    engine: bool = False
    counters: tuple[tuple[str, str, int], ...] = ()  # (key, path, scale) of the files present
    ifindex: int | None = None  # a NIC's, to tell whether sysfs shows this process's namespace
    state_path: str = ""  # the file read every cycle for up/down: operstate, or an RDMA port's state

    def __post_init__(self) -> None:
        if not self.state_path:
            object.__setattr__(self, "state_path", os.path.join(self.path, "state" if self.rdma else "operstate"))


@dataclass(slots=True)
class LinkReading:
    """One link's state this cycle; None where unknown (the series is omitted)."""

    device: str
    kind: str
    numa_node: int | None
    engine: bool
    up: bool | None
    speed_bytes_per_s: float | None
    counters: dict[str, int] = field(default_factory=dict)


# --- parsers ---------------------------------------------------------------------------------


def parse_netdev_speed(text: str | None) -> float | None:
    """sysfs `speed` in Mb/s -> bytes/s; -1, 0, 4294967295 (SPEED_UNKNOWN as unsigned) or junk
    -> None: unknown, never 0."""
    mbps = parse_int(text)
    if mbps is None or mbps <= 0 or mbps >= 0xFFFFFFFF:
        return None
    return mbps * 1e6 / 8


def parse_ib_rate(text: str | None) -> float | None:
    """IB port `rate`, "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)" -> bytes/s (the nominal rate
    the kernel prints: active speed times width)."""
    if text is None:
        return None
    parts = text.split()
    if len(parts) < 2 or not parts[1].startswith("Gb/sec"):
        return None
    try:
        gbps = float(parts[0])
    except ValueError:
        return None
    return gbps * 1e9 / 8 if gbps > 0 else None


def parse_ib_state(text: str | None) -> int | None:
    """IB port `state` / `phys_state`, "4: ACTIVE" -> 4."""
    if text is None:
        return None
    return parse_int(text.partition(":")[0])


def parse_counter(text: str | None) -> int | None:
    """A non-negative counter; anything else is unknown."""
    value = parse_int(text)
    return value if value is not None and 0 <= value < 1 << 64 else None


# /proc/net/dev columns (after "name:"): rx bytes packets errs drop fifo frame compressed multicast,
# then tx bytes packets errs drop fifo colls carrier compressed. The kernel prints rx_dropped +
# rx_missed_errors as rx "drop" (a NIC that ran out of ring buffer counts as a drop there).
PROC_NET_DEV_COLUMNS = {"receive_bytes": 0, "receive_packets": 1, "receive_errors": 2, "receive_drops": 3,
                        "transmit_bytes": 8, "transmit_packets": 9, "transmit_errors": 10, "transmit_drops": 11}
MAX_PROC_NET_DEV_BYTES = 1 << 20  # ~130 bytes a line: thousands of interfaces


def parse_proc_net_dev(text: str, wanted: Mapping[str, object] | set[str]) -> dict[str, dict[str, int]]:
    """/proc/net/dev -> {interface: {counter key: value}} for the `wanted` interfaces only."""
    out: dict[str, dict[str, int]] = {}
    for line in text.split("\n")[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        name = name.strip()
        if name not in wanted:
            continue
        fields = rest.split()
        if len(fields) < 16:
            continue
        try:
            out[name] = {key: int(fields[i]) for key, i in PROC_NET_DEV_COLUMNS.items()}
        except ValueError:
            continue
    return out


def netdev_up(operstate: str | None, carrier: str | None) -> bool | None:
    """operstate "up"; a driver that says "unknown" (tun, some virtual NICs) falls back to carrier."""
    if operstate is None:
        return None
    state = operstate.strip()
    if state == "up":
        return True
    if state == "unknown":
        return parse_int(carrier) == 1 if carrier is not None else None
    return False


def matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def valid_name(name: str) -> bool:
    return 0 < len(name) <= MAX_DEVICE_NAME and name.isprintable() and not any(c in name for c in " /\\\"")


def pci_root_of(real_path: str) -> str | None:
    """"/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0" -> "pci0000:17"."""
    for part in real_path.split(os.sep):
        if part.startswith("pci") and ":" in part:
            return part
    return None


# --- discovery ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineRule:
    """Which links belong to the engine: `configured` globs when given (they decide alone), else
    links on one of `gpu_nodes` or under one of `gpu_roots` (the engine's GPUs' NUMA nodes and
    PCI host bridges)."""

    configured: tuple[str, ...] | None = None
    gpu_nodes: frozenset[int] = frozenset()
    gpu_roots: frozenset[str] = frozenset()

    def decide(self, link: NetLink) -> bool:
        if self.configured is not None:
            return matches(link.device, self.configured)
        if link.numa_node is not None and link.numa_node in self.gpu_nodes:
            return True
        return link.pci_root is not None and link.pci_root in self.gpu_roots


@dataclass(slots=True)
class Discovery:
    links: tuple[NetLink, ...]
    capped: bool  # more links than MAX_NETWORK_LINKS (or entries than MAX_NETWORK_ENTRIES)
    has_net: bool  # /sys/class/net was there
    has_rdma: bool  # /sys/class/infiniband was there


def _scan(path: str) -> tuple[list[str], bool, bool]:
    """Up to MAX_NETWORK_ENTRIES names in a directory: (names, existed, truncated)."""
    names: list[str] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                if len(names) >= MAX_NETWORK_ENTRIES:
                    return names, True, True
                names.append(entry.name)
    except OSError:
        return [], False, False
    return names, True, False


def _device_facts(dev_dir: str, read: Reader) -> tuple[bool, int | None, str | None]:
    """(virtual, numa_node, pci_root) of the `device` link under a class entry."""
    device = os.path.join(dev_dir, "device")
    try:
        real = os.path.realpath(device, strict=True)
    except (OSError, ValueError):
        return True, None, None
    return False, parse_numa_node(read(os.path.join(device, "numa_node"))), pci_root_of(real)


def _netdev_links(sys_root: str, exclude: Sequence[str], read: Reader) -> tuple[list[NetLink], bool, bool]:
    base = os.path.join(sys_root, "class", "net")
    names, present, truncated = _scan(base)
    wanted = sorted(n for n in names if valid_name(n) and not matches(n, exclude))
    truncated = truncated or len(wanted) > MAX_CLASSIFIED
    links = []
    for name in wanted[:MAX_CLASSIFIED]:
        path = os.path.join(base, name)
        arphrd = parse_int(read(os.path.join(path, "type")))
        if arphrd == ARPHRD_LOOPBACK:
            continue
        virtual, node, root = _device_facts(path, read)
        kind = "infiniband" if arphrd == ARPHRD_INFINIBAND else "ethernet"
        counters = tuple((key, os.path.join(path, "statistics", f), 1) for key, f in NETDEV_FILES.items())
        ifindex = parse_int(read(os.path.join(path, "ifindex")))
        links.append(NetLink(name, kind, path, False, virtual, node, root, counters=counters, ifindex=ifindex))
    return links, present, truncated


def _rdma_links(sys_root: str, exclude: Sequence[str], read: Reader) -> tuple[list[NetLink], bool, bool]:
    base = os.path.join(sys_root, "class", "infiniband")
    devices, present, truncated = _scan(base)
    links: list[NetLink] = []
    for dev in sorted(d for d in devices if valid_name(d)):
        if len(links) >= MAX_CLASSIFIED:
            truncated = True
            break
        dev_dir = os.path.join(base, dev)
        virtual, node, root = _device_facts(dev_dir, read)
        ports, _, more = _scan(os.path.join(dev_dir, "ports"))
        truncated = truncated or more
        for port in sorted((p for p in ports if p.isdigit() and len(p) <= 3), key=int):
            if len(links) >= MAX_CLASSIFIED:
                truncated = True
                break
            label = f"{dev}:{port}"
            if matches(label, exclude):
                continue
            path = os.path.join(dev_dir, "ports", port)
            layer = (read(os.path.join(path, "link_layer")) or "").strip().lower()
            kind = "roce" if layer == "ethernet" else "infiniband"
            counters = tuple(
                (key, os.path.join(path, f), scale)
                for key, (f, scale) in IB_FILES.items()
                if os.path.exists(os.path.join(path, f))
            )
            links.append(NetLink(label, kind, path, True, virtual, node, root, counters=counters))
    return links, present, truncated


def discover_links(sys_root: str, exclude: Sequence[str], rule: EngineRule, read: Reader) -> Discovery:
    """Every NIC and RDMA port not excluded by name, physical ones first, at most
    MAX_NETWORK_LINKS. `read` is a plain (not held) reader: these files are read once per
    discovery."""
    net, has_net, net_cut = _netdev_links(sys_root, exclude, read)
    rdma, has_rdma, rdma_cut = _rdma_links(sys_root, exclude, read)
    ordered = sorted([*net, *rdma], key=lambda link: (link.virtual, link.device))
    kept = tuple(_with_engine(link, rule) for link in ordered[:MAX_NETWORK_LINKS])
    capped = net_cut or rdma_cut or len(ordered) > MAX_NETWORK_LINKS
    return Discovery(kept, capped, has_net, has_rdma)


def _with_engine(link: NetLink, rule: EngineRule) -> NetLink:
    return dataclasses.replace(link, engine=rule.decide(link))


def read_speed(link: NetLink, read: Reader) -> float | None:
    """The link rate in bytes/s, None when unknown (a down NIC says -1 or fails the read)."""
    if link.rdma:
        return parse_ib_rate(read(os.path.join(link.path, "rate")))
    return parse_netdev_speed(read(os.path.join(link.path, "speed")))


def read_state(link: NetLink, read: Reader) -> tuple[str | None, bool | None]:
    """(raw state text, up): the file read every cycle to tell up from down."""
    if link.rdma:
        text = read(link.state_path)
        state = parse_ib_state(text)
        return text, (state == IB_STATE_ACTIVE) if state is not None else None
    text = read(link.state_path)
    carrier = None
    if text is not None and text.strip() == "unknown":
        carrier = read(os.path.join(link.path, "carrier"))
    return text, netdev_up(text, carrier)


def read_counters(link: NetLink, read: Reader, presence: PresenceLog | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, path, scale in link.counters:
        value = parse_counter(read(path))
        if presence is not None:
            presence.note(path, value is not None)
        if value is not None:
            out[key] = value * scale
    return out


# --- rates and samples ------------------------------------------------------------------------


class ByteRates:
    """Bytes per second over the last cycle, per link and direction, as a share of the link rate.
    The first reading of a link, a counter that went backwards (driver reload, 32-bit wrap, link
    re-created) and a cycle with no time elapsed give no ratio; the next cycle does."""

    def __init__(self) -> None:
        self._prev: dict[str, tuple[float, dict[str, int]]] = {}
        # Per link, the samples that repeat from cycle to cycle (info, and its label tuples), so
        # that a cycle builds only the ones whose value moved.
        self._static: dict[tuple, tuple[tuple, Sample]] = {}

    def static(self, r: LinkReading) -> tuple[tuple, Sample]:
        """((("device", name),), the info sample) of a link, built once."""
        key = (r.device, r.engine, r.kind, r.numa_node)
        got = self._static.get(key)
        if got is None:
            device = ("device", r.device)
            node = "" if r.numa_node is None else str(r.numa_node)
            labels = (device, ("engine", "true" if r.engine else "false"), ("kind", r.kind), ("numa_node", node))
            got = self._static[key] = ((device,), Sample("llm_host_network_info", labels, 1.0))
        return got

    def ratios(self, device: str, now: float, counters: Mapping[str, int],
               speed: float | None) -> dict[str, float]:
        before = self._prev.get(device)
        self._prev[device] = (now, {k: counters[k] for k in ("receive_bytes", "transmit_bytes") if k in counters})
        if before is None or speed is None or speed <= 0:
            return {}
        then, old = before
        dt = now - then
        if dt <= 0:
            return {}
        out = {}
        for direction in DIRECTIONS:
            key = f"{direction}_bytes"
            if key in counters and key in old and counters[key] >= old[key]:
                out[direction] = min(1.0, (counters[key] - old[key]) / dt / speed)
        return out

    def keep(self, devices: Iterable[str]) -> None:
        """Forgets links not read this cycle (gone, or over the cap)."""
        wanted = set(devices)
        for device in [d for d in self._prev if d not in wanted]:
            del self._prev[device]
        for key in [k for k in self._static if k[0] not in wanted]:
            del self._static[key]


def network_samples(readings: Sequence[LinkReading], rates: ByteRates, now: float) -> list[Sample]:
    # A dozen samples per link every cycle: label tuples are built here, in label order, rather
    # than sorted by labels_of.
    out: list[Sample] = []
    append = out.append
    for r in readings:
        one, info = rates.static(r)
        append(info)
        if r.up is not None:
            append(Sample("llm_host_network_up", one, 1.0 if r.up else 0.0))
        if r.speed_bytes_per_s is not None:
            append(Sample("llm_host_network_speed_bytes_per_second", one, float(r.speed_bytes_per_s)))
        counters = r.counters
        for key, family in COUNTER_FAMILIES.items():
            value = counters.get(key)
            if value is not None:
                append(Sample(family, one, float(value)))
        for direction, ratio in rates.ratios(r.device, now, counters, r.speed_bytes_per_s).items():
            append(Sample("llm_host_network_utilization_ratio", (one[0], ("direction", direction)), ratio))
    rates.keep(r.device for r in readings)
    return out


def read_attr(path: str) -> str | None:
    """One sysfs attribute, read the plain way (open, one read, close): None when absent,
    unreadable, not a regular attribute (a FIFO never blocks: O_NONBLOCK) or over MAX_ATTR_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.pread(fd, MAX_ATTR_BYTES + 1, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace") if len(data) <= MAX_ATTR_BYTES else None


class NetworkTracker:
    """The host source's network part: discovers the links every search interval (at once when
    one went away), reads their state and counters every cycle through held fds, and keeps the
    previous byte counts for the utilization.

    The NICs' counters come from one read of /proc/self/net/dev when sysfs shows this process's
    own network namespace (every interface's sysfs `ifindex` is the one the kernel gives this
    process for its name): one read instead of eight per NIC. Otherwise (sysfs of another
    namespace, a fixture tree) from each NIC's statistics/ files."""

    def __init__(self, opts: HostOptions, clock: Callable[[], float], presence: PresenceLog) -> None:
        self._opts = opts
        self._clock = clock
        self._presence = presence
        self._files = HeldFiles(MAX_HELD_NETWORK_FILES, max_bytes=MAX_ATTR_BYTES)
        self._links: tuple[NetLink, ...] = ()
        self._next_discovery = float("-inf")
        self._states: dict[str, str | None] = {}  # last state text, to re-read the rate on a change
        self._speeds: dict[str, float | None] = {}
        self._rates = ByteRates()
        self._own_namespace = False  # read NIC counters from /proc/self/net/dev
        self._listed: tuple | None = None  # what the last discovery saw: names and GPUs
        self._proc_fds: dict[str, int] = {}  # PROC_NET_DEV -> its fd, held
        # Closes it when the source is dropped without close(), as HeldFiles does.
        self._finalizer = weakref.finalize(self, _close_fds, self._proc_fds)
        # Only what follows the links read now: the names of the last discovery (None before
        # the first) and the files of each that could not be read last cycle.
        self._known: frozenset[str] | None = None
        self._unreadable: dict[str, frozenset[str]] = {}
        self._changes = LinkChanges()
        self._next_log = float("-inf")

    @property
    def links(self) -> tuple[NetLink, ...]:
        return self._links

    @property
    def held_files(self) -> frozenset[str]:
        held = self._files.held
        return held | self._proc_fds.keys()

    def close(self) -> None:
        self._files.close()
        _close_fds(self._proc_fds)

    def samples(self, gpus: Sequence[PciLink]) -> list[Sample]:
        now = self._clock()
        if now >= self._next_discovery:
            # The full discovery (a few reads and a realpath per link, ~0.5 ms for 3 links) runs
            # when the class directories or the GPUs changed; listing them is ~20 us.
            key = self._listing(gpus)
            if key != self._listed:
                self._discover(gpus)
                self._listed = key
            else:  # a rate renegotiated between two cycles (down and up again unseen)
                self._speeds = {link.device: read_speed(link, read_attr) for link in self._links}
            self._next_discovery = now + self._opts.search_interval_s
        nic_counters = self._read_proc_net_dev() if self._own_namespace else None
        readings = []
        gone = False
        for link in self._links:
            reading = self._read(link, nic_counters)
            if reading is None:
                gone = True
                continue
            readings.append(reading)
        if gone:  # an interface went away or was renamed: discover them all again next cycle
            self._next_discovery, self._listed = float("-inf"), None
        self._files.close_unread()
        if self._changes and now >= self._next_log:
            log.info("host: network links %s; %d read now", self._changes.summary(), len(self._links))
            self._changes = LinkChanges()
            self._next_log = now + NETWORK_LOG_INTERVAL_S
        return network_samples(readings, self._rates, now)

    def _listing(self, gpus: Sequence[PciLink]) -> tuple:
        root = self._opts.sys_root
        net = _scan(os.path.join(root, "class", "net"))
        rdma = _scan(os.path.join(root, "class", "infiniband"))
        return (frozenset(net[0]), net[1:], frozenset(rdma[0]), rdma[1:],
                tuple((g.address, g.numa_node) for g in gpus))

    def _discover(self, gpus: Sequence[PciLink]) -> None:
        opts = self._opts
        wanted = opts.engine_gpu_pci_addresses
        engine_gpus = [g for g in gpus if wanted is None or g.address in wanted]
        roots = set()
        for g in engine_gpus:
            try:
                real = os.path.realpath(os.path.join(pci_devices_dir(opts.sys_root), g.address), strict=True)
            except (OSError, ValueError):
                continue
            root = pci_root_of(real)
            if root is not None:
                roots.add(root)
        rule = EngineRule(
            configured=opts.engine_network_devices,
            gpu_nodes=frozenset(g.numa_node for g in engine_gpus if g.numa_node is not None),
            gpu_roots=frozenset(roots),
        )
        found = discover_links(opts.sys_root, opts.network_exclude, rule, read_attr)
        self._presence.note(os.path.join(opts.sys_root, "class", "net"), found.has_net)
        self._presence.note(f"{os.path.join(opts.sys_root, 'class', 'infiniband')} (RDMA links)", found.has_rdma)
        # Logged once: the links past the bound are not read.
        self._presence.note(f"network links past the bound of {MAX_NETWORK_LINKS}", not found.capped)
        self._links = found.links
        devices = frozenset(link.device for link in found.links)
        if self._known is not None:  # the first list is where we start, not a change
            self._changes.add("appeared", devices - self._known)
            self._changes.add("gone", self._known - devices)
        self._known = devices
        self._unreadable = {d: keys for d, keys in self._unreadable.items() if d in devices}
        self._speeds = {link.device: read_speed(link, read_attr) for link in found.links}
        self._states = {}
        nics = [link for link in found.links if not link.rdma]
        self._own_namespace = bool(nics) and all(_in_own_namespace(link) for link in nics)

    def _read_proc_net_dev(self) -> dict[str, dict[str, int]] | None:
        fds = self._proc_fds
        for _ in range(2):  # a held fd that fails is opened once more
            if PROC_NET_DEV not in fds:
                try:
                    fds[PROC_NET_DEV] = os.open(PROC_NET_DEV, os.O_RDONLY)
                except OSError:
                    break
            try:
                text = _read_bounded(fds[PROC_NET_DEV], MAX_PROC_NET_DEV_BYTES)
            except OSError:
                os.close(fds.pop(PROC_NET_DEV))
                continue
            if text is not None:
                self._presence.note(PROC_NET_DEV, True)
                return parse_proc_net_dev(text, self._speeds)
            break
        self._presence.note(PROC_NET_DEV, False)
        return None

    def _read(self, link: NetLink, nic_counters: dict[str, dict[str, int]] | None) -> LinkReading | None:
        """This cycle's reading of a link; None when it is gone (or renamed: a held fd follows
        the device, so only its name tells)."""
        read = self._files.read
        text, up = read_state(link, read)
        if nic_counters is not None and not link.rdma:
            counters = nic_counters.get(link.device)
            if counters is None:  # no such name in this namespace any more
                return None
        else:
            counters = read_counters(link, read)
            if (text is None or not counters) and not os.path.isdir(link.path):
                return None
        self._note_unreadable(link, text is None, counters)
        before = self._states.get(link.device, text)
        self._states[link.device] = text
        if text != before:  # came up, went down, renegotiated: the rate may have changed
            self._speeds[link.device] = read_speed(link, read_attr)
        return LinkReading(
            device=link.device,
            kind=link.kind,
            numa_node=link.numa_node,
            engine=link.engine,
            up=up,
            speed_bytes_per_s=self._speeds.get(link.device),
            counters=counters,
        )

    def _note_unreadable(self, link: NetLink, no_state: bool, counters: Mapping[str, int]) -> None:
        missing = frozenset(key for key, _, _ in link.counters if key not in counters)
        if no_state:
            missing |= {"state"}
        before = self._unreadable.get(link.device, frozenset())
        if missing == before:
            return
        if missing:
            self._unreadable[link.device] = missing
        else:
            del self._unreadable[link.device]
        if missing - before:
            self._changes.add("with files not read", (f"{link.device}: {', '.join(sorted(missing))}",))
        elif not missing:
            self._changes.add("read again", (link.device,))


class LinkChanges:
    """What changed since the last summary line: per kind of change, a count and the first
    MAX_LOGGED_NAMES names (names are at most MAX_DEVICE_NAME characters: the line is bounded)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._names: dict[str, list[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._counts)

    def add(self, kind: str, names: Iterable[str]) -> None:
        listed = sorted(names)
        if not listed:
            return
        self._counts[kind] = self._counts.get(kind, 0) + len(listed)
        kept = self._names.setdefault(kind, [])
        kept.extend(listed[: MAX_LOGGED_NAMES - len(kept)])

    def summary(self) -> str:
        parts = []
        for kind, count in self._counts.items():
            names = self._names[kind]
            more = f", and {count - len(names)} more" if count > len(names) else ""
            parts.append(f"{count} {kind} ({'; '.join(names)}{more})")
        return ", ".join(parts)


PROC_NET_DEV = "/proc/self/net/dev"  # this process's namespace, whatever proc_root says


def _in_own_namespace(link: NetLink) -> bool:
    """Is this sysfs NIC the interface of that name in this process's network namespace?"""
    if link.ifindex is None:
        return False
    try:
        return socket.if_nametoindex(link.device) == link.ifindex
    except OSError:
        return False


def _close_fds(fds: dict[str, int]) -> None:
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _read_bounded(fd: int, limit: int) -> str | None:
    """The whole text behind a held fd (seq_file: a read returns a page at a time), None when
    longer than `limit`; raises OSError."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
        if offset > limit:
            return None
    return b"".join(chunks).decode("utf-8", errors="replace")
