"""Bounded state for rates and sliding windows: the only memory the derivations keep.

Counters are made reset-safe the way Prometheus' rate() does it: a value lower than the last one
means the counter restarted from zero, so the last value is added to an offset and the adjusted
series never decreases. A restart therefore never yields a negative rate, and the rate over the
gap is at most what was really counted (no spike).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from itertools import islice
from operator import add
from typing import NamedTuple


def _elementwise(op: Callable[[float, float], float], a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    """op(a[i], b[i]) for every i, in one C-level pass; unequal lengths raise as zip(strict=True)."""
    if len(a) != len(b):
        return tuple(op(x, y) for x, y in zip(a, b, strict=True))  # raises the same ValueError
    return tuple(map(op, a, b))


class ResetSafe:
    """Per-key offset so that a counter restart (value drops) never makes the series decrease."""

    __slots__ = ("_last", "_offset")

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._offset: dict[str, float] = {}

    def adjust(self, values: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, raw in values.items():
            last = self._last.get(key)
            if last is not None and raw < last:
                self._offset[key] = self._offset.get(key, 0.0) + last
            self._last[key] = raw
            out[key] = raw + self._offset.get(key, 0.0)
        return out


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

    def mean(self, key: str) -> float | None:
        """Mean of gauge `key` over the points inside the window (the baseline point excluded
        when others exist, so the mean covers the same span as the rates)."""
        points = islice(self._points, 1 if len(self._points) > 1 else 0, None)  # no copy of the deque
        vals = [p.gauges[key] for p in points if key in p.gauges]
        return sum(vals) / len(vals) if vals else None


class HistogramWindow:
    """Cumulative bucket counts kept as coarse checkpoints (one per `window_s / checkpoints`
    seconds), so a 5-minute window costs ~30 checkpoints however short the interval."""

    __slots__ = ("window_s", "step_s", "_bounds", "_checkpoints", "_last", "_offset", "last_seen")

    def __init__(self, window_s: float, checkpoints: int = 30) -> None:
        self.window_s = window_s
        self.step_s = window_s / checkpoints
        self._bounds: tuple[float, ...] = ()
        self._checkpoints: deque[tuple[float, tuple[float, ...]]] = deque(maxlen=checkpoints + 2)
        self._last: tuple[float, ...] = ()
        self._offset: tuple[float, ...] = ()
        self.last_seen = float("-inf")

    def _offset_for(self, counts: tuple[float, ...]) -> tuple[float, ...]:
        """What to add to `counts` to undo the resets seen so far."""
        # All buckets of a histogram restart together; a drop of the total (last bucket) is a reset.
        if not self._offset or len(self._offset) != len(counts):
            self._offset = (0.0,) * len(counts)
        elif self._last and counts[-1] < self._last[-1]:
            self._offset = _elementwise(add, self._offset, self._last)
        self._last = counts
        return self._offset

    def __len__(self) -> int:
        return len(self._checkpoints)

    def observe(self, ts: float, bounds: tuple[float, ...], counts: tuple[float, ...]) -> tuple[float, ...] | None:
        """Record the current cumulative counts; return the bucket deltas over the window
        (cumulative, aligned with `bounds`), or None when there is no earlier checkpoint yet."""
        if bounds != self._bounds:
            # New bucket layout (engine upgraded or replaced): old checkpoints do not compare.
            self._bounds = bounds
            self._checkpoints.clear()
            self._last, self._offset = (), ()
        offset = self._offset_for(counts)
        self.last_seen = ts
        if not self._checkpoints or ts - self._checkpoints[-1][0] >= self.step_s:
            self._checkpoints.append((ts, _elementwise(add, counts, offset)))
        # The newest checkpoint at or before the window start is the baseline; older ones go.
        while len(self._checkpoints) > 1 and self._checkpoints[1][0] <= ts - self.window_s:
            self._checkpoints.popleft()
        base_ts, base = self._checkpoints[0]
        if base_ts >= ts:
            return None
        # max(0.0, adjusted - base) per bucket in one pass: the adjusted counts (counts + offset)
        # are only kept when they make a checkpoint, and builtin max() would cost a call each.
        return tuple([d if (d := c + o - b) > 0.0 else 0.0 for c, o, b in zip(counts, offset, base, strict=True)])


class Scopes:
    """A dict of windows by scope (target, GPU) that forgets scopes not seen for a while,
    so targets that disappear do not leak memory."""

    def __init__(self, factory, forget_after_s: float) -> None:
        self._factory = factory
        self._forget_after_s = forget_after_s
        self._items: dict[str, object] = {}

    def get(self, scope: str):
        item = self._items.get(scope)
        if item is None:
            item = self._items[scope] = self._factory()
        return item

    def sweep(self, now: float) -> None:
        stale = [k for k, v in self._items.items() if getattr(v, "last_seen", now) < now - self._forget_after_s]
        for key in stale:
            del self._items[key]

    def __len__(self) -> int:
        return len(self._items)
