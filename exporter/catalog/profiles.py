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
import difflib
import io
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.catalog.base import Family
from exporter.settings import PROFILES  # the names are a setting's choices (--profile); what they write is here

SHIPPED = pathlib.Path(__file__).with_name("families.csv")
MAX_FAMILIES_FILE_BYTES = 256 * 1024  # the shipped file is about 20 KB
MAX_FAMILIES_FILE_LINES = 4096


class FamiliesFileError(ValueError):
    """A families file that cannot be used: the message names the line and what is wrong."""


Only = tuple[str, frozenset[str]] | None
"""Which series of a family are written: None every one, else (label, values): those whose `label`
is one of `values` (`llm_gpu_clock_event_active{reason=hw_slowdown|sw_power_cap}`)."""
Selection = Mapping[str, Only]
"""family -> the series of it that are written; a family not in it is not written."""

_ROW_NAME = re.compile(r"([a-z_:][a-z0-9_:]*)(?:\{([a-z_][a-z0-9_]*)=([^{}=]+)\})?\Z")


@dataclass(frozen=True, slots=True)
class Entry:
    family: str
    profile: str
    why: str
    only: Only = None


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


def _name(cell: str, known: Mapping[str, Family], where: str) -> tuple[str, Only]:
    """`family` or `family{label=v1|v2}`, the family known and the label one of its labels."""
    match = _ROW_NAME.match(cell)
    if match is None:
        raise FamiliesFileError(f"{where}: expected a family name or family{{label=value|value}}: {cell[:80]!r}")
    name, label, values = match.groups()
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise FamiliesFileError(f"{where}: unknown family {name!r}{hint}")
    if label is None:
        return name, None
    if label not in known[name].labels:
        raise FamiliesFileError(f"{where}: {name} has no label {label!r} (labels: {', '.join(known[name].labels)})")
    return name, (label, frozenset(v.strip() for v in values.split("|") if v.strip()))


def _merge(selection: dict[str, Only], name: str, only: Only, where: str) -> None:
    """A family listed twice writes what either row writes: every series if one row is unrestricted,
    else the union of the values of the one label they restrict."""
    if only is None or name not in selection:
        selection[name] = only
        return
    held = selection[name]
    if held is None:
        return
    if held[0] != only[0]:
        raise FamiliesFileError(f"{where}: {name} is restricted by two labels ({held[0]}, {only[0]})")
    selection[name] = (held[0], held[1] | only[1])


def parse_shipped(text: str, known: Mapping[str, Family]) -> tuple[Entry, ...]:
    """The shipped file: rows `family[{label=values}],profile,why`; every known family listed, at most
    once without a restriction, and never at a smaller profile than one of its restricted rows."""
    entries: list[Entry] = []
    for number, row in _rows(text, SHIPPED.name):
        where = f"{SHIPPED.name}:{number}"
        if len(row) != 3 or row[1] not in PROFILES or not row[2]:
            raise FamiliesFileError(f"{where}: expected family,profile ({', '.join(PROFILES)}),why: {row!r}")
        name, only = _name(row[0], known, where)
        entries.append(Entry(name, row[1], row[2], only))
    missing = sorted(set(known) - {e.family for e in entries})
    if missing:
        raise FamiliesFileError(f"{SHIPPED.name}: families without a profile: {', '.join(missing)}")
    for name in known:
        rows = [e for e in entries if e.family == name]
        whole = [e for e in rows if e.only is None]
        if len(whole) > 1 or (whole and any(PROFILES.index(e.profile) >= PROFILES.index(whole[0].profile)
                                               for e in rows if e.only is not None)):
            raise FamiliesFileError(f"{SHIPPED.name}: {name}: one unrestricted row at most, at a larger profile "
                                    "than its restricted rows")
    return tuple(entries)


def parse_selection(text: str, known: Mapping[str, Family], where: str) -> Selection:
    """A user's families file: the first cell of each row names a family (or some of its series) to
    write; the rest of the row (the shipped file's profile and reason) is ignored."""
    chosen: dict[str, Only] = {}
    for number, row in _rows(text, where):
        name, only = _name(row[0] if row else "", known, f"{where}:{number}")
        _merge(chosen, name, only, f"{where}:{number}")
    if not chosen:
        raise FamiliesFileError(f"{where}: lists no family")
    return MappingProxyType(chosen)


def _load_shipped() -> tuple[Entry, ...]:
    from exporter import catalog

    return parse_shipped(SHIPPED.read_text(encoding="utf-8"), catalog.FAMILIES)


ENTRIES: tuple[Entry, ...] = _load_shipped()


def selection(profile: str) -> Selection:
    """What `profile` writes: its own rows and those of every smaller profile."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: expected one of {', '.join(PROFILES)}")
    levels = PROFILES[: PROFILES.index(profile) + 1]
    chosen: dict[str, Only] = {}
    for entry in ENTRIES:
        if entry.profile in levels:
            _merge(chosen, entry.family, entry.only, SHIPPED.name)
    return MappingProxyType(chosen)


def families(profile: str) -> frozenset[str]:
    """The families `profile` writes, wholly or in part."""
    return frozenset(selection(profile))


def _engine_histograms_not_slo() -> frozenset[str]:
    from exporter import catalog
    from exporter.slo import SLOS

    return frozenset(f.name for f in catalog.FAMILIES.values()
                     if f.type == "histogram" and f.source == "engine" and f.name not in {s.metric for s in SLOS})


ENGINE_HISTOGRAMS_NOT_SLO = _engine_histograms_not_slo()
"""What `--histogram-buckets slo` leaves out: the engine's histograms no SLO is judged on."""


def read_families_file(path: str) -> Selection:
    """What a user's file selects; FamiliesFileError (or OSError) names what is wrong."""
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
                       "llm-serving-fleet:Output length distribution ($engine)",
                       "llm-serving-fleet:Router latency and time before the engine",
                       "llm-serving-fleet:Retries and errors per router"),
    ),
    # Every rule and every panel but the detail panels of full-only families: at most 30 series a GPU.
    "default": Serves(
        rules=("*",),
        boards=("*",),
        except_panels=tuple(f"llm-serving-gpu-roofline:{title}" for title in (
            "Utilization next to SM, tensor and DRAM bandwidth activity", "Achieved vs peak HBM bandwidth",
            "HBM bandwidth efficiency (share of peak)", "Prefill MFU", "Device memory per GPU", "Power vs limit",
            "Clocks as a share of max", "Temperature", "Clock event (throttle) reasons",
            "ECC errors, row remapping and PCIe replays",
        )) + tuple(f"llm-serving-host:{title}" for title in (
            "CPU busy per core", "GPU NUMA nodes (sysfs)", "Memory per NUMA node", "GPU PCIe links from sysfs",
            "Requests refused and series dropped",
        )) + ("llm-serving-overview:Tokens per engine step (5m)",),
    ),
    "full": Serves(rules=("*",), boards=("*",)),
})
