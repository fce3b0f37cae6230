"""The vocabulary of the per-router tables (vllm_router.py, sglang_router.py, ...): data only, read by
normalize.py, like the engine tables (exporter/sources/engines/table.py), whose accounting it reuses:
every family on a router's page is mapped, ignored with a reason, or unaccounted."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.catalog.router import BREAKER_STATES, ERROR_CAUSES
from exporter.sources.engines.table import Alias, EngineSpec

Where = tuple[str, str]

BREAKER_CODES: Mapping[float, str] = MappingProxyType({0.0: "closed", 1.0: "open", 2.0: "half_open"})
"""How vllm-router and the SGLang gateway (the same Rust breaker) encode its state as a gauge."""

LABEL_ROLES = ("backend", "cause", "policy", "role")
"""What a router label may become: the backend (engine replica) a series is about, the error's cause
(ERROR_CAUSES, through RouterSpec.causes), the policy (only on llm_router_info) or the PD role."""


@dataclass(frozen=True, slots=True)
class RouterAlias:
    """One router family (or the slice of it whose label `where` names) feeding one normalized family
    of exporter/catalog/router.py. `scale` converts to base units (histogram bounds and _sum).
    `cause` / `role`: the label value when the router's family is one cause or one PD stage.
    `states`: a gauge that encodes a state as a number (circuit breakers), value -> BREAKER_STATES;
    it becomes one series per state, 1 for the current one."""

    family: str
    type: str
    where: Where | None = None
    where_not: Where | None = None
    """The alias skips samples carrying exactly this label value (an error code "" on a success)."""
    scale: float = 1.0
    cause: str | None = None
    role: str | None = None
    states: Mapping[float, str] | None = None
    removed: float | None = None
    """A value the router keeps for a backend it removed (SGLang's -1 tombstone): skipped, not an error."""
    note: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class RouterSpec:
    kind: str
    title: str
    aliases: Mapping[str, RouterAlias | tuple[RouterAlias, ...]]
    """Keyed by the router's family name as exposed: counters with `_total`, histograms bare."""
    markers: tuple[str, ...]
    """The page is this kind when any of these substrings occurs (a family prefix of its own)."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Router label -> LABEL_ROLES entry; every other label is dropped and the series it split are added."""
    causes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The router's error-type values (lower-cased) -> ERROR_CAUSES; others are `other`."""
    policy_from: tuple[str, str] | None = None
    """(family, label) whose label value names the load-balancing policy (llm_router_info)."""
    ignored: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Router families left out on purpose -> why; `prefix*` covers a prefix."""
    versions: tuple[str, ...] = ()
    """Releases whose every family this table accounts for (from their metric-defining source)."""
    source: str = ""
    """Where the families were read: a live capture here, or the release's source (Dynamo, the EPP)."""
    notes: tuple[str, ...] = ()

    def alias_items(self) -> tuple[tuple[str, RouterAlias], ...]:
        return tuple((name, alias) for name, entry in self.aliases.items()
                     for alias in (entry if isinstance(entry, tuple) else (entry,)))

    @property
    def accounting(self) -> EngineSpec:
        """The table as the engine accounting reads it (mapped and ignored names only)."""
        return _accounting(self)

    def check(self) -> None:
        """The table's own consistency: causes, roles and states from the catalogue's vocabularies."""
        from exporter.catalog import FAMILIES

        for name, alias in self.alias_items():
            fam = FAMILIES.get(alias.family)
            if fam is None or fam.type != alias.type or fam.source != "router":
                raise ValueError(f"{self.kind}: {name} -> {alias.family} is not a router {alias.type} family")
            if alias.cause is not None and alias.cause not in ERROR_CAUSES:
                raise ValueError(f"{self.kind}: {name}: cause {alias.cause!r} not in {ERROR_CAUSES}")
            if alias.states is not None and not set(alias.states.values()) <= set(BREAKER_STATES):
                raise ValueError(f"{self.kind}: {name}: states outside {BREAKER_STATES}")
        for label, role in self.labels.items():
            if role not in LABEL_ROLES:
                raise ValueError(f"{self.kind}: label {label} -> {role!r} not in {LABEL_ROLES}")
        if not set(self.causes.values()) <= set(ERROR_CAUSES):
            raise ValueError(f"{self.kind}: causes outside {ERROR_CAUSES}")


@functools.lru_cache(maxsize=16)
def _accounting(spec: RouterSpec) -> EngineSpec:
    # Built once per table (compared by identity): the engine accounting's matcher is cached per spec.
    aliases = {name: Alias(family="llm_router_up", type="gauge") for name, _ in spec.alias_items()}
    return EngineSpec(kind=spec.kind, title=spec.title, aliases=aliases, ignored=spec.ignored)
