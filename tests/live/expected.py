"""What the exporter must export for one native engine page, worked out from the page itself.

An independent reading of the alias tables (exporter/sources/engines/*.py): the page is parsed with
prometheus_client's parser (not ours), each alias's native samples are scaled and summed, the
highest priority present wins, and products multiply their terms. The result is compared with the
exporter's /metrics as totals per normalized sample name (and `le` for buckets), so a wrong unit,
alias, priority, merge or bucket shows, whatever the labels.
"""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.engines.table import Alias, EngineSpec

Key = tuple[str, float | None]  # (normalized sample name, le bound for buckets)


def native_samples(page: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(page) for s in family.samples]


def _applies(condition: tuple[str, bool] | None, page: str) -> bool:
    return condition is None or (condition[0] in page) == condition[1]


def _alias_values(source: str, alias: Alias, samples, page: str) -> dict[Key, float]:
    out: dict[Key, float] = defaultdict(float)
    if not _applies(alias.when, page):
        return out
    parts = ("_bucket", "_sum", "_count") if alias.type == "histogram" else ("",)
    for name, labels, value in samples:
        for part in parts:
            if name != source + part:
                continue
            if alias.where is not None and labels.get(alias.where[0]) != alias.where[1]:
                continue
            if alias.minimum is not None and value < alias.minimum:
                continue
            if not math.isfinite(value):
                continue
            if part == "_bucket":
                le = float(labels["le"])
                out[(alias.family + part, le * alias.scale if math.isfinite(le) else le)] += value
            elif part == "_count":
                out[(alias.family + part, None)] += value
            else:
                out[(alias.family + part, None)] += value * alias.scale
    return out


def expected_totals(spec: EngineSpec, page: str) -> dict[Key, float]:
    samples = native_samples(page)
    by_family: dict[str, dict[int, dict[Key, float]]] = defaultdict(dict)
    for source, alias in spec.alias_items():
        values = _alias_values(source, alias, samples, page)
        if not values:
            continue
        slot = by_family[alias.family].setdefault(alias.priority, defaultdict(float))
        for key, value in values.items():
            slot[key] += value
    totals: dict[Key, float] = {}
    for priorities in by_family.values():
        totals.update(priorities[max(priorities)])
    for product in spec.products:
        if not _applies(product.when, page) or product.family in {k[0] for k in totals}:
            continue
        value = 1.0
        for term in product.terms:
            found = [labels.get(term.label) if term.label else v for n, labels, v in samples if n == term.source]
            numbers = [float(x) for x in found if x not in (None, "None")]
            if len(numbers) != 1:  # the tiny engines run one rank: one info sample
                value = math.nan
                break
            value = value / numbers[0] if term.divide else value * numbers[0]
        if math.isfinite(value):
            totals[(product.family, None)] = value
    return totals


def exporter_totals(page: str, target: str, families: set[str]) -> dict[Key, float]:
    """The exporter's engine families for one target, summed over labels (le kept)."""
    out: dict[Key, float] = defaultdict(float)
    for name, labels, value in native_samples(page):
        if labels.get("target") != target:
            continue
        base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        if base not in families and name not in families:
            continue
        out[(name, float(labels["le"]) if name.endswith("_bucket") else None)] += value
    return out
