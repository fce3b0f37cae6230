"""Snapshot -> Prometheus exposition bytes, rendered once per snapshot and then served as is.

Rendering on every scrape would cost more than node_exporter's whole scrape (design.md), so the
collection loop calls `render` once per cycle and the server hands out the cached bytes."""

from __future__ import annotations

import math
from collections.abc import Iterable

from exporter import catalog
from exporter.catalog.base import Family
from exporter.snapshot import Sample

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def format_value(value: float) -> str:
    if value != value:  # NaN
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}.0" if value != 0 or math.copysign(1, value) > 0 else "-0.0"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return "{" + inner + "}" if inner else ""


def _sample_order(sample: Sample) -> tuple:
    # Buckets of one series stay together and ascending; +Inf sorts last.
    le = sample.label("le")
    le_key = float(le) if le else 0.0
    rest = tuple(p for p in sample.labels if p[0] != "le")
    return (rest, sample.name, le_key)


def group_by_family(samples: Iterable[Sample]) -> dict[str, tuple[Family, list[Sample]]]:
    """Group samples under their catalogue family; samples of unknown families are dropped
    (the catalogue is the contract: nothing undocumented reaches /metrics)."""
    groups: dict[str, tuple[Family, list[Sample]]] = {}
    for sample in samples:
        fam = catalog.family_of(sample.name)
        if fam is None:
            continue
        entry = groups.get(fam.name)
        if entry is None:
            entry = groups[fam.name] = (fam, [])
        entry[1].append(sample)
    return groups


def render(samples: Iterable[Sample], *, openmetrics: bool = False) -> bytes:
    """Render samples as text format 0.0.4 (or OpenMetrics 1.0), families sorted by name."""
    groups = group_by_family(samples)
    lines: list[str] = []
    for name in sorted(groups):
        fam, fam_samples = groups[name]
        type_name = name
        if openmetrics and fam.type == "counter":
            type_name = name[: -len("_total")]
        lines.append(f"# HELP {type_name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {type_name} {fam.type}")
        for sample in sorted(fam_samples, key=_sample_order):
            lines.append(f"{sample.name}{format_labels(sample.labels)} {format_value(sample.value)}")
    if openmetrics:
        lines.append("# EOF")
    return ("\n".join(lines) + "\n").encode() if lines else b""
