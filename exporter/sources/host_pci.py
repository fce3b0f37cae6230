"""sysfs readers for the host source: NVIDIA GPU PCI devices (link state, NUMA node) and the NUMA
nodes themselves (CPUs, memory). Parsers are pure; the readers only join paths under sys_root."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from exporter.sources.host_proc import list_dir, parse_cpulist, parse_meminfo, read_text

NVIDIA_VENDOR = "0x10de"
# PCI class 0x0300xx is a VGA controller (workstation cards), 0x0302xx a 3D controller
# (datacenter cards: A100, H100, H200, L4). Audio functions (0x0403) and NVSwitch bridges
# (0x0680) share the vendor id and are skipped.
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")
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


def read_pci_link(sys_root: str, address: str) -> PciLink | None:
    """The device's link files; None when the device directory itself is gone."""
    dev = os.path.join(pci_devices_dir(sys_root), address)
    if not os.path.isdir(dev):
        return None

    def speed(name: str) -> float | None:
        text = read_text(os.path.join(dev, name))
        return parse_link_speed(text) if text is not None else None

    return PciLink(
        address=address,
        numa_node=parse_numa_node(read_text(os.path.join(dev, "numa_node"))),
        current_speed_gts=speed("current_link_speed"),
        max_speed_gts=speed("max_link_speed"),
        current_width=parse_int(read_text(os.path.join(dev, "current_link_width"))),
        max_width=parse_int(read_text(os.path.join(dev, "max_link_width"))),
    )


def numa_nodes_dir(sys_root: str) -> str:
    return os.path.join(sys_root, "devices", "system", "node")


def read_numa_nodes(sys_root: str) -> tuple[NumaNode, ...]:
    """Every sysfs node*/ directory; empty on kernels built without NUMA."""
    base = numa_nodes_dir(sys_root)
    nodes = []
    for entry in list_dir(base):
        if not entry.startswith("node") or not entry[4:].isdigit():
            continue
        path = os.path.join(base, entry)
        cpulist = _parsed(parse_cpulist, read_text(os.path.join(path, "cpulist")))
        meminfo = _parsed(parse_meminfo, read_text(os.path.join(path, "meminfo"))) or {}
        nodes.append(
            NumaNode(
                node=int(entry[4:]),
                cpus=cpulist,
                total_bytes=meminfo.get("MemTotal"),
                free_bytes=meminfo.get("MemFree"),
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.node))


def read_online_cpus(sys_root: str) -> frozenset[int] | None:
    return _parsed(parse_cpulist, read_text(os.path.join(sys_root, "devices", "system", "cpu", "online")))


def _parsed(parser: Callable[[str], T], text: str | None) -> T | None:
    """parser(text), or None when the file was absent or did not parse (unknown, not zero)."""
    if text is None:
        return None
    try:
        return parser(text)
    except (ValueError, IndexError):
        return None
