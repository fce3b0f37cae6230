"""Bounded state for rates and sliding windows: the only memory the derivations keep.

Counters go through exporter.counters (reset-safe per series, as Prometheus' rate() reads them)
before they enter a window, so a restart never yields a negative rate or a spike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import islice
from operator import add
from typing import NamedTuple

from exporter.counters import ResetSafe, SeriesResets, elementwise


class Point(NamedTuple):
    ts: float
    counters: Mapping[str, float]  # reset-adjusted
    gauges: Mapping[str, float]


class RateWindow:
    """Rates of counters and means of gauges over the last `window_s` seconds of one scope.

    Holds at most `max_points` points, so memory does not grow with a short interval."""

    __slots__ = ("window_s", "_points", "_reset", "last_seen")

    def __init__(self, window_s: float, max_points: int = 64) -> None:
        self.window_s = window_s
        self._points: deque[Point] = deque(maxlen=max_points)
        self._reset = ResetSafe()
        self.last_seen = float("-inf")

    def observe(self, ts: float, counters: Mapping[str, float], gauges: Mapping[str, float]) -> None:
        if self._points and ts <= self._points[-1].ts:
            return  # a repeated or out-of-order snapshot adds nothing
        self._points.append(Point(ts, self._reset.adjust(counters), dict(gauges)))
        self.last_seen = ts
        # Keep one point at or before the window start as the baseline for the rate.
        while len(self._points) > 2 and self._points[1].ts <= ts - self.window_s:
            self._points.popleft()

    def increase(self, key: str) -> tuple[float, float] | None:
        """(increase, seconds) of counter `key` over the window, or None with fewer than 2 points."""
        if not self._points or key not in self._points[-1].counters:
            return None
        last = self._points[-1]
        for first in self._points:  # the baseline: the oldest point that has the counter
            if key in first.counters:
                break
        if first is last or last.ts <= first.ts:
            return None
        return last.counters[key] - first.counters[key], last.ts - first.ts

    def rate(self, key: str) -> float | None:
        inc = self.increase(key)
        return None if inc is None else inc[0] / inc[1]

    def max(self, key: str) -> float | None:
        """Largest value of gauge `key` over the points inside the window (as mean())."""
        points = islice(self._points, 1 if len(self._points) > 1 else 0, None)
        vals = [p.gauges[key] for p in points if key in p.gauges]
        return max(vals) if vals else None

    def mean(self, key: str) -> float | None:
        """Mean of gauge `key` over the points inside the window (the baseline point excluded
        when others exist, so the mean covers the same span as the rates)."""
        points = islice(self._points, 1 if len(self._points) > 1 else 0, None)  # no copy of the deque
        vals = [p.gauges[key] for p in points if key in p.gauges]
        return sum(vals) / len(vals) if vals else None


class Checkpoint(NamedTuple):
    ts: float
    counts: tuple[float, ...]  # cumulative, reset-adjusted


class HistogramWindow:
    """Cumulative bucket counts kept as coarse checkpoints (one per `window_s / checkpoints`
    seconds), so a 5-minute window costs ~30 checkpoints however short the interval.

    Across a restart of one of its series (an engine or a data-parallel rank restarting: its counts
    fall) the window keeps what was counted before, as PromQL's increase() does: `observe` returns
    that delta, and the quantiles and the SLO attainment follow it (one window, as the rules read it).
    `fresh` is the part of it counted since the latest restart inside the window (the whole delta
    when there was none), for the diagnosis to say how much of the window the running process saw."""

    __slots__ = ("window_s", "step_s", "_bounds", "_checkpoints", "_resets", "last_seen", "_previous",
                 "_restarts_seen", "_restart", "fresh", "restarted_at")

    def __init__(self, window_s: float, checkpoints: int = 30) -> None:
        self.window_s = window_s
        self.step_s = window_s / checkpoints
        self._bounds: tuple[float, ...] = ()
        self._checkpoints: deque[Checkpoint] = deque(maxlen=checkpoints + 2)
        self._resets: SeriesResets | None = None
        self.last_seen = float("-inf")
        self._previous: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (counts, offset) last cycle
        self._restarts_seen = 0
        self._restart: Checkpoint | None = None  # when the latest restart was seen, and the counts before it
        self.fresh: tuple[float, ...] | None = None  # the last delta's part since that restart
        self.restarted_at: float | None = None  # that restart's time while it is inside the window

    def _offset_for(self, counts: tuple[float, ...], series) -> tuple[float, ...]:
        """What to add to `counts` (the sum of `series`) to undo the resets seen so far."""
        if self._resets is None or len(self._resets.offset) != len(counts):
            self._resets = SeriesResets(len(counts))
            self._restarts_seen, self._previous, self._restart = 0, None, None
        return self._resets.update(series)

    def __len__(self) -> int:
        return len(self._checkpoints)

    def observe(self, ts: float, bounds: tuple[float, ...], counts: tuple[float, ...],
                series: tuple[tuple[str, tuple[float, ...]], ...] | None = None) -> tuple[float, ...] | None:
        """Record the current cumulative counts; return the bucket deltas over the window
        (cumulative, aligned with `bounds`), or None when there is no earlier checkpoint yet.
        `series`: the per-series counts that `counts` sums (view.Histogram.series), so that a
        reset is handled per series; without it `counts` is one series. Sets `fresh` and
        `restarted_at` (None with the delta)."""
        self.fresh = self.restarted_at = None
        if bounds != self._bounds:
            # New bucket layout (engine upgraded or replaced): old checkpoints do not compare.
            self._bounds = bounds
            self._checkpoints.clear()
            self._resets = None
        offset = self._offset_for(counts, series if series is not None else (("", counts),))
        resets = self._resets
        assert resets is not None
        if resets.restarts != self._restarts_seen:
            # Restarted since the last cycle: what the window had counted then is the old process's.
            self._restarts_seen = resets.restarts
            if self._previous is not None:
                self._restart = Checkpoint(ts, elementwise(add, *self._previous))
        self._previous = (counts, offset)
        self.last_seen = ts
        if not self._checkpoints or ts - self._checkpoints[-1].ts >= self.step_s:
            self._checkpoints.append(Checkpoint(ts, elementwise(add, counts, offset)))
        # The newest checkpoint at or before the window start is the baseline; older ones go.
        while len(self._checkpoints) > 1 and self._checkpoints[1].ts <= ts - self.window_s:
            self._checkpoints.popleft()
        base_ts, base = self._checkpoints[0]
        if base_ts >= ts:
            return None
        # max(0.0, adjusted - base) per bucket in one pass: the adjusted counts (counts + offset)
        # are only kept when they make a checkpoint, and builtin max() would cost a call each.
        delta = tuple([d if (d := c + o - b) > 0.0 else 0.0 for c, o, b in zip(counts, offset, base, strict=True)])
        restart = self._restart
        if restart is not None and restart.ts > base_ts:
            self.restarted_at = restart.ts
            self.fresh = tuple([d if (d := c + o - b) > 0.0 else 0.0
                                for c, o, b in zip(counts, offset, restart.counts, strict=True)])
        else:
            self._restart = None  # out of the window: the whole delta is the running process's
            self.fresh = delta
        return delta


class Scopes:
    """A dict of windows by scope (target, GPU) that forgets scopes not seen for a while,
    so targets that disappear do not leak memory."""

    def __init__(self, factory, forget_after_s: float, max_items: int | None = None) -> None:
        self._factory = factory
        self._forget_after_s = forget_after_s
        self._max_items = max_items  # for scopes the outside world names (network links) and renames
        self._items: dict[str, object] = {}

    def get(self, scope: str):
        item = self._items.get(scope)
        if item is None:
            if self._max_items is not None and len(self._items) >= self._max_items:
                # The least recently seen goes: names that churn cost max_items windows, not one each.
                items = self._items
                del items[min(items, key=lambda k: getattr(items[k], "last_seen", float("-inf")))]
            item = self._items[scope] = self._factory()
        return item

    def sweep(self, now: float) -> None:
        stale = [k for k, v in self._items.items() if getattr(v, "last_seen", now) < now - self._forget_after_s]
        for key in stale:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)
