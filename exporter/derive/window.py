"""Bounded state for rates and sliding windows: the only memory the derivations keep.

Counters are made reset-safe the way Prometheus' rate() does it: a value lower than the last one
means the counter restarted from zero, so the last value is added to an offset and the adjusted
series never decreases. A restart therefore never yields a negative rate, and the rate over the
gap is at most what was really counted (no spike).

Resets are told per series, before series are summed: with data-parallel ranks each rank's
counter is its own series (view.EngineView.series), so one rank restarting adds what that rank
had counted, not the whole sum of the ranks. A series that vanishes keeps what it had counted in
the sum; one that comes back continues from its last value, or from zero when it came back lower
(a restart); one never seen before starts at its first value, as a new series does in rate().
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Hashable, Mapping
from itertools import islice
from operator import add, lt, neg
from typing import NamedTuple

_MAX_GONE = 256  # vanished series remembered (for a comeback) per window


def _elementwise(op: Callable[[float, float], float], a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    """op(a[i], b[i]) for every i, in one C-level pass; unequal lengths raise as zip(strict=True)."""
    if len(a) != len(b):
        return tuple(op(x, y) for x, y in zip(a, b, strict=True))  # raises the same ValueError
    return tuple(map(op, a, b))


def _remember(gone: dict, key: Hashable, last) -> None:
    gone.pop(key, None)
    while len(gone) >= _MAX_GONE:
        del gone[next(iter(gone))]
    gone[key] = last


class SeriesResets:
    """Offsets for the series one sum adds up (the data-parallel ranks of one counter, or of one
    histogram's bucket counts; all a series' values restart together), so that neither a series
    nor the sum ever decreases. A series that drops restarted: its last values join its offset. One
    that vanishes keeps what it had counted in the sum. One that comes back continues from where it
    left off, or from zero when it came back lower. One never seen before starts at its first values
    (its baseline), except in the first update, whose values are every series' baseline anyway."""

    __slots__ = ("_state", "_frozen", "_gone", "_started", "offset")

    def __init__(self, width: int, *, started: bool = False) -> None:
        zeros = (0.0,) * width
        # key -> (last values, offset): a plain tuple, made per series per cycle (a NamedTuple's
        # constructor is a Python call)
        self._state: dict[Hashable, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        self._frozen = zeros  # what vanished series had counted
        self._gone: dict[Hashable, tuple[float, ...]] = {}  # vanished series -> last values
        self._started = started
        self.offset = zeros  # what to add to the sum of the series' values

    def update(self, series: Collection[tuple[Hashable, tuple[float, ...]]]) -> tuple[float, ...]:
        """Take the current values of every present series; return the offset for their sum."""
        state, zeros = self._state, (0.0,) * len(self.offset)
        changed = False
        present = 0
        for key, own in series:
            present += 1
            known = state.get(key)
            if known is None:
                prev = self._gone.pop(key, None)
                if prev is None:
                    offset = tuple(map(neg, own)) if self._started else zeros
                elif any(map(lt, own, prev)):
                    offset = zeros  # came back restarted
                else:
                    offset = tuple(map(neg, prev))  # came back where it left off
                changed = True
            else:
                last, offset = known
                if own is not last and any(map(lt, own, last)):
                    offset = _elementwise(add, offset, last)
                    changed = True
            state[key] = (own, offset)
        self._started = True
        if len(state) > present:
            keys = {key for key, _ in series}
            self._vanish([k for k in state if k not in keys])
            changed = True
        if changed:
            total = self._frozen
            for _, offset in state.values():
                total = _elementwise(add, total, offset)
            self.offset = total
        return self.offset

    def _vanish(self, keys: list[Hashable]) -> None:
        for key in keys:
            last, offset = self._state.pop(key)
            self._frozen = _elementwise(add, self._frozen, _elementwise(add, last, offset))
            _remember(self._gone, key, last)

    def __bool__(self) -> bool:
        return bool(self._state)


class ResetSafe:
    """Reset-safe counters by name: `adjust` takes the raw values by series key, a name (one series)
    or (name, series id) for one of a name's series (a data-parallel rank), and returns the adjusted
    values summed per name (SeriesResets per name)."""

    __slots__ = ("_names", "_started")

    def __init__(self) -> None:
        self._names: dict[str, SeriesResets] = {}
        self._started = False

    def adjust(self, values: Mapping[Hashable, float]) -> dict[str, float]:
        grouped: dict[str, list[tuple[Hashable, tuple[float, ...]]]] = {}
        raw_sums: dict[str, float] = {}
        for key, raw in values.items():
            name = key if key.__class__ is str else key[0]
            grouped.setdefault(name, []).append((key, (raw,)))
            raw_sums[name] = raw_sums.get(name, 0.0) + raw
        out: dict[str, float] = {}
        for name, series in grouped.items():
            resets = self._names.get(name)
            if resets is None:
                resets = self._names[name] = SeriesResets(1, started=self._started)
            out[name] = raw_sums[name] + resets.update(series)[0]
        for name, resets in self._names.items():
            if name not in grouped and resets:
                resets.update(())  # all its series vanished: kept for when the name comes back
        self._started = True
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


class Checkpoint(NamedTuple):
    ts: float
    counts: tuple[float, ...]  # cumulative, reset-adjusted


class HistogramWindow:
    """Cumulative bucket counts kept as coarse checkpoints (one per `window_s / checkpoints`
    seconds), so a 5-minute window costs ~30 checkpoints however short the interval."""

    __slots__ = ("window_s", "step_s", "_bounds", "_checkpoints", "_resets", "last_seen")

    def __init__(self, window_s: float, checkpoints: int = 30) -> None:
        self.window_s = window_s
        self.step_s = window_s / checkpoints
        self._bounds: tuple[float, ...] = ()
        self._checkpoints: deque[Checkpoint] = deque(maxlen=checkpoints + 2)
        self._resets: SeriesResets | None = None
        self.last_seen = float("-inf")

    def _offset_for(self, counts: tuple[float, ...], series) -> tuple[float, ...]:
        """What to add to `counts` (the sum of `series`) to undo the resets seen so far."""
        if self._resets is None or len(self._resets.offset) != len(counts):
            self._resets = SeriesResets(len(counts))
        return self._resets.update(series)

    def __len__(self) -> int:
        return len(self._checkpoints)

    def observe(self, ts: float, bounds: tuple[float, ...], counts: tuple[float, ...],
                series: tuple[tuple[str, tuple[float, ...]], ...] | None = None) -> tuple[float, ...] | None:
        """Record the current cumulative counts; return the bucket deltas over the window
        (cumulative, aligned with `bounds`), or None when there is no earlier checkpoint yet.
        `series`: the per-series counts that `counts` sums (view.Histogram.series), so that a
        reset is handled per series; without it `counts` is one series."""
        if bounds != self._bounds:
            # New bucket layout (engine upgraded or replaced): old checkpoints do not compare.
            self._bounds = bounds
            self._checkpoints.clear()
            self._resets = None
        offset = self._offset_for(counts, series if series is not None else (("", counts),))
        self.last_seen = ts
        if not self._checkpoints or ts - self._checkpoints[-1].ts >= self.step_s:
            self._checkpoints.append(Checkpoint(ts, _elementwise(add, counts, offset)))
        # The newest checkpoint at or before the window start is the baseline; older ones go.
        while len(self._checkpoints) > 1 and self._checkpoints[1].ts <= ts - self.window_s:
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
