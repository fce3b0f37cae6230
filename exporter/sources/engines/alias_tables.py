"""The alias tables, compiled: each engine kind's EngineSpec (data, table.py) turned once at import
into the lookups the normalization pass runs on.

A Table maps each engine sample name the kind knows to its Routes (which normalized sample it
feeds, with what scale, selector and label defaults) and TermRoutes (a product's factors), and
gives the set of names the parser keeps (`keep`). A spec whose aliases depend on page conditions
(`when`) gets one variant per combination of conditions, chosen per page by `table_for`.
`TABLES` is every registered kind's table; tests/mutation_rebuild.py rebuilds it for mutants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from exporter.catalog import engine as engine_catalog
from exporter.sources.engines.registry import SPECS
from exporter.sources.engines.table import Alias, EngineSpec, Product, When, Where

__all__ = ["TABLES", "Route", "Slot", "Table", "TermRoute", "table_for"]

_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")

Slot = tuple[str, int]
"""(normalized family, alias priority): where the candidates of one alias priority are collected."""


@dataclass(frozen=True, slots=True)
class Route:
    """How one engine sample name feeds one normalized sample name."""

    index: int  # 0 .. Table.route_count - 1: its label cache in NormalizerState.route_entries
    slot: Slot
    name: str  # normalized sample name (family + part)
    part: str  # "", "_bucket", "_sum" or "_count"
    summed: bool  # counters and histogram parts add up on merge; gauges take the max
    scale: float
    scaled: bool  # the value itself is converted (not for bucket counts or `_count`)
    where: Where | None
    reason: str | None
    tier: str | None
    minimum: float | None
    source: str


@dataclass(frozen=True, slots=True)
class TermRoute:
    product: int
    term: int
    where: Where | None
    label: str | None
    summed: bool


@dataclass(frozen=True, slots=True)
class Table:
    """One engine kind's compiled table (or one variant of it, by page conditions)."""

    spec: EngineSpec
    route_count: int
    keep: frozenset[str]
    routes: Mapping[str, tuple[Route, ...]]
    terms: Mapping[str, tuple[TermRoute, ...]]
    types: Mapping[str, str]
    ceilings: Mapping[str, float]
    """Family -> its largest valid value (catalog Family.ceiling); every family's smallest is 0."""
    key: str = ""
    """The table's identity in a plan: the kind, plus the page conditions (`when`) found."""
    conditions: tuple[str, ...] = ()
    """The `when` substrings of the spec's aliases and products (on the kind's base table)."""
    variants: Mapping[frozenset[str], Table] | None = None
    """Conditions found on a page -> the table for it (on the base table; None without conditions)."""


def _alias_routes(source: str, alias: Alias, first_index: int) -> list[tuple[str, Route]]:
    parts = _HISTOGRAM_PARTS if alias.type == "histogram" else ("",)
    routes = []
    for offset, part in enumerate(parts):
        routes.append((source + part, Route(
            index=first_index + offset, slot=(alias.family, alias.priority), name=alias.family + part, part=part,
            summed=alias.type != "gauge", scale=alias.scale, scaled=part in ("", "_sum"),
            where=alias.where, reason=alias.reason, tier=alias.tier, minimum=alias.minimum, source=source,
        )))
    return routes


def _applies(when: When | None, present: frozenset[str] | None) -> bool:
    return when is None or present is None or (when[0] in present) == when[1]


def _compile(spec: EngineSpec, present: frozenset[str] | None = None) -> Table:
    """The table of `spec` for pages on which exactly the `present` conditions occur; with None,
    every alias and product (the base table: its `keep`, the union, serves every variant, so the
    parser's caches survive a change of variant)."""
    families = {fam.name: fam.type for fam in engine_catalog.FAMILIES}
    ceilings = {fam.name: fam.ceiling for fam in engine_catalog.FAMILIES}
    routes: dict[str, list[Route]] = {}
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
    terms: dict[str, list[TermRoute]] = {}
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
                TermRoute(index, position, term.where, term.label, summed))
    conditional: tuple[Alias | Product, ...] = (*(a for _, a in spec.alias_items()), *spec.products)
    conditions = tuple(sorted({item.when[0] for item in conditional if item.when is not None}))
    return Table(
        spec=spec,
        route_count=count,
        keep=frozenset(names),
        routes=MappingProxyType({k: tuple(v) for k, v in routes.items()}),
        terms=MappingProxyType({k: tuple(v) for k, v in terms.items()}),
        types=MappingProxyType(types),
        ceilings=MappingProxyType({family: ceilings[family] for family in types}),
        key=spec.kind + "".join(f"|{condition!r}" for condition in sorted(present or ())),
        conditions=conditions,
    )


def _compile_kind(spec: EngineSpec) -> Table:
    unknown = sorted({name for _, name in spec.roles} - set(engine_catalog.ROLES))
    if unknown:
        raise ValueError(f"{spec.kind}: roles {unknown} not in {engine_catalog.ROLES}")
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


def table_for(kind: str, text: str) -> Table:
    """The kind's table for this page: one substring scan per page condition of the kind."""
    base = TABLES[kind]
    if base.variants is None:
        return base
    return base.variants[frozenset(c for c in base.conditions if c in text)]


TABLES: Mapping[str, Table] = MappingProxyType({kind: _compile_kind(spec) for kind, spec in SPECS.items()})
