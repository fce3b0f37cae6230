"""sysfs readers for the host source: NVIDIA GPU PCI devices (link state, NUMA node) and the NUMA
nodes themselves (CPUs, memory). Parsers are pure; the readers only join paths under sys_root and
read with the `read` they are given (the host source's held files for what it reads every cycle)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from exporter.sources.host_proc import Reader, list_dir, parse_cpulist, parse_meminfo, read_text

NVIDIA_VENDOR = "0x10de"
# PCI class 0x0300xx is a VGA controller (workstation cards), 0x0302xx a 3D controller
# (datacenter cards: A100, H100, H200, L4). Audio functions (0x0403) and NVSwitch bridges
# (0x0680) share the vendor id and are skipped.
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")
NODE_MEMINFO_KEYS = ("MemTotal", "MemFree")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PciLink:
    """One GPU's PCI device as sysfs shows it; None where the file is absent or says Unknown."""

    address: str
    numa_node: int | None
    current_speed_gts: float | None
    max_speed_gts: float | None
    current_width: int | None
    max_width: int | None


@dataclass(frozen=True, slots=True)
class LinkCapability:
    """What a GPU's slot and firmware give it: these files do not change while the device is
    there (numa_node only when root overrides a wrong firmware value), so they are read now and
    then, not every cycle."""

    numa_node: int | None
    max_speed_gts: float | None
    max_width: int | None


@dataclass(frozen=True, slots=True)
class NumaNode:
    node: int
    cpus: frozenset[int] | None
    total_bytes: int | None
    free_bytes: int | None


def parse_link_speed(text: str) -> float | None:
    """"32.0 GT/s PCIe", "8 GT/s", "2.5 GT/s PCIe" -> GT/s; "Unknown" (link down) -> None."""
    token = text.strip().split(" ", 1)[0]
    try:
        return float(token)
    except ValueError:
        return None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def parse_numa_node(text: str | None) -> int | None:
    """sysfs numa_node; -1 means the firmware gave no affinity (VMs, single-socket boards)."""
    node = parse_int(text)
    return node if node is not None and node >= 0 else None


def is_nvidia_gpu(vendor: str | None, pci_class: str | None) -> bool:
    if vendor is None or pci_class is None:
        return False
    return vendor.strip().lower() == NVIDIA_VENDOR and pci_class.strip().lower().startswith(GPU_CLASS_PREFIXES)


def pci_devices_dir(sys_root: str) -> str:
    return os.path.join(sys_root, "bus", "pci", "devices")


def discover_gpus(sys_root: str) -> tuple[str, ...]:
    """PCI addresses of NVIDIA GPUs, sorted (the order nvidia-smi uses with PCI_BUS_ID)."""
    base = pci_devices_dir(sys_root)
    found = []
    for address in list_dir(base):
        dev = os.path.join(base, address)
        if is_nvidia_gpu(read_text(os.path.join(dev, "vendor")), read_text(os.path.join(dev, "class"))):
            found.append(address)
    return tuple(sorted(found))


def read_link_capability(sys_root: str, address: str, read: Reader = read_text) -> LinkCapability:
    dev = os.path.join(pci_devices_dir(sys_root), address)
    return LinkCapability(
        numa_node=parse_numa_node(read(os.path.join(dev, "numa_node"))),
        max_speed_gts=_speed(read(os.path.join(dev, "max_link_speed"))),
        max_width=parse_int(read(os.path.join(dev, "max_link_width"))),
    )


def read_pci_link(
    sys_root: str, address: str, read: Reader = read_text, capability: LinkCapability | None = None
) -> PciLink | None:
    """The device's link files; None when the device directory itself is gone. The current speed
    and width are read every time (a link that trains down is what the alerts are for); the
    capability is read too unless the caller passes the one it read before."""
    dev = os.path.join(pci_devices_dir(sys_root), address)
    current_speed = read(os.path.join(dev, "current_link_speed"))
    current_width = read(os.path.join(dev, "current_link_width"))
    # Both files read: the device is there (saves a stat per GPU per cycle). Otherwise tell a
    # device without link files (conventional PCI, not PCIe) from one that went away.
    if (current_speed is None or current_width is None) and not os.path.isdir(dev):
        return None
    if capability is None:  # read now and then only: the plain way, not held
        capability = read_link_capability(sys_root, address)
    return PciLink(
        address=address,
        numa_node=capability.numa_node,
        current_speed_gts=_speed(current_speed),
        max_speed_gts=capability.max_speed_gts,
        current_width=parse_int(current_width),
        max_width=capability.max_width,
    )


def capability_of(link: PciLink) -> LinkCapability:
    return LinkCapability(
        numa_node=link.numa_node, max_speed_gts=link.max_speed_gts, max_width=link.max_width
    )


def _speed(text: str | None) -> float | None:
    return parse_link_speed(text) if text is not None else None


def numa_nodes_dir(sys_root: str) -> str:
    return os.path.join(sys_root, "devices", "system", "node")


def read_numa_nodes(sys_root: str, read: Reader = read_text) -> tuple[NumaNode, ...]:
    """Every sysfs node*/ directory; empty on kernels built without NUMA."""
    base = numa_nodes_dir(sys_root)
    nodes = []
    for entry in list_dir(base):
        if not entry.startswith("node") or not entry[4:].isdigit():
            continue
        path = os.path.join(base, entry)
        cpulist = _parsed(parse_cpulist, read(os.path.join(path, "cpulist")))
        meminfo = _parsed(_node_meminfo, read(os.path.join(path, "meminfo"))) or {}
        nodes.append(
            NumaNode(
                node=int(entry[4:]),
                cpus=cpulist,
                total_bytes=meminfo.get("MemTotal"),
                free_bytes=meminfo.get("MemFree"),
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.node))


def _node_meminfo(text: str) -> dict[str, int]:
    return parse_meminfo(text, NODE_MEMINFO_KEYS)


def read_online_cpus(sys_root: str, read: Reader = read_text) -> frozenset[int] | None:
    return _parsed(parse_cpulist, read(os.path.join(sys_root, "devices", "system", "cpu", "online")))


def _parsed(parser: Callable[[str], T], text: str | None) -> T | None:
    """parser(text), or None when the file was absent or did not parse (unknown, not zero)."""
    if text is None:
        return None
    try:
        return parser(text)
    except (ValueError, IndexError):
        return None
