"""One entry per exported family. expose.py (HELP/TYPE), docs/metrics.md, the dashboard
check and the alert check all read this; nothing scans source code for metric names."""

from __future__ import annotations

from dataclasses import dataclass

TYPES = ("gauge", "counter", "histogram")
MAX_VALUE = 1e18
"""The largest value (and histogram bound) a remote party may report for any family: far above any
real count (1e18 bytes is an exabyte; a token counter at a million tokens a second takes 30,000
years to reach it) and far enough below float's 1.8e308 that no product or sum the derive stages
form from such values overflows."""


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    type: str  # gauge | counter | histogram
    unit: str  # seconds, bytes, ratio, tokens, requests, watts, joules, hertz, celsius, ...
    help: str
    labels: tuple[str, ...]
    source: str  # who provides it: engine, nvml, gpm, sim, host, derived, self

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"{self.name}: unknown type {self.type}")
        if self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters end in _total")

    @property
    def ceiling(self) -> float:
        """The largest valid value: 1 for a ratio, MAX_VALUE for the rest. Every family read from a
        remote party is non-negative; the normalizer drops what is outside (`out_of_range`)."""
        return 1.0 if self.unit == "ratio" else MAX_VALUE

    def sample_names(self) -> tuple[str, ...]:
        """The sample names this family may produce."""
        if self.type == "histogram":
            return (self.name + "_bucket", self.name + "_sum", self.name + "_count")
        return (self.name,)


def family(name: str, type_: str, unit: str, help_: str, labels: tuple[str, ...], source: str) -> Family:
    return Family(name, type_, unit, help_, labels, source)
