"""GPU faults that take a GPU out of service, declared once: the diagnosis' GPU health
(exporter/derive/health.py), the XID alert lists (exporter/mixin/config.py), docs/diagnosis.md and the
runbooks read this table. Data only (exporter/specs), like nvml_codes.py.

XID meanings and actions follow NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) and its
GPU memory error management guide: a code whose action is not NONE means the GPU cannot be trusted
with work until someone acts (restart the engine, reset the GPU, reboot the node, or replace it).
"""

from __future__ import annotations

from typing import NamedTuple

from exporter.specs.nvml_codes import RECOVERY_ACTIONS


class Action(NamedTuple):
    """What an operator does about a fault: a short name (a label value) and the words."""

    name: str
    words: str


NONE = Action("none", "no service action: read the engine's logs (an application fault)")
RESTART_ENGINE = Action("restart_engine", "drain and restart the engine; reset the GPU at the next window")
RESET_GPU = Action("reset_gpu", "drain the engine, then reset the GPU (nvidia-smi -r) or reboot; RMA if it recurs")
REBOOT_NODE = Action("reboot_node", "drain the node and reboot it; RMA if it recurs")
RMA = Action("rma", "take the GPU out of service and open an RMA")
CHECK = Action("check", "drain the engine and check the GPU with nvidia-smi and dmesg (XID 79: fallen off the bus)")


class Xid(NamedTuple):
    code: int
    what: str
    severity: str  # the XID alert it raises: critical (LLMGPUXidCritical) or warning (LLMGPUXidWarning)
    action: Action


XIDS: tuple[Xid, ...] = (
    Xid(13, "graphics engine exception (an application fault)", "warning", NONE),
    Xid(31, "GPU memory page fault (an application fault)", "warning", NONE),
    Xid(43, "GPU stopped processing (an application fault)", "warning", NONE),
    Xid(45, "preemptive cleanup: a process was killed", "warning", NONE),
    Xid(48, "double-bit ECC error", "critical", RESET_GPU),
    Xid(62, "internal micro-controller halt", "critical", RESET_GPU),
    Xid(63, "ECC page retirement or row remap recorded: it applies at the next GPU reset", "warning", RESET_GPU),
    Xid(64, "ECC page retirement or row remap failed", "critical", RESET_GPU),
    Xid(74, "NVLink error", "critical", RESET_GPU),
    Xid(79, "GPU has fallen off the bus", "critical", REBOOT_NODE),
    Xid(92, "high single-bit ECC error rate", "warning", NONE),
    Xid(94, "contained ECC error: the process that hit it was stopped", "warning", RESTART_ENGINE),
    Xid(95, "uncontained ECC error", "critical", RESET_GPU),
    Xid(119, "GSP RPC timeout", "critical", RESET_GPU),
    Xid(120, "GSP error", "critical", RESET_GPU),
)
BY_CODE = {x.code: x for x in XIDS}
XID_CRITICAL = tuple(x.code for x in XIDS if x.severity == "critical")
XID_WARNING = tuple(x.code for x in XIDS if x.severity == "warning")

FAULT_WINDOW_S = 3600.0
"""An event fault (a new uncorrected ECC error, an XID, a row remapped after an uncorrectable error)
holds the GPU unhealthy this long after it was last seen, as the XID and ECC alerts page for their
1h window; standing states (a pending or failed remap, a recovery action, a lost GPU) hold while
they last."""

SOURCE_LOST_REASONS = frozenset({"driver_not_loaded", "nvml_init", "nvml_missing", "nvml_permission",
                                 "nvml_mismatch", "no_gpus"})
"""GPU source failures (its collect error reasons) after which the GPUs it read before count as lost:
NVML can no longer open them (the driver unloaded or crashed, a GPU fallen off the bus so the count
drops to none). Under --gpu-backend nvml such a failure is a source error with no GPU series, and
the diagnosis read HEALTHY. A timeout or a busy cycle is not one of them: slow is not gone."""

# The driver's recovery action (llm_gpu_recovery_action), by NVML code: what to do about each.
RECOVERY_WORDS: dict[int, Action] = {
    1: RESET_GPU, 2: REBOOT_NODE, 3: Action("drain_p2p", "drain peer-to-peer and multi-node NVLink work on it"),
    4: Action("drain_and_reset", "drain the engine, then reset the GPU"), 5: Action(
        "recover_imex_domain", "recover the IMEX domain (multi-node NVLink) before using the GPU"),
    6: Action("bus_reset", "drain the engine, then reset the PCIe bus (or reboot)"),
    7: Action("system_reboot", "drain the node and reboot it"),
}
RECOVERY_NAMES = dict(RECOVERY_ACTIONS)


def window_text(seconds: float) -> str:
    """A duration as Prometheus writes one (1h, 30m, 45s)."""
    s = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"
