"""Parsing: one engine page detected and parsed, the first two steps of the normalization.

`read_page` resolves the page's engine kind (a configured one, the target's last one while its
markers hold, or registry.detect_kind), picks the kind's table variant, and parses only the
sample names that table maps (exposition.parse) under the page's family budget. The result, a
Page, is what a full pass (normalize.py) or a replay (replay.py) starts from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.sources.engines.accounting import FamilyAccount
from exporter.sources.engines.alias_tables import Table, table_for
from exporter.sources.engines.exposition import Exposition, TooManyNames, parse
from exporter.sources.engines.registry import KINDS, SPECS, YIELDS_TO, detect_kind, matches
from exporter.sources.engines.state import NormalizerState

__all__ = ["MAX_PAGE_FAMILIES", "MAX_PAGE_NAMES", "Page", "TooManyFamiliesError", "UnknownEngineError", "read_page"]

MAX_PAGE_FAMILIES = 5_000
"""Native families one page may have (TYPE declarations and sample names less their suffixes); a
page with more is refused (`too_many_families`). The largest real pages have 92 (vLLM 0.32, live)
to 263 (vLLM 0.34 with every feature on); every family costs CPU to parse and account for whatever
its size, and 100k one-sample families (1.1 MB, far under the payload cap) cost 4 s a scrape."""
NAMES_PER_FAMILY = 5
"""A family prints at most this many distinct names: a histogram's TYPE, _bucket, _sum, _count and
_created (a counter's TYPE, _total and _created are three)."""
MAX_PAGE_NAMES = MAX_PAGE_FAMILIES * NAMES_PER_FAMILY
"""The parser stops a page at this many distinct declared and dropped names, before it reads the
rest: a family bomb costs the parse of this many lines, not of the page."""


class UnknownEngineError(ValueError):
    """The page matches no known engine (and no kind was configured)."""


class TooManyFamiliesError(ValueError):
    """The page has more than MAX_PAGE_FAMILIES native families: refused whole."""

    def __init__(self, families: int | None = None) -> None:
        counted = f"{families} families" if families is not None else f"more than {MAX_PAGE_NAMES} metric names"
        super().__init__(f"the page has {counted}, over the budget of {MAX_PAGE_FAMILIES} families (real "
                         "engines print 100-300): none of it is read")


@dataclass(slots=True)
class Page:
    """One page detected and parsed: what a pass (or a replay) starts from."""

    text: str
    kind: str
    table: Table
    exposition: Exposition
    notes: dict[str, None]
    """Notes so far (detection's), in order: a dict as an ordered set."""
    families: FamilyAccount = field(default_factory=FamilyAccount)


def read_page(text: str, kind: str | None, state: NormalizerState) -> Page:
    """Steps 1 and 2: the page's kind and table variant, and its parse (only the mapped names)."""
    notes: dict[str, None] = {}
    kind = _resolve_kind(text, kind, state, notes)
    table = table_for(kind, text)
    try:
        exposition = parse(text, keep=table.keep.__contains__, label_cache=state.label_cache,
                           max_names=MAX_PAGE_NAMES)
    except TooManyNames:
        raise TooManyFamiliesError() from None
    families = state.families(kind, exposition)
    counted = families.mapped + families.ignored + families.unaccounted
    if counted > MAX_PAGE_FAMILIES:
        raise TooManyFamiliesError(counted)
    return Page(text, kind, table, exposition, notes, families)


# ---------------------------------------------------------------------------------------------
# Detection (registry.py has the markers and the order)


def _resolve_kind(text: str, kind: str | None, state: NormalizerState, notes: dict[str, None]) -> str:
    if kind is not None:
        if kind not in SPECS:
            raise UnknownEngineError(f"unknown engine kind {kind!r}; expected one of {', '.join(KINDS)}")
        state.last_kind = kind
        return kind
    last = state.last_kind
    if last is not None and matches(text, last) and not any(
            matches(text, specific) for specific in YIELDS_TO.get(last, ())):
        return last
    detected = detect_kind(text)
    if detected is None:
        if last is None:
            # An HTML error page or garbage is a parse failure, not an unknown engine: say so.
            try:
                parse(text, keep=_keep_nothing, max_names=MAX_PAGE_NAMES)
            except TooManyNames:
                raise TooManyFamiliesError() from None
            raise UnknownEngineError("the page matches no known engine (" + ", ".join(KINDS) + ")")
        notes[f"no {last} metric names on the page; kept the last detected kind"] = None
        return last
    if last is not None and detected != last:
        notes[f"engine kind changed from {last} to {detected}"] = None
    state.last_kind = detected
    return detected


def _keep_nothing(_name: str) -> bool:
    return False
