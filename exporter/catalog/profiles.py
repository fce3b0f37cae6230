"""Which families the exporter writes: profiles as data (exporter/catalog/families.csv).

dcgm-exporter's counters file is the model: one shipped file lists every family, the smallest
profile that exports it (minimal < default < full) and why. `--profile` picks a level; `--families
FILE` (the same format, copied and trimmed) picks exactly the families it lists. Everything upstream
of /metrics (sources, derive, the verdict, the status page) still sees every family: a profile only
decides what is written, so the verdict is the same under every profile.

What each profile must keep serving (the rules and board panels shipped for it) is SERVES below;
tests/test_profiles.py checks every rule and panel it names reads only families of its profile."""

from __future__ import annotations

import csv
import io
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

PROFILES: tuple[str, ...] = ("minimal", "default", "full")
DEFAULT_PROFILE = "default"
SHIPPED = pathlib.Path(__file__).with_name("families.csv")
MAX_FAMILIES_FILE_BYTES = 256 * 1024  # the shipped file is about 20 KB
MAX_FAMILIES_FILE_LINES = 4096


class FamiliesFileError(ValueError):
    """A families file that cannot be used: the message names the line and what is wrong."""


@dataclass(frozen=True, slots=True)
class Entry:
    family: str
    profile: str
    why: str


def _rows(text: str, where: str) -> list[tuple[int, list[str]]]:
    lines = text.splitlines()
    if len(lines) > MAX_FAMILIES_FILE_LINES:
        raise FamiliesFileError(f"{where}: more than {MAX_FAMILIES_FILE_LINES} lines")
    rows: list[tuple[int, list[str]]] = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("family,"):
            continue
        try:
            row = next(csv.reader(io.StringIO(stripped)))
        except (csv.Error, StopIteration) as error:
            raise FamiliesFileError(f"{where}:{number}: {error}") from None
        rows.append((number, [cell.strip() for cell in row]))
    return rows


def parse_shipped(text: str, known: Mapping[str, object]) -> tuple[Entry, ...]:
    """The shipped file: every row `family,profile,why`, every known family exactly once."""
    entries: dict[str, Entry] = {}
    for number, row in _rows(text, SHIPPED.name):
        if len(row) != 3 or row[1] not in PROFILES or row[0] not in known or row[0] in entries or not row[2]:
            raise FamiliesFileError(f"{SHIPPED.name}:{number}: expected a known family listed once, a profile "
                                    f"({', '.join(PROFILES)}) and a reason: {row!r}")
        entries[row[0]] = Entry(row[0], row[1], row[2])
    missing = sorted(set(known) - set(entries))
    if missing:
        raise FamiliesFileError(f"{SHIPPED.name}: families without a profile: {', '.join(missing)}")
    return tuple(entries.values())


def parse_selection(text: str, known: Mapping[str, object], where: str) -> frozenset[str]:
    """A user's families file: the first cell of each row names a family to write; the rest of the
    row (the shipped file's profile and reason) is ignored."""
    from exporter.settings import did_you_mean  # a leaf import: settings imports this module's constants

    chosen: set[str] = set()
    for number, row in _rows(text, where):
        name = row[0] if row else ""
        if name not in known:
            raise FamiliesFileError(f"{where}:{number}: unknown family {name[:80]!r}{did_you_mean(name, list(known))}")
        chosen.add(name)
    if not chosen:
        raise FamiliesFileError(f"{where}: lists no family")
    return frozenset(chosen)


def _load_shipped() -> tuple[Entry, ...]:
    from exporter import catalog

    return parse_shipped(SHIPPED.read_text(encoding="utf-8"), catalog.FAMILIES)


ENTRIES: tuple[Entry, ...] = _load_shipped()
BY_FAMILY: Mapping[str, Entry] = MappingProxyType({e.family: e for e in ENTRIES})


def families(profile: str) -> frozenset[str]:
    """The families `profile` writes: its own and those of every smaller profile."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    levels = PROFILES[: PROFILES.index(profile) + 1]
    return frozenset(e.family for e in ENTRIES if e.profile in levels)


def read_families_file(path: str) -> frozenset[str]:
    """The families a user's file lists; FamiliesFileError (or OSError) names what is wrong."""
    from exporter import catalog
    from exporter.safefile import read_regular_file

    data = read_regular_file(path, MAX_FAMILIES_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FamiliesFileError(f"{path}: not UTF-8 ({error.reason} at byte {error.start})") from None
    return parse_selection(text, catalog.FAMILIES, path)


@dataclass(frozen=True, slots=True)
class Serves:
    """The rules and panels a profile is shipped to keep working. `rules`: a rule file of alerts/rules
    (`slo.yaml`, every rule in it) or one rule (`hardware.yaml:LLMGPULost`); `boards`: a dashboard
    (`llm-serving-fleet`, every panel) or one panel (`llm-serving-overview:Bottleneck now`);
    `except_panels`: panels of those boards the profile does not serve (`board:title`)."""

    rules: tuple[str, ...]
    boards: tuple[str, ...]
    except_panels: tuple[str, ...] = ()


_FAULT_ALERTS = ("LLMGPULost", "LLMGPUXidCritical", "LLMGPUXidWarning", "LLMGPUUncorrectableECCErrors",
                 "LLMGPURowRemapFailure", "LLMGPURowRemapPending", "LLMGPURecoveryActionAdvised",
                 "LLMGPURecoveryActionRequired", "LLMGPUFabricNotReady", "LLMGPUFabricDegraded")

SERVES: Mapping[str, Serves] = MappingProxyType({
    # The verdict, the SLO burn alerts, the hardware fault alerts, the fleet view and the exporter's
    # own health: what a platform team at 1,000 replicas keeps.
    "minimal": Serves(
        rules=("slo.yaml", "fleet.yaml", "pipeline.yaml", "hardware.yaml:LLMBottleneckStuck",
               *(f"hardware.yaml:{name}" for name in _FAULT_ALERTS)),
        boards=("llm-serving-fleet", "llm-serving-overview:Bottleneck now",
                "llm-serving-overview:Bottleneck verdict over time"),
        except_panels=("llm-serving-fleet:Prompt and output length per model, p50 and p99 (5m)",
                       "llm-serving-fleet:Prompt length distribution ($engine)",
                       "llm-serving-fleet:Output length distribution ($engine)"),
    ),
    # Every rule and every panel but the detail panels of full-only families.
    "default": Serves(
        rules=("*",),
        boards=("*",),
        except_panels=(),
    ),
    "full": Serves(rules=("*",), boards=("*",)),
})
