"""NormalizerState: what the normalization keeps per engine target across cycles, and its bounds.

The parser's label cache, the route caches (what each engine label set becomes under each alias,
so a label set seen last cycle costs one dict lookup), the bucket-bound formats, the last detected
kind, the page's family account and replay.py's memo. Every cache is bounded by count and by
bytes, and simply cleared when full.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from exporter.snapshot import Labels
from exporter.sources.engines.accounting import MAX_MEMO_NAMES, FamilyAccount, account
from exporter.sources.engines.exposition import MAX_CACHED_CHARS, PAIR_OVERHEAD, Exposition, LabelCache
from exporter.sources.engines.histograms import format_le
from exporter.sources.engines.registry import SPECS

__all__ = ["Entry", "NormalizerState", "labels_chars"]

MAX_MAPPED_LABEL_SETS = 20_000
MAX_MAPPED_LABEL_CHARS = MAX_CACHED_CHARS
"""The route caches are cleared past this many bytes (about) of engine label sets and entries:
they keep label tuples alive after the parser's cache has let them go."""
MAX_LE_FORMATS = 4_096
MAX_CACHED_LE_LENGTH = 64
"""Bucket bounds longer than this (no float needs more than 24 characters) are formatted every
time, not cached."""
_PAIR_BYTES = PAIR_OVERHEAD
_ENTRY_BYTES = 600
"""About what an Entry adds besides its key: its out and group label tuples, parts, dict slot."""


class Entry(NamedTuple):
    """What one engine label set becomes under one route (NormalizerState's route caches)."""

    out: Labels
    group: Labels
    """The labels of its whole series (without `le`): how histogram parts are kept together."""
    model: str | None
    parts: tuple[str | None, str | None, str | None, str | None]
    """(rank, reason, le, tier): to rebuild the labels once the page's model is known."""


# A route cache's value: the Entry, _SKIP (False) for a rank copy, None where the route does not apply.
RouteEntry = Entry | Literal[False] | None


class NormalizerState:
    """Per-target memory kept across cycles: the parser's label cache, what each engine label set
    becomes under each alias (so a label set seen last cycle costs one dict lookup), and the last
    detected kind (checked first, so detection costs one or two substring scans once a target is
    known, and a page that momentarily lacks its markers keeps its kind), and replay.py's memo of
    the last page (None for the plain pass). Every cache is bounded and simply cleared when full."""

    __slots__ = ("_entries", "_entries_for", "_entry_chars", "_entry_count", "_families", "_le", "label_cache",
                 "last_kind", "memo")

    def __init__(self) -> None:
        self.label_cache = LabelCache()
        self.last_kind: str | None = None
        self._entries: list[dict[Labels, RouteEntry]] = []
        self._entries_for: tuple[str, str] | None = None
        """(kind, target) the route caches are for."""
        self._entry_count = 0
        self._entry_chars = 0
        self._le: dict[tuple[str, float], str | None] = {}
        # replay.py's Memo of the last page. Opaque here: the plain pass neither reads nor needs it,
        # and replay.py builds on this module, not the other way round.
        self.memo: object | None = None
        self._families: tuple[tuple, FamilyAccount] | None = None

    def families(self, kind: str, exposition: Exposition) -> FamilyAccount:
        """The page's family account; the last one is kept while the page's names repeat."""
        names = {sample[0] for sample in exposition.samples}
        names |= exposition.dropped_names
        declared = exposition.types.keys()
        if len(names) + len(declared) > MAX_MEMO_NAMES:
            return account(SPECS[kind], declared, names)
        key = (kind, frozenset(declared), frozenset(names))
        if self._families is None or self._families[0] != key:
            self._families = (key, account(SPECS[kind], declared, names))
        return self._families[1]

    def route_entries(self, kind: str, target: str, route_count: int) -> list[dict[Labels, RouteEntry]]:
        """One dict per route of `kind`: engine labels -> mapped entry (see Pass._entry)."""
        if (self._entries_for != (kind, target) or self._entry_count >= MAX_MAPPED_LABEL_SETS
                or self._entry_chars >= MAX_MAPPED_LABEL_CHARS):
            self._entries = [{} for _ in range(route_count)]
            self._entries_for = (kind, target)
            self._entry_count = 0
            self._entry_chars = 0
        return self._entries

    def counted(self, added: int, chars: int) -> None:
        self._entry_count += added
        self._entry_chars += chars

    def room(self) -> int:
        """How many more label sets the route caches may take before the next clear. A page with
        more distinct label sets than that (a cardinality bomb) maps the rest without caching them,
        so what the state keeps between cycles stays bounded by MAX_MAPPED_LABEL_SETS."""
        return max(0, MAX_MAPPED_LABEL_SETS - self._entry_count)

    def chars_room(self) -> int:
        """Likewise in characters of label values: bounded by MAX_MAPPED_LABEL_CHARS."""
        return max(0, MAX_MAPPED_LABEL_CHARS - self._entry_chars)

    def format_le(self, raw: str, scale: float) -> str | None:
        if len(raw) > MAX_CACHED_LE_LENGTH:
            return format_le(raw, scale)
        key = (raw, scale)
        formatted = self._le.get(key, "")
        if formatted == "":
            if len(self._le) >= MAX_LE_FORMATS:
                self._le.clear()
            formatted = self._le[key] = format_le(raw, scale)
        return formatted


def labels_chars(labels: Labels) -> int:
    """Approximate bytes a cached label set and its Entry hold, for the route caches' bound: the
    names and values, each pair's tuple and str headers (which dominate when a hostile page sends
    many short labels), and the Entry's own tuples."""
    return _ENTRY_BYTES + _PAIR_BYTES * len(labels) + sum([len(name) + len(value) for name, value in labels])
