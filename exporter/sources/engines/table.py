"""The vocabulary of the per-engine alias tables (vllm.py, sglang.py, ...).

An engine module is data only, like dcgm-exporter's counters CSV: which engine sample maps to which
normalized family, in which unit, with which priority when old and new names co-exist, and how its
labels map to `model`, `rank` and `reason`. normalize.py interprets these tables; nothing here runs
per sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

MS = 1e-3
"""Milliseconds to seconds."""
US = 1e-6
"""Microseconds to seconds."""

Where = tuple[str, str]
"""(label, value): the alias applies only to samples carrying exactly this label value."""

When = tuple[str, bool]
"""(substring, present): the alias or product applies only to pages that contain (True) or lack
(False) this substring of the raw text. For what no sample says: a HELP text (the parser does not
read HELP lines) or the presence of another family's sample (`"\\nname{"` is a sample line)."""


@dataclass(frozen=True, slots=True)
class Alias:
    """One engine family (or one label-selected slice of it) feeding one normalized family.

    `family` is the normalized name from exporter/catalog/engine.py and `type` its type there; the
    engine's declared TYPE is ignored on purpose (llama.cpp declares averages as counters).
    `scale` converts into base units: for a histogram it applies to the `le` bounds and to `_sum`,
    never to bucket counts or `_count`. When several aliases of one family are on the same page,
    only those with the highest `priority` are used: that is how a deprecated name that an engine
    still emits beside its replacement (vLLM's time_per_output_token vs inter_token_latency) is
    deduplicated in favour of the new one. `when` limits the alias to pages that do or do not
    contain a substring (see When): how a unit change that kept the name (vLLM's prefix-cache
    counters) is told apart.
    """

    family: str
    type: str
    scale: float = 1.0
    priority: int = 0
    where: Where | None = None
    reason: str | None = None
    """For llm_requests_finished_total: the reason when the engine gives no finish-reason label."""
    minimum: float | None = None
    """Values below this are the engine's "not available" sentinel (vLLM V0 hit rate -1): dropped."""
    note: str = ""
    """The quirk this alias handles, for docs/engines.md."""
    when: When | None = None


@dataclass(frozen=True, slots=True)
class Term:
    """One factor of a Product: a sample's value, or the number in one of its labels (info gauges
    such as vLLM's cache_config_info carry their data in labels)."""

    source: str
    where: Where | None = None
    label: str | None = None
    divide: bool = False


@dataclass(frozen=True, slots=True)
class Product:
    """A normalized gauge or counter computed from several engine samples of the same model and
    rank: KV capacity = blocks x tokens per block, usage = used / max. Emitted only when every
    term is present (no made-up values) and the page satisfies `when`."""

    family: str
    type: str
    terms: tuple[Term, ...]
    priority: int = 0
    note: str = ""
    when: When | None = None


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


COMMON_UNMAPPED: Mapping[str, str] = MappingProxyType({
    "process_*": "the engine process's own runtime (CPU, memory, fds): the host source reads the process",
    "python_*": "the Python runtime's garbage collector and version",
    "http_*": "the API server's HTTP instrumentation (requests by handler, sizes): not inference",
})
"""Families every Python engine's page carries beside its own (prometheus_client defaults)."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Everything normalize.py needs to know about one engine kind."""

    kind: str
    title: str
    aliases: Mapping[str, Alias | tuple[Alias, ...]]
    """Keyed by the engine's family name as exposed: counters with their `_total` suffix,
    histograms without `_bucket`/`_sum`/`_count`."""
    products: tuple[Product, ...] = ()
    labels: Mapping[str, str] = field(default_factory=_frozen)
    """Engine label -> normalized label (`model`, `rank` or `reason`); every other label is
    dropped, and series that then coincide are merged (see normalize.py)."""
    keep_only: Mapping[str, str] = field(default_factory=_frozen)
    """Label -> the only value kept: copies of one series reported by every tensor-parallel rank."""
    keep_only_unless: Mapping[str, str] = field(default_factory=_frozen)
    """keep_only label -> another label: a label set carrying the other label is not filtered on
    the first (SGLang with DP attention: each data-parallel rank's scheduler reports its own
    `tp_rank`, and `dp_rank` tells them apart)."""
    markers: tuple[tuple[str, ...], ...] = ()
    """Detection: the page is this kind when all substrings of any one marker occur. A marker that
    starts with a newline matches at the start of a line (and of the page, and after `# TYPE `)."""
    flavors: tuple[tuple[str, str], ...] = ()
    """(substring, flavor): the first substring found names the flavor."""
    default_flavor: str = ""
    notes: tuple[str, ...] = ()
    """Engine-level quirks and gaps, for docs/engines.md."""
    unmapped: Mapping[str, str] = field(default_factory=_frozen)
    """Engine families left out on purpose -> why, for docs/engines.md. A name ending in `*` covers
    every family with that prefix. The live tier (tests/live) fails on a family of a real engine's
    page that is neither mapped nor listed here."""

    def accounts_for(self, family: str) -> bool:
        """Whether `family` (as exposed, without `_bucket`/`_sum`/`_count`/`_created`) is mapped or
        listed as unmapped."""
        if family in self.aliases or any(t.source == family for p in self.products for t in p.terms):
            return True
        return any(family == name or (name.endswith("*") and family.startswith(name[:-1]))
                   for name in self.unmapped)

    def unaccounted(self, page: str) -> list[str]:
        """The families on a /metrics page (by sample name) that are neither mapped nor listed in
        `unmapped`: what docs/engines.md does not explain yet."""
        found: set[str] = set()
        for line in page.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if self.accounts_for(name) or self.accounts_for(name + "_total"):
                continue
            for suffix in ("_bucket", "_sum", "_count", "_created", "_info"):
                base = name.removesuffix(suffix)
                if base != name and (self.accounts_for(base) or self.accounts_for(base + "_total")):
                    break
            else:
                if not name.endswith("_created"):  # reported by its family's own samples
                    found.add(name)
        return sorted(found)

    def alias_items(self) -> tuple[tuple[str, Alias], ...]:
        """(engine name, alias) pairs, flattening tuples."""
        items: list[tuple[str, Alias]] = []
        for source, entry in self.aliases.items():
            for alias in entry if isinstance(entry, tuple) else (entry,):
                items.append((source, alias))
        return tuple(items)
