"""Snapshot -> Prometheus exposition bytes, rendered at most once per snapshot and then served as is.

Rendering on every scrape would cost more than node_exporter's whole scrape (design.md), so a
cycle's page is rendered by the first scrape that asks for it (collect.Published) and the server
hands out the cached bytes after that."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import add, itemgetter

from exporter import catalog
from exporter.catalog.base import Family
from exporter.snapshot import SPECIAL_VALUES as _SPECIAL_VALUES
from exporter.snapshot import Sample

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"




def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return "{" + inner + "}" if inner else ""


MAX_CACHED_LABEL_SETS = 50_000
MAX_CACHED_LABEL_CHARS = 16 << 20
"""The label-set cache is also cleared past this many characters (about bytes) of label text it
holds: engines' label values are capped (exposition.MAX_LABEL_VALUE_LENGTH), but fresh long values
every cycle would otherwise keep up to MAX_CACHED_LABEL_SETS of them formatted."""

_name_of = itemgetter(0)
_labels_of = itemgetter(1)
_value_of = itemgetter(2)


@dataclass(frozen=True, slots=True)
class _PagePlan:
    """A whole page's layout: for input position lists of the same (name, labels) sequence, which
    sample goes on which line and what precedes its value there."""

    names: tuple[str, ...]
    labels: tuple[tuple, ...]
    order: tuple[int, ...]
    """Input positions in output order (samples of unknown families left out)."""
    prefixes: tuple[str, ...]
    """Per output line: HELP/TYPE when it starts a family, then `name{labels} `."""

    def render(self, samples: tuple[Sample, ...], footer: str) -> bytes:
        if not self.order:
            return footer.encode()
        picked = itemgetter(*self.order)(samples) if len(self.order) > 1 else (samples[self.order[0]],)
        texts = list(map(repr, map(float, map(_value_of, picked))))
        # NaN and the infinities are the only reprs that exposition spells differently.
        lines = map(add, self.prefixes, map(_SPECIAL_VALUES.get, texts, texts))
        return ("\n".join(lines) + "\n" + footer).encode()


class Renderer:
    """Renders samples to exposition bytes, remembering what repeats between cycles.

    Engines, GPUs and the host report the same series every cycle with new values. The renderer
    keeps the last page's layout (which sample goes on which line, and the text before its value):
    when the page has the same series in the same order, only the values are formatted, all in C
    loops. When it changes, each family's layout is rebuilt from per-family plans that are reused
    while that family's series are unchanged, so one engine going away does not re-sort the GPUs.
    Caches are bounded: label sets cleared when full (in entries or characters), one plan per
    catalogue family and format (each the size of that family on the last page), one page plan per
    format."""

    __slots__ = ("_label_chars", "_labels", "_pages", "_plans")

    def __init__(self) -> None:
        self._labels: dict[tuple, tuple[str, tuple]] = {}
        self._label_chars = 0
        self._plans: dict[tuple[str, bool], tuple[tuple, list[int], list[str]]] = {}
        self._pages: dict[bool, _PagePlan] = {}

    def _label_entry(self, labels: tuple) -> tuple[str, tuple]:
        entry = self._labels.get(labels)
        if entry is None:
            le = next((v for k, v in labels if k == "le"), None)
            rest = tuple(p for p in labels if p[0] != "le")
            # Buckets of one series stay together and ascending; +Inf sorts last.
            sort_key = (rest, float(le) if le is not None else 0.0)
            text = format_labels(labels)
            chars = 2 * len(text) + 100  # the key's strings, the text, the sort key (shares the key's)
            if len(self._labels) >= MAX_CACHED_LABEL_SETS or self._label_chars + chars > MAX_CACHED_LABEL_CHARS:
                self._labels.clear()
                self._label_chars = 0
            entry = (text, sort_key)
            self._label_chars += chars
            self._labels[labels] = entry
        return entry

    def _plan(self, name: str, openmetrics: bool, fam: Family, samples: list[Sample]) -> tuple[list[int], list[str]]:
        """(order, prefixes) for this family's series: reused while the series are the same."""
        keys = tuple([(s.name, s.labels) for s in samples])
        cached = self._plans.get((name, openmetrics))
        if cached is not None and cached[0] == keys:
            return cached[1], cached[2]
        entry_of = self._label_entry
        keyed = []
        for index, sample in enumerate(samples):
            text, (rest, le_key) = entry_of(sample.labels)
            keyed.append(((rest, sample.name, le_key), index, f"{sample.name}{text} "))
        keyed.sort(key=_first)
        type_name = name[: -len("_total")] if openmetrics and fam.type == "counter" else name
        header = f"# HELP {type_name} {_escape_help(fam.help)}\n# TYPE {type_name} {fam.type}\n"
        order = [index for _, index, _ in keyed]
        prefixes = [header + keyed[0][2]] + [prefix for _, _, prefix in keyed[1:]]
        self._plans[(name, openmetrics)] = (keys, order, prefixes)
        return order, prefixes

    def _page_plan(self, samples: tuple[Sample, ...], names: tuple, labels: tuple, openmetrics: bool) -> _PagePlan:
        """Families sorted by name, each laid out by its (possibly cached) family plan."""
        groups = group_by_family(samples)
        order: list[int] = []
        prefixes: list[str] = []
        for name in sorted(groups):
            fam, positions = groups[name]
            family_order, family_prefixes = self._plan(name, openmetrics, fam, [samples[i] for i in positions])
            order.extend([positions[i] for i in family_order])
            prefixes.extend(family_prefixes)
        return _PagePlan(names, labels, tuple(order), tuple(prefixes))

    def render(self, samples: Iterable[Sample], *, openmetrics: bool = False) -> bytes:
        """Text format 0.0.4 (or OpenMetrics 1.0), families sorted by name."""
        samples = tuple(samples)
        names = tuple(map(_name_of, samples))
        labels = tuple(map(_labels_of, samples))
        page = self._pages.get(openmetrics)
        # Sources hand out the same label tuples every cycle, so this is mostly identity checks.
        if page is None or page.names != names or page.labels != labels:
            page = self._pages[openmetrics] = self._page_plan(samples, names, labels, openmetrics)
        return page.render(samples, "# EOF\n" if openmetrics else "")


def _first(item: tuple) -> tuple:
    return item[0]


def group_by_family(samples: Sequence[Sample]) -> dict[str, tuple[Family, list[int]]]:
    """Positions of the samples under their catalogue family; samples of unknown families are
    left out (the catalogue is the contract: nothing undocumented reaches /metrics)."""
    groups: dict[str, tuple[Family, list[int]]] = {}
    family_of = catalog.SAMPLE_TO_FAMILY.get
    for position, name in enumerate(map(_name_of, samples)):
        fam = family_of(name)
        if fam is None:
            continue
        entry = groups.get(fam.name)
        if entry is None:
            entry = groups[fam.name] = (fam, [])
        entry[1].append(position)
    return groups


def render(samples: Iterable[Sample], *, openmetrics: bool = False) -> bytes:
    """One-off rendering (tests, tools); the collection loop keeps a Renderer across cycles."""
    return Renderer().render(samples, openmetrics=openmetrics)
