"""The GPU source on NVML (nvidia-ml-py): per-GPU telemetry, clock-event reasons, PCIe/NVLink
rates, ECC/XID, engine memory, and GPM on Hopper and newer.

Degrade, never die:
- no library, no driver or no GPU: with `required=False` (--gpu-backend auto) a normal state, no
  samples and one log line; with `required=True` (--gpu-backend nvml) a SourceError;
- a field a GPU cannot give: omitted for that GPU, logged once;
- a GPU that is lost: `llm_gpu_up 0` for it, the others still served, and NVML is shut down and
  initialised again on a later cycle (with backoff) to pick it up if it comes back.

pynvml is imported inside the worker thread on first use, never at import time, and every NVML
call runs off the event loop.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from exporter.snapshot import Labels, Sample, make_labels
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.gpu._device import Device, DeviceReader, GpuIdentity, GpuLost
from exporter.sources.gpu._errors import (
    DRIVER_NOT_LOADED,
    LIB_RM_VERSION_MISMATCH,
    LIBRARY_NOT_FOUND,
    LOG,
    NO_PERMISSION,
    OnceLog,
    classify,
    describe,
    error_code,
)
from exporter.sources.gpu._xid import XidWatcher
from exporter.sources.gpu.attribution import GpuSelection

MAX_XID_CODES_PER_GPU = 32
# Reasons NVML may be unusable at start; in auto mode these mean "no NVIDIA GPU here".
_ABSENT_STATES = frozenset({"nvml_missing", "driver_not_loaded", "no_gpus"})


@dataclass(frozen=True, slots=True)
class NvmlOptions:
    """How the NVML source behaves. Defaults suit --gpu-backend auto."""

    required: bool = False
    """False (auto): a missing library/driver or zero GPUs is normal. True (nvml): it is an error."""
    engine_pids: Callable[[], Collection[int]] | None = None
    """PIDs of the engine's processes, for llm_gpu_engine_memory_used_bytes (None: all compute
    processes). Called once per cycle from a worker thread. An empty result omits the series."""
    pynvml_module: Any = None
    """A pynvml-compatible module to use instead of importing pynvml (tests pass a fake)."""
    gpm: bool = True
    """Read GPM metrics where nvmlGpmQueryDeviceSupport says the GPU has them."""
    xid_events: bool = True
    """Count XID critical errors from an event-set wait in a daemon thread."""
    xid_wait_ms: int = 500
    """Timeout of each event wait: how fast the XID thread notices it should stop."""
    retry_interval_s: float = 10.0
    """First delay before NVML is initialised again after a failure or a lost GPU (doubles)."""
    retry_max_s: float = 300.0
    gpm_min_interval_s: float = 0.1
    """NVML needs GPM samples more than 100 ms apart; a faster cycle keeps the older sample."""
    clock: Callable[[], float] = time.monotonic


class IdentityAttrs(NamedTuple):
    """Source attrs fixed for an NVML generation, each a comma-joined list in GPU index order."""

    gpus: str
    names: str
    uuids: str
    pci_bus_ids: str
    mig: str


@dataclass(slots=True)
class _Generation:
    """Everything that lives between one nvmlInit and its nvmlShutdown."""

    nvml: Any
    devices: list[Device]
    unopened: list[GpuIdentity]  # GPUs NVML counts but that were lost when opened
    driver_version: str
    cuda_version: str
    xid: XidWatcher | None = None
    needs_reinit: bool = False
    identity_attrs: IdentityAttrs | None = None  # see NvmlSource._identity_attrs


class _InitFailure(Exception):
    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.message = message


@dataclass(slots=True)
class _XidCounts:
    """XID counts by GPU UUID, written by the XID thread and read by the cycle."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, uuid: str, xid: int) -> None:
        code = str(xid) if 0 < xid < 100_000 else "other"
        with self.lock:
            per_gpu = self.counts.setdefault(uuid, {})
            if code not in per_gpu and len(per_gpu) >= MAX_XID_CODES_PER_GPU:
                code = "other"  # bound the label values a misbehaving GPU can create
            per_gpu[code] = per_gpu.get(code, 0) + 1

    def of(self, uuid: str) -> dict[str, int]:
        with self.lock:
            per_gpu = self.counts.get(uuid)
            return dict(per_gpu) if per_gpu else {}


class NvmlSource:
    """The `gpu` source on real GPUs. See the module docstring for its failure policy."""

    name = "gpu"
    kind = SourceKind.GPU
    timeout_s: float | None = None  # a hung NVML call is bounded by the interval (module docstring)

    def __init__(self, options: NvmlOptions | None = None) -> None:
        self._options = options or NvmlOptions()
        self._clock = self._options.clock
        self._once = OnceLog(LOG)
        self._reader = DeviceReader(self._once, self._clock, gpm=self._options.gpm,
                                    gpm_min_interval_s=self._options.gpm_min_interval_s)
        self._lock = threading.Lock()  # one cycle (or close) at a time
        self._gen: _Generation | None = None
        self._known: dict[int, GpuIdentity] = {}
        self._xids = _XidCounts()
        self._retry_at = 0.0
        self._retry_delay = self._options.retry_interval_s
        self._last_failure: _InitFailure | None = None
        self.inits = 0  # successful NVML initialisations, for tests and the status page
        self._selection: GpuSelection | None = None  # None: every GPU NVML shows (attribution.py)

    def select(self, selection: GpuSelection | None) -> None:
        """Read only the GPUs `selection` wants from the next cycle on: the others are opened with
        the generation (a handle costs nothing) but never read, and export nothing."""
        if selection != self._selection:
            self._selection = selection
            gen = self._gen
            if gen is not None:
                gen.identity_attrs = None  # the attrs list the watched GPUs: join them again

    def _wants(self, ident: GpuIdentity) -> bool:
        return self._selection is None or self._selection.wants(ident.index, ident.uuid)

    async def collect(self) -> SourceData:
        return await asyncio.to_thread(self._collect_sync)

    async def close(self) -> None:
        await asyncio.to_thread(self._close_sync)

    # -- the cycle --------------------------------------------------------------------------

    def _collect_sync(self) -> SourceData:
        # A wedged driver call must not pile up worker threads: refuse instead of queueing.
        if not self._lock.acquire(blocking=False):
            raise SourceError("busy", "the previous NVML collection is still running")
        try:
            now = self._clock()
            gen = self._gen
            if gen is not None and gen.needs_reinit and now >= self._retry_at:
                LOG.info("re-initialising NVML after a lost GPU")
                self._close_generation()
                gen = None
            if gen is None:
                try:
                    gen = self._open_or_fail(now)
                except _InitFailure as failure:
                    return self._unavailable(failure)
            return self._read(gen, now)
        finally:
            self._lock.release()

    def _open_or_fail(self, now: float) -> _Generation:
        if self._last_failure is not None and now < self._retry_at:
            raise self._last_failure
        try:
            gen = self._open_generation()
        except _InitFailure as failure:
            self._last_failure = failure
            self._schedule_retry(now)
            raise
        self._last_failure = None
        self._gen = gen
        return gen

    def _unavailable(self, failure: _InitFailure) -> SourceData:
        """No NVML this cycle. In auto mode, no library/driver/GPU on a machine that never had one is
        a normal state; GPUs seen before are reported down; anything else is an error."""
        normal = not self._options.required and failure.state in _ABSENT_STATES and not self._known
        if self._options.required or (not normal and not self._known):
            # The collector logs the source's state change, once: a line here would be a second
            # one for the same event (seen in the sidecar pod's log under --gpu-backend nvml).
            raise SourceError(failure.state, failure.message)
        self._once.log(logging.INFO if normal else logging.WARNING, ("init", failure.state),
                       "GPU source: %s%s", failure.message, "; no GPU series" if normal else "")
        idents = [self._known[i] for i in sorted(self._known) if self._wants(self._known[i])]
        samples = [Sample("llm_gpu_up", ident.labels(), 0.0) for ident in idents]
        for ident in idents:
            samples.extend(self._xid_samples(ident, ident.labels()))
        attrs = {"gpus": str(len(idents)), "names": ",".join(i.name for i in idents), "state": failure.state}
        return SourceData(tuple(samples), attrs)

    def _read(self, gen: _Generation, now: float) -> SourceData:
        pids, want_engine = self._engine_pids()
        samples: list[Sample] = []
        unopened = [i for i in gen.unopened if self._wants(i)]
        lost: list[GpuIdentity] = list(unopened)
        for dev in gen.devices:
            if not self._wants(dev.ident):
                continue
            if not dev.lost:
                try:
                    samples.extend(self._reader.read(dev, now, pids, want_engine))
                    self._once.forget_key(("lost", dev.ident.uuid))
                except GpuLost as exc:
                    dev.lost = True
                    self._once.log(logging.WARNING, ("lost", dev.ident.uuid),
                                   "GPU %s (%s) lost: %s; NVML will be re-initialised",
                                   dev.ident.index, dev.ident.uuid, exc)
            if dev.lost:
                lost.append(dev.ident)
                samples.append(Sample("llm_gpu_up", dev.labels, 0.0))
            samples.extend(self._xid_samples(dev.ident, dev.labels))
        for ident in unopened:
            samples.append(Sample("llm_gpu_up", ident.labels(), 0.0))
            samples.extend(self._xid_samples(ident, ident.labels()))
        if lost and not gen.needs_reinit:
            gen.needs_reinit = True
            self._schedule_retry(now)
        elif not lost:
            self._retry_delay = self._options.retry_interval_s
        return SourceData(tuple(samples), self._attrs(gen, lost))

    def _engine_pids(self) -> tuple[frozenset[int] | None, bool]:
        """(pids or None for all processes, whether to export engine memory this cycle)."""
        get = self._options.engine_pids
        if get is None:
            return None, True
        try:
            pids = frozenset(int(p) for p in get())
        except Exception as exc:  # noqa: BLE001 - the host side's problem; omit the one series
            self._once.log(logging.WARNING, ("engine_pids",), "engine PIDs unavailable: %r", exc)
            return frozenset(), False
        return pids, bool(pids)

    def _xid_samples(self, ident: GpuIdentity, labels: Labels) -> list[Sample]:
        counts = self._xids.of(ident.uuid) if ident.uuid else {}
        if not counts:  # the usual case: no XID since the exporter started
            return []
        return [Sample("llm_gpu_xid_errors_total", make_labels(labels + (("xid", code),)), float(n))
                for code, n in sorted(counts.items())]

    def _attrs(self, gen: _Generation, lost: list[GpuIdentity]) -> dict[str, str]:
        gpus, names, uuids, pci_bus_ids, mig = self._identity_attrs(gen)
        return {
            "gpus": gpus,
            "names": names,
            "uuids": uuids,
            "pci_bus_ids": pci_bus_ids,
            "state": "gpu_lost" if lost else "ok",
            "lost": ",".join(str(i.index) for i in sorted(lost, key=lambda i: i.index)),
            "driver_version": gen.driver_version,
            "cuda_version": gen.cuda_version,
            "mig": mig,
            # GPM may fall away
            "gpm": ",".join("1" if d.gpm is not None else "0" for d in gen.devices if self._wants(d.ident)),
        }

    def _identity_attrs(self, gen: _Generation) -> IdentityAttrs:
        """gpus, names, uuids, pci_bus_ids and mig attrs of the watched GPUs: fixed for a generation
        and a selection, so joined once."""
        if gen.identity_attrs is None:
            devices = [d for d in gen.devices if self._wants(d.ident)]
            idents = sorted([d.ident for d in devices] + [i for i in gen.unopened if self._wants(i)],
                            key=lambda i: i.index)
            gen.identity_attrs = IdentityAttrs(str(len(idents)), ",".join(i.name for i in idents),
                                  ",".join(i.uuid for i in idents), ",".join(i.pci_bus_id for i in idents),
                                  ",".join(d.mig_mode for d in devices))
        return gen.identity_attrs

    def _schedule_retry(self, now: float) -> None:
        self._retry_at = now + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, self._options.retry_max_s)

    # -- NVML generations -------------------------------------------------------------------

    def _load_module(self) -> Any:
        if self._options.pynvml_module is not None:
            return self._options.pynvml_module
        try:
            return importlib.import_module("pynvml")
        except ImportError as exc:
            raise _InitFailure("nvml_missing", f"nvidia-ml-py is not installed: {exc}") from exc

    def _open_generation(self) -> _Generation:
        nvml = self._load_module()
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise _init_failure(nvml, exc) from exc
        try:
            gen = self._enumerate(nvml)
        except BaseException:
            _shutdown_quietly(nvml)
            raise
        self.inits += 1
        self._start_xid(gen)
        return gen

    def _enumerate(self, nvml: Any) -> _Generation:
        try:
            count = int(nvml.nvmlDeviceGetCount())
            driver = _text(nvml, "nvmlSystemGetDriverVersion")
            cuda = _cuda_version(nvml)
        except Exception as exc:
            raise _init_failure(nvml, exc) from exc
        if count == 0:
            raise _InitFailure("no_gpus", "NVML reports no GPU")
        self._reader.bind(nvml)
        gen = _Generation(nvml=nvml, devices=[], unopened=[], driver_version=driver, cuda_version=cuda)
        for index in range(count):
            try:
                dev = self._reader.open_device(index, driver, cuda)
            except GpuLost as exc:
                ident = self._known.get(index, GpuIdentity(index, "", ""))
                LOG.warning("GPU %s could not be opened: %s", index, exc)
                gen.unopened.append(ident)
                continue
            self._known[index] = dev.ident
            gen.devices.append(dev)
        return gen

    def _start_xid(self, gen: _Generation) -> None:
        if not self._options.xid_events or not gen.devices:
            return
        watcher = XidWatcher(gen.nvml, {d.ident.uuid: d.handle for d in gen.devices}, self._xids.add,
                             self._once, self._options.xid_wait_ms)
        if watcher.start():
            gen.xid = watcher

    def _close_generation(self) -> None:
        gen, self._gen = self._gen, None
        if gen is None:
            return
        if gen.xid is not None and not gen.xid.stop():
            # The thread may still be inside nvmlEventSetWait: shutting NVML down under it is
            # unsafe, so leave this generation's library state alone.
            return
        for dev in gen.devices:
            if dev.gpm is not None:
                dev.gpm.close()
                dev.gpm = None
        _shutdown_quietly(gen.nvml)

    def _close_sync(self) -> None:
        if not self._lock.acquire(timeout=10.0):
            LOG.warning("NVML collection still running at close; NVML left initialised")
            return
        try:
            self._close_generation()
        finally:
            self._lock.release()


def _init_failure(nvml: Any, exc: BaseException) -> _InitFailure:
    """Sort an error from nvmlInit or enumeration into a bounded state code."""
    if classify(nvml, exc) is None:
        return _InitFailure("nvml_init", f"NVML initialisation failed: {exc!r}")
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    code = error_code(exc)
    if (mismatch is not None and isinstance(exc, mismatch)) or code == LIB_RM_VERSION_MISMATCH:
        state = "nvml_mismatch"
    else:
        state = {LIBRARY_NOT_FOUND: "nvml_missing", DRIVER_NOT_LOADED: "driver_not_loaded",
                 NO_PERMISSION: "nvml_permission"}.get(code, "nvml_init")
    return _InitFailure(state, f"NVML unavailable: {describe(exc)}")


def _shutdown_quietly(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - teardown of a library that may be half gone
        LOG.debug("nvmlShutdown failed: %r", exc)


def _text(nvml: Any, fname: str) -> str:
    value = getattr(nvml, fname)()
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(nvml: Any) -> str:
    """12040 -> "12.4"; empty when the driver does not say."""
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion())
    except Exception as exc:
        if classify(nvml, exc) is None:
            raise
        return ""
    return f"{version // 1000}.{version % 1000 // 10}"
