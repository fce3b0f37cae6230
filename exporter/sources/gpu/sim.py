"""Simulated GPUs (`--gpu-backend sim`): what the digital twin's step-by-step model implies,
exported under the same families and labels as the NVML source.

Reads one or more twins, in process (anything with `gpu_state() -> dict`, such as
exporter.simulator.Twin) or over HTTP (`GET <twin url>/sim/gpu`, with the engine scrape's client:
bounded time and size, no redirects or environment).

The twin's GPUs can fail as NVML shows it (`POST /sim/gpu/<index>/fault`, docs/simulator.md), and
this source answers each failure as the NVML source (exporter/sources/gpu/nvml.py) answers the same
NVML return code, sorted by the same table (exporter/sources/gpu/_errors.py):
- a GPU whose calls answer a lost code (GpuIsLost, Unknown, ...): `llm_gpu_up 0` for it under the
  identity last read, none of its other series, its XID counts kept; the others still served; the
  source's state `gpu_lost` and one warning line. Like NVML, the source then "re-initialises" after
  --gpu-retry-interval (doubling up to GPU_RETRY_MAX_S while the GPU stays lost) and until then does
  not look at the GPU again: a GPU that comes back shows at the next re-initialisation;
- a field that answers NotSupported (or another absent code): omitted, said once, and not asked
  again until the next re-initialisation; a transient code (Timeout, ...): omitted for that cycle;
- the library failing (nvmlInit answers DriverNotLoaded, ...: the document's `nvml_error`): every
  GPU lost while the source was reading, then at re-initialisation an init failure, which for an
  explicitly chosen backend is a source error (`llm_exporter_source_up{source="gpu"} 0`,
  `llm_exporter_collect_errors_total{reason="driver_not_loaded"}`), as with --gpu-backend nvml.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from exporter.httpclient import HttpClient, get_json_object
from exporter.redact import redact_url
from exporter.snapshot import Labels, Sample, make_labels
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.gpu._errors import (
    DRIVER_NOT_LOADED,
    LIB_RM_VERSION_MISMATCH,
    LIBRARY_NOT_FOUND,
    LOG,
    NO_PERMISSION,
    Kind,
    classify_code,
)
from exporter.sources.gpu.attribution import GpuSelection

SIM_DRIVER_VERSION = "sim"
# A /sim/gpu document is about 1.5 KB per GPU; this holds hundreds and bounds a wrong URL's page.
MAX_SIM_GPU_BYTES = 1024 * 1024
# The NVML source's back-off (NvmlOptions): the first delay is --gpu-retry-interval, doubled while
# a GPU stays lost, up to this.
GPU_RETRY_INTERVAL_S = 10.0
GPU_RETRY_MAX_S = 300.0
# GPUs whose identity, loss or absent fields are remembered (and said once): far more than a node
# has, and a bound on what a twin URL that invents new GPUs every cycle can make us keep or log.
MAX_KNOWN_GPUS = 1024
# Lines said once per (GPU, field) or per lost GPU: a node's few GPUs x 28 fields fit many times
# over; past it nothing more is said (the series still say it), so a hostile twin cannot grow it.
MAX_SAID_KEYS = 8192

# /sim/gpu field -> family (a plain gauge or counter per GPU).
_SCALARS: tuple[tuple[str, str], ...] = (
    ("utilization_ratio", "llm_gpu_utilization_ratio"),
    ("memory_utilization_ratio", "llm_gpu_memory_utilization_ratio"),
    ("memory_used_bytes", "llm_gpu_memory_used_bytes"),
    ("memory_total_bytes", "llm_gpu_memory_total_bytes"),
    ("memory_reserved_bytes", "llm_gpu_memory_reserved_bytes"),
    ("power_watts", "llm_gpu_power_watts"),
    ("power_limit_watts", "llm_gpu_power_limit_watts"),
    ("power_default_limit_watts", "llm_gpu_power_default_limit_watts"),
    ("energy_joules_total", "llm_gpu_energy_joules_total"),
    ("temperature_celsius", "llm_gpu_temperature_celsius"),
    ("sm_clock_hertz", "llm_gpu_sm_clock_hertz"),
    ("sm_clock_max_hertz", "llm_gpu_sm_clock_max_hertz"),
    ("memory_clock_hertz", "llm_gpu_memory_clock_hertz"),
    ("memory_clock_max_hertz", "llm_gpu_memory_clock_max_hertz"),
    ("dram_bandwidth_utilization_ratio", "llm_gpu_dram_bandwidth_utilization_ratio"),
    ("sm_active_ratio", "llm_gpu_sm_active_ratio"),
    ("sm_occupancy_ratio", "llm_gpu_sm_occupancy_ratio"),
    ("tensor_active_ratio", "llm_gpu_tensor_active_ratio"),
    ("pcie_replay_errors_total", "llm_gpu_pcie_replay_errors_total"),
)
# Fields a card may not have (null in /sim/gpu): omitted then, as the NVML source omits them.
_OPTIONAL_SCALARS: tuple[tuple[str, str], ...] = (
    ("memory_temperature_celsius", "llm_gpu_memory_temperature_celsius"),  # GDDR cards: no sensor
)
_REMAPPED_STATES = ("correctable", "uncorrectable", "pending", "failed")
# Every field a fault can make fail (the twin's FAILING_FIELDS); a code for any other key is ignored.
_FIELDS = frozenset({key for key, _ in _SCALARS + _OPTIONAL_SCALARS} | {
    "processes", "ecc_errors", "remapped_rows", "recovery_action", "fabric", "clock_event_reasons", "pcie",
    "nvlink"})
_EVERY_FIELD = "every field"  # a code the whole GPU answers (its log line says so once)
# NVML return code -> pynvml's name for it, for the log lines (as _errors.describe words a real error).
_CODE_NAMES = {1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission", 9: "DriverNotLoaded",
               10: "Timeout", 12: "LibraryNotFound", 13: "FunctionNotFound", 15: "GpuIsLost", 16: "ResetRequired",
               18: "LibRmVersionMismatch", 21: "NoData", 27: "NotReady", 28: "GpuNotFound", 999: "Unknown"}
# nvmlInit's code -> the source's state, as nvml._init_failure sorts it.
_INIT_STATES = {LIBRARY_NOT_FOUND: "nvml_missing", DRIVER_NOT_LOADED: "driver_not_loaded",
                NO_PERMISSION: "nvml_permission", LIB_RM_VERSION_MISMATCH: "nvml_mismatch"}


class GpuStateProvider(Protocol):
    def gpu_state(self) -> Mapping[str, Any]: ...


def _pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10 & 0xFF:02X}:00.0"


def _code(value: Any) -> int:
    """An NVML return code from a document: a positive int, else ValueError (a parse failure)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1_000_000:
        raise ValueError(f"an NVML return code is a positive integer, not {value!r}")
    return value


def _describe(code: int) -> str:
    return f"NVMLError_{_CODE_NAMES.get(code, 'Error')}({code})"


def _identity(g: Mapping[str, Any]) -> Labels:
    return make_labels({"gpu": str(int(g["index"])), "uuid": str(g["uuid"]), "name": str(g["name"])})


def gpu_samples(g: Mapping[str, Any], base: Labels, skip: frozenset[str] | set[str] = frozenset()) -> list[Sample]:
    """The samples of one GPU answering /sim/gpu's object `g`, less the fields in `skip`. Raises
    KeyError/TypeError/ValueError when the object is malformed."""
    out = [Sample("llm_gpu_up", base, 1.0), Sample("llm_gpu_info", make_labels(base + (
        ("driver_version", SIM_DRIVER_VERSION), ("cuda_version", SIM_DRIVER_VERSION),
        ("pci_bus_id", _pci_bus_id(int(g["index"]))), ("mig_mode", "disabled"))), 1.0)]
    for key, family in _SCALARS:
        if key not in skip:
            out.append(Sample(family, base, float(g[key])))
    for key, family in _OPTIONAL_SCALARS:
        if key not in skip and g.get(key) is not None:
            out.append(Sample(family, base, float(g[key])))
    # As NVML with no engine PIDs configured: the memory of every compute process on the GPU.
    processes = None if "processes" in skip else g["processes"]
    if processes:
        out.append(Sample("llm_gpu_engine_memory_used_bytes", base,
                          float(sum(float(p["used_gpu_memory_bytes"]) for p in processes))))
    ecc = None if "ecc_errors" in skip else g.get("ecc_errors")
    if ecc is not None:  # None: ECC off
        for kind in ("corrected", "uncorrected"):
            out.append(Sample("llm_gpu_ecc_errors_total", make_labels(base + (("type", kind),)), float(ecc[kind])))
    rows = None if "remapped_rows" in skip else g.get("remapped_rows")
    if rows is not None:  # None: no row remapping (GDDR cards)
        for state_name in _REMAPPED_STATES:
            out.append(Sample("llm_gpu_remapped_rows", make_labels(base + (("state", state_name),)),
                              float(rows[state_name])))
    out.extend(_xid_samples(g, base))
    # Absent keys or nulls: a driver that does not report them, a GPU outside an NVSwitch fabric.
    if "recovery_action" not in skip and g.get("recovery_action") is not None:
        out.append(Sample("llm_gpu_recovery_action", base, float(g["recovery_action"])))
    fabric = None if "fabric" in skip else g.get("fabric")
    if fabric:
        for key, family in (("state", "llm_gpu_fabric_state"), ("status", "llm_gpu_fabric_status"),
                            ("health", "llm_gpu_fabric_health")):
            if fabric.get(key) is not None:
                out.append(Sample(family, base, float(fabric[key])))
    if "clock_event_reasons" not in skip:
        for reason, active in g["clock_event_reasons"].items():
            out.append(Sample("llm_gpu_clock_event_active", make_labels(base + (("reason", reason),)),
                              float(active)))
    if "pcie" not in skip:
        pcie = g["pcie"]
        for state_name, gen_key, width_key in (("current", "gen_current", "width_current"),
                                               ("max", "gen_max", "width_max")):
            lab = make_labels(base + (("state", state_name),))
            out.append(Sample("llm_gpu_pcie_link_generation", lab, float(pcie[gen_key])))
            out.append(Sample("llm_gpu_pcie_link_width", lab, float(pcie[width_key])))
        out.append(Sample("llm_gpu_pcie_tx_bytes_per_second", base, float(pcie["tx_bytes_per_second"])))
        out.append(Sample("llm_gpu_pcie_rx_bytes_per_second", base, float(pcie["rx_bytes_per_second"])))
    nvlink = None if "nvlink" in skip else g.get("nvlink")
    if nvlink:  # a GPU without NVLink gets no NVLink series, not a made-up zero
        out.append(Sample("llm_gpu_nvlink_tx_bytes_per_second", base, float(nvlink["tx_bytes_per_second"])))
        out.append(Sample("llm_gpu_nvlink_rx_bytes_per_second", base, float(nvlink["rx_bytes_per_second"])))
    return out


def _xid_samples(g: Mapping[str, Any], base: Labels) -> list[Sample]:
    # A code's series appears with its first event, as the NVML source's do.
    return [Sample("llm_gpu_xid_errors_total", make_labels(base + (("xid", str(code)),)), float(count))
            for code, count in g["xid_errors"].items()]


def _field_errors(g: Mapping[str, Any]) -> dict[str, int]:
    errors = g.get("nvml_errors") or {}
    if not isinstance(errors, Mapping):
        raise TypeError(f"nvml_errors is an object, not {type(errors).__name__}")
    return {str(key): _code(code) for key, code in errors.items() if key in _FIELDS}


def samples_from_state(state: Mapping[str, Any]) -> list[Sample]:
    """Samples for every GPU in one /sim/gpu document, read once with nothing remembered: a GPU
    that fails is down (under its index alone, as NVML labels one it never read), a failing field
    omitted. Raises KeyError/TypeError/ValueError when the document is malformed."""
    out: list[Sample] = []
    for g in state["gpus"]:
        if g.get("nvml_error") is not None or state.get("nvml_error") is not None:
            out.append(Sample("llm_gpu_up", make_labels({"gpu": str(int(g["index"])), "uuid": "", "name": ""}), 0.0))
            continue
        out.extend(gpu_samples(g, _identity(g), set(_field_errors(g))))
    return out


@dataclass(slots=True)
class _Known:
    """A GPU read before: its labels (a lost GPU keeps them) and its XID counts (kept while lost,
    as the NVML source keeps the counts its event thread saw)."""

    labels: Labels
    name: str
    uuid: str
    xids: tuple[Sample, ...] = ()


@dataclass(slots=True)
class _Read:
    """One cycle's outcome, applied to the source's state only once every document parsed."""

    samples: list[Sample] = field(default_factory=list)
    known: dict[tuple[int, int], _Known] = field(default_factory=dict)
    newly_lost: dict[tuple[int, int], str] = field(default_factory=dict)  # key -> why
    absent: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)  # key -> field -> code
    transient: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    lost: list[tuple[int, int]] = field(default_factory=list)  # every GPU down this cycle
    order: list[tuple[int, int]] = field(default_factory=list)  # every GPU, in document order


class SimGpuSource:
    """Source "gpu" backed by twins. `targets`: twin objects and/or twin base URLs.
    `fetch_timeout_s` bounds each GET; the collection as a whole is bounded by the interval.
    `retry_interval_s`: the first delay before a re-initialisation after a lost GPU or a failed
    init (doubles up to GPU_RETRY_MAX_S), as the NVML source's."""

    kind = SourceKind.GPU
    timeout_s: float | None = None

    def __init__(self, targets: Sequence[GpuStateProvider | str] | GpuStateProvider | str, *,
                 fetch_timeout_s: float = 2.0, name: str = "gpu", retry_interval_s: float = GPU_RETRY_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(targets, str) or hasattr(targets, "gpu_state"):
            targets = [targets]
        self.targets: list[GpuStateProvider | str] = list(targets)
        if not self.targets:
            raise ValueError("SimGpuSource needs at least one twin or twin URL")
        self.name = name
        self.fetch_timeout_s = fetch_timeout_s
        self._clients: dict[str, HttpClient] = {}
        self._clock = clock
        self._said: set[tuple[str, ...]] = set()  # what was logged once (OnceLog's, bounded)
        self._retry_interval_s = retry_interval_s
        self._retry_delay = retry_interval_s
        self._retry_at = 0.0
        # The NVML source's generation, simulated: open between an init and a re-init; GPUs lost and
        # fields absent in it are not asked again until the next one.
        self._open = False
        self._needs_reinit = False
        self._last_failure: tuple[str, str] | None = None  # (state, message) of the failed init
        self._lost: set[tuple[int, int]] = set()
        self._absent: dict[tuple[int, int], set[str]] = {}
        self._known: dict[tuple[int, int], _Known] = {}
        self.inits = 0  # successful (simulated) NVML initialisations, for tests
        self._selection: GpuSelection | None = None  # None: every GPU (attribution.py)

    def select(self, selection: GpuSelection | None) -> None:
        """Watch only the GPUs `selection` wants from the next collection on (as the NVML source)."""
        self._selection = selection

    async def _fetch(self, url: str) -> Mapping[str, Any]:
        endpoint = url.rstrip("/") + "/sim/gpu"
        shown = redact_url(endpoint)  # error messages reach logs and /api/v1/snapshot
        client = self._clients.get(url)
        if client is None:
            try:
                client = self._clients[url] = HttpClient(endpoint, timeout_s=self.fetch_timeout_s,
                                                         headers={"Accept": "application/json"})
            except ValueError as e:
                raise SourceError("connection", str(e)) from None
        return await get_json_object(client, shown, MAX_SIM_GPU_BYTES)

    async def _documents(self) -> list[Mapping[str, Any]]:
        return [await self._fetch(t) if isinstance(t, str) else t.gpu_state() for t in self.targets]

    def _where(self, pos: int) -> str:
        target = self.targets[pos]
        return f" from {redact_url(target.rstrip('/') + '/sim/gpu')}" if isinstance(target, str) else ""

    async def collect(self) -> SourceData:
        now = self._clock()
        if self._open and self._needs_reinit and now >= self._retry_at:
            LOG.info("re-initialising the simulated NVML after a lost GPU")
            self._open = self._needs_reinit = False
            self._lost.clear()
            self._absent.clear()
        if not self._open and self._last_failure is not None and now < self._retry_at:
            raise SourceError(*self._last_failure)  # as NVML: a failed init is not tried again before its retry
        docs = await self._documents()
        opening = not self._open
        if opening:
            code = self._library_error(docs)
            if code is not None:
                # --gpu-backend sim is chosen, as --gpu-backend nvml: an init failure is an error (the
                # collector logs its state change once and counts it by reason).
                self._last_failure = (_INIT_STATES.get(code, "nvml_init"), f"NVML unavailable: {_describe(code)}")
                self._schedule_retry(now)
                raise SourceError(*self._last_failure)
            self._last_failure = None
            self._open = True
            self.inits += 1
        read = self._read(docs, opening)
        self._apply(read, now)
        return SourceData(tuple(read.samples), self._attrs(read))

    def _library_error(self, docs: list[Mapping[str, Any]]) -> int | None:
        for pos, doc in enumerate(docs):
            try:
                if doc.get("nvml_error") is not None:
                    return _code(doc["nvml_error"])
            except ValueError as e:
                raise SourceError("parse", f"malformed twin GPU state{self._where(pos)}: {e!r}") from None
        return None

    def _read(self, docs: list[Mapping[str, Any]], opening: bool) -> _Read:
        read = _Read()
        for pos, doc in enumerate(docs):
            try:
                library = None if doc.get("nvml_error") is None else _code(doc["nvml_error"])
                for g in doc["gpus"]:
                    # Another engine's GPU: not read, not exported. A GPU that fails may have no UUID in
                    # the document (NVML could not read it): chosen by index then, as NVML's unopened.
                    selection = self._selection
                    if selection is not None and selection.ids is not None and not selection.wants(
                            int(g["index"]), str(g.get("uuid") or "")):
                        continue
                    self._read_gpu(read, (pos, int(g["index"])), g, library, opening)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise SourceError("parse", f"malformed twin GPU state{self._where(pos)}: {e!r}") from None
        return read

    def _read_gpu(self, read: _Read, key: tuple[int, int], g: Mapping[str, Any], library: int | None,
                  opening: bool) -> None:
        read.order.append(key)
        known = read.known.get(key) or self._known.get(key)
        code = library if library is not None else (None if g.get("nvml_error") is None else _code(g["nvml_error"]))
        if key in self._lost:  # not looked at again until the next re-initialisation
            self._down(read, key, known)
            return
        if code is not None:
            if known is None or opening or classify_code(code) is Kind.LOST:
                # NVML cannot open a GPU that fails (no handle, no identity): lost, as one that fails later.
                read.newly_lost[key] = _describe(code)
                self._down(read, key, known)
            else:  # every call fails, but not as lost: no readings, the GPU still up
                read.samples.extend((Sample("llm_gpu_up", known.labels, 1.0), Sample("llm_gpu_info", make_labels(
                    known.labels + (("driver_version", SIM_DRIVER_VERSION), ("cuda_version", SIM_DRIVER_VERSION),
                                    ("pci_bus_id", _pci_bus_id(key[1])), ("mig_mode", "disabled"))), 1.0)))
                read.known[key] = known
                # As NVML marks each call absent (until re-initialised) or skips it for the cycle.
                (read.absent if classify_code(code) is Kind.ABSENT else read.transient)[key] = {_EVERY_FIELD: code}
            return
        errors = _field_errors(g)
        lost = next((c for c in errors.values() if classify_code(c) is Kind.LOST), None)
        if lost is not None:  # a read that meets a lost code drops the GPU, readings and all
            read.newly_lost[key] = _describe(lost)
            self._down(read, key, known)
            return
        base = _identity(g)
        for name, c in errors.items():
            (read.absent if classify_code(c) is Kind.ABSENT else read.transient).setdefault(key, {})[name] = c
        skip = set(errors) | self._absent.get(key, set())
        samples = gpu_samples(g, base, skip)
        read.samples.extend(samples)
        read.known[key] = _Known(base, str(g["name"]), str(g["uuid"]), tuple(_xid_samples(g, base)))

    def _down(self, read: _Read, key: tuple[int, int], known: _Known | None) -> None:
        labels = known.labels if known is not None else make_labels({"gpu": str(key[1]), "uuid": "", "name": ""})
        read.samples.append(Sample("llm_gpu_up", labels, 0.0))
        if known is not None:
            read.samples.extend(known.xids)
        read.lost.append(key)

    def _apply(self, read: _Read, now: float) -> None:
        for key, known in read.known.items():
            if key in self._known or len(self._known) < MAX_KNOWN_GPUS:
                self._known[key] = known
            self._said.discard(("lost", *map(str, key)))
        for key, why in read.newly_lost.items():
            if len(self._lost) >= MAX_KNOWN_GPUS:
                break  # down this cycle all the same; remembered (and said) for the first ones only
            self._lost.add(key)
            last = self._known.get(key)
            self._say(logging.WARNING, ("lost", *map(str, key)),
                           "GPU %s (%s) lost: %s; NVML will be re-initialised", key[1],
                           last.uuid if last else "never read", why)
        for key, fields in read.absent.items():
            if key not in self._absent and len(self._absent) >= MAX_KNOWN_GPUS:
                continue  # omitted this cycle all the same
            absent = self._absent.setdefault(key, set())
            last = self._known.get(key)
            for name, code in sorted(fields.items()):
                absent.update(_FIELDS if name == _EVERY_FIELD else (name,))
                self._say(logging.INFO, ("absent", *map(str, key), name),
                               "GPU %s (%s): %s not available, series omitted: %s",
                               key[1], last.name if last else "", name, _describe(code))
        for key, fields in list(read.transient.items())[:MAX_KNOWN_GPUS]:
            for name, code in sorted(fields.items()):
                self._say(logging.DEBUG, ("transient", *map(str, key), name),
                               "GPU %s: %s failed this cycle: %s", key[1], name, _describe(code))
        if read.lost and not self._needs_reinit:
            self._needs_reinit = True
            self._schedule_retry(now)
        elif not read.lost:
            self._retry_delay = self._retry_interval_s

    def _say(self, level: int, key: tuple[str, ...], message: str, *args: object) -> None:
        if key in self._said or len(self._said) >= MAX_SAID_KEYS:
            return
        self._said.add(key)
        LOG.log(level, message, *args)

    def _schedule_retry(self, now: float) -> None:
        self._retry_at = now + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, GPU_RETRY_MAX_S)

    def _attrs(self, read: _Read) -> dict[str, str]:
        idents = [self._known.get(key) for key in read.order]
        return {
            "backend": "sim",
            "gpus": str(len(read.order)),
            "names": ",".join(k.name if k else "" for k in idents),
            "uuids": ",".join(k.uuid if k else "" for k in idents),
            "state": "gpu_lost" if read.lost else "ok",
            "lost": ",".join(str(index) for _, index in sorted(read.lost)),
            "driver_version": SIM_DRIVER_VERSION,
            "cuda_version": SIM_DRIVER_VERSION,
        }

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()
