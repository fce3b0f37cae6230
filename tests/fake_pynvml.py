"""A fake pynvml that behaves like nvidia-ml-py 13.x for the calls the GPU source makes.

Same function names, return shapes (structs with .gpu/.memory, .used/.total/.reserved, field-value
arrays with valueType/nvmlReturn/timestamp, GPM sample handles and a metrics-get request with
`metrics[i].metricId/nvmlReturn/value`), NVML units (mW, mJ, MHz, KiB, MiB/s, microsecond
timestamps) and error classes (NVMLError with `.value` mapping to NVMLError_<Name> subclasses,
unhashable like the real ones; NVMLLibraryMismatchError as a plain Exception). Field values
answer the same numbers as the dedicated calls (energy, volatile ECC totals, PCIe replays, remapped
rows), each with its own nvmlReturn (NotSupported where the call would raise it).

The fake should cost about what a pynvml call does, so that profiles of the source show the
source: per-call work is kept small (no dataclass built per field, no closures built per call).

Models: h100 and h200 (Hopper: GPM, 18 NVLinks), a100 (Ampere: NVLink, no GPM, no PCIe byte
counters), l4 (Ada: PCIe only, no HBM sensor, no row remapping). Counters advance only with
`advance(seconds)`, so rates in golden files are exact.

Scenarios: `fail(index, "nvmlDeviceGetPowerUsage", NVMLError_NotSupported)`, `lose(index)` /
`recover(index)`, `init_error = NVMLError_LibraryNotFound` (what pynvml raises when
libnvidia-ml.so.1 is missing) or `NVMLError_DriverNotLoaded`, `old_driver = True` (no v2 memory,
no TemperatureV / ClocksEvent symbols, and the process call raising NVMLLibraryMismatchError),
`set_mig(index, True)`, `inject_xid(index, xid)`, `set_recovery_action(index, action)`,
`set_fabric(index, state=..., status=..., health=...)`, `fabric_v3 = False` (a driver before 550:
the versioned fabric call refuses the v3 struct with ArgumentVersionMismatch).

The driver's recovery action (field 230) is 0 on every model (an old driver: NotSupported). NVLink
fabric: h100 and h200 sit in an NVSwitch fabric (HGX), registered and healthy; the a100 answers
NotSupported (the fabric API is Hopper and newer) and the l4 answers state NOT_SUPPORTED.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

# -- constants (values as in pynvml) --------------------------------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
nvmlMemory_v2 = 0x02000028
nvmlTemperature_v1 = 0x100000C
nvmlEventTypeXidCriticalError = 0x8

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_REMAPPED_COR = 142
NVML_FI_DEV_REMAPPED_UNC = 143
NVML_FI_DEV_REMAPPED_PENDING = 144
NVML_FI_DEV_REMAPPED_FAILURE = 145
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY = 1
NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY = 2
NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY = 3
nvmlGpuFabricInfo_v2 = 0x02000024
nvmlGpuFabricInfo_v3 = 0x3000028

NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477

MIB = 1024 * 1024
GIB = 1024 * MIB
EPOCH = 1_700_000_000.0  # the fake clock starts here (seconds); field timestamps are microseconds


# -- errors (built like pynvml's _extractNVMLErrorsAsClasses) ---------------------------------------

class NVMLLibraryMismatchError(Exception):
    """pynvml raises this (not an NVMLError) when a versioned symbol is missing."""


class NVMLError(Exception):
    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int | None = None):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, *args: Any) -> None:
        super().__init__()

    def __str__(self) -> str:
        return f"NVML error {self.value}"

    # Like pynvml: __eq__ without __hash__, so instances are unhashable.
    def __eq__(self, other: object) -> bool:
        return self.value == other.value  # type: ignore[attr-defined]


def _error_class(const: int, name: str) -> type[NVMLError]:
    """NVMLError_<Name> for one code, registered so NVMLError(code) builds it (like pynvml)."""

    def new(cls: type, *args: Any) -> NVMLError:
        return NVMLError.__new__(cls, const)

    cls = type(name, (NVMLError,), {"__new__": new})
    NVMLError._valClassMapping[const] = cls
    return cls


NVMLError_Uninitialized = _error_class(NVML_ERROR_UNINITIALIZED, "NVMLError_Uninitialized")
NVMLError_InvalidArgument = _error_class(NVML_ERROR_INVALID_ARGUMENT, "NVMLError_InvalidArgument")
NVMLError_NotSupported = _error_class(NVML_ERROR_NOT_SUPPORTED, "NVMLError_NotSupported")
NVMLError_NoPermission = _error_class(NVML_ERROR_NO_PERMISSION, "NVMLError_NoPermission")
NVMLError_AlreadyInitialized = _error_class(NVML_ERROR_ALREADY_INITIALIZED, "NVMLError_AlreadyInitialized")
NVMLError_NotFound = _error_class(NVML_ERROR_NOT_FOUND, "NVMLError_NotFound")
NVMLError_InsufficientSize = _error_class(NVML_ERROR_INSUFFICIENT_SIZE, "NVMLError_InsufficientSize")
NVMLError_DriverNotLoaded = _error_class(NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded")
NVMLError_Timeout = _error_class(NVML_ERROR_TIMEOUT, "NVMLError_Timeout")
NVMLError_LibraryNotFound = _error_class(NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound")
NVMLError_FunctionNotFound = _error_class(NVML_ERROR_FUNCTION_NOT_FOUND, "NVMLError_FunctionNotFound")
NVMLError_GpuIsLost = _error_class(NVML_ERROR_GPU_IS_LOST, "NVMLError_GpuIsLost")
NVMLError_ResetRequired = _error_class(NVML_ERROR_RESET_REQUIRED, "NVMLError_ResetRequired")
NVMLError_LibRmVersionMismatch = _error_class(NVML_ERROR_LIB_RM_VERSION_MISMATCH, "NVMLError_LibRmVersionMismatch")
NVMLError_NoData = _error_class(NVML_ERROR_NO_DATA, "NVMLError_NoData")
NVMLError_ArgumentVersionMismatch = _error_class(NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                                                 "NVMLError_ArgumentVersionMismatch")
NVMLError_NotReady = _error_class(NVML_ERROR_NOT_READY, "NVMLError_NotReady")
NVMLError_GpuNotFound = _error_class(NVML_ERROR_GPU_NOT_FOUND, "NVMLError_GpuNotFound")
NVMLError_Unknown = _error_class(NVML_ERROR_UNKNOWN, "NVMLError_Unknown")


# -- models ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    uuid_prefix: str
    memory_total: int  # bytes
    memory_reserved: int
    power_limit_mw: int
    sm_clock_max_mhz: int
    mem_clock_max_mhz: int
    pcie_max_gen: int
    pcie_max_width: int
    nvlinks: int
    gpm: bool
    mem_temp: bool = True
    remapped_rows: bool = True
    pcie_counters: bool = True
    clock_reasons_supported: int = 0x1FF
    fabric: str = "unsupported"  # "nvswitch": in an NVSwitch fabric; "state0": answers state NOT_SUPPORTED
    default_power_limit_mw: int = 0  # 0: the power_limit_mw the model was made with (a test lowers that)

    def __post_init__(self) -> None:
        if not self.default_power_limit_mw:
            object.__setattr__(self, "default_power_limit_mw", self.power_limit_mw)


MODELS = {
    "h100": GpuModel("h100", "NVIDIA H100 80GB HBM3", "5a9d1e00", 81559 * MIB, 520 * MIB, 700_000,
                     1980, 2619, 5, 16, 18, True, fabric="nvswitch"),
    "h200": GpuModel("h200", "NVIDIA H200", "7c3b2f00", 143771 * MIB, 560 * MIB, 700_000,
                     1980, 3201, 5, 16, 18, True, fabric="nvswitch"),
    "a100": GpuModel("a100", "NVIDIA A100-SXM4-80GB", "1f6a8e00", 81920 * MIB, 480 * MIB, 400_000,
                     1410, 1593, 4, 16, 12, False, pcie_counters=False),
    "l4": GpuModel("l4", "NVIDIA L4", "3e4d5c00", 23034 * MIB, 350 * MIB, 72_000,
                   2040, 6251, 4, 16, 0, False, mem_temp=False, remapped_rows=False,
                   clock_reasons_supported=0x16F, fabric="state0"),
}

ENGINE_PID = 4242
OTHER_PID = 777


@dataclass
class Load:
    """What a GPU is doing; counters advance at these rates."""

    gpu_util: int  # %
    mem_util: int  # % of time memory was read or written
    memory_used: int  # bytes
    power_mw: int
    temp_c: int
    mem_temp_c: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    pcie_gen: int
    pcie_width: int
    reasons: int  # clock-event bitmask
    pcie_tx_bps: int  # bytes/s
    pcie_rx_bps: int
    nvlink_tx_kib_per_link: int  # KiB/s per active link
    nvlink_rx_kib_per_link: int
    dram_bw_pct: float  # GPM percentages
    sm_active_pct: float
    sm_occupancy_pct: float
    tensor_pct: float
    processes: tuple[tuple[int, int | None], ...]  # (pid, used bytes or None)


def busy_load(model: GpuModel) -> Load:
    used = model.memory_total * 9 // 10
    return Load(gpu_util=97, mem_util=62, memory_used=used, power_mw=model.power_limit_mw * 93 // 100,
                temp_c=67, mem_temp_c=74, sm_clock_mhz=model.sm_clock_max_mhz * 9 // 10,
                mem_clock_mhz=model.mem_clock_max_mhz, pcie_gen=model.pcie_max_gen,
                pcie_width=model.pcie_max_width, reasons=0x4, pcie_tx_bps=1_500_000_000,
                pcie_rx_bps=3_000_000_000, nvlink_tx_kib_per_link=2_000_000, nvlink_rx_kib_per_link=1_500_000,
                dram_bw_pct=83.0, sm_active_pct=91.0, sm_occupancy_pct=37.0, tensor_pct=44.0,
                processes=((ENGINE_PID, used - GIB), (OTHER_PID, GIB)))


def idle_load(model: GpuModel) -> Load:
    used = model.memory_total * 9 // 10  # weights and KV cache stay allocated between requests
    return Load(gpu_util=0, mem_util=0, memory_used=used, power_mw=model.power_limit_mw // 10,
                temp_c=32, mem_temp_c=35, sm_clock_mhz=345, mem_clock_mhz=model.mem_clock_max_mhz,
                pcie_gen=1, pcie_width=model.pcie_max_width, reasons=0x1, pcie_tx_bps=1_000_000,
                pcie_rx_bps=2_000_000, nvlink_tx_kib_per_link=0, nvlink_rx_kib_per_link=0,
                dram_bw_pct=0.0, sm_active_pct=0.0, sm_occupancy_pct=0.0, tensor_pct=0.0,
                processes=((ENGINE_PID, used),))


LOADS = {"busy": busy_load, "idle": idle_load}


# -- structs -----------------------------------------------------------------------------------

class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<FakeHandle {self.index}>"


class c_nvmlMemory_t(SimpleNamespace):
    """v1: used includes reserved memory."""


class c_nvmlMemory_v2_t(SimpleNamespace):
    """v2: version, total, reserved, free, used (used excludes reserved)."""


class c_nvmlUtilization_t(SimpleNamespace):
    """.gpu and .memory in percent."""


class c_nvmlValue_t:
    """The value union. A fresh ctypes union reads 0 in every member; class attributes give those
    zeros, so building one costs about what the C struct does (the fake should not dominate a
    profile of the source)."""

    dVal = 0.0
    uiVal = 0
    ulVal = 0
    ullVal = 0
    sllVal = 0
    siVal = 0
    usVal = 0


class c_nvmlFieldValue_t:
    """One element of the array nvmlDeviceGetFieldValues returns."""

    __slots__ = ("fieldId", "scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn", "value")

    def __init__(self, fieldId: int, scopeId: int, timestamp: int = 0) -> None:
        self.fieldId = fieldId
        self.scopeId = scopeId
        self.timestamp = timestamp
        self.latencyUsec = 0
        self.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        self.nvmlReturn = NVML_SUCCESS
        self.value = c_nvmlValue_t()


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """Laid out as pynvml's (ctypes, so the source can pass ctypes.byref of it as it does for real)."""

    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint)]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32),
                ("healthSummary", ctypes.c_uint8)]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v3)


@dataclass
class c_metricInfo_t:
    shortName: str | None = None
    longName: str | None = None
    unit: str | None = None


@dataclass
class c_nvmlGpmMetric_t:
    metricId: int = 0
    nvmlReturn: int = NVML_SUCCESS
    value: float = 0.0
    metricInfo: c_metricInfo_t = field(default_factory=c_metricInfo_t)


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(NVML_GPM_METRIC_MAX)]


@dataclass
class c_nvmlGpmSupport_t:
    version: int = NVML_GPM_SUPPORT_VERSION
    isSupportedDevice: int = 0


@dataclass
class c_nvmlEventData_t:
    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeGpmSample:
    filled: bool = False
    freed: bool = False
    t: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)


@dataclass
class FakeEventSet:
    handles: list[FakeHandle] = field(default_factory=list)
    queue: list[c_nvmlEventData_t] = field(default_factory=list)
    freed: bool = False


# -- one device --------------------------------------------------------------------------------

@dataclass
class FakeDevice:
    index: int
    model: GpuModel
    load: Load
    handle: FakeHandle
    lost: bool = False
    mig: bool = False
    failures: dict[str, BaseException | type] = field(default_factory=dict)
    energy_mj: float = 123_456_789.0
    pcie_tx_bytes: float = 9_000_000_000.0
    pcie_rx_bytes: float = 7_000_000_000.0
    nvlink_tx_kib: float = 50_000_000.0  # per link
    nvlink_rx_kib: float = 40_000_000.0
    gpm_busy: dict[str, float] = field(default_factory=lambda: {"dram": 0.0, "sm": 0.0, "occ": 0.0, "tensor": 0.0})
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    pcie_replays: int = 0
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    recovery_action: int = NVML_GPU_RECOVERY_ACTION_NONE
    fabric_state: int = NVML_GPU_FABRIC_STATE_COMPLETED  # on models in an NVSwitch fabric
    fabric_status: int = NVML_SUCCESS
    fabric_health: int = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY

    @property
    def uuid(self) -> str:
        return f"GPU-{self.model.uuid_prefix}-{self.index:04x}-4c1e-8a2b-{self.index:012x}"

    @property
    def bus_id(self) -> str:
        return f"00000000:{0x18 + self.index * 0x10:02X}:00.0"

    def advance(self, dt: float) -> None:
        load = self.load
        self.energy_mj += load.power_mw * dt  # mW x s = mJ
        self.pcie_tx_bytes += load.pcie_tx_bps * dt
        self.pcie_rx_bytes += load.pcie_rx_bps * dt
        self.nvlink_tx_kib += load.nvlink_tx_kib_per_link * dt
        self.nvlink_rx_kib += load.nvlink_rx_kib_per_link * dt
        for key, pct in (("dram", load.dram_bw_pct), ("sm", load.sm_active_pct),
                         ("occ", load.sm_occupancy_pct), ("tensor", load.tensor_pct)):
            self.gpm_busy[key] += pct * dt

    def gpm_counters(self) -> dict[str, float]:
        links = self.model.nvlinks
        return dict(self.gpm_busy, pcie_tx=self.pcie_tx_bytes, pcie_rx=self.pcie_rx_bytes,
                    nvlink_tx=self.nvlink_tx_kib * 1024 * links, nvlink_rx=self.nvlink_rx_kib * 1024 * links)


# -- field values (nvmlDeviceGetFieldValues) ---------------------------------------------------

_BAD_SCOPE = object()  # a reader's answer for a link the GPU does not have (InvalidArgument)


def _nvlink(counter: str) -> Any:
    def read(dev: FakeDevice, scope: int) -> Any:
        return getattr(dev, counter) if scope < dev.model.nvlinks else _BAD_SCOPE
    return read


def _remapped(i: int) -> Any:
    def read(dev: FakeDevice, scope: int) -> Any:
        return None if not dev.model.remapped_rows or dev.mig else dev.remapped[i]
    return read


# fieldId -> (valueType, union member, reader(dev, scopeId) -> value, None for NotSupported).
# Units as NVML gives them: energy in mJ, NVLink in KiB, PCIe in bytes; the same values the
# dedicated calls return (nvmlDeviceGetTotalEccErrors, ...GetRemappedRows, ...).
_UINT, _ULL = NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_FIELD_READERS: dict[int, tuple[int, str, Any]] = {
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (_ULL, "ullVal", lambda dev, scope: dev.ecc_corrected),
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (_ULL, "ullVal", lambda dev, scope: dev.ecc_uncorrected),
    NVML_FI_DEV_MEMORY_TEMP: (_UINT, "uiVal",
                              lambda dev, scope: dev.load.mem_temp_c if dev.model.mem_temp else None),
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (_ULL, "ullVal", lambda dev, scope: dev.energy_mj),
    NVML_FI_DEV_PCIE_REPLAY_COUNTER: (_UINT, "uiVal", lambda dev, scope: dev.pcie_replays),
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (_ULL, "ullVal", _nvlink("nvlink_tx_kib")),
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (_ULL, "ullVal", _nvlink("nvlink_rx_kib")),
    NVML_FI_DEV_REMAPPED_COR: (_UINT, "uiVal", _remapped(0)),
    NVML_FI_DEV_REMAPPED_UNC: (_UINT, "uiVal", _remapped(1)),
    NVML_FI_DEV_REMAPPED_PENDING: (_UINT, "uiVal", _remapped(2)),
    NVML_FI_DEV_REMAPPED_FAILURE: (_UINT, "uiVal", _remapped(3)),
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (_ULL, "ullVal",
                                      lambda dev, scope: dev.pcie_tx_bytes if dev.model.pcie_counters else None),
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (_ULL, "ullVal",
                                      lambda dev, scope: dev.pcie_rx_bytes if dev.model.pcie_counters else None),
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (_UINT, "uiVal", lambda dev, scope: dev.recovery_action),
}
_NEW_FIELDS = frozenset({NVML_FI_DEV_GET_GPU_RECOVERY_ACTION})  # NotSupported on an old driver

# GPM metric id -> (counter of FakeGpmSample.counters, divisor): the metric is the counter's rate
# over the window between the two samples, divided into NVML's unit (MiB/s for the byte rates).
_GPM_FORMULAS: dict[int, tuple[str, float]] = {
    NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram", 1.0),
    NVML_GPM_METRIC_SM_UTIL: ("sm", 1.0),
    NVML_GPM_METRIC_SM_OCCUPANCY: ("occ", 1.0),
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor", 1.0),
    NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("pcie_tx", MIB),
    NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("pcie_rx", MIB),
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("nvlink_tx", MIB),
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("nvlink_rx", MIB),
}


# -- the module-like fake ----------------------------------------------------------------------

class FakeNvml:
    """Pass an instance where pynvml is expected: NvmlOptions(pynvml_module=FakeNvml(...))."""

    def __init__(self, models: tuple[str, ...] | list[str] = ("h100",), load: str = "busy", *,
                 driver: str = "550.54.15", cuda: int = 12040) -> None:
        self.devices = [FakeDevice(i, MODELS[m], LOADS[load](MODELS[m]), FakeHandle(i))
                        for i, m in enumerate(models)]
        self.driver = driver
        self.cuda = cuda
        self.now = EPOCH
        self._field_timestamp = 0  # microseconds, set by each nvmlDeviceGetFieldValues
        self.init_error: BaseException | type | None = None
        self.old_driver = False
        self.fabric_v3 = True  # the versioned fabric call takes the v3 struct (health summary)
        self.calls: Counter[str] = Counter()
        self.inits = 0
        self.refcount = 0
        self.gpm_samples_live = 0
        self.gpm_short_windows = 0
        self.gpm_unsupported: set[int] = set()  # metric ids answered with NOT_SUPPORTED
        self.event_sets_live = 0
        self._events = threading.Condition()
        self._event_sets: list[FakeEventSet] = []
        # Error classes and constants, reachable the way pynvml's are (N.NVMLError_NotSupported).
        module = sys.modules[__name__]
        for name in dir(module):
            if name.startswith(("NVML", "nvmlMemory", "nvmlTemperature", "nvmlEventType", "nvmlGpuFabricInfo",
                                "c_nvml")):
                setattr(self, name, getattr(module, name))

    # -- scenario controls --

    def clock(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt
        for dev in self.devices:
            dev.advance(dt)

    def fail(self, index: int, fname: str, error: BaseException | type) -> None:
        self.devices[index].failures[fname] = error

    def lose(self, index: int) -> None:
        self.devices[index].lost = True

    def recover(self, index: int) -> None:
        self.devices[index].lost = False

    def set_mig(self, index: int, enabled: bool) -> None:
        self.devices[index].mig = enabled

    def set_load(self, index: int, **changes: Any) -> None:
        dev = self.devices[index]
        dev.load = replace(dev.load, **changes)

    def set_recovery_action(self, index: int, action: int) -> None:
        self.devices[index].recovery_action = action

    def set_fabric(self, index: int, *, state: int | None = None, status: int | None = None,
                   health: int | None = None) -> None:
        dev = self.devices[index]
        if state is not None:
            dev.fabric_state = state
        if status is not None:
            dev.fabric_status = status
        if health is not None:
            dev.fabric_health = health

    def inject_xid(self, index: int, xid: int) -> None:
        handle = self.devices[index].handle
        with self._events:
            for event_set in self._event_sets:
                if handle in event_set.handles and not event_set.freed:
                    event_set.queue.append(c_nvmlEventData_t(handle, nvmlEventTypeXidCriticalError, xid))
            self._events.notify_all()

    # -- plumbing --

    def _check_init(self, fname: str) -> None:
        self.calls[fname] += 1
        if self.refcount == 0:
            raise NVMLError_Uninitialized()

    def _dev(self, handle: FakeHandle, fname: str) -> FakeDevice:
        # _check_init inlined: this runs on every device call, and the fake should cost about
        # what the C call does.
        self.calls[fname] += 1
        if self.refcount == 0:
            raise NVMLError_Uninitialized()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.devices):
            raise NVMLError_InvalidArgument()
        dev = self.devices[handle.index]
        if dev.lost:
            raise NVMLError_GpuIsLost()
        failure = dev.failures.get(fname)
        if failure is not None:
            raise failure() if isinstance(failure, type) else failure
        return dev

    def _new_symbol(self, fname: str) -> None:
        """Symbols newer drivers have; an old driver answers FunctionNotFound."""
        if self.old_driver:
            raise NVMLError_FunctionNotFound()

    # -- library --

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            err = self.init_error
            raise err() if isinstance(err, type) else err
        self.refcount += 1
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._check_init("nvmlShutdown")
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check_init("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise NVMLError_InvalidArgument()
        if self.devices[index].lost:
            raise NVMLError_GpuIsLost()
        return self.devices[index].handle

    # -- identity and static --

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._dev(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._dev(handle, "nvmlDeviceGetName").model.name

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        dev = self._dev(handle, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=dev.bus_id, busIdLegacy=dev.bus_id[4:], pciDeviceId=0x233010DE)

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        dev = self._dev(handle, "nvmlDeviceGetMigMode")
        if dev.model.key == "l4":
            raise NVMLError_NotSupported()
        mode = NVML_DEVICE_MIG_ENABLE if dev.mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, clock: int) -> int:
        dev = self._dev(handle, "nvmlDeviceGetMaxClockInfo")
        return {NVML_CLOCK_SM: dev.model.sm_clock_max_mhz, NVML_CLOCK_GRAPHICS: dev.model.sm_clock_max_mhz,
                NVML_CLOCK_MEM: dev.model.mem_clock_max_mhz}[clock]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxPcieLinkGeneration").model.pcie_max_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxPcieLinkWidth").model.pcie_max_width

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: FakeHandle) -> int:
        dev = self._dev(handle, "nvmlDeviceGetSupportedClocksEventReasons")
        self._new_symbol("nvmlDeviceGetSupportedClocksEventReasons")
        return dev.model.clock_reasons_supported

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetSupportedClocksThrottleReasons").model.clock_reasons_supported

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        dev = self._dev(handle, "nvmlDeviceGetNvLinkState")
        if dev.model.nvlinks == 0:
            raise NVMLError_NotSupported()
        if link >= dev.model.nvlinks:
            raise NVMLError_InvalidArgument()
        return NVML_FEATURE_ENABLED

    # -- per cycle --

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> c_nvmlUtilization_t:
        dev = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        if dev.mig:
            raise NVMLError_NotSupported()  # "not currently supported" under MIG
        return c_nvmlUtilization_t(gpu=dev.load.gpu_util, memory=dev.load.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        dev = self._dev(handle, "nvmlDeviceGetMemoryInfo")
        total, reserved, used = dev.model.memory_total, dev.model.memory_reserved, dev.load.memory_used
        if not version:
            return c_nvmlMemory_t(total=total, used=used + reserved, free=total - used - reserved)
        if self.old_driver:
            raise NVMLError_FunctionNotFound()  # nvmlDeviceGetMemoryInfo_v2 needs driver 510+
        return c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved, used=used,
                                 free=total - used - reserved)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage").load.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit").model.power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerManagementDefaultLimit").model.default_power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return int(self._dev(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj)

    def nvmlDeviceGetTemperatureV(self, handle: FakeHandle, sensor: int, version: int = nvmlTemperature_v1) -> int:
        dev = self._dev(handle, "nvmlDeviceGetTemperatureV")
        self._new_symbol("nvmlDeviceGetTemperatureV")
        return dev.load.temp_c + dev.index

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        dev = self._dev(handle, "nvmlDeviceGetTemperature")
        return dev.load.temp_c + dev.index

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock: int) -> int:
        dev = self._dev(handle, "nvmlDeviceGetClockInfo")
        return {NVML_CLOCK_SM: dev.load.sm_clock_mhz, NVML_CLOCK_GRAPHICS: dev.load.sm_clock_mhz,
                NVML_CLOCK_MEM: dev.load.mem_clock_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        dev = self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        self._new_symbol("nvmlDeviceGetCurrentClocksEventReasons")
        return dev.load.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").load.reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrPcieLinkGeneration").load.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrPcieLinkWidth").load.pcie_width

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return self._dev(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetPcieThroughput(self, handle: FakeHandle, counter: int) -> int:
        """Blocks 20 ms like the real call; the source must never call it."""
        dev = self._dev(handle, "nvmlDeviceGetPcieThroughput")
        time.sleep(0.02)
        return (dev.load.pcie_tx_bps if counter == NVML_PCIE_UTIL_TX_BYTES else dev.load.pcie_rx_bps) // 1000

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        dev = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        return dev.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else dev.ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        dev = self._dev(handle, "nvmlDeviceGetRemappedRows")
        if not dev.model.remapped_rows or dev.mig:
            raise NVMLError_NotSupported()
        return dev.remapped

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[Any]) -> list[c_nvmlFieldValue_t]:
        """Like pynvml: each id is a fieldId or a (fieldId, scopeId) pair; each answer carries its
        own nvmlReturn, and the call itself fails only for the device as a whole."""
        dev = self._dev(handle, "nvmlDeviceGetFieldValues")
        self._field_timestamp = int(round(self.now * 1e6))  # one batch, one read time
        read = self._field  # looked up per call: tests replace it to make one field fail
        return [read(dev, *f) if isinstance(f, tuple) else read(dev, f, 0) for f in field_ids]

    def _field(self, dev: FakeDevice, fid: int, scope: int) -> c_nvmlFieldValue_t:
        out = c_nvmlFieldValue_t(fid, scope, self._field_timestamp)
        entry = _FIELD_READERS.get(fid)
        value = None if entry is None or (self.old_driver and fid in _NEW_FIELDS) else entry[2](dev, scope)
        if value is None:
            out.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        elif value is _BAD_SCOPE:
            out.nvmlReturn = NVML_ERROR_INVALID_ARGUMENT
        else:
            out.valueType = entry[0]  # type: ignore[index]
            setattr(out.value, entry[1], int(value))  # type: ignore[index]
        return out

    def _fill_fabric(self, dev: FakeDevice, ref: Any) -> int:
        """Fill the struct behind ctypes.byref(...) as the driver would; NVML_SUCCESS like pynvml."""
        info = getattr(ref, "_obj", ref)
        if dev.model.fabric == "unsupported":
            raise NVMLError_NotSupported()
        if dev.model.fabric == "state0":
            info.state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return NVML_SUCCESS
        info.state = dev.fabric_state
        info.status = dev.fabric_status if dev.fabric_state == NVML_GPU_FABRIC_STATE_COMPLETED else NVML_SUCCESS
        if hasattr(info, "healthSummary"):
            info.healthSummary = dev.fabric_health
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: FakeHandle, ref: Any) -> int:
        dev = self._dev(handle, "nvmlDeviceGetGpuFabricInfoV")
        self._new_symbol("nvmlDeviceGetGpuFabricInfoV")
        info = getattr(ref, "_obj", ref)
        if info.version not in (nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3) or (
                info.version == nvmlGpuFabricInfo_v3 and not self.fabric_v3):
            raise NVMLError_ArgumentVersionMismatch()
        return self._fill_fabric(dev, ref)

    def nvmlDeviceGetGpuFabricInfo(self, handle: FakeHandle, ref: Any) -> int:
        """Deprecated, but the only form before driver 535."""
        return self._fill_fabric(self._dev(handle, "nvmlDeviceGetGpuFabricInfo"), ref)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[FakeProcess]:
        dev = self._dev(handle, "nvmlDeviceGetComputeRunningProcesses")
        if self.old_driver:
            # pynvml's throwOnVersionMismatch turns FunctionNotFound for _v3 into this.
            raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        return [FakeProcess(pid, used) for pid, used in dev.load.processes]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: FakeHandle) -> list[FakeProcess]:
        dev = self._dev(handle, "nvmlDeviceGetComputeRunningProcesses_v2")
        return [FakeProcess(pid, used) for pid, used in dev.load.processes]

    # -- GPM --

    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> c_nvmlGpmSupport_t:
        dev = self._dev(handle, "nvmlGpmQueryDeviceSupport")
        return c_nvmlGpmSupport_t(isSupportedDevice=1 if dev.model.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._check_init("nvmlGpmSampleAlloc")
        self.gpm_samples_live += 1
        return FakeGpmSample()

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self._check_init("nvmlGpmSampleFree")
        if sample.freed:
            raise NVMLError_InvalidArgument()  # double free
        sample.freed = True
        self.gpm_samples_live -= 1

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        dev = self._dev(handle, "nvmlGpmSampleGet")
        if not dev.model.gpm:
            raise NVMLError_NotSupported()
        if sample.freed:
            raise NVMLError_InvalidArgument()
        sample.filled, sample.t, sample.counters = True, self.now, dev.gpm_counters()
        return sample

    def nvmlGpmMetricsGet(self, request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        self._check_init("nvmlGpmMetricsGet")
        s1, s2 = request.sample1, request.sample2
        if (request.version != NVML_GPM_METRICS_GET_VERSION or s1 is None or s2 is None or s1 is s2
                or not (s1.filled and s2.filled) or s1.freed or s2.freed):
            raise NVMLError_InvalidArgument()
        dt = s2.t - s1.t
        if dt < 0.1:
            self.gpm_short_windows += 1  # NVML wants > 100 ms between samples
        if dt <= 0:
            raise NVMLError_InvalidArgument()

        c1, c2 = s1.counters, s2.counters
        unsupported = self.gpm_unsupported
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            formula = _GPM_FORMULAS.get(metric.metricId)
            if formula is None or metric.metricId in unsupported:
                metric.nvmlReturn, metric.value = NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                key, divisor = formula
                metric.nvmlReturn, metric.value = NVML_SUCCESS, (c2[key] - c1[key]) / dt / divisor
        return request

    # -- events --

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init("nvmlEventSetCreate")
        event_set = FakeEventSet()
        with self._events:
            self._event_sets.append(event_set)
        self.event_sets_live += 1
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        self._dev(handle, "nvmlDeviceGetSupportedEventTypes")
        return nvmlEventTypeXidCriticalError | 0x1 | 0x2

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        self._dev(handle, "nvmlDeviceRegisterEvents")
        with self._events:
            event_set.handles.append(handle)

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> c_nvmlEventData_t:
        self._check_init("nvmlEventSetWait_v2")
        with self._events:
            if event_set.freed:
                raise NVMLError_InvalidArgument()
            self._events.wait_for(lambda: event_set.queue or event_set.freed, timeout_ms / 1000.0)
            if event_set.queue:
                return event_set.queue.pop(0)
        raise NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._check_init("nvmlEventSetFree")
        with self._events:
            event_set.freed = True
            self._event_sets.remove(event_set)
            self._events.notify_all()
        self.event_sets_live -= 1
