"""One entry per exported family. expose.py (HELP/TYPE), docs/metrics.md, the dashboard
check and the alert check all read this; nothing scans source code for metric names."""

from __future__ import annotations

from dataclasses import dataclass

TYPES = ("gauge", "counter", "histogram")


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

    def sample_names(self) -> tuple[str, ...]:
        """The sample names this family may produce."""
        if self.type == "histogram":
            return (self.name + "_bucket", self.name + "_sum", self.name + "_count")
        return (self.name,)


def family(name: str, type_: str, unit: str, help_: str, labels: tuple[str, ...], source: str) -> Family:
    return Family(name, type_, unit, help_, labels, source)
