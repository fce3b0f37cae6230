"""The immutable records every stage reads: sources -> Snapshot -> derive -> expose.

Health sits beside the data (nvidia_gpu_exporter's collect.Snapshot), never inferred from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from itertools import chain
from types import MappingProxyType
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name; a tuple so samples are hashable and cheap to compare."""


def labels_of(**pairs: str) -> Labels:
    return tuple(sorted(pairs.items()))


def make_labels(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(sorted(items))


class Sample(NamedTuple):
    """One exported sample. `name` is the full sample name (`..._bucket`, `..._total`).

    A NamedTuple rather than a frozen dataclass: engines produce thousands per cycle and a
    NamedTuple is immutable at half the construction cost."""

    name: str
    labels: Labels
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


_EMPTY: Mapping[str, str] = MappingProxyType({})


class SourceKind(Enum):
    """What a source measures, which decides the stages that read it. Declared by each source and
    carried on its result, so no stage infers it from a source's name (`engine:<target>`, `gpu`,
    `host` are label values only). OTHER: read by no derivation (tests, extensions)."""

    ENGINE = "engine"
    GPU = "gpu"
    HOST = "host"
    ROUTER = "router"  # a router in front of engine replicas (exporter/sources/routers/); derive/routing.py
    PROBE = "probe"  # client-side requests to an engine's API (exporter/probe/); derive/probe.py reads it
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class SourceResult:
    """What one source produced in one cycle, with its health.

    `attrs` carries small facts that are not samples but that later stages need
    (an engine's detected engine, the model name, GPU product names); values are strings.
    `timeout_s` is the bound the collection ran under.
    """

    source: str
    ok: bool
    duration_s: float
    finished_at: float
    samples: tuple[Sample, ...] = ()
    error_reason: str = ""
    error_message: str = ""
    attrs: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    kind: SourceKind = SourceKind.OTHER
    timeout_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of every source, taken in one collection cycle.

    `taken_at` is the wall clock (what a person reads); `steady_at` a monotonic clock anchored to
    the wall clock when the exporter started, which every window and rate is keyed by: the wall
    clock can step (NTP, an operator, a VM resumed), and a window keyed by it froze for as long as
    a backward step (an hour for -3600 s) and then read a rate inflated by a forward one. None
    (snapshots built by hand in tests and tools): the wall clock."""

    taken_at: float
    results: Mapping[str, SourceResult]
    derived: tuple[Sample, ...] = ()
    steady_at: float | None = None

    @property
    def now(self) -> float:
        """The time windows and rates use (the steady clock when there is one)."""
        return self.taken_at if self.steady_at is None else self.steady_at

    def result(self, source: str) -> SourceResult | None:
        return self.results.get(source)

    def samples(self, name: str | None = None, *, include_derived: bool = False) -> Iterator[Sample]:
        """Samples of every healthy source (a failed source's series are dropped)."""
        if name is None:  # the whole page, every cycle: chained in C rather than yielded one by one
            parts = [result.samples for result in self.results.values() if result.ok]
            if include_derived:
                parts.append(self.derived)
            return chain.from_iterable(parts)
        return self._named(name, include_derived)

    def _named(self, name: str, include_derived: bool) -> Iterator[Sample]:
        for result in self.results.values():
            if not result.ok:
                continue
            for sample in result.samples:
                if sample.name == name:
                    yield sample
        if include_derived:
            for sample in self.derived:
                if sample.name == name:
                    yield sample

    def values(self, name: str, **match: str) -> list[Sample]:
        """Samples named `name` whose labels include every `match` pair."""
        wanted = match.items()
        return [s for s in self.samples(name) if all(s.label(k) == v for k, v in wanted)]


# Exposition spells NaN and the infinities its own way; derive (an `le` label) and expose share it.
SPECIAL_VALUES = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def format_value(value: float) -> str:
    """Python's shortest round-trip repr is valid exposition for finite floats ("3.0", "1e-05");
    only NaN and the infinities are spelled differently."""
    text = repr(float(value))
    return SPECIAL_VALUES.get(text, text)
