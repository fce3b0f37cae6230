"""One log line per state change, rate-limited per key and bounded in bytes.

"Log once when it starts, once when it stops" is cheap for a state that changes now and then, and
an amplifier for one that a remote party can flip every cycle: an engine whose unaccounted family
names changed on every scrape wrote a 12.6 KB warning a second (about 1 GB a day per target), and
one whose drop reason alternated wrote two lines a cycle. So each owner (an engine target) keeps a
StateLog: a change is written at once while its key wrote fewer than STATE_LOG_BURST lines in the
last STATE_LOG_INTERVAL_S (a start, a stop and a restart are all seen); otherwise it is held back and
counted, and the first cycle the window allows writes the state as it then is, saying how many
changes went unlogged. A key whose state flips every cycle writes three lines a minute, and what any
line quotes of a list of remote names is cut at MAX_QUOTED_CHARS.

A leaf module (logging and time only): any part of the exporter may use it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import MappingProxyType

__all__ = ["MAX_QUOTED_CHARS", "STATE_LOG_BURST", "STATE_LOG_INTERVAL_S", "StateLog", "quote_names"]

STATE_LOG_INTERVAL_S = 60.0
STATE_LOG_BURST = 3
"""At most this many lines per key in any STATE_LOG_INTERVAL_S: a state flipped every cycle writes
about 4,300 lines of at most a few hundred bytes a day (about 1.5 MB) instead of one or two lines a
cycle (1 GB a day at 1 s); a state that changes now and then is logged the moment it does."""
MAX_QUOTED_CHARS = 300
"""What one line quotes of a list of names from a remote page, in characters: enough to recognise an
engine release's new families, never the 12.6 KB of 64 made-up 200-character names."""
_ELLIPSIS = "..."


def quote_names(names: Iterable[str], total: int | None = None, limit: int = MAX_QUOTED_CHARS) -> str:
    """`a, b, c and 61 more`: the names that fit in `limit` characters (the first one cut short if
    it alone does not), and how many of `total` (default: as many as given) were left out."""
    shown: list[str] = []
    used = count = 0
    for name in names:
        count += 1
        cost = len(name) + (2 if shown else 0)
        if used + cost <= limit:
            shown.append(name)
            used += cost
        elif not shown:
            shown.append(name[: max(0, limit - len(_ELLIPSIS))] + _ELLIPSIS)
            used = limit
    more = (total if total is not None else count) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


class _Key:
    __slots__ = ("held", "seen", "times")

    def __init__(self, initial: Hashable, burst: int) -> None:
        self.seen = initial
        self.times: deque[float] = deque(maxlen=burst)  # when this key's last lines were written
        self.held = 0  # changes since the last line that wrote nothing


class StateLog:
    """The state-change lines of one owner, by key (a bounded set: fixed by the caller's code, such as
    one key per drop reason), and the lines held back, by the caller's `reason` (a bounded label)."""

    __slots__ = ("_clock", "_keys", "_suppressed", "burst", "interval_s")

    def __init__(self, *, interval_s: float = STATE_LOG_INTERVAL_S, burst: int = STATE_LOG_BURST,
                 clock: Callable[[], float] = time.monotonic, reasons: Iterable[str] = ()) -> None:
        """`reasons`: shown in `suppressed` from the start (0 until a line is held back)."""
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._keys: dict[str, _Key] = {}
        self._suppressed: dict[str, int] = dict.fromkeys(reasons, 0)

    def update(self, key: str, state: Hashable, reason: str, write: Callable[[str], object],
               initial: Hashable = None) -> None:
        """Tell `key`'s state now (every cycle, changed or not: a held-back change is written by the
        first update the window allows). `write(suffix)` writes the line for the current state, the
        suffix saying how many earlier changes were not logged ("" when none); it may write nothing
        for a state that needs no line. `initial`: the state before the first update."""
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(initial, self.burst)
        changed = state != entry.seen
        if changed:
            entry.seen = state
            entry.held += 1
        if not entry.held:
            return
        now = self._clock()
        times = entry.times
        if len(times) == times.maxlen and now - times[0] < self.interval_s:
            if changed:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        # The changes held back (and counted) since the last line; this one's own change is not.
        earlier = entry.held - 1 if changed else entry.held
        suffix = f" ({earlier} earlier change{'s' if earlier != 1 else ''} not logged)" if earlier else ""
        write(suffix)
        times.append(now)
        entry.held = 0

    @property
    def suppressed(self) -> Mapping[str, int]:
        """State changes held back, by reason, since the start (the log's own counter)."""
        return MappingProxyType(self._suppressed)
