"""What an engine's page holds that its table does not explain: every native family counted once as
mapped, ignored (on purpose, with a reason) or unaccounted (table.py ACCOUNT_STATES).

A family is a `# TYPE` declaration or, for samples without one, their name less a histogram or
counter suffix; a family declared with no sample yet counts too (prometheus_client prints HELP and
TYPE for a labelled metric before its first series). This is how a user learns that an engine
upgrade added or renamed families before a board goes blank: the exporter exports the counts
(llm_exporter_engine_families{state}), names the unaccounted ones in /api/v1/snapshot and on the
status page, and logs once when that set changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.sources.engines.exposition import _NAME_RE
from exporter.sources.engines.table import IGNORED, MAPPED, UNACCOUNTED, EngineSpec

__all__ = ["MAX_NAMED", "FamilyAccount", "account", "page_families", "unaccounted"]

MAX_NAMED = 64
"""Unaccounted families named per page (all are counted): a hostile page of 10^5 made-up names
must not become 10^5 label values, log text or snapshot entries."""
MAX_NAME_CHARS = 200
MAX_MEMO_NAMES = 4_096
"""Pages with more distinct names than this are accounted afresh every time rather than kept as
the memo's key (NormalizerState.families)."""
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_created", "_gsum", "_gcount", "_total", "_info")


@dataclass(frozen=True, slots=True)
class FamilyAccount:
    """The native families of one page, by what the table says of them."""

    mapped: int = 0
    ignored: int = 0
    unaccounted: int = 0
    names: tuple[str, ...] = ()
    """The unaccounted families, sorted, at most MAX_NAMED (each at most MAX_NAME_CHARS)."""

    def counts(self) -> Mapping[str, int]:
        return {MAPPED: self.mapped, IGNORED: self.ignored, UNACCOUNTED: self.unaccounted}


EMPTY = FamilyAccount()


def account(spec: EngineSpec, declared: Iterable[str], names: Iterable[str]) -> FamilyAccount:
    """Count the families `declared` by TYPE lines and those of the sample `names` that no TYPE
    line declares, each once, by their state in `spec`."""
    # A TYPE line's name is not checked by the parser (sample names are): one that is not a metric
    # name (an escape sequence, markup) is no family, and never reaches a log line or a page.
    families = _families((name for name in declared if _NAME_RE.match(name)), names, spec)
    counts = {MAPPED: 0, IGNORED: 0, UNACCOUNTED: 0}
    unaccounted: list[str] = []
    for family in families.values():
        state = spec.state_of(family)
        counts[state] += 1
        if state == UNACCOUNTED:
            unaccounted.append(family[:MAX_NAME_CHARS])
    unaccounted.sort()
    return FamilyAccount(counts[MAPPED], counts[IGNORED], counts[UNACCOUNTED], tuple(unaccounted[:MAX_NAMED]))


def unaccounted(spec: EngineSpec, page: str) -> list[str]:
    """The families on a /metrics page's text that `spec` neither maps nor ignores (tests, the live tier)."""
    return sorted(name for name in page_families(page, spec).values() if spec.state_of(name) == UNACCOUNTED)


def page_families(page: str, spec: EngineSpec | None = None) -> dict[str, str]:
    """The families of a page's text (for tests and the live tier): key -> name, as account() sees them."""
    declared: set[str] = set()
    names: set[str] = set()
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                declared.add(parts[2])
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return _families(declared, names, spec)


def _families(declared: Iterable[str], names: Iterable[str], spec: EngineSpec | None) -> dict[str, str]:
    """Family key -> the name to judge and report. A counter's `foo`, `foo_total` and `foo_created`
    (prometheus_client declares `_created` as a gauge family of its own) are one family, and so are a
    histogram's parts; a sample without a TYPE line is its own family less a part suffix, unless the
    table knows it by its full name (a gauge really called `..._count`)."""
    declared = set(declared)
    families: dict[str, str] = {}
    for name in sorted(declared, key=lambda n: n.endswith("_created")):  # the counter's own name first
        families.setdefault(_key(name), name)
    for name in sorted(names, key=lambda n: (n.endswith("_created"), n)):
        if name in declared or _declared_base(name, declared):
            continue
        family = name if spec is not None and spec.state_of(name) != UNACCOUNTED else _base(name)
        families.setdefault(_key(family), family)
    return families


def _key(name: str) -> str:
    return name.removesuffix("_created").removesuffix("_total")


def _declared_base(name: str, declared: set[str]) -> bool:
    for suffix in _SAMPLE_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in declared or base + "_total" in declared:
                return True
    return False


def _base(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
