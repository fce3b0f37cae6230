"""Reset-safe counters: the one rule every cumulative counter the exporter reads goes through.

A value lower than the last one means the counter restarted from zero, the way Prometheus' rate()
reads it: the last value is added to an offset, so the adjusted series never decreases, a restart
never yields a negative rate, and the rate over the gap is at most what was really counted.

Resets are told per series, before series are summed: with data-parallel ranks each rank's
counter is its own series, so one rank restarting adds what that rank had counted, not the whole
sum of the ranks. A series that vanishes keeps what it had counted in the sum; one that comes back
continues from its last value, or from zero when it came back lower (a restart); one never seen
before starts at its first value, as a new series does in rate().
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from operator import add, lt, neg
from typing import TypeVar

_MAX_GONE = 256  # vanished series remembered (for a comeback) per window


def elementwise(op: Callable[[float, float], float], a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
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

    __slots__ = ("_state", "_frozen", "_gone", "_started", "offset", "restarts")

    def __init__(self, width: int, *, started: bool = False) -> None:
        zeros = (0.0,) * width
        # key -> (last values, offset): a plain tuple, made per series per cycle (a NamedTuple's
        # constructor is a Python call)
        self._state: dict[Hashable, tuple[tuple[float, ...], tuple[float, ...]]] = {}
        self._frozen = zeros  # what vanished series had counted
        self._gone: dict[Hashable, tuple[float, ...]] = {}  # vanished series -> last values
        self._started = started
        self.offset = zeros  # what to add to the sum of the series' values
        self.restarts = 0  # series seen restarting (values fell, or came back lower) so far

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
                    self.restarts += 1
                else:
                    offset = tuple(map(neg, prev))  # came back where it left off
                changed = True
            else:
                last, offset = known
                if own is not last and any(map(lt, own, last)):
                    offset = elementwise(add, offset, last)
                    changed = True
                    self.restarts += 1
            state[key] = (own, offset)
        self._started = True
        if len(state) > present:
            keys = {key for key, _ in series}
            self._vanish([k for k in state if k not in keys])
            changed = True
        if changed:
            total = self._frozen
            for _, offset in state.values():
                total = elementwise(add, total, offset)
            self.offset = total
        return self.offset

    def _vanish(self, keys: list[Hashable]) -> None:
        for key in keys:
            last, offset = self._state.pop(key)
            self._frozen = elementwise(add, self._frozen, elementwise(add, last, offset))
            _remember(self._gone, key, last)

    def __bool__(self) -> bool:
        return bool(self._state)


# A series key of ResetSafe.adjust: a name, or (name, series id). A TypeVar, not a union: a mapping's
# key type is invariant, and callers pass mappings keyed by one or the other.
_SeriesKey = TypeVar("_SeriesKey", str, tuple[str, str])


class ResetSafe:
    """Reset-safe counters by name: `adjust` takes the raw values by series key, a name (one series)
    or (name, series id) for one of a name's series (a data-parallel rank), and returns the adjusted
    values summed per name (SeriesResets per name)."""

    __slots__ = ("_names", "_started")

    def __init__(self) -> None:
        self._names: dict[str, SeriesResets] = {}
        self._started = False

    def adjust(self, values: Mapping[_SeriesKey, float]) -> dict[str, float]:
        grouped: dict[str, list[tuple[Hashable, tuple[float, ...]]]] = {}
        raw_sums: dict[str, float] = {}
        for key, raw in values.items():
            name = key if isinstance(key, str) else key[0]
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
