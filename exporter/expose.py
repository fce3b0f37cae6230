"""Snapshot -> Prometheus exposition bytes, rendered once per snapshot and then served as is.

Rendering on every scrape would cost more than node_exporter's whole scrape (design.md), so the
collection loop calls `render` once per cycle and the server hands out the cached bytes."""

from __future__ import annotations

from collections.abc import Iterable

from exporter import catalog
from exporter.catalog.base import Family
from exporter.snapshot import Sample

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


_SPECIAL_VALUES = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def format_value(value: float) -> str:
    """Python's shortest round-trip repr is valid exposition for finite floats ("3.0", "1e-05");
    only NaN and the infinities are spelled differently."""
    text = repr(float(value))
    return _SPECIAL_VALUES.get(text, text)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return "{" + inner + "}" if inner else ""


MAX_CACHED_LABEL_SETS = 50_000


class Renderer:
    """Renders samples to exposition bytes, remembering what repeats between cycles.

    Engines, GPUs and the host report the same series every cycle with new values. Per family the
    renderer keeps the last cycle's series keys, their sorted order and their `name{labels} `
    prefixes; when the keys are unchanged only the values are formatted. Label sets are cached too.
    Both caches are bounded (label sets cleared when full; one plan per catalogue family)."""

    __slots__ = ("_labels", "_plans")

    def __init__(self) -> None:
        self._labels: dict[tuple, tuple[str, tuple]] = {}
        self._plans: dict[tuple[str, bool], tuple[tuple, list[int], list[str]]] = {}

    def _label_entry(self, labels: tuple) -> tuple[str, tuple]:
        entry = self._labels.get(labels)
        if entry is None:
            le = next((v for k, v in labels if k == "le"), None)
            rest = tuple(p for p in labels if p[0] != "le")
            # Buckets of one series stay together and ascending; +Inf sorts last.
            sort_key = (rest, float(le) if le is not None else 0.0)
            entry = (format_labels(labels), sort_key)
            if len(self._labels) >= MAX_CACHED_LABEL_SETS:
                self._labels.clear()
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

    def render(self, samples: Iterable[Sample], *, openmetrics: bool = False) -> bytes:
        """Text format 0.0.4 (or OpenMetrics 1.0), families sorted by name."""
        groups = group_by_family(samples)
        lines: list[str] = []
        for name in sorted(groups):
            fam, fam_samples = groups[name]
            order, prefixes = self._plan(name, openmetrics, fam, fam_samples)
            lines.extend([prefix + format_value(fam_samples[index].value)
                          for prefix, index in zip(prefixes, order, strict=True)])
        if openmetrics:
            lines.append("# EOF")
        return ("\n".join(lines) + "\n").encode() if lines else b""


def _first(item: tuple) -> tuple:
    return item[0]


def group_by_family(samples: Iterable[Sample]) -> dict[str, tuple[Family, list[Sample]]]:
    """Group samples under their catalogue family; samples of unknown families are dropped
    (the catalogue is the contract: nothing undocumented reaches /metrics)."""
    groups: dict[str, tuple[Family, list[Sample]]] = {}
    family_of = catalog.family_of
    for sample in samples:
        fam = family_of(sample.name)
        if fam is None:
            continue
        entry = groups.get(fam.name)
        if entry is None:
            entry = groups[fam.name] = (fam, [])
        entry[1].append(sample)
    return groups


def render(samples: Iterable[Sample], *, openmetrics: bool = False) -> bytes:
    """One-off rendering (tests, tools); the collection loop keeps a Renderer across cycles."""
    return Renderer().render(samples, openmetrics=openmetrics)
