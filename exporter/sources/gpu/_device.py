"""One GPU through NVML: what is read once per NVML generation (identity, maxima, capabilities)
and what is read each cycle, every field through one safe wrapper (gpustat's safenvml).

A field the GPU cannot give (NotSupported, NoPermission, FunctionNotFound, a version mismatch) is
remembered as absent for the generation, logged once and omitted; a transient failure skips the
field for one cycle; a lost GPU raises GpuLost so the caller can mark it down and keep the others.

On a GPU host the cost of a cycle is mostly NVML calls (a driver round trip plus pynvml's ctypes
work each), so a cycle makes as few as it can: the counters NVML also serves as field values
(energy, ECC, PCIe replays, remapped rows, HBM temperature, PCIe and NVLink byte counters) ride in
one nvmlDeviceGetFieldValues call per GPU; what cannot change within a generation (maxima, the
supported clock-event reasons, identity) is read when the GPU is opened and its samples built then;
the enforced power limit, which only an operator or the BMC changes, is asked for every
POWER_LIMIT_REFRESH_S, and the NVLink fabric state (NVSwitch systems only) every FABRIC_REFRESH_S.
The driver's recovery action rides in the field batch.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from exporter.snapshot import Labels, Sample, labels_of, make_labels
from exporter.sources.gpu._counters import CounterRates, ResetSafeTotals
from exporter.sources.gpu._errors import (
    NOT_SUPPORTED,
    Kind,
    OnceLog,
    classify,
    classify_code,
    describe,
)
from exporter.sources.gpu._gpm import NVLINK_METRICS, PCIE_METRICS, RATIO_METRICS, GpmSampler
from exporter.specs.nvml_codes import FABRIC_COMPLETED

# Field ids and enum values are NVML ABI; pynvml names them, fallbacks keep old bindings working.
FI_ECC_SBE_VOL_TOTAL = 3  # volatile corrected (single-bit) ECC errors, as nvmlDeviceGetTotalEccErrors
FI_ECC_DBE_VOL_TOTAL = 4  # volatile uncorrected (double-bit) ECC errors
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY = 83  # mJ since the driver loaded, as nvmlDeviceGetTotalEnergyConsumption
FI_PCIE_REPLAY = 94  # as nvmlDeviceGetPcieReplayCounter
FI_NVLINK_DATA_TX = 138  # cumulative KiB per link (scopeId = link)
FI_NVLINK_DATA_RX = 139
FI_REMAPPED_COR = 142  # the four values of nvmlDeviceGetRemappedRows
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_PCIE_TX_BYTES = 197  # cumulative bytes, may wrap
FI_PCIE_RX_BYTES = 198
FI_GPU_RECOVERY_ACTION = 230  # nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, ...
_NVLINK_FIELDS = (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX)
_NVLINK_RATES = ("llm_gpu_nvlink_tx_bytes_per_second", "llm_gpu_nvlink_rx_bytes_per_second")

TEMPERATURE_GPU = 0
CLOCK_SM = 1
CLOCK_MEM = 2
MEMORY_ERROR_CORRECTED = 0
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
MIG_ENABLED = 1
FEATURE_ENABLED = 1

# Clock-event (throttle) reason bits of nvmlDeviceGetCurrentClocksEventReasons.
REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
REMAPPED_STATES = ("correctable", "uncorrectable", "pending", "failed")

# nvmlFieldValue_t.valueType -> union member, and the wrap-around of the unsigned narrow types.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_VALUE_WRAP = {1: float(2**32), 6: float(2**16)}

KIB = 1024.0

FIELD_MISSES_BEFORE_CALL = 3
"""Cycles in a row a call-backed field may come back without a value (NO_DATA, NOT_READY, ...)
before its dedicated call takes over: a transient miss costs one sample, a lasting one no series."""

POWER_LIMIT_REFRESH_S = 10.0
"""How long a reading of the enforced power limit is reused (it changes only when a cap is set)."""

FABRIC_REFRESH_S = 10.0
"""How long a reading of the NVLink fabric state is reused: it moves once at boot (not started, in
progress, completed) and otherwise only when the fabric degrades; its alerts wait minutes."""
FABRIC_NOT_SUPPORTED = 0  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: not in an NVSwitch fabric
HEALTH_NOT_SUPPORTED = 0  # NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED

# What a field's value becomes (FieldSpec.sink).
GAUGE = 0  # one sample of the value as it is
ENERGY = 1  # mJ -> J, kept monotonic across driver reloads
PCIE_BYTES = 2  # a cumulative byte counter: one rate
NVLINK_KIB = 3  # one link's cumulative KiB: summed over the links into one rate per direction

# Values served both by a field and by a dedicated call (the call's key names the group). They
# are read in the batch; one the batch refuses is read with its own call from the next cycle on,
# so a driver that answers one way and not the other loses nothing.
class CallBacked(NamedTuple):
    group: str  # the dedicated call that takes over when the batch refuses the field
    fid: int
    sink: int  # GAUGE, ENERGY, ...
    family: str
    extra: tuple[str, str] | None  # one more label pair, e.g. ("type", "corrected")


_CALL_BACKED: tuple[CallBacked, ...] = tuple(CallBacked(*entry) for entry in (
    ("energy", FI_TOTAL_ENERGY, ENERGY, "llm_gpu_energy_joules_total", None),
    ("ecc_corrected", FI_ECC_SBE_VOL_TOTAL, GAUGE, "llm_gpu_ecc_errors_total", ("type", "corrected")),
    ("ecc_uncorrected", FI_ECC_DBE_VOL_TOTAL, GAUGE, "llm_gpu_ecc_errors_total", ("type", "uncorrected")),
    ("pcie_replay", FI_PCIE_REPLAY, GAUGE, "llm_gpu_pcie_replay_errors_total", None),
    ("remapped_rows", FI_REMAPPED_COR, GAUGE, "llm_gpu_remapped_rows", ("state", "correctable")),
    ("remapped_rows", FI_REMAPPED_UNC, GAUGE, "llm_gpu_remapped_rows", ("state", "uncorrectable")),
    ("remapped_rows", FI_REMAPPED_PENDING, GAUGE, "llm_gpu_remapped_rows", ("state", "pending")),
    ("remapped_rows", FI_REMAPPED_FAILURE, GAUGE, "llm_gpu_remapped_rows", ("state", "failed")),
))
CALL_BACKED_GROUPS = frozenset(entry.group for entry in _CALL_BACKED)


class GpuLost(Exception):
    """The GPU stopped answering (GpuIsLost, Unknown, ResetRequired, ...) while reading `what`."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(f"{what}: {describe(cause)}")
        self.what = what


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str = ""

    def labels(self) -> Labels:
        return labels_of(gpu=str(self.index), uuid=self.uuid, name=self.name)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One entry of a GPU's field batch, and what its answer becomes."""

    fid: int
    scope: int  # the link of a per-link NVLink field, else 0
    group: str  # the call-backed group it belongs to; "" when only the batch serves it
    sink: int
    name: str = ""  # family of the sample (unused for NVLINK_KIB)
    labels: Labels = ()
    direction: int = 0  # NVLINK_KIB: 0 tx, 1 rx


Call = tuple[str, str, tuple[Any, ...]]  # (key, function name, arguments)


class ReasonSamples(NamedTuple):
    """The clock-event samples of the last mask read: one entry per GPU, so bounded."""

    mask: int
    samples: tuple[Sample, ...]


@dataclass(slots=True)
class Device:
    """One GPU within one NVML generation; dropped (GPM buffers freed) when NVML is re-initialised."""

    ident: GpuIdentity
    handle: Any
    labels: Labels
    info_labels: Labels = ()
    mig_mode: str = "unsupported"
    sm_clock_max_hz: float | None = None
    mem_clock_max_hz: float | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    reasons: tuple[tuple[int, Labels], ...] = ()
    nvlinks: tuple[int, ...] = ()
    gpm: GpmSampler | None = None
    # Built when opened: the samples of values fixed for the generation, and the alternatives of
    # the calls that have a newer and an older form.
    static_samples: tuple[Sample, ...] = ()
    memory_calls: tuple[Call, ...] = ()
    temperature_calls: tuple[Call, ...] = ()
    reason_calls: tuple[Call, ...] = ()
    process_calls: tuple[Call, ...] = ()
    # (key, function, struct) per fabric-info form, newest first; NVML fills the struct in place.
    fabric_calls: tuple[tuple[str, str, Any], ...] = ()
    # The field batch: what each entry becomes, and the (fieldId, scopeId) list NVML is given.
    field_specs: tuple[FieldSpec, ...] = ()
    fields: list[tuple[int, int]] = field(default_factory=list)
    by_call: set[str] = field(default_factory=set)  # call-backed groups the batch refused
    field_misses: dict[str, int] = field(default_factory=dict)  # group -> cycles in a row without a value
    absent: set[str] = field(default_factory=set)
    absent_fields: set[tuple[int, int]] = field(default_factory=set)
    lost: bool = False
    # One-entry caches of values that seldom change between cycles.
    reason_samples: ReasonSamples | None = None
    power_limit: Sample | None = None
    power_limit_due: float = 0.0  # when to ask for the enforced power limit again
    power_default: Sample | None = None  # the board's default limit: fixed, asked until it answers once
    fabric: tuple[Sample, ...] = ()  # the last fabric reading's samples
    fabric_due: float = 0.0  # when to ask for the fabric state again
    _label_cache: dict[tuple[str, str], Labels] = field(default_factory=dict)

    def with_label(self, key: str, value: str) -> Labels:
        """The GPU's labels plus one more, built once (labels are sorted tuples)."""
        labels = self._label_cache.get((key, value))
        if labels is None:
            labels = self._label_cache[(key, value)] = make_labels(self.labels + ((key, value),))
        return labels


def normalise_bus_id(bus_id: str) -> str:
    """NVML's `00000000:18:00.0` -> sysfs's `0000:18:00.0`, so the host source can match it."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) == 8:
        return domain[4:] + ":" + rest
    return bus_id


class DeviceReader:
    """Reads GPUs of one NVML module. Counter state lives here, keyed by UUID, so rates and the
    energy total survive re-initialisation of NVML (the caller keeps one reader for its life)."""

    def __init__(self, once: OnceLog, clock: Callable[[], float], *, gpm: bool = True,
                 gpm_min_interval_s: float = 0.1) -> None:
        self.nvml: Any = None
        self._once = once
        self._clock = clock
        self._gpm_enabled = gpm
        self._gpm_min_interval_s = gpm_min_interval_s
        self._rates = CounterRates()
        self._energy = ResetSafeTotals()
        self.bind(None)

    def bind(self, nvml: Any) -> None:
        """Read GPUs through `nvml` from now on. Its enum values are looked up here, once, rather
        than on every call."""
        self.nvml = nvml
        self._clock_sm = getattr(nvml, "NVML_CLOCK_SM", CLOCK_SM)
        self._clock_mem = getattr(nvml, "NVML_CLOCK_MEM", CLOCK_MEM)
        self._temperature_gpu = getattr(nvml, "NVML_TEMPERATURE_GPU", TEMPERATURE_GPU)
        self._volatile_ecc = getattr(nvml, "NVML_VOLATILE_ECC", VOLATILE_ECC)
        self._ecc_types = {
            "ecc_corrected": getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", MEMORY_ERROR_CORRECTED),
            "ecc_uncorrected": getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", MEMORY_ERROR_UNCORRECTED),
        }
        self._memory_v2 = getattr(nvml, "nvmlMemory_v2", None)

    # -- the safe wrapper -------------------------------------------------------------------

    def call(self, dev: Device, key: str, fname: str, *args: Any, log: bool = True) -> Any:
        """fname(*args) or None. Marks `key` absent for the generation when NVML says it cannot be
        answered; raises GpuLost when the GPU is gone."""
        if key in dev.absent:
            return None
        fn = getattr(self.nvml, fname, None)
        if fn is None:
            dev.absent.add(key)
            if log:
                self._log_absent(dev, key, f"{fname} not in these NVML bindings")
            return None
        try:
            return fn(*args)
        except Exception as exc:
            kind = classify(self.nvml, exc)
            if kind is None:
                raise
            if kind is Kind.LOST:
                raise GpuLost(key, exc) from exc
            if kind is Kind.ABSENT:
                dev.absent.add(key)
                if log:
                    self._log_absent(dev, key, describe(exc))
            else:
                self._once.log(logging.DEBUG, ("transient", dev.ident.uuid, key),
                               "GPU %s: %s failed this cycle: %s", dev.ident.index, key, describe(exc))
            return None

    def call_first(self, dev: Device, calls: tuple[Call, ...]) -> Any:
        """The first alternative that answers; the next one is tried only when the previous is
        absent (a newer call missing from an older driver), not when it failed transiently."""
        last = len(calls) - 1
        for i, (key, fname, args) in enumerate(calls):
            if key in dev.absent:
                continue
            value = self.call(dev, key, fname, *args, log=i == last)
            if value is not None or key not in dev.absent:
                return value
        return None

    def _log_absent(self, dev: Device, key: str, why: str) -> None:
        self._once.log(logging.INFO, ("absent", dev.ident.uuid, key),
                       "GPU %s (%s): %s not available, series omitted: %s",
                       dev.ident.index, dev.ident.name, key, why)

    # -- once per generation ----------------------------------------------------------------

    def open_device(self, index: int, driver_version: str, cuda_version: str) -> Device:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(nvml.nvmlDeviceGetUUID(handle))
            name = str(nvml.nvmlDeviceGetName(handle))
        except Exception as exc:
            if classify(nvml, exc) is None:
                raise
            # Without a handle and identity there is nothing to read: treat the GPU as lost.
            raise GpuLost("handle", exc) from exc
        ident = GpuIdentity(index, uuid, name)
        dev = Device(ident=ident, handle=handle, labels=ident.labels())
        pci = self.call(dev, "pci_info", "nvmlDeviceGetPciInfo", handle)
        if pci is not None:
            dev.ident = ident = GpuIdentity(index, uuid, name, normalise_bus_id(str(pci.busId)))
        self._read_mig_mode(dev)
        dev.info_labels = make_labels(dev.labels + (
            ("driver_version", driver_version), ("cuda_version", cuda_version),
            ("pci_bus_id", ident.pci_bus_id), ("mig_mode", dev.mig_mode)))
        self._read_maxima(dev)
        dev.reasons = self._supported_reasons(dev)
        dev.nvlinks = self._active_nvlinks(dev)
        dev.gpm = self._open_gpm(dev)
        dev.static_samples = self._static_samples(dev)
        self._plan_calls(dev)
        self.plan_fields(dev)
        return dev

    def _read_mig_mode(self, dev: Device) -> None:
        mode = self.call(dev, "mig_mode", "nvmlDeviceGetMigMode", dev.handle, log=False)
        if mode is None:
            return
        enabled = int(mode[0]) == getattr(self.nvml, "NVML_DEVICE_MIG_ENABLE", MIG_ENABLED)
        dev.mig_mode = "enabled" if enabled else "disabled"
        if enabled:
            self._once.log(logging.INFO, ("mig", dev.ident.uuid),
                           "GPU %s (%s) has MIG enabled: utilization and remapped rows are not "
                           "available; memory, power and GPM describe the whole GPU",
                           dev.ident.index, dev.ident.name)

    def _read_maxima(self, dev: Device) -> None:
        h = dev.handle
        sm = self.call(dev, "sm_clock_max", "nvmlDeviceGetMaxClockInfo", h, self._clock_sm)
        mem = self.call(dev, "mem_clock_max", "nvmlDeviceGetMaxClockInfo", h, self._clock_mem)
        dev.sm_clock_max_hz = None if sm is None else float(sm) * 1e6
        dev.mem_clock_max_hz = None if mem is None else float(mem) * 1e6
        # Max of the GPU and its slot together: what the link could train to.
        dev.pcie_max_gen = self.call(dev, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", h)
        dev.pcie_max_width = self.call(dev, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", h)

    def _supported_reasons(self, dev: Device) -> tuple[tuple[int, Labels], ...]:
        h = dev.handle
        mask = self.call_first(dev, (
            ("clock_events_supported", "nvmlDeviceGetSupportedClocksEventReasons", (h,)),
            ("clock_throttle_supported", "nvmlDeviceGetSupportedClocksThrottleReasons", (h,)),
        ))
        return tuple((bit, dev.with_label("reason", name)) for name, bit in REASONS
                     if mask is None or int(mask) & bit)

    def _active_nvlinks(self, dev: Device) -> tuple[int, ...]:
        nvml = self.nvml
        get_state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        if get_state is None:
            return ()
        active = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = get_state(dev.handle, link)
            except Exception as exc:
                kind = classify(nvml, exc)
                if kind is None:
                    raise
                if kind is Kind.LOST:
                    raise GpuLost("nvlink_state", exc) from exc
                if link == 0 and getattr(exc, "value", None) == NOT_SUPPORTED:
                    break  # a GPU without NVLink (PCIe-only cards)
                continue  # links the GPU does not have answer InvalidArgument
            if int(state) == FEATURE_ENABLED:
                active.append(link)
        return tuple(active)

    def _open_gpm(self, dev: Device) -> GpmSampler | None:
        if not self._gpm_enabled:
            return None
        support = self.call(dev, "gpm_support", "nvmlGpmQueryDeviceSupport", dev.handle)
        if support is None or not int(support.isSupportedDevice):
            if support is not None:
                self._log_absent(dev, "gpm", "nvmlGpmQueryDeviceSupport: not a GPM device (pre-Hopper)")
            return None
        metrics = RATIO_METRICS + PCIE_METRICS + (NVLINK_METRICS if dev.nvlinks else ())
        return GpmSampler(self.nvml, dev.handle, metrics, self._gpm_min_interval_s)

    def _static_samples(self, dev: Device) -> tuple[Sample, ...]:
        """The samples whose values cannot change until NVML is re-initialised, built once."""
        out = []
        if dev.sm_clock_max_hz is not None:
            out.append(Sample("llm_gpu_sm_clock_max_hertz", dev.labels, dev.sm_clock_max_hz))
        if dev.mem_clock_max_hz is not None:
            out.append(Sample("llm_gpu_memory_clock_max_hertz", dev.labels, dev.mem_clock_max_hz))
        max_labels = dev.with_label("state", "max")
        if dev.pcie_max_gen is not None:
            out.append(Sample("llm_gpu_pcie_link_generation", max_labels, float(dev.pcie_max_gen)))
        if dev.pcie_max_width is not None:
            out.append(Sample("llm_gpu_pcie_link_width", max_labels, float(dev.pcie_max_width)))
        out.append(Sample("llm_gpu_info", dev.info_labels, 1.0))
        out.append(Sample("llm_gpu_up", dev.labels, 1.0))
        return tuple(out)

    def _plan_calls(self, dev: Device) -> None:
        """The alternatives of the calls that have a newer and an older form, newest first."""
        h = dev.handle
        dev.memory_calls = (("memory_info", "nvmlDeviceGetMemoryInfo", (h,)),)
        if self._memory_v2 is not None:
            # v2 splits out driver-reserved memory; drivers before 510 lack it (FunctionNotFound).
            dev.memory_calls = (("memory_info_v2", "nvmlDeviceGetMemoryInfo", (h, self._memory_v2)),
                                *dev.memory_calls)
        sensor = self._temperature_gpu
        dev.temperature_calls = (
            ("temperature_v", "nvmlDeviceGetTemperatureV", (h, sensor)),
            ("temperature", "nvmlDeviceGetTemperature", (h, sensor)),
        )
        dev.reason_calls = (
            ("clock_events", "nvmlDeviceGetCurrentClocksEventReasons", (h,)),
            ("clock_throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", (h,)),
        )
        # The unversioned call raises NVMLLibraryMismatchError on drivers without _v3; try _v2 then.
        dev.process_calls = (
            ("processes", "nvmlDeviceGetComputeRunningProcesses", (h,)),
            ("processes_v2", "nvmlDeviceGetComputeRunningProcesses_v2", (h,)),
        )
        # Fabric info: the versioned call with v3 (health summary, driver 550+), then v2 (state and
        # status), then the deprecated unversioned call. Bindings without a struct skip that form.
        fabric = []
        for key, fname, struct_name in (("fabric_v3", "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
                                        ("fabric_v2", "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
                                        ("fabric", "nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            struct = getattr(self.nvml, struct_name, None)
            if struct is not None and hasattr(self.nvml, fname):
                fabric.append((key, fname, struct()))  # the versioned structs set .version themselves
        dev.fabric_calls = tuple(fabric)

    def plan_fields(self, dev: Device) -> None:
        """Choose what the GPU's one nvmlDeviceGetFieldValues call asks for; again whenever a field
        drops out or GPM goes away. With GPM, PCIe and NVLink rates come from GPM instead, so their
        counters are not read."""
        if "field_values" in dev.absent:
            specs: tuple[FieldSpec, ...] = ()
        else:
            wanted = [FieldSpec(FI_MEMORY_TEMP, 0, "", GAUGE, "llm_gpu_memory_temperature_celsius", dev.labels),
                      FieldSpec(FI_GPU_RECOVERY_ACTION, 0, "", GAUGE, "llm_gpu_recovery_action", dev.labels)]
            wanted += [FieldSpec(e.fid, 0, e.group, e.sink, e.family,
                                 dev.with_label(*e.extra) if e.extra else dev.labels)
                       for e in _CALL_BACKED if e.group not in dev.by_call]
            if dev.gpm is None:
                wanted += [
                    FieldSpec(FI_PCIE_TX_BYTES, 0, "", PCIE_BYTES, "llm_gpu_pcie_tx_bytes_per_second", dev.labels),
                    FieldSpec(FI_PCIE_RX_BYTES, 0, "", PCIE_BYTES, "llm_gpu_pcie_rx_bytes_per_second", dev.labels),
                ]
                wanted += [FieldSpec(fid, link, "", NVLINK_KIB, direction=direction)
                           for link in dev.nvlinks for direction, fid in enumerate(_NVLINK_FIELDS)]
            specs = tuple(s for s in wanted if (s.fid, s.scope) not in dev.absent_fields)
        dev.field_specs = specs
        dev.fields = [(s.fid, s.scope) for s in specs]

    # -- every cycle ------------------------------------------------------------------------

    def read(self, dev: Device, now: float, engine_pids: frozenset[int] | None, want_engine: bool) -> list[Sample]:
        """All series of one GPU for this cycle; raises GpuLost."""
        out: list[Sample] = []
        self._read_utilization(dev, out)
        self._read_memory(dev, out)
        self._read_power(dev, now, out)
        self._read_temperature(dev, out)
        self._read_clocks(dev, out)
        self._read_pcie_link(dev, out)
        if dev.fabric_calls:
            self._read_fabric(dev, now, out)
        self._read_gpm(dev, now, out)  # first: if GPM turns out absent, counters are read this cycle
        if dev.by_call:
            # Before the batch: a group the batch refuses this cycle is read by call from the next,
            # never twice in one cycle.
            self._read_by_call(dev, out)
        self._read_fields(dev, now, out)
        if want_engine:
            self._read_engine_memory(dev, engine_pids, out)
        out.extend(dev.static_samples)
        return out

    def _read_utilization(self, dev: Device, out: list[Sample]) -> None:
        util = self.call(dev, "utilization", "nvmlDeviceGetUtilizationRates", dev.handle)
        if util is not None:
            out.append(Sample("llm_gpu_utilization_ratio", dev.labels, util.gpu / 100.0))
            out.append(Sample("llm_gpu_memory_utilization_ratio", dev.labels, util.memory / 100.0))

    def _read_memory(self, dev: Device, out: list[Sample]) -> None:
        mem = self.call_first(dev, dev.memory_calls)
        if mem is None:
            return
        out.append(Sample("llm_gpu_memory_used_bytes", dev.labels, float(mem.used)))
        out.append(Sample("llm_gpu_memory_total_bytes", dev.labels, float(mem.total)))
        reserved = getattr(mem, "reserved", None)
        if reserved is not None:
            out.append(Sample("llm_gpu_memory_reserved_bytes", dev.labels, float(reserved)))

    def _read_power(self, dev: Device, now: float, out: list[Sample]) -> None:
        power_mw = self.call(dev, "power", "nvmlDeviceGetPowerUsage", dev.handle)
        if power_mw is not None:
            out.append(Sample("llm_gpu_power_watts", dev.labels, power_mw / 1000.0))
        if now >= dev.power_limit_due:
            limit_mw = self.call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", dev.handle)
            if limit_mw is None:
                dev.power_limit = None  # absent, or failed this cycle: asked again next cycle
            else:
                dev.power_limit = Sample("llm_gpu_power_limit_watts", dev.labels, limit_mw / 1000.0)
                dev.power_limit_due = now + POWER_LIMIT_REFRESH_S
            if dev.power_default is None:
                default_mw = self.call(dev, "power_default_limit", "nvmlDeviceGetPowerManagementDefaultLimit",
                                       dev.handle)
                if default_mw is not None:
                    dev.power_default = Sample("llm_gpu_power_default_limit_watts", dev.labels,
                                               default_mw / 1000.0)
        if dev.power_limit is not None:
            out.append(dev.power_limit)
        if dev.power_default is not None:
            out.append(dev.power_default)

    def _read_temperature(self, dev: Device, out: list[Sample]) -> None:
        celsius = self.call_first(dev, dev.temperature_calls)
        if celsius is not None:
            out.append(Sample("llm_gpu_temperature_celsius", dev.labels, float(celsius)))

    def _read_clocks(self, dev: Device, out: list[Sample]) -> None:
        h = dev.handle
        sm = self.call(dev, "sm_clock", "nvmlDeviceGetClockInfo", h, self._clock_sm)
        if sm is not None:
            out.append(Sample("llm_gpu_sm_clock_hertz", dev.labels, sm * 1e6))
        mem = self.call(dev, "mem_clock", "nvmlDeviceGetClockInfo", h, self._clock_mem)
        if mem is not None:
            out.append(Sample("llm_gpu_memory_clock_hertz", dev.labels, mem * 1e6))
        if not dev.reasons:
            return
        mask = self.call_first(dev, dev.reason_calls)
        if mask is not None:
            out.extend(self._reason_samples(dev, int(mask)))

    def _reason_samples(self, dev: Device, mask: int) -> tuple[Sample, ...]:
        """One sample per supported reason. The mask seldom changes between cycles, so the samples
        of the last one are kept (a single entry, so bounded)."""
        last = dev.reason_samples
        if last is not None and last.mask == mask:
            return last.samples
        samples = tuple(Sample("llm_gpu_clock_event_active", labels, 1.0 if mask & bit else 0.0)
                        for bit, labels in dev.reasons)
        dev.reason_samples = ReasonSamples(mask, samples)
        return samples

    def _read_pcie_link(self, dev: Device, out: list[Sample]) -> None:
        """The link as trained now (the maxima are static samples)."""
        h = dev.handle
        gen = self.call(dev, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h)
        if gen is not None:
            out.append(Sample("llm_gpu_pcie_link_generation", dev.with_label("state", "current"), float(gen)))
        width = self.call(dev, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h)
        if width is not None:
            out.append(Sample("llm_gpu_pcie_link_width", dev.with_label("state", "current"), float(width)))

    def _read_fabric(self, dev: Device, now: float, out: list[Sample]) -> None:
        """NVLink fabric state, the registration's status once completed and the health summary,
        asked every FABRIC_REFRESH_S. A GPU outside an NVSwitch fabric (NotSupported, or state
        NOT_SUPPORTED) is asked once per generation and has no fabric series."""
        if now >= dev.fabric_due:
            dev.fabric = self._fabric_samples(dev)
            if dev.fabric:
                dev.fabric_due = now + FABRIC_REFRESH_S
        out.extend(dev.fabric)

    def _fabric_samples(self, dev: Device) -> tuple[Sample, ...]:
        info = None
        for i, (key, fname, struct) in enumerate(dev.fabric_calls):
            if key in dev.absent:
                continue
            # Only the last form's absence is logged: an older driver refusing v3 is not news.
            answer = self.call(dev, key, fname, dev.handle, ctypes.byref(struct),
                               log=i == len(dev.fabric_calls) - 1)
            if key in dev.absent:
                continue  # this form is missing from the driver: try the older one now
            if answer is None:
                return ()  # failed this cycle: no fabric series until it answers again
            info = struct
            break
        if info is None:
            dev.fabric_calls = ()
            return ()
        state = int(info.state)
        if state == FABRIC_NOT_SUPPORTED:
            self._log_absent(dev, "fabric", "the GPU is not in an NVSwitch fabric (state NOT_SUPPORTED)")
            dev.fabric_calls = ()  # asked again when NVML is re-initialised
            return ()
        out = [Sample("llm_gpu_fabric_state", dev.labels, float(state))]
        if state == FABRIC_COMPLETED:
            # NVML: status is the probe's result, valid once the state is completed.
            out.append(Sample("llm_gpu_fabric_status", dev.labels, float(int(info.status))))
        summary = getattr(info, "healthSummary", HEALTH_NOT_SUPPORTED)
        if int(summary) != HEALTH_NOT_SUPPORTED:
            out.append(Sample("llm_gpu_fabric_health", dev.labels, float(int(summary))))
        return tuple(out)

    def _read_by_call(self, dev: Device, out: list[Sample]) -> None:
        """The call-backed values the field batch refused, one dedicated call each."""
        h = dev.handle
        for group in sorted(dev.by_call):
            if group == "energy":
                energy_mj = self.call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
                if energy_mj is not None:
                    joules = self._energy.update(dev.ident.uuid, energy_mj / 1000.0)
                    out.append(Sample("llm_gpu_energy_joules_total", dev.labels, joules))
            elif group in ("ecc_corrected", "ecc_uncorrected"):
                count = self.call(dev, group, "nvmlDeviceGetTotalEccErrors", h, self._ecc_types[group],
                                  self._volatile_ecc)
                if count is not None:
                    labels = dev.with_label("type", group.removeprefix("ecc_"))
                    out.append(Sample("llm_gpu_ecc_errors_total", labels, float(count)))
            elif group == "pcie_replay":
                replays = self.call(dev, "pcie_replay", "nvmlDeviceGetPcieReplayCounter", h)
                if replays is not None:
                    out.append(Sample("llm_gpu_pcie_replay_errors_total", dev.labels, float(replays)))
            elif group == "remapped_rows":
                rows = self.call(dev, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
                if rows is not None:
                    for state, value in zip(REMAPPED_STATES, rows, strict=False):
                        out.append(Sample("llm_gpu_remapped_rows", dev.with_label("state", state), float(value)))

    def _read_fields(self, dev: Device, now: float, out: list[Sample]) -> None:
        specs = dev.field_specs
        if not specs:
            return
        values = self.call(dev, "field_values", "nvmlDeviceGetFieldValues", dev.handle, dev.fields)
        if values is None:
            if "field_values" in dev.absent:
                # Refused as a whole: the call-backed values go back to their own calls.
                dev.by_call.update(CALL_BACKED_GROUPS)
                self.plan_fields(dev)
            return
        uuid = dev.ident.uuid
        nvlink_kib = [0.0, 0.0]  # tx, rx: summed over the links
        nvlink_t = [0.0, 0.0]  # tx, rx: time of the newest reading
        nvlink_complete = True
        replan = False
        for spec, value in zip(specs, values, strict=False):
            ret = value.nvmlReturn
            if ret:
                replan = self._field_failed(dev, spec, int(ret)) or replan
                nvlink_complete = nvlink_complete and spec.sink != NVLINK_KIB
                continue
            number = float(getattr(value.value, _VALUE_MEMBER.get(value.valueType, "ullVal")))
            if dev.field_misses and spec.group:
                dev.field_misses.pop(spec.group, None)
            sink = spec.sink
            if sink == NVLINK_KIB:  # checked first: most of the batch on a GPU without GPM
                direction = spec.direction
                nvlink_kib[direction] += number
                t = value.timestamp / 1e6 if value.timestamp else now
                if t > nvlink_t[direction]:
                    nvlink_t[direction] = t
            elif sink == GAUGE:
                out.append(Sample(spec.name, spec.labels, number))
            elif sink == ENERGY:
                out.append(Sample(spec.name, spec.labels, self._energy.update(uuid, number / 1000.0)))
            else:  # PCIE_BYTES
                t = value.timestamp / 1e6 if value.timestamp else now
                rate = self._rates.update((uuid, spec.fid), number, t, _VALUE_WRAP.get(value.valueType))
                if rate is not None:
                    out.append(Sample(spec.name, spec.labels, rate))
        if replan:
            self.plan_fields(dev)
        if dev.nvlinks and nvlink_complete and dev.gpm is None:
            self._nvlink_rates(dev, nvlink_kib, nvlink_t, out)

    def _nvlink_rates(self, dev: Device, kib: list[float], newest: list[float], out: list[Sample]) -> None:
        """Rates of the per-link counters summed over every active link (only a sum over the same
        links is comparable between cycles, hence the links in the key)."""
        for direction, (fid, name) in enumerate(zip(_NVLINK_FIELDS, _NVLINK_RATES, strict=True)):
            t = newest[direction]
            if t == 0.0:
                continue
            rate = self._rates.update((dev.ident.uuid, fid, dev.nvlinks), kib[direction], t)
            if rate is not None:
                out.append(Sample(name, dev.labels, rate * KIB))

    def _field_failed(self, dev: Device, spec: FieldSpec, ret: int) -> bool:
        """Handle one field's nvmlReturn; True when the batch must be planned again without it."""
        kind = classify_code(ret)
        if kind is Kind.LOST:
            raise GpuLost(f"field {spec.fid}", _ReturnCode(ret))
        if kind is not Kind.ABSENT:
            if not spec.group:
                return False
            misses = dev.field_misses[spec.group] = dev.field_misses.get(spec.group, 0) + 1
            if misses < FIELD_MISSES_BEFORE_CALL:
                return False
        if spec.group:
            # Its dedicated call may still answer: asked from the next cycle (it logs if not).
            self._once.log(logging.DEBUG, ("by_call", dev.ident.uuid, spec.group),
                           "GPU %s: field %s refused in the batch (nvmlReturn %s); %s read by its own call",
                           dev.ident.index, spec.fid, ret, spec.group)
            dev.by_call.add(spec.group)
        else:
            self._log_absent(dev, f"field {spec.fid}/{spec.scope}", f"nvmlReturn {ret}")
            dev.absent_fields.add((spec.fid, spec.scope))
        return True

    def _read_gpm(self, dev: Device, now: float, out: list[Sample]) -> None:
        sampler = dev.gpm
        if sampler is None:
            return
        try:
            result = sampler.sample(now)
        except Exception as exc:
            kind = classify(self.nvml, exc)
            if kind is None:
                raise
            if kind is Kind.LOST:
                raise GpuLost("gpm", exc) from exc
            if kind is Kind.ABSENT:
                # e.g. GPM refused under MIG: fall back to the cumulative PCIe/NVLink counters.
                self._log_absent(dev, "gpm", describe(exc))
                sampler.close()
                dev.gpm = None
                self.plan_fields(dev)
            return
        if result is None:
            return
        for name, value in result.values.items():
            out.append(Sample(name, dev.labels, value))
        for name, ret in result.failed.items():
            self._once.log(logging.INFO, ("gpm_metric", dev.ident.uuid, name),
                           "GPU %s: GPM could not compute %s (nvmlReturn %s); omitted",
                           dev.ident.index, name, ret)

    def _read_engine_memory(self, dev: Device, engine_pids: frozenset[int] | None, out: list[Sample]) -> None:
        procs = self.call_first(dev, dev.process_calls)
        if procs is None:
            return
        total = 0
        for proc in procs:
            if engine_pids is not None and proc.pid not in engine_pids:
                continue
            if proc.usedGpuMemory is None:
                return  # unknown for a process we would count: no made-up number
            total += proc.usedGpuMemory
        out.append(Sample("llm_gpu_engine_memory_used_bytes", dev.labels, float(total)))


class _ReturnCode(Exception):
    """A per-field nvmlReturn, shaped like an NVMLError for describe()."""

    def __init__(self, value: int) -> None:
        super().__init__(f"nvmlReturn {value}")
        self.value = value
