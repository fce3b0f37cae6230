"""Steady-state memo over normalize.py: replay the last page's decisions when its series repeat.

An engine prints the same series in the same order on every scrape, and what the normalization
pass decides (label mapping, merges, alias choice, the series limit, the notes) depends only on the
page's (name, labels) sequence, its table variant (normalize.Table.key) and which values are
non-finite or below an alias minimum, not on the values themselves (products aside: a zero divisor
drops one). So once a page's keys repeat, the full pass runs with a Recorder as its trace and the
result is a Plan: each output sample's name and labels and the scaled input samples it sums or
maxes, in the full pass's order of float operations, the notes, and the shape of the products.
While later pages have the same keys and the same value mask, only the plan is re-evaluated (a
multiply per output sample, the product terms again, and their shape checked).

Validation depends on values too: a plan is only recorded from a page that passed it whole (but
for non-finite values, which the mask covers), and a replay re-checks the plan's counters and
histograms in a few C-level passes (Checks) and takes the full pass when one fails. Any other
difference takes the full pass, which records afresh. The output is exactly the plain pass's
(tests/test_engines_normalize.py and tests/test_hardening_parse.py prove it).

Measured on the documented vLLM 0.11 page (`python -m bench normalize`): a warm cycle costs 0.6 ms
with the plan and 1.5 ms without, per engine target per collection cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import gt, itemgetter, ne
from types import MappingProxyType
from typing import NamedTuple

from exporter.catalog.base import MAX_VALUE
from exporter.snapshot import Labels, Sample
from exporter.sources.engines.alias_tables import Slot, TermRoute
from exporter.sources.engines.exposition import MAX_CACHED_CHARS, PAIR_OVERHEAD
from exporter.sources.engines.normalize import NormalizedScrape, Pass, full_pass, minimum_note, scrape_of
from exporter.sources.engines.normalize import normalize as plain_normalize
from exporter.sources.engines.page import Page, read_page
from exporter.sources.engines.state import NormalizerState

__all__ = ["MAX_PLAN_SAMPLES", "Memo", "normalize_if_unchanged", "normalize_with_memo"]

MAX_PLAN_SAMPLES = 20_000
"""A page with more parsed samples than this is not planned (the state keeps no per-page record of
it): a cardinality bomb costs the full pass every cycle but pins no memory."""
MAX_PLAN_BYTES = MAX_CACHED_CHARS
"""Nor is a page whose keys would pin more than about this many bytes (its text, as a bound on the
characters of its names and labels, and each label pair's headers): the memo keeps the last page's
label tuples after the parser's cache has let them go, and a page of many short labels holds ten
times its text."""

Key = tuple[str, Labels]
"""An output sample's (name, labels)."""


def normalize_with_memo(
    text: str,
    *,
    target: str,
    kind: str | None = None,
    state: NormalizerState | None = None,
    max_series: int = 10_000,
) -> NormalizedScrape:
    """normalize.normalize (the plain pass) with the memo: the same result, a replay when the page
    repeats. Named apart from the plain pass, whose signature it shares, so a caller says which it means."""
    if state is None:  # no state to keep a memo in: the plain pass
        return plain_normalize(text, target=target, kind=kind, max_series=max_series)
    scrape = _normalize(text, target, kind, state, max_series, replay_only=False)
    assert scrape is not None  # only a replay_only call gives up
    return scrape


def normalize_if_unchanged(
    text: str,
    *,
    target: str,
    kind: str | None,
    state: NormalizerState,
    max_series: int = 10_000,
) -> NormalizedScrape | None:
    """The page normalized by replaying the last page's plan (its series are unchanged: a parse
    and value arithmetic, no mapping); None when it needs the full pass of `normalize_with_memo`."""
    return _normalize(text, target, kind, state, max_series, replay_only=True)


class PageKeys(NamedTuple):
    """What a page must repeat to be planned: the table variant, target and series sequence."""

    table: str
    target: str
    names: tuple[str, ...]
    labels: tuple[Labels, ...]


class Memo(NamedTuple):
    """Kept in NormalizerState.memo between pages (replaced whole on every full pass)."""

    plan: Plan | None
    seen: PageKeys | None
    """The keys of the last page that took the full pass."""


def _normalize(text: str, target: str, kind: str | None, state: NormalizerState, max_series: int,
               *, replay_only: bool) -> NormalizedScrape | None:
    memo = state.memo if isinstance(state.memo, Memo) else None
    if replay_only and (memo is None or memo.plan is None):
        return None  # nothing to replay: parsing here would only be repeated by the full pass
    page = read_page(text, kind, state)
    parsed = page.exposition.samples
    if parsed:
        names, labels, values, _ = zip(*parsed, strict=True)
    else:
        names = labels = values = ()
    keys = PageKeys(page.table.key, target, names, labels)
    plan = memo.plan if memo is not None else None
    if plan is not None and plan.fits(keys, max_series, values):
        replayed = plan.replay(page, state, target, values)
        if replayed is not None:
            return replayed
    if replay_only:
        return None
    # Record a plan once the page's keys repeat: a first scrape, or a page that changes shape every
    # cycle, pays nothing for it.
    kept = keys if _plannable(text, labels) else None
    recorder = Recorder() if kept is not None and memo is not None and kept == memo.seen else None
    run, scrape = full_pass(page, state, target, max_series, recorder)
    # A page that failed validation on its values is not planned: the next one may pass.
    new_plan = None
    if recorder is not None and kept is not None and not run.invalid:
        new_plan = recorder.plan(run, kept, max_series, values, scrape.dropped_series)
    state.memo = Memo(new_plan, kept)
    return scrape


def _plannable(text: str, labels: tuple[Labels, ...]) -> bool:
    """Whether the page's keys are small enough to keep (MAX_PLAN_SAMPLES, MAX_PLAN_BYTES)."""
    return (len(labels) <= MAX_PLAN_SAMPLES
            and len(text) + PAIR_OVERHEAD * sum(map(len, labels)) <= MAX_PLAN_BYTES)


# ---------------------------------------------------------------------------------------------
# Recording: the trace of one full pass


class _Note(NamedTuple):
    text: str


class _Below(NamedTuple):
    """A value under its alias minimum: dropped, with a note that names the value."""

    source: str
    sample: int  # the sample's index on the page (`index` would hide tuple.index)


class _Term(NamedTuple):
    term: TermRoute
    mapped: tuple
    labels: Labels
    sample: int  # the sample's index on the page (`index` would hide tuple.index)


class Scaled(NamedTuple):
    position: int
    sample: int  # the sample's index on the page (`index` would hide tuple.index)
    scale: float


class Fold(NamedTuple):
    position: int
    groups: list[list[tuple[int, float]]]
    """Groups of (input index, scale), in the order the full pass folds them."""
    summed: bool


class ProductRef(NamedTuple):
    position: int
    slot: Slot
    key: Key


class Recorder:
    """normalize.Trace: notes where every candidate value comes from, so that plan() can describe
    the page. Lives for one full pass."""

    __slots__ = ("events", "minimum_checks", "refs", "sources")

    def __init__(self) -> None:
        self.sources: dict[tuple[Slot, Key], list[list[tuple[int, float]]]] = {}
        """(slot, key) -> groups of (sample index, scale) it folds."""
        self.events: list[_Note | _Below | _Term] = []
        """What a replay redoes in page order."""
        self.minimum_checks: list[tuple[int, float]] = []
        self.refs: list[tuple[Slot, Key]] = []
        """(slot, key) of each output sample, in output order."""

    def checked(self, index: int, minimum: float) -> None:
        self.minimum_checks.append((index, minimum))

    def noted(self, text: str) -> None:
        self.events.append(_Note(text))

    def below(self, source: str, index: int) -> None:
        self.events.append(_Below(source, index))

    def term(self, term: TermRoute, mapped: tuple, labels: Labels, index: int) -> None:
        self.events.append(_Term(term, mapped, labels, index))

    def fed(self, slot: Slot, key: Key, index: int, scale: float, first: bool) -> None:
        if first:
            self.sources[(slot, key)] = [[(index, scale)]]
        else:
            self.sources[(slot, key)][-1].append((index, scale))

    def renamed(self, slot: Slot, key: Key, new_key: Key, merged: bool) -> None:
        groups = self.sources.pop((slot, key))
        self.sources[(slot, new_key)] = self.sources[(slot, new_key)] + groups if merged else groups

    def emitted(self, slot: Slot, keys: list[Key]) -> None:
        self.refs.extend([(slot, key) for key in keys])

    def plan(self, run: Pass, keys: PageKeys, max_series: int, values: tuple, dropped: int) -> Plan:
        """The recorded decisions of `run` (finished, with this recorder as its trace) as a Plan."""
        out_names: list[str] = []
        out_labels: list[Labels] = []
        first_index: list[int] = []
        scaled: list[Scaled] = []
        folds: list[Fold] = []
        products: list[ProductRef] = []
        types = run.table.types
        # A product overwrites whatever an alias of its slot put under the same key.
        written = set(run.product_writes)
        for position, (slot, key) in enumerate(self.refs):
            out_names.append(key[0])
            out_labels.append(key[1])
            if (slot, key) in written:
                first_index.append(0)
                products.append(ProductRef(position, slot, key))
                continue
            groups = self.sources[(slot, key)]
            index, scale = groups[0][0]
            first_index.append(index)
            if len(groups) > 1 or len(groups[0]) > 1:
                folds.append(Fold(position, groups, types[slot[0]] != "gauge"))
            elif scale != 1.0:
                scaled.append(Scaled(position, index, scale))
        return Plan(
            keys=keys, max_series=max_series, mask=_value_mask(values), minimum_checks=tuple(self.minimum_checks),
            below=tuple(values[index] < minimum for index, minimum in self.minimum_checks),
            events=tuple(self.events), model=run.model, unmapped=run.unmapped,
            product_writes=run.product_writes, out_names=tuple(out_names), out_labels=tuple(out_labels),
            pick=_picker(first_index), scaled=tuple(scaled), folds=tuple(folds),
            products=tuple(products), finish_notes=tuple(run.note_log or ()), dropped=dropped,
            drops=MappingProxyType(dict(run.drops)), checks=self._checks(run),
        )

    def _checks(self, run: Pass) -> Checks:
        """What a replay must re-check on the values of this run's output (see Checks)."""
        types = run.table.types
        ceilings = run.table.ceilings
        ratios: list[int] = []
        histograms: dict[tuple[str, Labels], tuple[list, list, list]] = {}
        for position, (slot, key) in enumerate(self.refs):
            family = slot[0]
            kind = types[family]
            if ceilings[family] < MAX_VALUE:
                ratios.append(position)
            if kind == "histogram":
                buckets, counts, _ = entry = histograms.setdefault((family, run.group_of[key]), ([], [], []))
                name = key[0]
                if name.endswith("_bucket"):
                    buckets.append((float(dict(key[1])["le"]), position))
                elif name.endswith("_count"):
                    counts.append(position)
                else:
                    entry[2].append(position)
        lower: list[int] = []
        upper: list[int] = []
        last: list[int] = []
        totals: list[int] = []
        whole: list[int] = []
        for buckets, counts, _ in histograms.values():
            buckets.sort()
            order = [position for _, position in buckets]
            lower.extend(order[:-1])
            upper.extend(order[1:])
            last.append(order[-1])
            totals.append(counts[0])
            whole.extend(order)
            whole.append(counts[0])
        return Checks(_positions(ratios), _positions(lower), _positions(upper), _positions(last),
                      _positions(totals), _positions(whole))


# ---------------------------------------------------------------------------------------------
# Replaying


_new_sample = tuple.__new__
"""tuple.__new__(Sample, (name, labels, value)) is what Sample(name, labels, value) does, without
the Python-level __new__ call."""


class Plan(NamedTuple):
    """What one page (its keys, max_series and value mask) becomes, recorded by a full pass:
    re-evaluated for the next page with the same keys, max_series and mask."""

    keys: PageKeys
    max_series: int
    mask: tuple[int, ...]
    """Indexes of the non-finite input values."""
    minimum_checks: tuple[tuple[int, float], ...]
    below: tuple[bool, ...]
    """Per minimum check: the value was below the alias minimum (dropped)."""
    events: tuple[_Note | _Below | _Term, ...]
    model: str | None
    unmapped: int
    product_writes: list[tuple[Slot, Key]]
    out_names: tuple[str, ...]
    out_labels: tuple[Labels, ...]
    pick: Callable[[tuple[float, ...]], list[float]]
    """The input values -> per output sample, the value of its first input sample (a placeholder
    for a product): the whole value when it has one input and no scale."""
    scaled: tuple[Scaled, ...]
    """A single input that is scaled."""
    folds: tuple[Fold, ...]
    """Merged series."""
    products: tuple[ProductRef, ...]
    finish_notes: tuple[str, ...]
    dropped: int
    drops: Mapping[str, int]
    """The run's drops by reason: the same for every page that fits (non-finite values only)."""
    checks: Checks

    @property
    def names(self) -> tuple[str, ...]:
        return self.keys.names

    def fits(self, keys: PageKeys, max_series: int, values: tuple) -> bool:
        return (keys == self.keys and max_series == self.max_series and _value_mask(values) == self.mask
                and tuple(values[index] < minimum for index, minimum in self.minimum_checks) == self.below)

    def replay(self, page: Page, state: NormalizerState, target: str, values: tuple) -> NormalizedScrape | None:
        """The scrape of a page that fits, or None when its products come out in another shape (a
        division by zero appeared or went away) or its values fail validation (the full pass then
        says which)."""
        run = Pass(page.table, state, dict(page.notes), target)
        run.model = self.model
        for event in self.events:
            if isinstance(event, _Term):
                run.add_term(event.term, event.mapped, event.labels, values[event.sample])
            elif isinstance(event, _Note):
                run.note(event.text)
            else:
                run.note(minimum_note(event.source, values[event.sample]))
        run.products()
        if run.product_writes != self.product_writes:
            return None
        out = self.pick(values)
        for position, index, scale in self.scaled:
            out[position] = values[index] * scale
        for position, groups, summed in self.folds:
            out[position] = _fold(values, groups, summed)
        candidates = run.candidates
        for position, slot, key in self.products:
            out[position] = candidates[slot][key]
        if not self.checks.passed(out):
            return None
        for text in self.finish_notes:
            run.note(text)
        samples = tuple(map(_new_sample, repeat(Sample), zip(self.out_names, self.out_labels, out, strict=True)))
        return scrape_of(page, self.model, samples, self.unmapped, self.dropped, self.drops, run.notes)


class Checks(NamedTuple):
    """Validation of a replayed page's output values, all C-level passes over positions: every
    value is finite and in [0, MAX_VALUE] and the ratios (`ratios`) at most 1, each histogram's
    buckets do not fall as `le` rises (`lower` <= `upper`, pairwise), its +Inf bucket (`last`)
    equals its _count (`totals`), and its counts (`whole`) are whole numbers. Non-finite inputs
    change the plan's mask instead."""

    ratios: Callable[[list], tuple]
    lower: Callable[[list], tuple]
    upper: Callable[[list], tuple]
    last: Callable[[list], tuple]
    totals: Callable[[list], tuple]
    whole: Callable[[list], tuple]

    def passed(self, out: list[float]) -> bool:
        if out:
            total = sum(out)  # finite only if every value is (none is near float's range once bounded)
            if total - total != 0.0 or min(out) < 0.0 or max(out) > MAX_VALUE:
                return False
        ratios = self.ratios(out)
        if ratios and max(ratios) > 1.0:
            return False
        if any(map(gt, self.lower(out), self.upper(out))) or any(map(ne, self.last(out), self.totals(out))):
            return False
        return all(map(float.is_integer, self.whole(out)))


def _value_mask(values: Sequence[float]) -> tuple[int, ...]:
    """Indexes of the non-finite values: () in one C-level pass when the sum is finite."""
    total = sum(values)
    if total - total == 0.0:
        return ()
    return tuple(index for index, value in enumerate(values) if value - value != 0.0)


def _positions(indexes: list[int]) -> Callable[[list], tuple]:
    """The items at `indexes` as a tuple, in one C-level call."""
    if not indexes:
        return _nothing
    if len(indexes) == 1:
        only = indexes[0]
        return lambda values: (values[only],)
    return itemgetter(*indexes)


def _nothing(_values: list) -> tuple:
    return ()


def _picker(indexes: list[int]) -> Callable[[tuple[float, ...]], list[float]]:
    if len(indexes) > 1:
        getter = itemgetter(*indexes)
        return lambda values: list(getter(values))
    return lambda values: [values[index] for index in indexes]


def _fold(values: tuple, groups: list, summed: bool) -> float:
    """A merged series' value, in the order the full pass computes it: each group is folded in page
    order (consume), then the groups one after another (renames of the page's model fill)."""
    total = 0.0
    for number, group in enumerate(groups):
        part = 0.0
        for position, (index, scale) in enumerate(group):
            value = values[index] * scale
            if position == 0:
                part = value
            elif summed:
                part = part + value
            elif value > part:
                part = value
        if number == 0:
            total = part
        elif summed:
            total = total + part
        else:
            total = max(total, part)
    return total
