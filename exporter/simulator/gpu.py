"""What NVML would report about the twin's GPUs, integrated slice by slice from the engine's work.

Power follows activity (idle floor + busy, DRAM and tensor terms, scaled by clock), temperature
follows power through a first-order thermal model (the HBM stacks through a second, slower one),
and clocks follow temperature and the power limit with NVML's clock-event reasons. The slowest
GPU of a TP group paces every step, so the clock ratio fed back to the engine is the minimum over
the group.

NVML's error counters (volatile ECC, remapped rows, PCIe replays, XID events) start at 0 on a
healthy card and move only through scheduled `GpuFault`s (the `faults` scenario); like a real
GPU's, they survive an engine restart and a scenario switch. So do the driver's recovery action
(none on a healthy card) and, on boards in an NVSwitch fabric, the fabric state (completed and
healthy), which a `GpuFault` can set.

What NVML answers can fail too, at run time (`POST /sim/gpu/<index>/fault`, docs/simulator.md): a
GPU that fell off the bus answers GpuIsLost to every call, one whose calls fail answers another
NVML return code, a field can become unsupported, and the library as a whole can fail (nvmlInit
answers DriverNotLoaded). /sim/gpu then shows what NVML would: a failing GPU's entry holds only its
index and the code, a failing field is null with its code under `nvml_errors`, a failing library is
the document's `nvml_error`. The engine runs on: the fault is in what NVML says, not in the work.
Like the error counters, faults survive an engine restart and a scenario switch, until recovered.
"""

from __future__ import annotations

import math
import random
import uuid as uuidlib
from dataclasses import dataclass, field

from exporter.physics.costs import Hardware
from exporter.specs.nvml_codes import FABRIC_HEALTH, FABRIC_STATES, RECOVERY_ACTIONS

CLOCK_EVENT_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)


# Boards whose GPUs register with an NVSwitch fabric (HGX/DGX and NVL72 SXM boards of Hopper and
# newer): NVML reports a fabric state for them. PCIe cards, NVLink-bridged NVL pairs and Ampere
# (the fabric API is Hopper and newer) have none, so their fabric series are absent.
NVSWITCH_GPUS = frozenset({"h100-sxm", "h200-sxm", "h20", "b200", "gb200"})
_RECOVERY_CODES = {name: code for code, name in RECOVERY_ACTIONS}
_FABRIC_STATE_CODES = {name: code for code, name in FABRIC_STATES}
_FABRIC_HEALTH_CODES = {name: code for code, name in FABRIC_HEALTH}

# NVML return codes (nvmlReturn_t) the twin's faults answer with; exporter/sources/gpu/_errors.py
# sorts them as the NVML source does (absent field, transient failure, lost GPU).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
# Every code nvml.h defines (1..29) and Unknown: a fault answers one NVML could.
NVML_ERROR_CODES = frozenset({*range(1, 30), NVML_ERROR_UNKNOWN})
FAULT_KINDS = ("lost", "nvml_error", "unsupported_field")
# The GPU object's fields a fault can make fail: all but its identity (index, uuid, name) and the
# XID events (the driver's event queue, not a query of the device).
FAILING_FIELDS = frozenset({
    "utilization_ratio", "dram_bandwidth_utilization_ratio", "sm_active_ratio", "tensor_active_ratio",
    "memory_utilization_ratio", "sm_occupancy_ratio", "memory_used_bytes", "memory_total_bytes",
    "memory_reserved_bytes", "processes", "power_watts", "power_limit_watts", "power_default_limit_watts",
    "energy_joules_total", "temperature_celsius", "memory_temperature_celsius", "sm_clock_hertz",
    "sm_clock_max_hertz", "memory_clock_hertz", "memory_clock_max_hertz", "clock_event_reasons", "pcie", "nvlink",
    "pcie_replay_errors_total", "ecc_errors", "remapped_rows", "recovery_action", "fabric"})

IDLE_UTILIZATION = 0.05  # below this average a GPU counts as idle (derive.signals.BUSY_UTILIZATION)


@dataclass(frozen=True, slots=True)
class Thermal:
    ambient_c: float = 30.0
    cooling: float = 1.0  # 1 = healthy airflow; lower = clogged filter, failed fan, hot aisle
    rise_at_tdp_c: float = 50.0  # steady-state rise over ambient at full TDP with healthy cooling
    tau_s: float = 20.0
    sw_slowdown_c: float = 87.0
    hw_slowdown_c: float = 92.0
    hysteresis_c: float = 5.0
    idle_power_fraction: float = 0.1
    power_limit_share: float = 1.0  # the enforced power limit / the board's default (an operator's nvidia-smi -pl)


@dataclass(frozen=True, slots=True)
class GpuFault:
    """One hardware event on GPU `gpu` (its position in the twin's TP group), `at_s` twin seconds
    after the scenario that schedules it started. Counts add to what the card already shows."""

    at_s: float
    gpu: int = 0
    xid: int = 0  # an XID event of this code (0: none)
    ecc_corrected: int = 0  # single-bit errors, corrected by ECC
    ecc_uncorrected: int = 0  # double-bit errors (XID 48 is their event)
    # A row with an uncorrectable error queued for remapping: uncorrectable remapped rows + 1 and
    # `pending` set until the GPU is reset (the twin never resets its GPUs).
    remap_pending: bool = False
    pcie_replays_per_s: float | None = None  # from now on, link-level replays per second while the link carries traffic
    # From now on, the driver's recovery action (a RECOVERY_ACTIONS name, e.g. "gpu_reset"; the twin
    # never resets its GPUs, so it stays until a later fault sets "none"), and on NVSwitch boards the
    # fabric state and health (FABRIC_STATES / FABRIC_HEALTH names).
    recovery_action: str | None = None
    fabric_state: str | None = None
    fabric_health: str | None = None

    def __post_init__(self) -> None:
        for value, names in ((self.recovery_action, _RECOVERY_CODES), (self.fabric_state, _FABRIC_STATE_CODES),
                             (self.fabric_health, _FABRIC_HEALTH_CODES)):
            if value is not None and value not in names:
                raise ValueError(f"GpuFault: {value!r} is not one of {', '.join(names)}")


# Memory the driver and firmware reserve (NVML v2 `reserved`): a fixed part plus a share of the
# card's memory, e.g. about 500 MiB on an 80 GB card, 420 MiB on a 24 GB one.
RESERVED_BASE_BYTES = 384 * 2**20
RESERVED_PER_GIB_BYTES = 1.5 * 2**20
MEMORY_TAU_S = 40.0  # the HBM stacks' thermal time constant (slower than the die's)


def reserved_memory_bytes(memory_bytes: float) -> int:
    return int(RESERVED_BASE_BYTES + RESERVED_PER_GIB_BYTES * memory_bytes / 2**30)


def sm_occupancy_while_active(tokens_per_step: float) -> float:
    """Resident warps over the maximum on a busy SM, by the tokens a step batches: a decode step of
    a few sequences runs thin GEMV-like kernels (about a fifth of the warps), a wide prefill batch
    tiles every SM with register-heavy tensor-core kernels (about 60%, never near 100%)."""
    m = max(0.0, tokens_per_step)
    return 0.2 + 0.4 * m / (m + 256.0)


@dataclass(frozen=True, slots=True)
class Slice:
    """Per-GPU work done in one slice of `dt` seconds (differences of engine Activity)."""

    dt: float
    busy_s: float
    memory_s: float
    compute_s: float
    dram_bytes: float
    flops: float
    comm_bytes: float
    host_io_bytes: float
    steps: int = 0  # engine steps that ended in the slice
    tokens: float = 0.0  # tokens those steps batched (prefill chunks + decoded tokens)
    # GPUDirect RDMA: bytes a NIC read from (sent) or wrote to (received) this GPU's memory over its
    # PCIe link in the slice (the KV of a prefill/decode pair)
    nic_read_bytes: float = 0.0
    nic_write_bytes: float = 0.0


def _ema(old: float, new: float, dt: float, tau: float = 1.0) -> float:
    a = 1.0 - math.exp(-dt / tau)
    return old + (new - old) * a


@dataclass(slots=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    temp_offset_c: float
    temperature_c: float
    memory_temperature_c: float
    energy_j: float = 0.0
    power_w: float = 0.0
    clock_factor: float = 1.0  # throttle multiplier on the max SM clock
    power_clock_factor: float = 1.0  # the clock share at which the work fits the power limit
    active: bool = False
    utilization: float = 0.0
    dram_util: float = 0.0
    sm_active: float = 0.0
    tensor_active: float = 0.0
    sm_occupancy: float = 0.0
    memory_busy: float = 0.0  # NVML utilization.memory: share of time DRAM was read or written
    pcie_tx: float = 0.0
    pcie_rx: float = 0.0
    nvlink_tx: float = 0.0
    nvlink_rx: float = 0.0
    reasons: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(CLOCK_EVENT_REASONS, False))
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    pcie_replays: float = 0.0
    pcie_replays_per_s: float = 0.0
    xids: dict[str, int] = field(default_factory=dict)  # XID code -> events since the twin started
    recovery_action: int = 0  # NVML code (RECOVERY_ACTIONS): 0 none
    fabric_state: int = _FABRIC_STATE_CODES["completed"]
    fabric_health: int = _FABRIC_HEALTH_CODES["healthy"]
    nvml_error: int = 0  # the NVML return code every call on the GPU answers (0: it answers)
    field_errors: dict[str, int] = field(default_factory=dict)  # /sim/gpu field -> the code it answers


def _power_clock(headroom_w: float, dynamic_w: float) -> float:
    """The clock share at which `dynamic_w` (drawn at full clock) fits in `headroom_w`: dynamic power
    goes with clock^1.5. Never below 0.3: the driver's floor keeps the card running."""
    return max(0.3, min(1.0, (headroom_w / dynamic_w) ** (2 / 3))) if dynamic_w > 0 else 1.0


class GpuModel:
    def __init__(self, hw: Hardware, thermal: Thermal, *, memory_used_bytes: float, index_base: int,
                 rng: random.Random, power_limit_w: float | None = None) -> None:
        self.hw = hw
        self.thermal = thermal
        self.memory_used_bytes = memory_used_bytes
        self._power_limit_override = power_limit_w
        self.power_limit_w = power_limit_w or hw.gpu.tdp_watts * thermal.power_limit_share
        self.t = 0.0  # twin seconds integrated so far
        self._faults: list[tuple[float, GpuFault]] = []  # (absolute time, fault), in time order
        self.library_error = 0  # the code nvmlInit and every call answer while the library fails (0: none)
        self.devices: list[GpuDevice] = []
        for i in range(hw.tp):
            offset = rng.uniform(-1.5, 1.5)  # no two cards sit in the same airflow
            uid = uuidlib.UUID(int=rng.getrandbits(128), version=4)
            self.devices.append(GpuDevice(
                index=index_base + i, uuid=f"GPU-{uid}", name=hw.gpu.nvml_name,
                temp_offset_c=offset, temperature_c=thermal.ambient_c + 5.0 + offset,
                memory_temperature_c=thermal.ambient_c + 4.0 + offset,
            ))
        for d in self.devices:
            d.power_w = self._idle_power()

    def _idle_power(self) -> float:
        return self.hw.gpu.tdp_watts * self.thermal.idle_power_fraction

    def set_thermal(self, thermal: Thermal) -> None:
        self.thermal = thermal
        self.power_limit_w = self._power_limit_override or self.hw.gpu.tdp_watts * thermal.power_limit_share

    def set_hardware(self, hw: Hardware) -> None:
        self.hw = hw

    def set_faults(self, faults: tuple[GpuFault, ...]) -> None:
        """Schedule a scenario's faults from now on. The new scenario sets the hardware's condition: a
        fault not yet due from the previous one is dropped and its link stops replaying, while what
        already happened stays on the counters (and a pending remap pending: only a GPU reset applies it)."""
        self._faults = sorted(((self.t + f.at_s, f) for f in faults), key=lambda e: e[0])
        for d in self.devices:
            d.pcie_replays_per_s = 0.0

    def _apply_due_faults(self) -> None:
        while self._faults and self._faults[0][0] <= self.t:
            _, f = self._faults.pop(0)
            if not 0 <= f.gpu < len(self.devices):
                continue
            d = self.devices[f.gpu]
            if f.xid:
                d.xids[str(f.xid)] = d.xids.get(str(f.xid), 0) + 1
            d.ecc_corrected += f.ecc_corrected
            d.ecc_uncorrected += f.ecc_uncorrected
            if f.remap_pending:
                d.remapped_uncorrectable += 1
                d.remap_pending = True
            if f.pcie_replays_per_s is not None:
                d.pcie_replays_per_s = f.pcie_replays_per_s
            if f.recovery_action is not None:
                d.recovery_action = _RECOVERY_CODES[f.recovery_action]
            if f.fabric_state is not None:
                d.fabric_state = _FABRIC_STATE_CODES[f.fabric_state]
            if f.fabric_health is not None:
                d.fabric_health = _FABRIC_HEALTH_CODES[f.fabric_health]

    @property
    def has_hbm(self) -> bool:
        """HBM cards have a memory temperature sensor and row remapping; GDDR cards have neither."""
        return self.hw.gpu.memory_type.upper().startswith("HBM")

    @property
    def has_ecc(self) -> bool:
        """Data-centre cards run with ECC on; GeForce cards report it off (the series is absent)."""
        return "geforce" not in self.hw.gpu.nvml_name.lower()

    @property
    def clock_ratio(self) -> float:
        """SM clock over max of the slowest GPU: TP ranks wait for each other every layer."""
        return min(d.clock_factor for d in self.devices) if self.devices else 1.0

    def update(self, s: Slice) -> None:
        if s.dt <= 0:
            return
        spec = self.hw.gpu
        th = self.thermal
        self.t += s.dt
        self._apply_due_faults()
        busy = min(1.0, s.busy_s / s.dt)
        dram = min(1.0, s.dram_bytes / (spec.mem_bandwidth_bytes_per_s * s.dt))
        # Memory-bound time is the time DRAM streams at its achievable rate: NVML's memory busy share.
        memory_busy = min(1.0, s.memory_s / s.dt)
        occupancy_active = sm_occupancy_while_active(s.tokens / s.steps) if s.steps else 0.0
        for d in self.devices:
            tensor = min(1.0, s.flops / (spec.bf16_dense_flops * max(d.clock_factor, 0.05) * s.dt))
            work = s.memory_s + s.compute_s
            compute_share = s.compute_s / work if work else 0.0
            sm_active = busy * (0.75 + 0.2 * compute_share)
            d.active = busy > 0.01
            idle_w = self._idle_power()
            dynamic = min(1.0, 0.25 * busy + 0.35 * dram + 0.6 * tensor)
            # What the work would draw at full clocks: over the limit, the driver lowers the clock until
            # it fits (sw_power_cap). Dynamic power falls faster than clock (voltage drops with it).
            demand = idle_w + (spec.tdp_watts - idle_w) * dynamic
            capped = demand > self.power_limit_w
            d.reasons["sw_power_cap"] = capped
            d.power_clock_factor = _power_clock(max(self.power_limit_w - idle_w, 0.0), demand - idle_w) \
                if capped else 1.0
            power = idle_w + (spec.tdp_watts - idle_w) * dynamic * d.clock_factor**1.5
            power = min(power, self.power_limit_w)
            d.power_w = power
            d.energy_j += power * s.dt
            steady = th.ambient_c + d.temp_offset_c + (power / spec.tdp_watts) * th.rise_at_tdp_c / th.cooling
            d.temperature_c += (steady - d.temperature_c) * (1.0 - math.exp(-s.dt / th.tau_s))
            # The HBM stacks sit beside the die on the same cold plate: heated by the board's power
            # and by their own DRAM traffic, so a memory-bound card runs its memory hotter than its
            # die and a compute-bound one cooler.
            memory_steady = th.ambient_c + d.temp_offset_c + (
                0.8 * (power / spec.tdp_watts) * th.rise_at_tdp_c + 15.0 * dram) / th.cooling
            d.memory_temperature_c += (memory_steady - d.memory_temperature_c) * (1.0 - math.exp(-s.dt / MEMORY_TAU_S))
            self._throttle(d)
            d.reasons["gpu_idle"] = not d.active
            d.utilization = _ema(d.utilization, busy, s.dt)
            d.dram_util = _ema(d.dram_util, dram, s.dt)
            d.sm_active = _ema(d.sm_active, sm_active, s.dt)
            d.tensor_active = _ema(d.tensor_active, tensor, s.dt)
            d.sm_occupancy = _ema(d.sm_occupancy, sm_active * occupancy_active, s.dt)
            d.memory_busy = _ema(d.memory_busy, memory_busy, s.dt)
            if d.active:  # replays are retransmitted packets: only a link carrying traffic has them
                d.pcie_replays += d.pcie_replays_per_s * s.dt
            io = s.host_io_bytes / s.dt
            p2p = s.comm_bytes / s.dt
            # Over a network link (cross-node TP) the all-reduce goes GPU -> PCIe -> NIC (GPUDirect RDMA).
            on_pcie = self.hw.tp > 1 and self.hw.link in ("pcie", "network")
            d.pcie_tx = _ema(d.pcie_tx, io * 0.3 + (p2p if on_pcie else 0.0) + s.nic_read_bytes / s.dt, s.dt)
            d.pcie_rx = _ema(d.pcie_rx, io * 0.7 + (p2p if on_pcie else 0.0) + s.nic_write_bytes / s.dt, s.dt)
            on_nvlink = self.hw.tp > 1 and self.hw.link == "nvlink"
            d.nvlink_tx = _ema(d.nvlink_tx, p2p if on_nvlink else 0.0, s.dt)
            d.nvlink_rx = _ema(d.nvlink_rx, p2p if on_nvlink else 0.0, s.dt)

    def _throttle(self, d: GpuDevice) -> None:
        th = self.thermal
        r = d.reasons
        t = d.temperature_c
        if t >= th.hw_slowdown_c:
            r["hw_thermal_slowdown"] = r["hw_slowdown"] = True
        elif t < th.hw_slowdown_c - th.hysteresis_c:
            r["hw_thermal_slowdown"] = r["hw_slowdown"] = False
        if t >= th.sw_slowdown_c:
            r["sw_thermal_slowdown"] = True
        elif t < th.sw_slowdown_c - 2.0:
            r["sw_thermal_slowdown"] = False
        factor = 1.0
        if r["sw_thermal_slowdown"]:
            factor = 0.85
        if r["hw_thermal_slowdown"]:
            factor = 0.5  # HW slowdown cuts the clock at least in half
        if r["sw_power_cap"]:
            factor = min(factor, d.power_clock_factor)
        d.clock_factor = factor

    # --- what NVML shows --------------------------------------------------------------------

    def sm_clock_hz(self, d: GpuDevice) -> float:
        spec = self.hw.gpu
        if not d.active:
            return max(210e6, 0.15 * spec.max_sm_clock_hz)
        return spec.max_sm_clock_hz * d.clock_factor

    def memory_clock_hz(self, d: GpuDevice) -> float:
        spec = self.hw.gpu
        # HBM runs at one clock; GDDR drops to its idle state between bursts.
        if spec.memory_type.startswith("GDDR") and not d.active:
            return 0.1 * spec.max_mem_clock_hz
        return spec.max_mem_clock_hz

    def pcie_link(self, d: GpuDevice) -> dict[str, int]:
        spec = self.hw.gpu
        # An idle GPU drops its link to gen 1 to save power; under load it trains to what the slot allows.
        # Idle means idle for a while (utilization, an average): a GPU between bursts keeps its link (a
        # prefill instance waiting for its KV link to drain read as a link trained down under load).
        gen = self.hw.link_gen if d.active or d.utilization >= IDLE_UTILIZATION else 1
        return {"gen_current": gen, "gen_max": spec.pcie_gen, "width_current": self.hw.link_width,
                "width_max": spec.pcie_width}

    def state(self) -> list[dict[str, object]]:
        spec = self.hw.gpu
        reserved = reserved_memory_bytes(spec.memory_bytes)
        # NVML v2: used + reserved + free = total; the engine's preallocation is all of `used`.
        used = int(min(self.memory_used_bytes, spec.memory_bytes - reserved))
        hbm, ecc = self.has_hbm, self.has_ecc
        fabric = spec.key in NVSWITCH_GPUS
        out: list[dict[str, object]] = []
        for d in self.devices:
            if d.nvml_error:  # nothing but the error: NVML cannot even say which card it was
                out.append({"index": d.index, "nvml_error": d.nvml_error})
                continue
            entry: dict[str, object] = {
                "index": d.index,
                "uuid": d.uuid,
                "name": d.name,
                "utilization_ratio": round(d.utilization, 6),
                "dram_bandwidth_utilization_ratio": round(d.dram_util, 6),
                "sm_active_ratio": round(d.sm_active, 6),
                "tensor_active_ratio": round(d.tensor_active, 6),
                "memory_utilization_ratio": round(d.memory_busy, 6),
                "sm_occupancy_ratio": round(d.sm_occupancy, 6),
                "memory_used_bytes": used,
                "memory_total_bytes": int(spec.memory_bytes),
                "memory_reserved_bytes": reserved,
                # NVML's compute processes: the engine, holding what it preallocated (its CUDA context included).
                "processes": [{"name": "engine", "used_gpu_memory_bytes": used}],
                "power_watts": round(d.power_w, 3),
                "power_limit_watts": self.power_limit_w,
                "power_default_limit_watts": self.hw.gpu.tdp_watts,
                "energy_joules_total": round(d.energy_j, 3),
                "temperature_celsius": round(d.temperature_c, 3),
                "memory_temperature_celsius": round(d.memory_temperature_c, 3) if hbm else None,
                "sm_clock_hertz": self.sm_clock_hz(d),
                "sm_clock_max_hertz": spec.max_sm_clock_hz,
                "memory_clock_hertz": self.memory_clock_hz(d),
                "memory_clock_max_hertz": spec.max_mem_clock_hz,
                "clock_event_reasons": {k: int(v) for k, v in d.reasons.items()},
                "pcie": {**self.pcie_link(d), "tx_bytes_per_second": round(d.pcie_tx, 3),
                         "rx_bytes_per_second": round(d.pcie_rx, 3)},
                "nvlink": None if not spec.nvlink_bytes_per_s else {
                    "tx_bytes_per_second": round(d.nvlink_tx, 3), "rx_bytes_per_second": round(d.nvlink_rx, 3)},
                "pcie_replay_errors_total": int(d.pcie_replays),
                "ecc_errors": {"corrected": d.ecc_corrected, "uncorrected": d.ecc_uncorrected} if ecc else None,
                "remapped_rows": None if not hbm else {
                    "correctable": d.remapped_correctable, "uncorrectable": d.remapped_uncorrectable,
                    "pending": int(d.remap_pending), "failed": int(d.remap_failed)},
                "xid_errors": dict(sorted(d.xids.items(), key=lambda kv: int(kv[0]))),
                "recovery_action": d.recovery_action,
                # status: NVML's result of the registration (0 success), once the state is completed.
                "fabric": None if not fabric else {
                    "state": d.fabric_state, "health": d.fabric_health,
                    "status": 0 if d.fabric_state == _FABRIC_STATE_CODES["completed"] else None},
            }
            if d.field_errors:
                entry.update(dict.fromkeys(d.field_errors))
                entry["nvml_errors"] = dict(d.field_errors)
            out.append(entry)
        return out


def _device(models: list[GpuModel], index: int) -> GpuDevice:
    for model in models:
        for d in model.devices:
            if d.index == index:
                return d
    shown = ", ".join(str(d.index) for m in models for d in m.devices)
    raise LookupError(f"no GPU {index} in this twin (its GPUs: {shown})")


def inject_fault(models: list[GpuModel], index: int | None, kind: str, *, code: int | None = None,
                 field_name: str | None = None) -> dict[str, object]:
    """Make GPU `index` (None: every GPU, and for nvml_error the library itself) fail as NVML would
    show it, until recover_faults. Raises ValueError for a bad kind, code or field, LookupError for
    a GPU the twin does not have. Returns what now fails."""
    if kind not in FAULT_KINDS:
        raise ValueError(f"kind is one of {', '.join(FAULT_KINDS)}")
    devices = [d for m in models for d in m.devices] if index is None else [_device(models, index)]
    if kind == "unsupported_field":
        if code is not None:
            raise ValueError("unsupported_field answers NotSupported (3); nvml_error with a field takes a code")
        code = NVML_ERROR_NOT_SUPPORTED
        if field_name is None:
            raise ValueError("unsupported_field needs a field (a key of the GPU's /sim/gpu object)")
    elif kind == "lost":
        if code is not None or field_name is not None:
            raise ValueError("lost takes no code or field: a GPU off the bus answers GpuIsLost (15) to everything")
        code = NVML_ERROR_GPU_IS_LOST
    elif code is None:
        code = NVML_ERROR_UNKNOWN
    if not isinstance(code, int) or isinstance(code, bool) or code not in NVML_ERROR_CODES:
        raise ValueError("code is an NVML return code: 1 to 29, or 999 (Unknown)")
    if field_name is not None:
        if not isinstance(field_name, str) or field_name not in FAILING_FIELDS:
            raise ValueError(f"field is one of the GPU's /sim/gpu fields: {', '.join(sorted(FAILING_FIELDS))}")
        for d in devices:
            d.field_errors[field_name] = code
        return {"gpus": [d.index for d in devices], "field": field_name, "code": code}
    if index is None and kind == "nvml_error":
        for m in models:
            m.library_error = code
        return {"library": True, "code": code}
    for d in devices:
        d.nvml_error = code
    return {"gpus": [d.index for d in devices], "code": code}


def recover_faults(models: list[GpuModel], index: int | None) -> dict[str, object]:
    """GPU `index` answers again (None: every GPU and the library). Returns the GPUs recovered."""
    devices = [d for m in models for d in m.devices] if index is None else [_device(models, index)]
    for d in devices:
        d.nvml_error = 0
        d.field_errors.clear()
    if index is None:
        for m in models:
            m.library_error = 0
    return {"gpus": [d.index for d in devices]}


def library_error(models: list[GpuModel]) -> int | None:
    """The code nvmlInit answers while the library fails (a fault on every GPU: `all`), else None."""
    return next((m.library_error for m in models if m.library_error), None)
