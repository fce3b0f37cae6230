"""One GPU through NVML: what is read once per NVML generation (identity, maxima, capabilities)
and what is read each cycle, every field through one safe wrapper (gpustat's safenvml).

A field the GPU cannot give (NotSupported, NoPermission, FunctionNotFound, a version mismatch) is
remembered as absent for the generation, logged once and omitted; a transient failure skips the
field for one cycle; a lost GPU raises GpuLost so the caller can mark it down and keep the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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

# Field ids and enum values are NVML ABI; pynvml names them, fallbacks keep old bindings working.
FI_MEMORY_TEMP = 82
FI_NVLINK_DATA_TX = 138  # cumulative KiB per link (scopeId = link)
FI_NVLINK_DATA_RX = 139
FI_PCIE_TX_BYTES = 197  # cumulative bytes, may wrap
FI_PCIE_RX_BYTES = 198
_NVLINK_FIELDS = (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX)
_PCIE_FIELDS = (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES)

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

# nvmlFieldValue_t.valueType -> union member, and the wrap-around of the unsigned narrow types.
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_VALUE_WRAP = {1: float(2**32), 6: float(2**16)}

KIB = 1024.0


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
    fields: list[tuple[int, int]] = field(default_factory=list)
    absent: set[str] = field(default_factory=set)
    absent_fields: set[tuple[int, int]] = field(default_factory=set)
    lost: bool = False
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


def field_value(value: Any) -> float:
    member = _VALUE_MEMBER.get(int(value.valueType), "ullVal")
    return float(getattr(value.value, member))


Call = tuple[str, str, tuple[Any, ...], dict[str, Any]]


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

    # -- the safe wrapper -------------------------------------------------------------------

    def call(self, dev: Device, key: str, fname: str, *args: Any, log: bool = True, **kwargs: Any) -> Any:
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
            return fn(*args, **kwargs)
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
        for i, (key, fname, args, kwargs) in enumerate(calls):
            if key in dev.absent:
                continue
            value = self.call(dev, key, fname, *args, log=i == len(calls) - 1, **kwargs)
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
        dev.fields = self.field_list(dev)
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
        h, nvml = dev.handle, self.nvml
        sm = self.call(dev, "sm_clock_max", "nvmlDeviceGetMaxClockInfo", h, getattr(nvml, "NVML_CLOCK_SM", CLOCK_SM))
        mem = self.call(dev, "mem_clock_max", "nvmlDeviceGetMaxClockInfo", h,
                        getattr(nvml, "NVML_CLOCK_MEM", CLOCK_MEM))
        dev.sm_clock_max_hz = None if sm is None else float(sm) * 1e6
        dev.mem_clock_max_hz = None if mem is None else float(mem) * 1e6
        # Max of the GPU and its slot together: what the link could train to.
        dev.pcie_max_gen = self.call(dev, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", h)
        dev.pcie_max_width = self.call(dev, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", h)

    def _supported_reasons(self, dev: Device) -> tuple[tuple[int, Labels], ...]:
        h = dev.handle
        mask = self.call_first(dev, (
            ("clock_events_supported", "nvmlDeviceGetSupportedClocksEventReasons", (h,), {}),
            ("clock_throttle_supported", "nvmlDeviceGetSupportedClocksThrottleReasons", (h,), {}),
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

    def field_list(self, dev: Device) -> list[tuple[int, int]]:
        """The fields batched into one nvmlDeviceGetFieldValues call. With GPM, PCIe and NVLink
        rates come from GPM instead, so their counters are not read."""
        fields = [(FI_MEMORY_TEMP, 0)]
        if dev.gpm is None:
            fields += [(fid, 0) for fid in _PCIE_FIELDS]
            fields += [(fid, link) for link in dev.nvlinks for fid in _NVLINK_FIELDS]
        return [f for f in fields if f not in dev.absent_fields]

    # -- every cycle ------------------------------------------------------------------------

    def read(self, dev: Device, now: float, engine_pids: frozenset[int] | None, want_engine: bool) -> list[Sample]:
        """All series of one GPU for this cycle; raises GpuLost."""
        out: list[Sample] = []
        self._read_utilization(dev, out)
        self._read_memory(dev, out)
        self._read_power(dev, out)
        self._read_temperature(dev, out)
        self._read_clocks(dev, out)
        self._read_pcie(dev, out)
        self._read_errors(dev, out)
        self._read_gpm(dev, now, out)  # first: if GPM turns out absent, counters are read this cycle
        self._read_fields(dev, now, out)
        if want_engine:
            self._read_engine_memory(dev, engine_pids, out)
        out.append(Sample("llm_gpu_info", dev.info_labels, 1.0))
        out.append(Sample("llm_gpu_up", dev.labels, 1.0))
        return out

    def _read_utilization(self, dev: Device, out: list[Sample]) -> None:
        util = self.call(dev, "utilization", "nvmlDeviceGetUtilizationRates", dev.handle)
        if util is not None:
            out.append(Sample("llm_gpu_utilization_ratio", dev.labels, util.gpu / 100.0))
            out.append(Sample("llm_gpu_memory_utilization_ratio", dev.labels, util.memory / 100.0))

    def _read_memory(self, dev: Device, out: list[Sample]) -> None:
        h = dev.handle
        v2 = getattr(self.nvml, "nvmlMemory_v2", None)
        calls: tuple[Call, ...] = (("memory_info", "nvmlDeviceGetMemoryInfo", (h,), {}),)
        if v2 is not None:
            # v2 splits out driver-reserved memory; drivers before 510 lack it (FunctionNotFound).
            calls = (("memory_info_v2", "nvmlDeviceGetMemoryInfo", (h,), {"version": v2}),) + calls
        mem = self.call_first(dev, calls)
        if mem is None:
            return
        out.append(Sample("llm_gpu_memory_used_bytes", dev.labels, float(mem.used)))
        out.append(Sample("llm_gpu_memory_total_bytes", dev.labels, float(mem.total)))
        reserved = getattr(mem, "reserved", None)
        if reserved is not None:
            out.append(Sample("llm_gpu_memory_reserved_bytes", dev.labels, float(reserved)))

    def _read_power(self, dev: Device, out: list[Sample]) -> None:
        h = dev.handle
        power_mw = self.call(dev, "power", "nvmlDeviceGetPowerUsage", h)
        if power_mw is not None:
            out.append(Sample("llm_gpu_power_watts", dev.labels, power_mw / 1000.0))
        limit_mw = self.call(dev, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        if limit_mw is not None:
            out.append(Sample("llm_gpu_power_limit_watts", dev.labels, limit_mw / 1000.0))
        energy_mj = self.call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        if energy_mj is not None:
            joules = self._energy.update(dev.ident.uuid, energy_mj / 1000.0)
            out.append(Sample("llm_gpu_energy_joules_total", dev.labels, joules))

    def _read_temperature(self, dev: Device, out: list[Sample]) -> None:
        h = dev.handle
        sensor = getattr(self.nvml, "NVML_TEMPERATURE_GPU", TEMPERATURE_GPU)
        celsius = self.call_first(dev, (
            ("temperature_v", "nvmlDeviceGetTemperatureV", (h, sensor), {}),
            ("temperature", "nvmlDeviceGetTemperature", (h, sensor), {}),
        ))
        if celsius is not None:
            out.append(Sample("llm_gpu_temperature_celsius", dev.labels, float(celsius)))

    def _read_clocks(self, dev: Device, out: list[Sample]) -> None:
        h, nvml = dev.handle, self.nvml
        sm = self.call(dev, "sm_clock", "nvmlDeviceGetClockInfo", h, getattr(nvml, "NVML_CLOCK_SM", CLOCK_SM))
        if sm is not None:
            out.append(Sample("llm_gpu_sm_clock_hertz", dev.labels, sm * 1e6))
        mem = self.call(dev, "mem_clock", "nvmlDeviceGetClockInfo", h, getattr(nvml, "NVML_CLOCK_MEM", CLOCK_MEM))
        if mem is not None:
            out.append(Sample("llm_gpu_memory_clock_hertz", dev.labels, mem * 1e6))
        if dev.sm_clock_max_hz is not None:
            out.append(Sample("llm_gpu_sm_clock_max_hertz", dev.labels, dev.sm_clock_max_hz))
        if dev.mem_clock_max_hz is not None:
            out.append(Sample("llm_gpu_memory_clock_max_hertz", dev.labels, dev.mem_clock_max_hz))
        if not dev.reasons:
            return
        mask = self.call_first(dev, (
            ("clock_events", "nvmlDeviceGetCurrentClocksEventReasons", (h,), {}),
            ("clock_throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", (h,), {}),
        ))
        if mask is not None:
            mask = int(mask)
            for bit, labels in dev.reasons:
                out.append(Sample("llm_gpu_clock_event_active", labels, 1.0 if mask & bit else 0.0))

    def _read_pcie(self, dev: Device, out: list[Sample]) -> None:
        h = dev.handle
        link_state = (
            ("llm_gpu_pcie_link_generation", "current",
             self.call(dev, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h)),
            ("llm_gpu_pcie_link_generation", "max", dev.pcie_max_gen),
            ("llm_gpu_pcie_link_width", "current", self.call(dev, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h)),
            ("llm_gpu_pcie_link_width", "max", dev.pcie_max_width),
        )
        for name, state, value in link_state:
            if value is not None:
                out.append(Sample(name, dev.with_label("state", state), float(value)))
        replays = self.call(dev, "pcie_replay", "nvmlDeviceGetPcieReplayCounter", h)
        if replays is not None:
            out.append(Sample("llm_gpu_pcie_replay_errors_total", dev.labels, float(replays)))

    def _read_errors(self, dev: Device, out: list[Sample]) -> None:
        h, nvml = dev.handle, self.nvml
        volatile = getattr(nvml, "NVML_VOLATILE_ECC", VOLATILE_ECC)
        for ecc_type, code in (("corrected", getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)),
                               ("uncorrected", getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1))):
            count = self.call(dev, "ecc_" + ecc_type, "nvmlDeviceGetTotalEccErrors", h, code, volatile)
            if count is not None:
                out.append(Sample("llm_gpu_ecc_errors_total", dev.with_label("type", ecc_type), float(count)))
        rows = self.call(dev, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            for state, value in zip(("correctable", "uncorrectable", "pending", "failed"), rows, strict=False):
                out.append(Sample("llm_gpu_remapped_rows", dev.with_label("state", state), float(value)))

    def _read_fields(self, dev: Device, now: float, out: list[Sample]) -> None:
        if not dev.fields:
            return
        values = self.call(dev, "field_values", "nvmlDeviceGetFieldValues", dev.handle, dev.fields)
        if values is None:
            return
        nvlink: dict[int, list[float]] = {fid: [0.0, 0.0] for fid in _NVLINK_FIELDS}  # sum KiB, max t
        nvlink_complete = True
        dropped: list[tuple[int, int]] = []
        for (fid, scope), value in zip(dev.fields, values, strict=False):
            ret = int(value.nvmlReturn)
            if ret != 0:
                if self._field_failed(dev, fid, scope, ret):
                    dropped.append((fid, scope))
                nvlink_complete = nvlink_complete and fid not in nvlink
                continue
            number = field_value(value)
            t = value.timestamp / 1e6 if value.timestamp else now
            if fid == FI_MEMORY_TEMP:
                out.append(Sample("llm_gpu_memory_temperature_celsius", dev.labels, number))
            elif fid in _PCIE_FIELDS:
                name = ("llm_gpu_pcie_tx_bytes_per_second" if fid == FI_PCIE_TX_BYTES
                        else "llm_gpu_pcie_rx_bytes_per_second")
                rate = self._rates.update((dev.ident.uuid, fid), number, t, _VALUE_WRAP.get(int(value.valueType)))
                if rate is not None:
                    out.append(Sample(name, dev.labels, rate))
            elif fid in nvlink:
                nvlink[fid][0] += number
                nvlink[fid][1] = max(nvlink[fid][1], t)
        if dropped:
            dev.absent_fields.update(dropped)
            dev.fields = self.field_list(dev)
        if dev.nvlinks and nvlink_complete and dev.gpm is None:
            self._nvlink_rates(dev, nvlink, out)

    def _nvlink_rates(self, dev: Device, nvlink: dict[int, list[float]], out: list[Sample]) -> None:
        """Rates of the per-link counters summed over every active link (only a sum over the same
        links is comparable between cycles, hence the links in the key)."""
        for fid, name in ((FI_NVLINK_DATA_TX, "llm_gpu_nvlink_tx_bytes_per_second"),
                          (FI_NVLINK_DATA_RX, "llm_gpu_nvlink_rx_bytes_per_second")):
            kib, t = nvlink[fid]
            if t == 0.0:
                continue
            rate = self._rates.update((dev.ident.uuid, fid, dev.nvlinks), kib, t)
            if rate is not None:
                out.append(Sample(name, dev.labels, rate * KIB))

    def _field_failed(self, dev: Device, fid: int, scope: int, ret: int) -> bool:
        """Handle one field's nvmlReturn; True when the field should not be asked for again."""
        kind = classify_code(ret)
        if kind is Kind.LOST:
            raise GpuLost(f"field {fid}", _ReturnCode(ret))
        if kind is Kind.ABSENT:
            self._log_absent(dev, f"field {fid}/{scope}", f"nvmlReturn {ret}")
            return True
        return False

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
                dev.fields = self.field_list(dev)
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
        h = dev.handle
        # The unversioned call raises NVMLLibraryMismatchError on drivers without _v3; try _v2 then.
        procs = self.call_first(dev, (
            ("processes", "nvmlDeviceGetComputeRunningProcesses", (h,), {}),
            ("processes_v2", "nvmlDeviceGetComputeRunningProcesses_v2", (h,), {}),
        ))
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
