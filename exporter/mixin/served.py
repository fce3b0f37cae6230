"""What each profile serves: the shipped rules and board panels it is declared to keep working
(exporter/catalog/profiles.py SERVES), and the families they read, so a profile that leaves out a
family one of them reads is caught before it ships (tests/test_profiles.py) and docs/metrics.md can
say which alerts and panels each profile keeps.

A rule or panel reads the catalogue families its PromQL names (exporter/mixin/dashboards/promql.py),
through any recording rule it reads (recursively, whichever file records it); names that are neither
(Prometheus' own `up`, `ALERTS`) are not the exporter's to serve."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from exporter import catalog
from exporter.catalog import profiles
from exporter.mixin.dashboards.promql import metric_names

RuleFiles = Mapping[str, list[dict]]
"""file name (`slo.yaml`) -> its rule groups, as alerts/generate.py renders them."""
Boards = Mapping[str, dict]
"""board name (`llm-serving-fleet`) -> its dashboard JSON."""

_LABEL_VALUES = re.compile(r"(?:label_values|query_result)\((.*)\)\s*$", re.S)


@dataclass(frozen=True, slots=True)
class Reader:
    """One rule or panel and the families it reads."""

    kind: str  # "rule" or "panel"
    where: str  # `slo.yaml:LLMTimeToFirstTokenErrorBudgetBurn`, `llm-serving-fleet:Verdicts now`
    families: frozenset[str]
    exprs: tuple[str, ...]  # its own and those of the recording rules it reads, recursively


def _recorded(rule_files: RuleFiles) -> dict[str, list[str]]:
    """recorded series -> the expressions that record it (a name recorded by several rules reads all)."""
    out: dict[str, list[str]] = {}
    for groups in rule_files.values():
        for group in groups:
            for rule in group["rules"]:
                if "record" in rule:
                    out.setdefault(rule["record"], []).append(rule["expr"])
    return out


def _reads(exprs: Iterable[str], recorded: Mapping[str, list[str]]) -> tuple[frozenset[str], tuple[str, ...]]:
    """(families, expressions) that `exprs` read, through the recording rules they name."""
    found: set[str] = set()
    seen: set[str] = set()
    every = list(exprs)
    todo = [name for expr in every for name in metric_names(expr)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in recorded:
            every.extend(recorded[name])
            todo.extend(n for expr in recorded[name] for n in metric_names(expr))
        elif (family := catalog.family_of(name)) is not None:
            found.add(family.name)
    return frozenset(found), tuple(every)


_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_LITERALS = re.compile(r"[A-Za-z0-9_.:-]+(?:\|[A-Za-z0-9_.:-]+)*\Z")


def _values_read(exprs: Iterable[str], family: str, label: str) -> set[str] | None:
    """The values of `label` that the selectors of `family` in `exprs` read; None when one of them
    reads any value (no matcher on the label, a negative one, or a pattern that is not a list)."""
    names = "|".join(re.escape(n) for n in catalog.FAMILIES[family].sample_names())
    selector = re.compile(rf"(?<![A-Za-z0-9_:])(?:{names})(?![A-Za-z0-9_:])\s*(\{{[^}}]*\}})?")
    values: set[str] = set()
    for expr in exprs:
        for match in selector.finditer(expr):
            matchers = [m for m in _MATCHER.finditer(match.group(1) or "") if m.group(1) == label]
            if not matchers or matchers[0].group(2) not in ("=", "=~") or not _LITERALS.match(matchers[0].group(3)):
                return None
            values.update(matchers[0].group(3).split("|"))
    return values


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _variables(board: dict) -> list[str]:
    """The expressions of the board's query variables."""
    exprs: list[str] = []
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if isinstance(query, str) and (match := _LABEL_VALUES.match(query.strip())):
            inner = match.group(1)
            # label_values(metric, label) or label_values(expr, label): the expression is before the last comma
            exprs.append(inner.rsplit(",", 1)[0] if "," in inner else inner)
    return exprs


def readers(rule_files: RuleFiles, boards: Boards) -> list[Reader]:
    """Every rule and every panel with the families it reads (a board's variables count for each of
    its panels: a panel whose variable has no values shows nothing)."""
    recorded = _recorded(rule_files)
    out: list[Reader] = []
    for file, groups in rule_files.items():
        for group in groups:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                out.append(Reader("rule", f"{file}:{name}", *_reads([rule["expr"]], recorded)))
    for board_name, board in boards.items():
        variables = _variables(board)
        for panel in _panels(board.get("panels", [])):
            exprs = [t.get("expr", "") for t in panel.get("targets", []) if t.get("expr")]
            if exprs:
                out.append(Reader("panel", f"{board_name}:{panel.get('title', '')}",
                                  *_reads([*variables, *exprs], recorded)))
    return out


def _matches(where: str, patterns: Iterable[str]) -> bool:
    """`slo.yaml` (every rule of the file), `slo.yaml:Name`, `*` (everything); the same for boards."""
    return any(pattern == "*" or where == pattern or where.startswith(pattern + ":")
               or fnmatch.fnmatchcase(where, pattern) for pattern in patterns)


def served_by(profile: str, all_readers: Iterable[Reader],
              serves: Mapping[str, profiles.Serves] = profiles.SERVES) -> list[Reader]:
    """The rules and panels `profile` is declared to serve."""
    spec = serves[profile]
    out = []
    for reader in all_readers:
        patterns = spec.rules if reader.kind == "rule" else spec.boards
        if _matches(reader.where, patterns) and not (reader.kind == "panel" and reader.where in spec.except_panels):
            out.append(reader)
    return out


def violations(rule_files: RuleFiles, boards: Boards, *, written: Mapping[str, profiles.Selection] | None = None,
               serves: Mapping[str, profiles.Serves] = profiles.SERVES) -> list[str]:
    """One line per rule or panel a profile serves that reads a family the profile leaves out, and per
    declared rule, board or panel that matches nothing (a stale name serves nothing)."""
    written = written if written is not None else {p: profiles.selection(p) for p in profiles.PROFILES}
    all_readers = readers(rule_files, boards)
    problems: list[str] = []
    for profile, spec in serves.items():
        selection = written[profile]
        for reader in served_by(profile, all_readers, serves):
            missing = sorted(reader.families - set(selection))
            for family in sorted(reader.families & set(selection)):
                only = selection[family]
                if only is not None:
                    read = _values_read(reader.exprs, family, only[0])
                    if read is None or read - only[1]:
                        shown = "every value" if read is None else "|".join(sorted(read - only[1]))
                        missing.append(f"{family}{{{only[0]}={shown}}}")
            if missing:
                problems.append(f"{profile}: {reader.kind} {reader.where} reads {', '.join(missing)}, "
                                f"which the {profile} profile leaves out")
        for kind, patterns in (("rule", spec.rules), ("panel", (*spec.boards, *spec.except_panels))):
            for pattern in patterns:
                if not any(r.kind == kind and _matches(r.where, (pattern,)) for r in all_readers):
                    problems.append(f"{profile}: declares {kind} {pattern!r}, which matches no shipped {kind}")
    return problems
