"""The catalogue of every family llm-exporter exports, assembled from one module per area."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from exporter.catalog import derived, engine, gpu, host, probe, router, self_health
from exporter.catalog.base import Family

AREAS: tuple[tuple[str, tuple[Family, ...]], ...] = (
    ("Engine (normalized)", engine.FAMILIES),
    ("Router (normalized and derived)", router.FAMILIES),
    ("GPU", gpu.FAMILIES),
    ("Host", host.FAMILIES),
    ("Derived", derived.FAMILIES),
    ("Client probe", probe.FAMILIES),
    ("Exporter self-health", self_health.FAMILIES),
)


def all_areas() -> tuple[tuple[str, tuple[Family, ...]], ...]:
    return AREAS


def _index() -> Mapping[str, Family]:
    by_name: dict[str, Family] = {}
    for _, families in AREAS:
        for fam in families:
            if fam.name in by_name:
                raise ValueError(f"family {fam.name} defined twice")
            by_name[fam.name] = fam
    return MappingProxyType(by_name)


FAMILIES: Mapping[str, Family] = _index()

SAMPLE_TO_FAMILY: Mapping[str, Family] = MappingProxyType(
    {sample_name: fam for fam in FAMILIES.values() for sample_name in fam.sample_names()}
)


def family_of(sample_name: str) -> Family | None:
    return SAMPLE_TO_FAMILY.get(sample_name)
