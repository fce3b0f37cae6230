"""Engine exposition -> the normalized `llm_*` schema (exporter/catalog/engine.py): the plain pass.

The per-engine modules are data (table.py explains the vocabulary) and registry.py says which exist
and how a page is recognised. The pass that interprets them is this module; its parts live beside
it: page.py reads a page (steps 1 and 2), alias_tables.py compiles the engine tables it runs on,
histograms.py formats bucket bounds and checks a merged histogram, drops.py names the drop
reasons and state.py holds what a target keeps across cycles. The steps:

1. detect the engine kind (registry.detect_kind: a few substring checks on the raw page, no parsing),
   and pick the kind's table variant by the page conditions (`when`: HELP texts the parser does not
   read, or another family's presence) found on it;
2. parse only the sample names the kind's table maps (the parser drops the rest before touching
   their labels, and `_created` samples are never in a table);
3. map labels: the engine's model label -> `model`, its data-parallel rank -> `rank` (bounded),
   its finish reason -> `reason` (bounded), `le` kept and reformatted; every other label is dropped;
4. convert units (a histogram's `le` bounds and `_sum`, never its counts);
5. merge series that coincide after the label mapping: counters and histogram parts are summed
   (they are partitions of one count, e.g. Triton model versions or TGI error kinds), gauges take
   the maximum (they are copies of one state, e.g. per-process copies, and for usage ratios the
   fullest copy is the one that limits);
6. per normalized family keep only the highest-priority alias present (old/new name dedupe);
7. validate: drop non-finite values, negative counters, values outside their family's domain
   (every family is non-negative, ratios at most 1, nothing above catalog.MAX_VALUE: `out_of_range`),
   series the page prints more than once (`duplicate`: an exposition may not, and summing or
   picking one copy would be a guess) and whole histogram series that are not
   valid (a bad or missing `le`, no +Inf bucket, no _count or _sum, counts that fall as `le` rises,
   _count unequal to the +Inf bucket, negative or fractional counts), each with a note and counted
   by reason in NormalizedScrape.drops, and bound the series count.

Nothing is invented: a family the engine lacks has no series, never a zero.

The exporter calls replay.normalize_with_memo, which wraps this pass with a memo for pages whose series
repeat (see replay.py); a Pass reports its decisions to an optional Trace for that, and is the same
pass with or without one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType
from typing import Final, NamedTuple, Protocol

from exporter.catalog import engine as engine_catalog
from exporter.catalog.base import MAX_VALUE
from exporter.snapshot import Labels, Sample
from exporter.sources.engines.accounting import FamilyAccount
from exporter.sources.engines.alias_tables import Route, Slot, Table, TermRoute
from exporter.sources.engines.drops import (
    CARDINALITY,
    DUPLICATE,
    FAULT_NOTES,
    NEGATIVE_COUNTER,
    NON_FINITE,
    OUT_OF_RANGE,
    VALUE_FAULTS,
)
from exporter.sources.engines.histograms import BAD_LE_TEXT, histogram_fault
from exporter.sources.engines.page import Page, read_page
from exporter.sources.engines.registry import flavor, role
from exporter.sources.engines.state import Entry, NormalizerState, RouteEntry, labels_chars
from exporter.sources.engines.table import EngineSpec, Product

__all__ = ["NormalizedScrape", "Pass", "Trace", "full_pass", "minimum_note", "normalize", "scrape_of"]

REASONS = frozenset(engine_catalog.FINISH_REASONS)
"""Finish reasons kept as is (after the table's own `reasons`); anything else becomes `other`."""
TIERS = frozenset(engine_catalog.CACHE_TIERS)
MAX_RANK = 1024
"""Ranks are decimal indexes below this; anything else becomes `other` (a bounded label)."""
ABSENT_MODELS = frozenset({"", "undefined", "None"})
"""Model label values that mean "no model" (trtllm-serve's first release printed `undefined`)."""
MAX_NOTES = 16


# ---------------------------------------------------------------------------------------------
# Public API


@dataclass(frozen=True, slots=True)
class NormalizedScrape:
    kind: str
    flavor: str
    """The alias set that matched, e.g. vllm-v1, vllm-v0, sglang, triton-trtllm, trtllm-serve."""
    model: str
    """The engine's model name ("" when the engine gives none)."""
    samples: tuple[Sample, ...]
    unmapped_samples: int
    """Engine samples with no place in the schema (including `_created` samples)."""
    dropped_series: int
    """Normalized samples cut by `max_series`."""
    notes: tuple[str, ...]
    """What was dropped or assumed on this page, one line each (bounded)."""
    drops: Mapping[str, int] = field(default_factory=dict)
    """Series dropped on this page by reason (CARDINALITY, NON_FINITE, ..., and the parser's
    label-limit reasons); a histogram counts each of its series (buckets, _sum, _count)."""
    families: FamilyAccount = field(default_factory=FamilyAccount)
    """The page's native families: mapped, ignored on purpose, or unaccounted (accounting.py)."""
    role: str | None = None
    """The instance's PD role as the page names it (catalog ROLES), None when it does not."""


def normalize(
    text: str,
    *,
    target: str,
    kind: str | None = None,
    state: NormalizerState | None = None,
    max_series: int = 10_000,
) -> NormalizedScrape:
    """Normalize one engine page. Raises ExpositionError for an invalid payload and
    UnknownEngineError when `kind` is None and the page matches no engine."""
    state = state if state is not None else NormalizerState()
    return full_pass(read_page(text, kind, state), state, target, max_series)[1]


def full_pass(page: Page, state: NormalizerState, target: str, max_series: int,
              trace: Trace | None = None) -> tuple[Pass, NormalizedScrape]:
    """Steps 3 to 7 over a read page: the finished Pass (for a Trace's plan) and its scrape."""
    run = Pass(page.table, state, page.notes, target, trace=trace)
    run.consume(page.exposition.samples, _duplicates(page.exposition.samples))
    samples, dropped = run.finish(max_series)
    return run, scrape_of(page, run.model, samples, run.unmapped, dropped, run.drops, run.notes)


def scrape_of(page: Page, model: str | None, samples: tuple[Sample, ...], unmapped: int, dropped: int,
              drops: Mapping[str, int], notes: dict[str, None]) -> NormalizedScrape:
    """The result of a pass (or a replay) over `page`, with the parser's label-limit drops."""
    rejected = page.exposition.rejected
    if rejected:
        drops = dict(drops)
        for reason, count in rejected.items():
            drops[reason] = drops.get(reason, 0) + count
    return NormalizedScrape(
        kind=page.kind,
        flavor=flavor(page.text, page.table.spec),
        model=model or "",
        samples=samples,
        unmapped_samples=page.exposition.dropped_samples + unmapped,
        dropped_series=dropped,
        notes=tuple(notes)[:MAX_NOTES],
        drops=MappingProxyType(dict(drops)) if drops else _NO_DROPS,
        families=page.families,
        role=role(page.text, page.table.spec),
    )


_NO_DROPS: Mapping[str, int] = MappingProxyType({})


# ---------------------------------------------------------------------------------------------
# Label and value mapping


def _bound_rank(value: str) -> str:
    # ASCII digits only: str.isdigit() is also true for "³" or "①", which int() refuses.
    if value.isascii() and value.isdigit() and int(value) < MAX_RANK:
        return str(int(value))
    return "other"


def _bound_reason(value: str, spec: EngineSpec) -> str:
    lowered = value.lower()
    lowered = spec.reasons.get(lowered, lowered)
    return lowered if lowered in REASONS else "other"


def _bound_tier(value: str, spec: EngineSpec) -> str:
    lowered = value.lower()
    lowered = spec.tiers.get(lowered, lowered)
    return lowered if lowered in TIERS else "unknown"


def _map_labels(labels: Labels, spec: EngineSpec) -> tuple | None:
    """(model, rank, reason, le, tier) of an engine label set, or None for a rank copy to skip."""
    model = rank = reason = le = tier = None
    for key, value in labels:
        if key == "le":
            le = value
            continue
        wanted = spec.keep_only.get(key)
        if wanted is not None and value != wanted:
            unless = spec.keep_only_unless.get(key)
            if unless is None or all(name != unless for name, _ in labels):
                return None
        role = spec.labels.get(key)
        if role == "model":
            if model is None and value not in ABSENT_MODELS:
                model = value
        elif role == "rank":
            rank = _bound_rank(value)
        elif role == "reason":
            reason = _bound_reason(value, spec)
        elif role == "tier":
            tier = _bound_tier(value, spec)
    return (model, rank, reason, le, tier)


def _label_tuple(target: str, kind: str, model: str | None, rank: str | None, reason: str | None,
                 le: str | None, tier: str | None = None) -> Labels:
    # Built in sorted order directly: engine < le < model < rank < reason < target < tier.
    pairs = [("engine", kind)]
    if le is not None:
        pairs.append(("le", le))
    if model is not None:
        pairs.append(("model", model))
    if rank is not None:
        pairs.append(("rank", rank))
    if reason is not None:
        pairs.append(("reason", reason))
    pairs.append(("target", target))
    if tier is not None:
        pairs.append(("tier", tier))
    return tuple(pairs)


# ---------------------------------------------------------------------------------------------
# One normalization pass

_SKIP: Final = False  # Final: typed Literal[False], so `not entry` leaves an Entry
"""Entry of a label set that is a tensor-parallel copy (kept by rank 0)."""


def minimum_note(source: str, value: float) -> str:
    return f"dropped {source} = {value:g} (the engine's 'not available' value)"


class Trace(Protocol):
    """Told where each of a pass's decisions comes from (replay.Recorder): by sample index, in the
    order the pass makes them. A pass without one does the same work."""

    def checked(self, index: int, minimum: float) -> None:
        """Sample `index` went through a route with an alias minimum."""

    def noted(self, text: str) -> None:
        """A note that does not depend on the value (a non-finite value dropped)."""

    def below(self, source: str, index: int) -> None:
        """Sample `index` was under its alias minimum and dropped."""

    def term(self, term: TermRoute, mapped: tuple, labels: Labels, index: int) -> None:
        """Sample `index` fed a product term."""

    def fed(self, slot: Slot, key: tuple[str, Labels], index: int, scale: float, first: bool) -> None:
        """Sample `index`, times `scale`, started (`first`) or was folded into the candidate `key`."""

    def renamed(self, slot: Slot, key: tuple[str, Labels], new_key: tuple[str, Labels], merged: bool) -> None:
        """The page's model was given to `key`: it became (or was `merged` into) `new_key`."""

    def emitted(self, slot: Slot, keys: list[tuple[str, Labels]]) -> None:
        """These candidates became output samples, in this order."""


class Duplicates(NamedTuple):
    """Samples whose (name, labels) the page prints more than once, by index."""

    conflicting: frozenset[int]
    """Every copy of a series printed with different values: which is meant cannot be told."""
    repeats: frozenset[int]
    """The second and later copies of a series printed again with the same value: ignored."""


_NO_DUPLICATES = Duplicates(frozenset(), frozenset())
_NAME_AND_LABELS = itemgetter(0, 1)


class Pass:
    """The mutable work of one normalization (normalize(), or a replay's product terms); never
    outlives it."""

    def __init__(self, table: Table, state: NormalizerState, notes: dict[str, None], target: str,
                 trace: Trace | None = None) -> None:
        self.table = table
        self.state = state
        self.notes = notes
        self.target = target
        self.trace = trace
        self.unmapped = 0
        self.model: str | None = None
        self.candidates: dict[Slot, dict[tuple[str, Labels], float]] = {}
        self.group_of: dict[tuple[str, Labels], Labels] = {}
        """Histogram part -> the labels of its whole series (without `le`)."""
        self.unfilled: dict[tuple[str, Labels], tuple] = {}
        self.terms: dict[tuple[int, int], dict[tuple, float]] = {}
        self.product_writes: list[tuple[Slot, tuple[str, Labels]]] = []
        """(slot, key) of each product value written, in order: the products' shape."""
        self.note_log: list[str] | None = None
        """The notes of finish(), all of them (a replay adds them again)."""
        self.drops: dict[str, int] = {}
        """Series dropped by reason (NormalizedScrape.drops)."""
        self.invalid = False
        """A drop decided by values (not by the page's keys and non-finite mask): no plan."""
        self.duplicated: set[tuple[Slot, tuple[str, Labels]]] = set()
        """Output keys (histograms: "" and their series' group) fed by a series the page printed twice."""

    def drop(self, reason: str, count: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + count

    def note(self, text: str) -> None:
        if self.note_log is not None:
            self.note_log.append(text)
        if len(self.notes) < MAX_NOTES:
            self.notes[text] = None

    def _entry(self, route: Route, labels: Labels) -> RouteEntry:
        """What a label set becomes under a route: None when the route does not apply (selector,
        bucket without le), _SKIP for a rank copy, else its Entry. A bucket whose bound is not a
        number gets le=BAD_LE_TEXT, so that its whole histogram is dropped by finish()."""
        mapped = _map_labels(labels, self.table.spec)
        if mapped is None:
            return _SKIP
        if route.where is not None and route.where not in labels:
            return None
        model, rank, reason, le, tier = mapped
        if route.part == "_bucket":
            if le is None:
                return None
            le = self.state.format_le(le, route.scale)
            if le is None:
                le = BAD_LE_TEXT
        else:
            le = None
        reason = (reason or route.reason) if route.reason is not None else None
        tier = (tier or route.tier) if route.tier is not None else None
        kind = self.table.spec.kind
        out = _label_tuple(self.target, kind, model, rank, reason, le, tier)
        group = out if le is None else _label_tuple(self.target, kind, model, rank, reason, None, tier)
        return Entry(out, group, model, (rank, reason, le, tier))

    def consume(self, samples: list, duplicates: Duplicates = _NO_DUPLICATES) -> None:
        """Fold the page's samples into candidates. A series the page prints twice with one value
        counts once; printed with different values, the outputs it would feed are dropped."""
        conflicting, repeats = duplicates
        if repeats:
            self.note(f"ignored {len(repeats)} repeated series (printed again with the same value)")
            self.invalid = True
        routes_of = self.table.routes
        terms_of = self.table.terms
        entries = self.state.route_entries(self.table.spec.kind, self.target, self.table.route_count)
        candidates = self.candidates
        group_of = self.group_of
        trace = self.trace
        added = added_chars = 0
        room = self.state.room()
        chars_room = self.state.chars_room()
        for index, (name, labels, value, _timestamp) in enumerate(samples):
            if repeats and index in repeats:
                continue
            used = skipped = False
            for route in routes_of.get(name, ()):
                cache = entries[route.index]
                entry = cache.get(labels, None)
                if entry is None and labels not in cache:
                    entry = self._entry(route, labels)
                    if added < room and added_chars < chars_room:
                        cache[labels] = entry
                        added += 1
                        added_chars += labels_chars(labels)
                if not entry:
                    skipped = skipped or entry is _SKIP
                    continue
                used = True
                out, group, model, parts = entry
                if conflicting and index in conflicting:
                    self.duplicated.add((route.slot, (route.name if not route.part else "", group if route.part
                                                      else out)))
                    continue
                if trace is not None and route.minimum is not None:
                    trace.checked(index, route.minimum)
                # NaN or +-Inf, without two calls into math. A histogram part goes on: finish()
                # drops its whole histogram.
                if value - value != 0.0 and not route.part:
                    text = f"dropped a non-finite value of {route.source}"
                    self.note(text)
                    self.drop(NON_FINITE)
                    if trace is not None:
                        trace.noted(text)
                    continue
                if route.minimum is not None and value < route.minimum:
                    self.note(minimum_note(route.source, value))
                    if trace is not None:
                        trace.below(route.source, index)
                    continue
                if route.scaled:
                    value *= route.scale
                if model is not None and self.model is None:
                    self.model = model
                bucket = candidates.get(route.slot)
                if bucket is None:
                    bucket = candidates[route.slot] = {}
                key = (route.name, out)
                previous = bucket.get(key)
                if previous is None:
                    bucket[key] = value
                    if route.part:  # histogram parts are emitted (or dropped) as whole series
                        group_of[key] = group
                    if model is None:
                        self.unfilled[key] = parts
                elif route.summed:
                    bucket[key] = previous + value
                elif value > previous:
                    bucket[key] = value
                if trace is not None:
                    trace.fed(route.slot, key, index, route.scale if route.scaled else 1.0, previous is None)
            for term in terms_of.get(name, ()):
                mapped = _map_labels(labels, self.table.spec)
                if conflicting and index in conflicting:
                    used = True
                    self.note(f"dropped {FAULT_NOTES[DUPLICATE]} {name} (a product's term)")
                    self.drop(DUPLICATE)
                    self.invalid = True
                elif mapped is None:
                    skipped = True
                elif term.where is None or term.where in labels:
                    used = True
                    self.add_term(term, mapped, labels, value)
                    if trace is not None:
                        trace.term(term, mapped, labels, index)
            if not used and not skipped:
                self.unmapped += 1
        self.state.counted(added, added_chars)

    def add_term(self, term: TermRoute, mapped: tuple, labels: Labels, value: float) -> None:
        model, rank = mapped[0], mapped[1]
        if term.label is not None:
            raw = dict(labels).get(term.label)
            if raw is None:  # a label this release does not have (a newer product's term): no note
                return
            try:
                value = float(raw) if raw is not None else math.nan
            except ValueError:
                value = math.nan
        product = self.table.spec.products[term.product]
        if value - value != 0.0:
            self.note(f"{product.family}: no number in {product.terms[term.term].source}"
                      + (f" label {term.label}" if term.label else ""))
            if not product.add:
                return
            value = math.nan  # a sum with an unknown part is unknown: finish() drops it (out_of_range)
        if model is not None and self.model is None:
            self.model = model
        values = self.terms.setdefault((term.product, term.term), {})
        key = (model, rank)
        previous = values.get(key)
        if previous is None:
            values[key] = value
        elif term.summed:
            values[key] = previous + value
        elif value > previous or previous != previous:  # copies: a number wins over an `add` part's NaN
            values[key] = value

    def products(self) -> None:
        kind = self.table.spec.kind
        for index, product in enumerate(self.table.spec.products):
            if product.add:
                self._sum(index, product)
                continue
            first = self.terms.get((index, 0))
            others = [self.terms.get((index, position)) for position in range(1, len(product.terms))]
            if not first or any(not values for values in others):
                continue
            for (model, rank), value in first.items():
                result = self._product_value(product, value, others, (model, rank))
                if result is None:
                    continue
                out = _label_tuple(self.target, kind, model or self.model, rank, None, None, product.tier)
                slot = (product.family, product.priority)
                bucket = self.candidates.setdefault(slot, {})
                key = (product.family, out)
                bucket[key] = result
                self.product_writes.append((slot, key))

    def _sum(self, index: int, product: Product) -> None:
        """An `add` product: per (model, rank), the sum of the terms present (at least one). A
        negative or non-finite part makes the sum NaN, which finish() drops as out of range."""
        parts = [values for position in range(len(product.terms))
                 if (values := self.terms.get((index, position)))]
        if not parts:
            return
        totals: dict[tuple, float] = {}
        for values in parts:
            for key, value in values.items():
                if not value >= 0.0:  # negative or NaN
                    value = math.nan
                previous = totals.get(key)
                totals[key] = value if previous is None else previous + value
        kind = self.table.spec.kind
        slot = (product.family, product.priority)
        bucket = self.candidates.setdefault(slot, {})
        for (model, rank), value in totals.items():
            out = _label_tuple(self.target, kind, model or self.model, rank, None, None, product.tier)
            key = (product.family, out)
            bucket[key] = value
            self.product_writes.append((slot, key))

    def _product_value(self, product: Product, value: float, others: list, key: tuple) -> float | None:
        if product.terms[0].divide:
            if value == 0:
                self.note(f"{product.family}: division by zero")
                return None
            value = 1.0 / value
        for position, values in enumerate(others, 1):
            # Info gauges (vLLM cache_config_info) have no model label: match on rank alone.
            factor = values.get(key)
            if factor is None:
                factor = values.get((None, key[1]))
            if factor is None:
                return None
            if product.terms[position].divide:
                if factor == 0:
                    self.note(f"{product.family}: division by zero")
                    return None
                value /= factor
            else:
                value *= factor
        return value

    def _fill_model(self) -> None:
        """Give the page's model to series whose engine sample had no model label. Rare (engines
        put the model on everything or on nothing), so this re-keys only those few."""
        if self.model is None or not self.unfilled:
            return
        kind = self.table.spec.kind
        trace = self.trace
        for slot, bucket in self.candidates.items():
            summed = self.table.types[slot[0]] != "gauge"
            for key in [key for key in bucket if key in self.unfilled]:
                rank, reason, le, tier = self.unfilled[key]
                value = bucket.pop(key)
                self.group_of.pop(key, None)
                out = _label_tuple(self.target, kind, self.model, rank, reason, le, tier)
                group = _label_tuple(self.target, kind, self.model, rank, reason, None, tier)
                new_key = (key[0], out)
                previous = bucket.get(new_key)
                if previous is None:
                    bucket[new_key] = value
                    if key[0] != slot[0]:  # a histogram part
                        self.group_of[new_key] = group
                else:
                    bucket[new_key] = previous + value if summed else max(previous, value)
                if trace is not None:
                    trace.renamed(slot, key, new_key, previous is not None)

    def finish(self, max_series: int) -> tuple[tuple[Sample, ...], int]:
        self._fill_model()
        self.products()
        self.note_log = []
        best: dict[str, int] = {}
        for family, priority in self.candidates:
            if priority > best.get(family, priority - 1):
                best[family] = priority
        types = self.table.types
        samples: list[Sample] = []
        dropped = 0
        if self.duplicated:
            self._drop_duplicated()
        for family, priority in best.items():
            chosen = self.candidates[(family, priority)]
            if types[family] == "histogram":
                dropped += self._emit_histograms((family, priority), chosen, samples, max_series)
                continue
            room = max_series - len(samples)
            items = list(chosen.items())
            if types[family] == "counter" and min(chosen.values(), default=0.0) < 0.0:
                negative = [item for item in items if item[1] < 0.0]
                self.note(f"dropped {len(negative)} negative {family} series")
                self.drop(NEGATIVE_COUNTER, len(negative))
                self.invalid = True
                items = [item for item in items if not item[1] < 0.0]
            ceiling = self.table.ceilings.get(family, MAX_VALUE)
            values = chosen.values() if len(items) == len(chosen) else [value for _key, value in items]
            if items and _outside(values, ceiling):
                outside = [item for item in items if not 0.0 <= item[1] <= ceiling]
                self.note(f"dropped {len(outside)} {family} series outside [0, {ceiling:g}] "
                          f"(e.g. {outside[0][1]:g})")
                self.drop(OUT_OF_RANGE, len(outside))
                self.invalid = True
                items = [item for item in items if 0.0 <= item[1] <= ceiling]
            dropped += max(0, len(items) - room)
            kept = items[:max(room, 0)]
            samples.extend([Sample(name, labels, value) for (name, labels), value in kept])
            if self.trace is not None:
                self.trace.emitted((family, priority), [key for key, _value in kept])
        if dropped:
            self.note(f"dropped {dropped} series over the limit of {max_series}")
            self.drop(CARDINALITY, dropped)
        return tuple(samples), dropped

    def _drop_duplicated(self) -> None:
        """Drop every output a duplicated series fed (its whole histogram for a part): half of a
        sum, or one of two copies of a gauge, would be a silent guess."""
        self.invalid = True
        groups: dict[Slot, set[Labels]] = {}
        for slot, (name, labels) in self.duplicated:
            if not name:  # a histogram part: its whole series
                groups.setdefault(slot, set()).add(labels)
                continue
            bucket = self.candidates.get(slot)
            if bucket is not None:
                bucket.pop((name, labels), None)
            self.note(f"dropped {FAULT_NOTES[DUPLICATE]} {slot[0]} series")
            self.drop(DUPLICATE)
        for slot, doomed_groups in groups.items():
            bucket = self.candidates.get(slot, {})
            doomed = [key for key in bucket if self.group_of.get(key) in doomed_groups]
            for key in doomed:
                del bucket[key]
            self.note(f"dropped {FAULT_NOTES[DUPLICATE]} {slot[0]} histogram")
            self.drop(DUPLICATE, len(doomed_groups))

    def _emit_histograms(self, slot: Slot, chosen: dict, samples: list[Sample], max_series: int) -> int:
        """Append whole histograms (a capped histogram would be wrong, not just short); returns
        how many samples did not fit."""
        family = slot[0]
        groups: dict[Labels, list] = {}
        group_of = self.group_of
        for key, value in chosen.items():
            group = group_of[key]
            members = groups.get(group)
            if members is None:
                groups[group] = [(key, value)]
            else:
                members.append((key, value))
        dropped = 0
        for members in groups.values():
            fault = histogram_fault(family, members)
            if fault is not None:
                self.note(f"dropped {FAULT_NOTES[fault]} {family} histogram")
                self.drop(fault, len(members))
                # The others follow from the page's keys and non-finite mask, which a plan fits.
                self.invalid = self.invalid or fault in VALUE_FAULTS
                continue
            if len(samples) + len(members) > max_series:
                dropped += len(members)
                continue
            samples.extend([Sample(name, labels, value) for (name, labels), value in members])
            if self.trace is not None:
                self.trace.emitted(slot, [key for key, _value in members])
        return dropped


def _outside(values: Collection[float], ceiling: float) -> bool:
    """Some value is not in [0, ceiling]: C-level passes, and the sum catches a NaN (a product's)."""
    total = sum(values)
    return total - total != 0.0 or min(values) < 0.0 or max(values) > ceiling


def _duplicates(samples: list) -> Duplicates:
    """C-level passes for a page without duplicates (every honest one)."""
    if len(set(map(_NAME_AND_LABELS, samples))) == len(samples):
        return _NO_DUPLICATES
    keys = list(map(_NAME_AND_LABELS, samples))
    copies: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        copies.setdefault(key, []).append(index)
    conflicting: set[int] = set()
    repeats: set[int] = set()
    for indexes in copies.values():
        if len(indexes) < 2:
            continue
        values = {repr(samples[index][2]) for index in indexes}  # repr: NaN equals NaN
        if len(values) > 1:
            conflicting.update(indexes)
        else:
            repeats.update(indexes[1:])
    return Duplicates(frozenset(conflicting), frozenset(repeats))
