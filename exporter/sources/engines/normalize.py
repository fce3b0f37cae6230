"""Engine exposition -> the normalized `llm_*` schema (exporter/catalog/engine.py).

The per-engine modules are data (table.py explains the vocabulary); this module interprets them:

1. detect the engine kind with a few substring checks on the raw page (no parsing), and pick the
   kind's table variant by the page conditions (`when`: HELP texts the parser does not read, or
   another family's presence) found on it;
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
7. validate: drop non-finite values, negative counters and whole histogram series that are not
   valid (a bad or missing `le`, no +Inf bucket, no _count or _sum, counts that fall as `le` rises,
   _count unequal to the +Inf bucket, negative or fractional counts), each with a note and counted
   by reason in NormalizedScrape.drops, and bound the series count.

Nothing is invented: a family the engine lacks has no series, never a zero.

Steady state: an engine prints the same series in the same order on every scrape, and what steps
3-7 decide depends only on the page's (name, labels) sequence and on which values are non-finite or
below a sentinel minimum, not on the values themselves (products aside: a zero divisor drops one);
the table variant is part of a page's keys. Validation depends on values too: a plan is only
recorded from a page that passed it whole (but for non-finite values, which the mask covers), and
a replay re-checks the plan's counters and histograms in a few C-level passes (_Checks) and takes
the full pass when one fails. Once a page's keys repeat, the full pass records that
decision as a _Plan: each output sample's name and labels and the scaled input samples it sums or
maxes, in the full pass's order of float operations, the notes, and the shape of the products. While
later pages have the same keys and the same value mask, normalize() only re-evaluates the plan (a
multiply per output sample, the product terms again, and their shape checked); any difference takes
the full pass, which records afresh. The output is the same with or without a warm state
(tests/test_engines_normalize.py proves it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from itertools import repeat
from operator import gt, itemgetter, ne
from types import MappingProxyType

from prometheus_client.utils import floatToGoString

from exporter.catalog import engine as engine_catalog
from exporter.snapshot import Labels, Sample
from exporter.sources.engines import llamacpp, lmdeploy, nim, sglang, tgi, triton, trtllm, vllm
from exporter.sources.engines.exposition import MAX_CACHED_CHARS, ExpositionError, LabelCache, parse
from exporter.sources.engines.table import Alias, EngineSpec, Product, When, Where

__all__ = [
    "KINDS",
    "SPECS",
    "ExpositionError",
    "NormalizedScrape",
    "NormalizerState",
    "UnknownEngineError",
    "coverage_table",
    "detect_kind",
    "normalize",
]

SPECS: Mapping[str, EngineSpec] = MappingProxyType({
    spec.kind: spec
    for spec in (vllm.SPEC, sglang.SPEC, tgi.SPEC, llamacpp.SPEC, triton.SPEC, trtllm.SPEC, lmdeploy.SPEC,
                 nim.SPEC)
})
KINDS: tuple[str, ...] = tuple(SPECS)
"""Valid engine kinds (config validation uses this)."""

# Most specific first: LMDeploy and NIM reuse vLLM's names; the unprefixed trtllm-serve names are
# NIM's too (trtllm-serve adds an `engine_type` label; NIM is only recognised by a NIM-only name).
# A NIM that also shows its backend's `vllm:` series is read as vLLM, which has more families, and
# so is Triton with the vLLM backend (its `vllm:*` series carry `model`; the vLLM table also reads
# Triton's core request counters).
DETECTION_ORDER: tuple[str, ...] = ("lmdeploy", "sglang", "llamacpp", "tgi", "trtllm", "vllm", "triton", "nim")

YIELDS_TO: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "triton": ("vllm",),
    "nim": ("trtllm", "vllm"),
})
"""Kind kept from the last page -> the more specific kinds that are checked again on every page,
because their names can join the kept kind's on the same page later: Triton registers the vLLM
backend's `vllm:*` families only when the model has loaded (its core `nv_inference_*` come first),
an idle NIM-looking page can turn out to be another engine once samples appear. Each listed kind
precedes the kept one in DETECTION_ORDER (checked at import), so this is what detect_kind would
choose; a few substring scans on these pages only."""

FINISHED = "llm_requests_finished_total"
REASONS = frozenset({"stop", "length", "abort", "error"})
"""Finish reasons kept as is; anything else becomes `other`."""
MAX_RANK = 1024
"""Ranks are decimal indexes below this; anything else becomes `other` (a bounded label)."""
ABSENT_MODELS = frozenset({"", "undefined", "None"})
"""Model label values that mean "no model" (trtllm-serve's first release printed `undefined`)."""
MAX_NOTES = 16
MAX_MAPPED_LABEL_SETS = 20_000
MAX_MAPPED_LABEL_CHARS = MAX_CACHED_CHARS
"""The route caches are cleared past this many characters of engine label values (about bytes):
they keep label tuples alive after the parser's cache has let them go."""
MAX_LE_FORMATS = 4_096
MAX_CACHED_LE_LENGTH = 64
"""Bucket bounds longer than this (no float needs more than 24 characters) are formatted every
time, not cached."""
MAX_PLAN_SAMPLES = 20_000
"""A page with more parsed samples than this is not planned (the state keeps no per-page record of
it): a cardinality bomb costs the full pass every cycle but pins no memory."""
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")

# Reasons of NormalizedScrape.drops (with the parser's label-limit reasons): the `reason` label of
# llm_exporter_series_dropped_total.
CARDINALITY = "cardinality"
NON_FINITE = "non_finite"
NEGATIVE_COUNTER = "negative_counter"
HISTOGRAM_BAD_LE = "histogram_bad_le"
HISTOGRAM_NO_INF = "histogram_no_inf"
HISTOGRAM_INCOMPLETE = "histogram_incomplete"
HISTOGRAM_NOT_MONOTONIC = "histogram_not_monotonic"
HISTOGRAM_COUNT_MISMATCH = "histogram_count_mismatch"
HISTOGRAM_FRACTIONAL = "histogram_fractional_count"
_FAULT_NOTES: Mapping[str, str] = MappingProxyType({
    NON_FINITE: "a non-finite", NEGATIVE_COUNTER: "a negative", HISTOGRAM_BAD_LE: "a bad le in a",
    HISTOGRAM_NO_INF: "an incomplete (no +Inf bucket)", HISTOGRAM_INCOMPLETE: "an incomplete (no _count or _sum)",
    HISTOGRAM_NOT_MONOTONIC: "a non-monotonic (counts fall as le rises)",
    HISTOGRAM_COUNT_MISMATCH: "an inconsistent (_count is not the +Inf bucket)",
    HISTOGRAM_FRACTIONAL: "a fractional-count",
})
_VALUE_FAULTS = frozenset({NEGATIVE_COUNTER, HISTOGRAM_NOT_MONOTONIC, HISTOGRAM_COUNT_MISMATCH, HISTOGRAM_FRACTIONAL})
"""Faults decided by values that a plan's keys and mask do not fix: a page with one is not planned."""
_BAD_LE_TEXT = "bad"
"""The `le` of a bucket whose bound is not a number, until its histogram is dropped whole."""
_INF = math.inf


class UnknownEngineError(ValueError):
    """The page matches no known engine (and no kind was configured)."""


# ---------------------------------------------------------------------------------------------
# Compiled tables: built once at import from the immutable engine specs.


@dataclass(frozen=True, slots=True)
class _Route:
    """How one engine sample name feeds one normalized sample name."""

    index: int  # position in _Compiled.route_list: the per-route label cache of NormalizerState
    slot: tuple[str, int]  # (family, priority): where candidates are collected
    name: str  # normalized sample name (family + part)
    part: str  # "", "_bucket", "_sum" or "_count"
    summed: bool  # counters and histogram parts add up on merge; gauges take the max
    scale: float
    scaled: bool  # the value itself is converted (not for bucket counts or `_count`)
    where: Where | None
    reason: str | None
    minimum: float | None
    source: str


@dataclass(frozen=True, slots=True)
class _TermRoute:
    product: int
    term: int
    where: Where | None
    label: str | None
    summed: bool


@dataclass(frozen=True, slots=True)
class _Needle:
    """A detection marker: any of `anywhere` occurs, or the page starts with `prefix`."""

    anywhere: tuple[str, ...]
    prefix: str | None


@dataclass(frozen=True, slots=True)
class _Compiled:
    spec: EngineSpec
    route_count: int
    keep: frozenset[str]
    routes: Mapping[str, tuple[_Route, ...]]
    terms: Mapping[str, tuple[_TermRoute, ...]]
    markers: tuple[tuple[_Needle, ...], ...]
    types: Mapping[str, str]
    key: str = ""
    """The table's identity in a plan: the kind, plus the page conditions (`when`) found."""
    conditions: tuple[str, ...] = ()
    """The `when` substrings of the spec's aliases and products (on the kind's base table)."""
    variants: Mapping[frozenset[str], _Compiled] | None = None
    """Conditions found on a page -> the table for it (on the base table; None without conditions)."""


def _alias_routes(source: str, alias: Alias, first_index: int) -> list[tuple[str, _Route]]:
    parts = _HISTOGRAM_PARTS if alias.type == "histogram" else ("",)
    routes = []
    for offset, part in enumerate(parts):
        routes.append((source + part, _Route(
            index=first_index + offset, slot=(alias.family, alias.priority), name=alias.family + part, part=part,
            summed=alias.type != "gauge", scale=alias.scale, scaled=part in ("", "_sum"),
            where=alias.where, reason=alias.reason, minimum=alias.minimum, source=source,
        )))
    return routes


def _needle(marker: str) -> _Needle:
    if marker.startswith("\n"):
        bare = marker[1:]
        return _Needle((marker, "# TYPE " + bare), bare)
    return _Needle((marker,), None)


def _applies(when: When | None, present: frozenset[str] | None) -> bool:
    return when is None or present is None or (when[0] in present) == when[1]


def _compile(spec: EngineSpec, present: frozenset[str] | None = None) -> _Compiled:
    """The table of `spec` for pages on which exactly the `present` conditions occur; with None,
    every alias and product (the base table: its `keep`, the union, serves every variant, so the
    parser's caches survive a change of variant)."""
    families = {fam.name: fam.type for fam in engine_catalog.FAMILIES}
    routes: dict[str, list[_Route]] = {}
    names: set[str] = set()
    types: dict[str, str] = {}
    count = 0
    for source, alias in spec.alias_items():
        if families.get(alias.family) != alias.type:
            raise ValueError(f"{spec.kind}: {source} -> {alias.family} ({alias.type}) not in the catalogue")
        types[alias.family] = alias.type
        # Route indexes do not depend on the variant: the state's per-route caches fit them all.
        for sample_name, route in _alias_routes(source, alias, count):
            names.add(sample_name)
            if _applies(alias.when, present):
                routes.setdefault(sample_name, []).append(route)
            count += 1
    terms: dict[str, list[_TermRoute]] = {}
    for index, product in enumerate(spec.products):
        if families.get(product.family) != product.type or product.type == "histogram":
            raise ValueError(f"{spec.kind}: product {product.family} ({product.type}) not in the catalogue")
        types[product.family] = product.type
        for position, term in enumerate(product.terms):
            names.add(term.source)
            if not _applies(product.when, present):
                continue
            summed = product.type == "counter" and term.label is None
            terms.setdefault(term.source, []).append(
                _TermRoute(index, position, term.where, term.label, summed))
    conditions = tuple(sorted({item.when[0] for item in (*(a for _, a in spec.alias_items()), *spec.products)
                               if item.when is not None}))
    return _Compiled(
        spec=spec,
        route_count=count,
        keep=frozenset(names),
        routes=MappingProxyType({k: tuple(v) for k, v in routes.items()}),
        terms=MappingProxyType({k: tuple(v) for k, v in terms.items()}),
        markers=tuple(tuple(_needle(m) for m in marker) for marker in spec.markers),
        types=MappingProxyType(types),
        key=spec.kind + "".join(f"|{condition!r}" for condition in sorted(present or ())),
        conditions=conditions,
    )


def _compile_kind(spec: EngineSpec) -> _Compiled:
    base = _compile(spec)
    if not base.conditions:
        return base
    if len(base.conditions) > 4:
        raise ValueError(f"{spec.kind}: too many page conditions ({len(base.conditions)})")
    variants = {}
    for mask in range(1 << len(base.conditions)):
        present = frozenset(c for bit, c in enumerate(base.conditions) if mask >> bit & 1)
        variants[present] = replace(_compile(spec, present), keep=base.keep)
    return replace(base, variants=MappingProxyType(variants))


def _table(kind: str, text: str) -> _Compiled:
    """The kind's table for this page: one substring scan per page condition of the kind."""
    base = _COMPILED[kind]
    if base.variants is None:
        return base
    return base.variants[frozenset(c for c in base.conditions if c in text)]


_COMPILED: Mapping[str, _Compiled] = MappingProxyType({kind: _compile_kind(spec) for kind, spec in SPECS.items()})
assert set(DETECTION_ORDER) == set(KINDS)
assert all(DETECTION_ORDER.index(more) < DETECTION_ORDER.index(kept)
           for kept, specific in YIELDS_TO.items() for more in specific)


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


class NormalizerState:
    """Per-target memory kept across cycles: the parser's label cache, what each engine label set
    becomes under each alias (so a label set seen last cycle costs one dict lookup), and the last
    detected kind (checked first, so detection costs one or two substring scans once a target is
    known, and a page that momentarily lacks its markers keeps its kind), and the plan of the last
    page whose keys repeated (see the module docstring). Every cache is bounded and simply cleared
    when full; the plan is one page's, and only for a page of at most MAX_PLAN_SAMPLES samples."""

    __slots__ = ("_entries", "_entries_for", "_entry_chars", "_entry_count", "_le", "_plan", "_seen", "label_cache",
                 "last_kind")

    def __init__(self) -> None:
        self.label_cache = LabelCache()
        self.last_kind: str | None = None
        self._entries: list[dict[Labels, object]] = []
        self._entries_for: tuple[str, str] | None = None
        self._entry_count = 0
        self._entry_chars = 0
        self._le: dict[tuple[str, float], str | None] = {}
        self._plan: _Plan | None = None
        self._seen: tuple | None = None
        """(kind, target, names, labels) of the last page that took the full pass."""

    def route_entries(self, kind: str, target: str, route_count: int) -> list[dict[Labels, object]]:
        """One dict per route of `kind`: engine labels -> mapped entry (see _Run._entry)."""
        if (self._entries_for != (kind, target) or self._entry_count >= MAX_MAPPED_LABEL_SETS
                or self._entry_chars >= MAX_MAPPED_LABEL_CHARS):
            self._entries = [{} for _ in range(route_count)]
            self._entries_for = (kind, target)
            self._entry_count = 0
            self._entry_chars = 0
        return self._entries

    def counted(self, added: int, chars: int = 0) -> None:
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
            return _format_le(raw, scale)
        key = (raw, scale)
        formatted = self._le.get(key, "")
        if formatted == "":
            if len(self._le) >= MAX_LE_FORMATS:
                self._le.clear()
            formatted = self._le[key] = _format_le(raw, scale)
        return formatted


def detect_kind(text: str) -> str | None:
    """The engine kind of an exposition, from cheap substring checks; None when unknown."""
    for kind in DETECTION_ORDER:
        if _matches(text, _COMPILED[kind].markers):
            return kind
    return None


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
    and value arithmetic, no mapping); None when it needs the full pass of `normalize`."""
    return _normalize(text, target, kind, state, max_series, replay_only=True)


def _normalize(text: str, target: str, kind: str | None, state: NormalizerState, max_series: int,
               *, replay_only: bool) -> NormalizedScrape | None:
    if replay_only and state._plan is None:
        return None  # nothing to replay: parsing here would only be repeated by the full pass
    notes: dict[str, None] = {}
    kind = _resolve_kind(text, kind, state, notes)
    compiled = _table(kind, text)
    exposition = parse(text, keep=compiled.keep.__contains__, label_cache=state.label_cache)
    parsed = exposition.samples
    if parsed:
        names, labels, values, _ = zip(*parsed, strict=True)
    else:
        names = labels = values = ()
    plan = state._plan
    replayed = None
    if plan is not None and plan.fits(compiled.key, target, max_series, names, labels, values):
        replayed = plan.replay(compiled, state, dict(notes), target, values)
    if replayed is not None:
        model, samples, unmapped, dropped, notes, drops = replayed
    elif replay_only:
        return None
    else:
        # Record a plan once the page's keys repeat: a first scrape, or a page that changes shape
        # every cycle, pays nothing for it.
        seen = (compiled.key, target, names, labels) if len(parsed) <= MAX_PLAN_SAMPLES else None
        record = seen is not None and seen == state._seen
        run = _Run(compiled, state, notes, target, record=record)
        run.consume(parsed)
        samples, dropped = run.finish(max_series)
        model, unmapped, drops = run.model, run.unmapped, run.drops
        # A page that failed validation on its values is not planned: the next one may pass.
        planned = record and not run.invalid
        state._plan = run.plan(compiled.key, max_series, names, labels, values, dropped) if planned else None
        state._seen = seen
    if exposition.rejected:
        drops = dict(drops)
        for reason, count in exposition.rejected.items():
            drops[reason] = drops.get(reason, 0) + count
    return NormalizedScrape(
        kind=kind,
        flavor=_flavor(text, compiled.spec),
        model=model or "",
        samples=samples,
        unmapped_samples=exposition.dropped_samples + unmapped,
        dropped_series=dropped,
        notes=tuple(notes)[:MAX_NOTES],
        drops=MappingProxyType(dict(drops)) if drops else _NO_DROPS,
    )


_NO_DROPS: Mapping[str, int] = MappingProxyType({})


# ---------------------------------------------------------------------------------------------
# Detection


def _matches(text: str, markers: tuple[tuple[_Needle, ...], ...]) -> bool:
    return any(all(_found(text, needle) for needle in marker) for marker in markers)


def _found(text: str, needle: _Needle) -> bool:
    if needle.prefix is not None and text.startswith(needle.prefix):
        return True
    return any(part in text for part in needle.anywhere)


def _resolve_kind(text: str, kind: str | None, state: NormalizerState, notes: dict[str, None]) -> str:
    if kind is not None:
        if kind not in SPECS:
            raise UnknownEngineError(f"unknown engine kind {kind!r}; expected one of {', '.join(KINDS)}")
        state.last_kind = kind
        return kind
    last = state.last_kind
    if last is not None and _matches(text, _COMPILED[last].markers) and not any(
            _matches(text, _COMPILED[specific].markers) for specific in YIELDS_TO.get(last, ())):
        return last
    detected = detect_kind(text)
    if detected is None:
        if last is None:
            # An HTML error page or garbage is a parse failure, not an unknown engine: say so.
            parse(text, keep=_keep_nothing)
            raise UnknownEngineError("the page matches no known engine (" + ", ".join(KINDS) + ")")
        notes[f"no {last} metric names on the page; kept the last detected kind"] = None
        return last
    if last is not None and detected != last:
        notes[f"engine kind changed from {last} to {detected}"] = None
    state.last_kind = detected
    return detected


def _keep_nothing(_name: str) -> bool:
    return False


def _flavor(text: str, spec: EngineSpec) -> str:
    for marker, flavor in spec.flavors:
        if marker in text:
            return flavor
    return spec.default_flavor


# ---------------------------------------------------------------------------------------------
# Label and value mapping


def _format_le(raw: str, scale: float) -> str | None:
    """Prometheus float formatting of a bucket bound after unit conversion ("0.001", "2.5", "1.0",
    "+Inf"): what Prometheus 3 normalizes `le` to, so "1" and "1.0" are one series. Decimal keeps
    "250" ms exactly "0.25" s."""
    try:
        number = float(raw)
    except ValueError:
        return None
    if math.isnan(number):
        return None
    if math.isinf(number):
        return floatToGoString(number)
    if scale != 1.0:
        try:
            number = float(Decimal(raw.strip()) * Decimal(repr(scale)))
        except InvalidOperation:
            number *= scale
    return floatToGoString(number)


def _bound_rank(value: str) -> str:
    if value.isdigit() and int(value) < MAX_RANK:
        return str(int(value))
    return "other"


def _bound_reason(value: str) -> str:
    lowered = value.lower()
    return lowered if lowered in REASONS else "other"


def _map_labels(labels: Labels, spec: EngineSpec) -> tuple | None:
    """(model, rank, reason, le) of an engine label set, or None for a rank copy to skip."""
    model = rank = reason = le = None
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
            reason = _bound_reason(value)
    return (model, rank, reason, le)


def _label_tuple(target: str, kind: str, model: str | None, rank: str | None, reason: str | None,
                 le: str | None) -> Labels:
    # Built in sorted order directly: engine < le < model < rank < reason < target.
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
    return tuple(pairs)


# ---------------------------------------------------------------------------------------------
# One normalization pass

_SKIP = False
"""Entry of a label set that is a tensor-parallel copy (kept by rank 0)."""

_NOTE, _MINIMUM, _TERM = 0, 1, 2
"""Kinds of _Run.events, what a replay redoes in page order: a fixed note, the value-dependent note
of a sentinel value, a product term."""


def _minimum_note(source: str, value: float) -> str:
    return f"dropped {source} = {value:g} (the engine's 'not available' value)"


def _value_mask(values: Sequence[float]) -> tuple[int, ...]:
    """Indexes of the non-finite values: () in one C-level pass when the sum is finite."""
    total = sum(values)
    if total - total == 0.0:
        return ()
    return tuple(index for index, value in enumerate(values) if value - value != 0.0)


class _Run:
    """The mutable work of one normalize() call; never outlives it. With `record`, it also notes
    where every candidate value comes from, so that plan() can describe the page (see _Plan)."""

    def __init__(self, compiled: _Compiled, state: NormalizerState, notes: dict[str, None], target: str,
                 record: bool = False) -> None:
        self.compiled = compiled
        self.state = state
        self.notes = notes
        self.target = target
        self.unmapped = 0
        self.model: str | None = None
        self.candidates: dict[tuple[str, int], dict[tuple[str, Labels], float]] = {}
        self.group_of: dict[tuple[str, Labels], Labels] = {}
        """Histogram part -> the labels of its whole series (without `le`)."""
        self.unfilled: dict[tuple[str, Labels], tuple] = {}
        self.terms: dict[tuple[int, int], dict[tuple, float]] = {}
        self.product_writes: list[tuple[tuple[str, int], tuple[str, Labels]]] = []
        """(slot, key) of each product value written, in order: the products' shape."""
        self.record = record
        self.sources: dict[tuple[tuple[str, int], tuple[str, Labels]], list | None] = {}
        """With `record`: (slot, key) -> groups of (sample index, scale) it folds, None for a product."""
        self.events: list[tuple] = []
        self.minimum_checks: list[tuple[int, float]] = []
        self.refs: list[tuple[tuple[str, int], tuple[str, Labels]]] = []
        self.note_log: list[str] | None = None
        self.drops: dict[str, int] = {}
        """Series dropped by reason (NormalizedScrape.drops)."""
        self.invalid = False
        """A drop decided by values (not by the page's keys and non-finite mask): no plan."""

    def drop(self, reason: str, count: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + count

    def note(self, text: str) -> None:
        if self.note_log is not None:
            self.note_log.append(text)
        if len(self.notes) < MAX_NOTES:
            self.notes[text] = None

    def _entry(self, route: _Route, labels: Labels) -> object:
        """What a label set becomes under a route: None when the route does not apply (selector,
        bucket without le), _SKIP for a rank copy, else (labels out, group labels, model, parts)
        where parts rebuild the labels once the page's model is known. A bucket whose bound is not
        a number gets le=_BAD_LE_TEXT, so that its whole histogram is dropped by finish()."""
        mapped = _map_labels(labels, self.compiled.spec)
        if mapped is None:
            return _SKIP
        if route.where is not None and route.where not in labels:
            return None
        model, rank, reason, le = mapped
        if route.part == "_bucket":
            if le is None:
                return None
            le = self.state.format_le(le, route.scale)
            if le is None:
                le = _BAD_LE_TEXT
        else:
            le = None
        reason = (reason or route.reason) if route.reason is not None else None
        kind = self.compiled.spec.kind
        out = _label_tuple(self.target, kind, model, rank, reason, le)
        group = out if le is None else _label_tuple(self.target, kind, model, rank, reason, None)
        return (out, group, model, (rank, reason, le))

    def consume(self, samples: list) -> None:
        routes_of = self.compiled.routes
        terms_of = self.compiled.terms
        entries = self.state.route_entries(self.compiled.spec.kind, self.target, self.compiled.route_count)
        candidates = self.candidates
        group_of = self.group_of
        record = self.record
        sources = self.sources
        events = self.events
        added = added_chars = 0
        room = self.state.room()
        chars_room = self.state.chars_room()
        for index, (name, labels, value, _timestamp) in enumerate(samples):
            used = skipped = False
            for route in routes_of.get(name, ()):
                cache = entries[route.index]
                entry = cache.get(labels, None)
                if entry is None and labels not in cache:
                    entry = self._entry(route, labels)
                    if added < room and added_chars < chars_room:
                        cache[labels] = entry
                        added += 1
                        added_chars += _labels_chars(labels)
                if not entry:
                    skipped = skipped or entry is _SKIP
                    continue
                used = True
                out, group, model, parts = entry
                if record and route.minimum is not None:
                    self.minimum_checks.append((index, route.minimum))
                # NaN or +-Inf, without two calls into math. A histogram part goes on: finish()
                # drops its whole histogram.
                if value - value != 0.0 and not route.part:
                    text = f"dropped a non-finite value of {route.source}"
                    self.note(text)
                    self.drop(NON_FINITE)
                    if record:
                        events.append((_NOTE, text))
                    continue
                if route.minimum is not None and value < route.minimum:
                    self.note(_minimum_note(route.source, value))
                    if record:
                        events.append((_MINIMUM, route.source, index))
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
                    if record:
                        sources[(route.slot, key)] = [[(index, route.scale if route.scaled else 1.0)]]
                else:
                    if route.summed:
                        bucket[key] = previous + value
                    elif value > previous:
                        bucket[key] = value
                    if record:
                        sources[(route.slot, key)][-1].append((index, route.scale if route.scaled else 1.0))
            for term in terms_of.get(name, ()):
                mapped = _map_labels(labels, self.compiled.spec)
                if mapped is None:
                    skipped = True
                elif term.where is None or term.where in labels:
                    used = True
                    self._add_term(term, mapped, labels, value)
                    if record:
                        events.append((_TERM, term, mapped, labels, index))
            if not used and not skipped:
                self.unmapped += 1
        self.state.counted(added, added_chars)

    def _add_term(self, term: _TermRoute, mapped: tuple, labels: Labels, value: float) -> None:
        model, rank = mapped[0], mapped[1]
        if term.label is not None:
            raw = dict(labels).get(term.label)
            try:
                value = float(raw) if raw is not None else math.nan
            except ValueError:
                value = math.nan
        product = self.compiled.spec.products[term.product]
        if value - value != 0.0:
            self.note(f"{product.family}: no number in {product.terms[term.term].source}"
                      + (f" label {term.label}" if term.label else ""))
            return
        if model is not None and self.model is None:
            self.model = model
        values = self.terms.setdefault((term.product, term.term), {})
        key = (model, rank)
        previous = values.get(key)
        if previous is None:
            values[key] = value
        elif term.summed:
            values[key] = previous + value
        else:
            values[key] = max(previous, value)

    def _products(self) -> None:
        kind = self.compiled.spec.kind
        for index, product in enumerate(self.compiled.spec.products):
            first = self.terms.get((index, 0))
            others = [self.terms.get((index, position)) for position in range(1, len(product.terms))]
            if not first or any(not values for values in others):
                continue
            for (model, rank), value in first.items():
                result = self._product_value(product, value, others, (model, rank))
                if result is None:
                    continue
                out = _label_tuple(self.target, kind, model or self.model, rank, None, None)
                slot = (product.family, product.priority)
                bucket = self.candidates.setdefault(slot, {})
                key = (product.family, out)
                bucket[key] = result
                self.product_writes.append((slot, key))
                if self.record:
                    self.sources[(slot, key)] = None

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
        kind = self.compiled.spec.kind
        sources = self.sources
        for slot, bucket in self.candidates.items():
            summed = self.compiled.types[slot[0]] != "gauge"
            for key in [key for key in bucket if key in self.unfilled]:
                rank, reason, le = self.unfilled[key]
                value = bucket.pop(key)
                self.group_of.pop(key, None)
                out = _label_tuple(self.target, kind, self.model, rank, reason, le)
                group = _label_tuple(self.target, kind, self.model, rank, reason, None)
                new_key = (key[0], out)
                previous = bucket.get(new_key)
                if previous is None:
                    bucket[new_key] = value
                    if key[0] != slot[0]:  # a histogram part
                        self.group_of[new_key] = group
                    if self.record:
                        sources[(slot, new_key)] = sources.pop((slot, key))
                else:
                    bucket[new_key] = previous + value if summed else max(previous, value)
                    if self.record:
                        sources[(slot, new_key)] = sources[(slot, new_key)] + sources.pop((slot, key))

    def finish(self, max_series: int) -> tuple[tuple[Sample, ...], int]:
        self._fill_model()
        self._products()
        if self.record:
            self.note_log = []
        best: dict[str, int] = {}
        for family, priority in self.candidates:
            if priority > best.get(family, priority - 1):
                best[family] = priority
        types = self.compiled.types
        samples: list[Sample] = []
        dropped = 0
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
            dropped += max(0, len(items) - room)
            kept = items[:max(room, 0)]
            samples.extend([Sample(name, labels, value) for (name, labels), value in kept])
            if self.record:
                self.refs.extend([((family, priority), key) for key, _value in kept])
        if dropped:
            self.note(f"dropped {dropped} series over the limit of {max_series}")
            self.drop(CARDINALITY, dropped)
        return tuple(samples), dropped

    def _emit_histograms(self, slot: tuple[str, int], chosen: dict, samples: list[Sample], max_series: int) -> int:
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
            fault = _histogram_fault(family, members)
            if fault is not None:
                self.note(f"dropped {_FAULT_NOTES[fault]} {family} histogram")
                self.drop(fault, len(members))
                # The others follow from the page's keys and non-finite mask, which a plan fits.
                self.invalid = self.invalid or fault in _VALUE_FAULTS
                continue
            if len(samples) + len(members) > max_series:
                dropped += len(members)
                continue
            samples.extend([Sample(name, labels, value) for (name, labels), value in members])
            if self.record:
                self.refs.extend([(slot, key) for key, _value in members])
        return dropped

    def plan(self, kind: str, max_series: int, names: tuple, labels: tuple, values: tuple,
             dropped: int) -> _Plan:
        """The recorded decisions of this (finished, recording) run as a _Plan."""
        out_names: list[str] = []
        out_labels: list[Labels] = []
        first_index: list[int] = []
        scaled: list[tuple[int, int, float]] = []
        folds: list[tuple[int, list, bool]] = []
        products: list[tuple[int, tuple[str, int], tuple[str, Labels]]] = []
        types = self.compiled.types
        for position, (slot, key) in enumerate(self.refs):
            out_names.append(key[0])
            out_labels.append(key[1])
            groups = self.sources[(slot, key)]
            if groups is None:
                first_index.append(0)
                products.append((position, slot, key))
                continue
            index, scale = groups[0][0]
            first_index.append(index)
            if len(groups) > 1 or len(groups[0]) > 1:
                folds.append((position, groups, types[slot[0]] != "gauge"))
            elif scale != 1.0:
                scaled.append((position, index, scale))
        return _Plan(
            kind=kind, target=self.target, max_series=max_series, names=names, labels=labels,
            mask=_value_mask(values), minimum_checks=tuple(self.minimum_checks),
            below=tuple(values[index] < minimum for index, minimum in self.minimum_checks),
            events=tuple(self.events), model=self.model, unmapped=self.unmapped,
            product_writes=self.product_writes, out_names=tuple(out_names), out_labels=tuple(out_labels),
            pick=_picker(first_index), scaled=tuple(scaled), folds=tuple(folds),
            products=tuple(products), finish_notes=tuple(self.note_log or ()), dropped=dropped,
            drops=MappingProxyType(dict(self.drops)), checks=self._checks(),
        )

    def _checks(self) -> _Checks:
        """What a replay must re-check on the values of this run's output (see _Checks)."""
        types = self.compiled.types
        nonnegative: list[int] = []
        histograms: dict[tuple[str, Labels], tuple[list, list, list]] = {}
        for position, (slot, key) in enumerate(self.refs):
            family = slot[0]
            kind = types[family]
            if kind == "counter":
                nonnegative.append(position)
            elif kind == "histogram":
                nonnegative.append(position)
                buckets, counts, _ = entry = histograms.setdefault((family, self.group_of[key]), ([], [], []))
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
        return _Checks(_positions(nonnegative), _positions(lower), _positions(upper), _positions(last),
                       _positions(totals), _positions(whole))


_new_sample = tuple.__new__
"""tuple.__new__(Sample, (name, labels, value)) is what Sample(name, labels, value) does, without
the Python-level __new__ call."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one page (its kind, target, max_series, (name, labels) sequence and value mask) becomes,
    recorded by a full pass: re-evaluated for the next page with the same keys and mask."""

    kind: str
    """The table's key (_Compiled.key): the kind and the page conditions found on the page."""
    target: str
    max_series: int
    names: tuple[str, ...]
    labels: tuple[Labels, ...]
    mask: tuple[int, ...]
    """Indexes of the non-finite input values."""
    minimum_checks: tuple[tuple[int, float], ...]
    below: tuple[bool, ...]
    """Per minimum check: the value was below the alias minimum (dropped)."""
    events: tuple[tuple, ...]
    model: str | None
    unmapped: int
    product_writes: list
    out_names: tuple[str, ...]
    out_labels: tuple[Labels, ...]
    pick: Callable[[tuple[float, ...]], list[float]]
    """The input values -> per output sample, the value of its first input sample (a placeholder
    for a product): the whole value when it has one input and no scale."""
    scaled: tuple[tuple[int, int, float], ...]
    """(output position, input index, scale) for a single input that is scaled."""
    folds: tuple[tuple[int, list, bool], ...]
    """(output position, groups of (input index, scale), summed) for merged series."""
    products: tuple[tuple[int, tuple[str, int], tuple[str, Labels]], ...]
    finish_notes: tuple[str, ...]
    dropped: int
    drops: Mapping[str, int]
    """The run's drops by reason: the same for every page that fits (non-finite values only)."""
    checks: _Checks

    def fits(self, kind: str, target: str, max_series: int, names: tuple, labels: tuple,
             values: tuple) -> bool:
        return (kind == self.kind and target == self.target and max_series == self.max_series
                and names == self.names and labels == self.labels and _value_mask(values) == self.mask
                and tuple(values[index] < minimum for index, minimum in self.minimum_checks) == self.below)

    def replay(self, compiled: _Compiled, state: NormalizerState, notes: dict[str, None], target: str,
               values: tuple) -> tuple | None:
        """(model, samples, unmapped, dropped, notes, drops) of a page that fits, or None when its
        products come out in another shape (a division by zero appeared or went away) or its values
        fail validation (the full pass then says which)."""
        run = _Run(compiled, state, notes, target)
        run.model = self.model
        for event in self.events:
            if event[0] == _TERM:
                run._add_term(event[1], event[2], event[3], values[event[4]])
            elif event[0] == _NOTE:
                run.note(event[1])
            else:
                run.note(_minimum_note(event[1], values[event[2]]))
        run._products()
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
        return self.model, samples, self.unmapped, self.dropped, notes, self.drops


@dataclass(frozen=True, slots=True)
class _Checks:
    """Validation of a replayed page's output values, all C-level passes over positions: the
    counters and histogram parts are not negative, each histogram's buckets do not fall as `le`
    rises (`lower` <= `upper`, pairwise), its +Inf bucket (`last`) equals its _count (`totals`), and
    its counts (`whole`) are whole numbers. Non-finite values change the plan's mask instead."""

    nonnegative: Callable[[list], tuple]
    lower: Callable[[list], tuple]
    upper: Callable[[list], tuple]
    last: Callable[[list], tuple]
    totals: Callable[[list], tuple]
    whole: Callable[[list], tuple]

    def passed(self, out: list[float]) -> bool:
        values = self.nonnegative(out)
        if values and min(values) < 0.0:
            return False
        if any(map(gt, self.lower(out), self.upper(out))) or any(map(ne, self.last(out), self.totals(out))):
            return False
        return all(map(float.is_integer, self.whole(out)))


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


def _labels_chars(labels: Labels) -> int:
    """Approximate size of a label set in characters, for the route caches' bound."""
    return 16 * len(labels) + sum([len(value) for _, value in labels])


def _picker(indexes: list[int]) -> Callable[[tuple[float, ...]], list[float]]:
    if len(indexes) > 1:
        getter = itemgetter(*indexes)
        return lambda values: list(getter(values))
    return lambda values: [values[index] for index in indexes]


def _fold(values: tuple, groups: list, summed: bool) -> float:
    """A merged series' value, in the order the full pass computes it: each group is folded in page
    order (consume), then the groups one after another (_fill_model)."""
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


def _histogram_fault(family: str, members: list) -> str | None:
    """Why one histogram series (its buckets, _sum and _count after merging) is not valid, or None:
    what a strict OpenMetrics parser and histogram_quantile() need. O(buckets), once per page that
    takes the full pass; replays use _Checks."""
    bucket_name = family + "_bucket"
    count_name = family + "_count"
    buckets: list[tuple[float, float]] = []
    count = total = None
    for (name, labels), value in members:
        if value - value != 0.0:
            return NON_FINITE
        if name == bucket_name:
            le = next((v for k, v in labels if k == "le"), _BAD_LE_TEXT)
            if le == _BAD_LE_TEXT:
                return HISTOGRAM_BAD_LE
            buckets.append((float(le), value))
        elif name == count_name:
            count = value
        else:
            total = value
    buckets.sort()
    if not buckets or buckets[-1][0] != _INF:
        return HISTOGRAM_NO_INF
    if count is None or total is None:
        return HISTOGRAM_INCOMPLETE
    if count < 0.0 or total < 0.0 or buckets[0][1] < 0.0:
        return NEGATIVE_COUNTER
    previous = 0.0
    for _, value in buckets:
        if value < previous:
            return HISTOGRAM_NOT_MONOTONIC
        previous = value
    if count != previous:
        return HISTOGRAM_COUNT_MISMATCH
    if not count.is_integer() or not all(value.is_integer() for _, value in buckets):
        return HISTOGRAM_FRACTIONAL
    return None


# ---------------------------------------------------------------------------------------------
# Coverage (docs/metrics.md, docs/engines.md)


def coverage(kind: str) -> dict[str, list[str]]:
    """Normalized family -> the engine names feeding it, highest priority first."""
    spec = SPECS[kind]
    entries: dict[str, list[tuple[int, str]]] = {}
    for source, alias in spec.alias_items():
        shown = source + (f'{{{alias.where[0]}="{alias.where[1]}"}}' if alias.where else "")
        entries.setdefault(alias.family, []).append((alias.priority, shown))
    for product in spec.products:
        shown = " x ".join(
            ("1/" if term.divide else "") + term.source
            + (f'{{{term.where[0]}="{term.where[1]}"}}' if term.where else "")
            + (f"[{term.label}]" if term.label else "")
            for term in product.terms)
        entries.setdefault(product.family, []).append((product.priority, shown))
    return {family: [name for _, name in sorted(items, key=lambda item: -item[0])]
            for family, items in entries.items()}


def coverage_table() -> str:
    """Markdown table engine x normalized family: ✔ where an engine feeds the family, – where the
    series is absent (never a made-up zero). Generated from the alias tables."""
    covered = {kind: coverage(kind) for kind in KINDS}
    header = "| Family | " + " | ".join(SPECS[kind].title for kind in KINDS) + " |"
    rule = "|---|" + "---|" * len(KINDS)
    rows = [header, rule]
    for fam in engine_catalog.FAMILIES:
        if fam.name in ("llm_engine_up", "llm_engine_info"):
            continue
        cells = ["✔" if fam.name in covered[kind] else "–" for kind in KINDS]
        rows.append(f"| `{fam.name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
