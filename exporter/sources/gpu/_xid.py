"""XID critical-error events, waited for in a daemon thread.

`nvmlEventSetWait_v2` blocks until an event arrives or its timeout passes, so it cannot sit in the
collection cycle. The thread waits with a short timeout so that `stop()` returns promptly; a
timeout is the normal idle path, not an error.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from exporter.sources.gpu._errors import TIMEOUT, OnceLog, classify, describe, error_code

XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
_ERROR_BACKOFF_S = (1.0, 30.0)


def handle_key(handle: Any) -> int:
    """An identity for a device handle that survives NVML returning a new pointer object for the
    same device in event data (real handles are ctypes pointers; fakes are plain objects)."""
    try:
        address = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return address if address is not None else id(handle)


class XidWatcher:
    """Registers every GPU for XID events and reports each one as on_event(uuid, xid)."""

    def __init__(self, nvml: Any, handles: Mapping[str, Any], on_event: Callable[[str, int], None],
                 once: OnceLog, wait_ms: int = 500) -> None:
        self._nvml = nvml
        self._handles = dict(handles)  # uuid -> handle
        self._by_key = {handle_key(h): uuid for uuid, h in self._handles.items()}
        self._on_event = on_event
        self._once = once
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self.registered: tuple[str, ...] = ()

    def start(self) -> bool:
        """Create the event set and start the thread; False when no GPU takes XID events."""
        nvml = self._nvml
        mask = getattr(nvml, "nvmlEventTypeXidCriticalError", XID_CRITICAL_ERROR)
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            if classify(nvml, exc) is None:
                raise
            self._once.log(logging.WARNING, ("xid", "create"), "XID events unavailable: %s", describe(exc))
            return False
        registered = []
        for uuid, handle in self._handles.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
                registered.append(uuid)
            except Exception as exc:
                if classify(nvml, exc) is None:
                    raise
                self._once.log(logging.INFO, ("xid", "register", uuid),
                               "GPU %s: XID events not available: %s", uuid, describe(exc))
        self.registered = tuple(registered)
        if not registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        nvml = self._nvml
        backoff = _ERROR_BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except Exception as exc:
                kind = classify(nvml, exc)
                if kind is not None and error_code(exc) == TIMEOUT:
                    backoff = _ERROR_BACKOFF_S[0]
                    continue
                # A lost GPU or a dead library: wait and try again; stop() ends the loop.
                self._once.log(logging.WARNING, ("xid", "wait"), "XID event wait failed: %s",
                               describe(exc) if kind is not None else repr(exc))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _ERROR_BACKOFF_S[1])
                continue
            if int(data.eventType) & XID_CRITICAL_ERROR:
                self._on_event(self._uuid_of(data.device), int(data.eventData))

    def _uuid_of(self, handle: Any) -> str:
        uuid = self._by_key.get(handle_key(handle))
        if uuid is not None:
            return uuid
        try:
            return str(self._nvml.nvmlDeviceGetUUID(handle))
        except Exception:  # noqa: BLE001 - an XID 79 GPU may no longer answer; count it anyway
            return ""

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the thread and free the event set; False if the thread did not end in time (the
        set is then left allocated, since the thread may still be waiting in it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(self._wait_ms / 1000.0 + 1.0 if timeout_s is None else timeout_s)
            if thread.is_alive():
                self._once.log(logging.WARNING, ("xid", "stop"), "XID thread did not stop in time")
                return False
        self._free()
        return True

    def _free(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        with contextlib.suppress(Exception):
            self._nvml.nvmlEventSetFree(event_set)
