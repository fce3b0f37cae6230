"""Rates and reset-safe totals from NVML's cumulative counters.

Rates come from two readings of a counter taken in consecutive cycles, so no cycle has to sleep
(nvmlDeviceGetPcieThroughput samples for 20 ms inside the call; this never does).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

from exporter.counters import SeriesResets


class Reading(NamedTuple):
    value: float
    t: float  # seconds


class CounterRates:
    """Per-key rate of change of a cumulative counter between the last two readings."""

    def __init__(self) -> None:
        self._last: dict[Hashable, Reading] = {}

    def update(self, key: Hashable, value: float, t: float, wrap: float | None = None) -> float | None:
        """Record `value` read at time `t` (seconds) and return the rate since the previous reading.

        None on the first reading, when no time passed, and when the counter went down: with `wrap`
        (a 32-bit counter) a drop is taken as one wrap-around; without it, as a reset (driver
        reload), after which the next reading gives a rate again."""
        last = self._last.get(key)
        if last is not None and t <= last.t:
            # Same or older timestamp: NVML served a cached value. Keep the older point so the
            # next rate spans the full interval.
            return None
        self._last[key] = Reading(value, t)
        if last is None:
            return None
        delta = value - last.value
        if delta < 0:
            if wrap is None:
                return None
            delta += wrap
        return delta / (t - last.t)

    def forget(self, key: Hashable) -> None:
        self._last.pop(key, None)


RESET_TOLERANCE = 1e-3
"""A drop smaller than this share of the last reading is not a reset: the energy counter can be
read by its field or by its own call (one may take over from the other), and two readers of one
counter can differ by a few mJ. Read as a reset, that would add the GPU's whole lifetime again."""


class ResetSafeTotals:
    """Keeps a counter monotonic across resets of its source (the energy counter restarts at 0
    when the driver reloads) with the one reset rule of exporter.counters; a drop within
    RESET_TOLERANCE is read-out jitter and holds the total where it was."""

    def __init__(self) -> None:
        self._resets: dict[Hashable, SeriesResets] = {}
        self._last: dict[Hashable, float] = {}

    def update(self, key: Hashable, raw: float) -> float:
        last = self._last.get(key)
        if last is not None and last * (1.0 - RESET_TOLERANCE) <= raw < last:
            raw = last
        self._last[key] = raw
        resets = self._resets.get(key)
        if resets is None:
            resets = self._resets[key] = SeriesResets(1)
        return raw + resets.update(((key, (raw,)),))[0]
