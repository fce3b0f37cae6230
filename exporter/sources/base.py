"""The contract between a source and the collection loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from exporter.snapshot import Sample, SourceKind

__all__ = ["Source", "SourceData", "SourceError", "SourceKind"]


class SourceError(Exception):
    """A failure the source understood. `reason` is a short bounded code used as a label value
    (`timeout`, `dns`, `connection`, `http_status`, `parse`, `too_large`, `nvml_init`, ...; the
    list is in the help of llm_exporter_collect_errors_total, exporter/catalog/self_health.py).
    `status`: the HTTP status of an `http_status` failure."""

    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class SourceData:
    """What `Source.collect` returns on success."""

    samples: tuple[Sample, ...]
    attrs: Mapping[str, str] = field(default_factory=dict)


class Source(Protocol):
    """A source is collected once per cycle. `collect` must not block the event loop:
    blocking work (NVML, /proc reads) goes through `asyncio.to_thread`.
    Raise SourceError for understood failures; anything else is caught and counted too.

    A source may also have `attrs: Mapping[str, str]`, stable facts about it (an engine target's name
    and engine) reported even when a collection fails, so `llm_engine_up 0` still names its target.
    It is optional (the host and GPU sources have none), so the collector reads it with getattr and it
    is no member here: a protocol member every source would have to define."""

    name: str
    """Unique among the sources; the `source` label of its self-health series."""
    kind: SourceKind
    timeout_s: float | None
    """How long one collection may take before the cycle reports it failed (`timeout`); None:
    the collection interval."""

    async def collect(self) -> SourceData: ...

    async def close(self) -> None: ...
