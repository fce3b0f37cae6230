"""The vocabulary of the per-engine alias tables (vllm.py, sglang.py, ...).

An engine module is data only, like dcgm-exporter's counters CSV: which engine sample maps to which
normalized family, in which unit, with which priority when old and new names co-exist, and how its
labels map to `model`, `rank` and `reason`. normalize.py interprets these tables; nothing here runs
per sample.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

MS = 1e-3
"""Milliseconds to seconds."""
US = 1e-6
"""Microseconds to seconds."""
MIB = 1048576.0
"""Mebibytes (what SGLang calls MB: bytes / (1024 * 1024)) to bytes."""

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
    tier: str | None = None
    """For llm_prefix_cache_hits_total: the cache tier (catalog CACHE_TIERS) when the engine gives no
    tier label."""


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
    term is present (no made-up values) and the page satisfies `when`.

    With `add`, the terms are added instead: each is one disjoint part of the quantity (SGLang's
    PD queues, vLLM's KV fetch stages), emitted when at least one part is on the page (an engine
    release without a part has none of those requests). Copies of one term's series still take the
    maximum (gauges) as everywhere, so a per-priority copy beside its total is not added. A part
    that is negative or not a number makes the sum unknown: it is dropped (`out_of_range`), never
    added as a partial sum."""

    family: str
    type: str
    terms: tuple[Term, ...]
    priority: int = 0
    note: str = ""
    when: When | None = None
    tier: str | None = None
    """For llm_prefix_cache_hits_total: the cache tier (catalog CACHE_TIERS)."""
    add: bool = False


MAX_CACHED_NAME = 200
"""Family names longer than this are judged without the cache (names come from remote pages)."""
MAPPED = "mapped"
IGNORED = "ignored"
UNACCOUNTED = "unaccounted"
ACCOUNT_STATES = (MAPPED, IGNORED, UNACCOUNTED)
"""What a table says of a family on an engine's page: the `state` label of
llm_exporter_engine_families."""


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


COMMON_IGNORED: Mapping[str, str] = MappingProxyType({
    "process_*": "the engine process's own runtime (CPU, memory, fds): the host source reads the process",
    "python_*": "the Python runtime's garbage collector and version",
    "http_*": "the API server's HTTP instrumentation (requests by handler, sizes): not inference",
})
"""Families every Python engine's page carries beside its own (prometheus_client defaults)."""


# An engine's alias table: its family name -> one alias, or several that split it by a label (`where`).
Aliases = Mapping[str, Alias | tuple[Alias, ...]]


@dataclass(frozen=True, slots=True, eq=False)
class EngineSpec:
    """Everything normalize.py needs to know about one engine kind. Compared by identity: there
    is one per kind (registry.SPECS)."""

    kind: str
    title: str
    aliases: Aliases
    """Keyed by the engine's family name as exposed: counters with their `_total` suffix,
    histograms without `_bucket`/`_sum`/`_count`."""
    products: tuple[Product, ...] = ()
    labels: Mapping[str, str] = field(default_factory=_frozen)
    """Engine label -> normalized label (`model`, `rank`, `reason` or `tier`); every other label is
    dropped, and series that then coincide are merged (see normalize.py)."""
    reasons: Mapping[str, str] = field(default_factory=_frozen)
    """The engine's finish-reason values (lower-cased) -> catalog FINISH_REASONS, where they differ;
    a value in neither becomes `other`."""
    tiers: Mapping[str, str] = field(default_factory=_frozen)
    """The engine's cache-tier label values (lower-cased) -> catalog CACHE_TIERS; others `unknown`."""
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
    roles: tuple[tuple[str, str], ...] = ()
    """(substring, role): the first substring found on the page names the instance's PD role
    (catalog ROLES), the `role` of llm_engine_info; none found: the engine does not say (the target's
    `role` option, else `both`)."""
    waiting_includes_kv_transfer: bool | None = None
    """Whether the engine's llm_requests_waiting counts the requests llm_requests_waiting_kv_transfer
    counts (True: vLLM, whose waiting gauge includes requests deferred for a KV load; False: SGLang,
    whose PD queues are apart from its waiting queue); None: the engine reports no such requests.
    The requests an instance holds but does not run are llm_requests_waiting, plus
    llm_requests_waiting_kv_transfer where this is False."""
    notes: tuple[str, ...] = ()
    """Engine-level quirks and gaps, for docs/engines.md. Free text: a family named only here is
    not accounted for."""
    ignored: Mapping[str, str] = field(default_factory=_frozen)
    """Engine families left out on purpose -> why (one line), for docs/engines.md and the
    exporter's llm_exporter_engine_families. A name ending in `*` covers every family with that
    prefix. Keyed like `aliases` (counters with `_total`)."""
    versions: tuple[str, ...] = ()
    """The engine releases whose every family this table accounts for (the conformance fixtures
    tests/fixtures/engines/<kind>-<version>__*.prom prove it), newest last."""

    def mapped_sources(self) -> frozenset[str]:
        """Every engine family a route or a product term reads."""
        return frozenset(name for name, _ in self.alias_items()) | frozenset(
            term.source for product in self.products for term in product.terms)

    def state_of(self, family: str) -> str:
        """`mapped`, `ignored` or `unaccounted` for one family as exposed (ACCOUNT_STATES); a
        counter may be named with or without `_total`."""
        if len(family) > MAX_CACHED_NAME:  # a page's made-up long names must not pin the cache's bytes
            return _state_of.__wrapped__(self, family)
        return _state_of(self, family)

    def accounts_for(self, family: str) -> bool:
        """Whether `family` (as exposed, without `_bucket`/`_sum`/`_count`/`_created`) is mapped or
        listed as ignored."""
        return self.state_of(family) != UNACCOUNTED

    def alias_items(self) -> tuple[tuple[str, Alias], ...]:
        """(engine name, alias) pairs, flattening tuples."""
        items: list[tuple[str, Alias]] = []
        for source, entry in self.aliases.items():
            for alias in entry if isinstance(entry, tuple) else (entry,):
                items.append((source, alias))
        return tuple(items)


@functools.lru_cache(maxsize=4096)
def _state_of(spec: EngineSpec, family: str) -> str:
    # O(1) a family, whatever the table's size: a page of 10^5 made-up families was classified by
    # 58 fnmatch calls each (4 s of CPU a scrape) through a cache it overflowed.
    matcher = _matcher(spec)
    names = (family, family + "_total") if not family.endswith("_total") else (family, family[:-6])
    mapped = matcher.mapped
    if names[0] in mapped or names[1] in mapped:
        return MAPPED
    return IGNORED if matcher.ignores(names[0]) or matcher.ignores(names[1]) else UNACCOUNTED


@dataclass(frozen=True, slots=True)
class _Matcher:
    """A table's mapped and ignored names, compiled once per spec: sets for exact names, one tuple
    for `prefix*` patterns (str.startswith tests them all in C), and one regex for any other glob."""

    mapped: frozenset[str]
    exact: frozenset[str]
    prefixes: tuple[str, ...]
    globs: re.Pattern[str] | None

    def ignores(self, name: str) -> bool:
        return (name in self.exact or name.startswith(self.prefixes)
                or (self.globs is not None and self.globs.match(name) is not None))


@functools.lru_cache(maxsize=16)
def _matcher(spec: EngineSpec) -> _Matcher:
    # A pattern without `*` matches itself only (`?` and `[` are literal there, as they always were).
    exact = frozenset(pattern for pattern in spec.ignored if "*" not in pattern)
    starred = [pattern for pattern in spec.ignored if "*" in pattern]
    prefixes = tuple(pattern[:-1] for pattern in starred if _is_prefix(pattern))
    others = [pattern for pattern in starred if not _is_prefix(pattern)]
    # fnmatch.translate gives `(?s:...)\Z` per pattern; names are metric names, so one alternation
    # is a few linear attempts per name, never a backtracking blow-up.
    globs = re.compile("|".join(fnmatch.translate(p) for p in others)) if others else None
    return _Matcher(spec.mapped_sources(), exact, prefixes, globs)


def _is_prefix(pattern: str) -> bool:
    """`prefix*` with no other glob character."""
    return pattern.endswith("*") and not any(c in pattern[:-1] for c in "*?[")
