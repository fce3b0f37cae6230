"""How NVML failures are sorted: omit one field, skip one cycle, or treat the GPU as lost.

pynvml raises one NVMLError subclass per return code (`e.value` holds the code), plus
NVMLLibraryMismatchError, which is a plain Exception: `except NVMLError` misses it. Errors are
sorted by code rather than by class so the same table works for the real module and test fakes.
NVMLError instances are unhashable (`__eq__` without `__hash__`), so nothing here keys on them.
"""

from __future__ import annotations

import enum
import logging
from types import ModuleType

LOG = logging.getLogger("exporter.sources.gpu")

NOT_SUPPORTED = 3
NO_PERMISSION = 4
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
LIB_RM_VERSION_MISMATCH = 18


class Kind(enum.Enum):
    ABSENT = "absent"  # the GPU or driver cannot give this field: omit it until NVML is re-initialised
    TRANSIENT = "transient"  # no value this cycle; ask again next cycle
    LOST = "lost"  # the GPU (or NVML itself) is gone: mark the GPU down and re-initialise later


# NotSupported, NoPermission, InvalidArgument, FunctionNotFound, ArgumentVersionMismatch, Deprecated,
# VgpuEccNotSupported, FreqNotSupported: asking again will not help.
_ABSENT_CODES = frozenset({2, 3, 4, 13, 22, 24, 25, 26})
# Uninitialized, DriverNotLoaded, GpuIsLost, ResetRequired, LibRmVersionMismatch, GpuNotFound, Unknown:
# gpustat and nvidia_gpu_exporter treat these as the device (or library) being gone.
_LOST_CODES = frozenset({1, 9, 15, 16, 18, 28, 999})


def classify_code(code: int) -> Kind:
    if code in _ABSENT_CODES:
        return Kind.ABSENT
    if code in _LOST_CODES:
        return Kind.LOST
    return Kind.TRANSIENT


def classify(nvml: ModuleType, exc: BaseException) -> Kind | None:
    """Kind of an exception raised by an NVML call, or None when it is not an NVML failure."""
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    if mismatch is not None and isinstance(exc, mismatch):
        # Raised when a versioned symbol is missing from the installed driver: that field is absent.
        return Kind.ABSENT
    if isinstance(exc, nvml.NVMLError):
        return classify_code(error_code(exc))
    return None


def error_code(exc: BaseException) -> int:
    code = getattr(exc, "value", None)
    return code if isinstance(code, int) else -1


def describe(exc: BaseException) -> str:
    """A short, safe description (str() of a real NVMLError calls into the library)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - str() may call nvmlErrorString on a dead library
        text = ""
    return f"{type(exc).__name__}({error_code(exc)}){': ' + text if text else ''}"


class OnceLog:
    """Logs each key once: a field a GPU cannot give is listed once, not on every cycle."""

    def __init__(self, logger: logging.Logger = LOG) -> None:
        self._logger = logger
        self._seen: set[tuple[str, ...]] = set()

    def log(self, level: int, key: tuple[str, ...], message: str, *args: object) -> bool:
        if key in self._seen:
            return False
        self._seen.add(key)
        self._logger.log(level, message, *args)
        return True

    def forget_key(self, key: tuple[str, ...]) -> None:
        """Let `key` log again: the state it reported ended and may come back."""
        self._seen.discard(key)
