"""The two clocks of a collection cycle: the wall clock people read, and a steady one for rates.

Every window and rate the exporter derives is keyed by the steady clock (time.monotonic, anchored
to the wall clock at start so that it reads like Unix time). Keyed by the wall clock, a window
froze after the clock stepped back (a snapshot older than the last one adds nothing: 100 tok/s
shown for an hour after a -3600 s step, 1000 true) and read too high after a step forward. The
wall clock still stamps what a person or Prometheus reads (`taken_at`, last-success timestamps,
a GPU fault's time), so a step is detected here, logged once and counted: NTP stepping a clock
that was far off, an operator's `date -s`, a VM resumed from a snapshot."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

log = logging.getLogger("llm_exporter.clock")

# NTP slews small errors (at most 0.5 ms/s) and steps only large ones (ntpd: over 128 ms; chrony's
# makestep: over 1 s). A cycle-to-cycle change of the wall clock's offset from the steady clock
# above this is a step; slewing never gets near it, nor does a late cycle (both clocks move).
CLOCK_STEP_TOLERANCE_S = 1.0
# A clock that keeps stepping (a broken RTC, a fight between two time daemons) is one line a minute.
CLOCK_LOG_INTERVAL_S = 60.0


class Reading(NamedTuple):
    wall: float  # Unix seconds, as the system clock says now
    steady: float  # monotonic seconds on the Unix scale of the exporter's start: windows and rates


class Clocks:
    """Reads both clocks once per cycle and notices when the wall clock steps."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] | None = time.monotonic) -> None:
        self._wall = wall
        # No monotonic clock (a test's or tool's hand-driven clock): the steady clock is the wall one.
        self._monotonic = monotonic
        self._anchor = wall() - monotonic() if monotonic is not None else 0.0
        self.offset_s = 0.0  # wall minus steady: how far the wall clock has stepped since start
        self.steps = 0
        self._last_log = float("-inf")
        self._unlogged = 0

    def read(self) -> Reading:
        wall = self._wall()
        if self._monotonic is None:
            return Reading(wall, wall)
        steady = self._monotonic() + self._anchor
        offset = wall - steady
        step, self.offset_s = offset - self.offset_s, offset
        if abs(step) > CLOCK_STEP_TOLERANCE_S:
            self.steps += 1
            self._log(step, steady)
        return Reading(wall, steady)

    def _log(self, step: float, steady: float) -> None:
        if steady - self._last_log < CLOCK_LOG_INTERVAL_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more steps in the last minute not logged)" if self._unlogged else ""
        self._last_log, self._unlogged = steady, 0
        log.warning("the wall clock stepped %s by %.1f s%s: rates and windows keep the monotonic clock; "
                    "timestamps follow the wall clock (llm_exporter_clock_steps_total)",
                    "back" if step < 0 else "forward", abs(step), more)
