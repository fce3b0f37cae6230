"""One router page to normalized samples: parse only what the table maps, map labels, add the
series a dropped label split, and account for every family on the page.

What a router's page controls is bounded here: the page by the engine parser's limits (samples,
names), backend label values by length and count (a router in front of a fleet names hundreds of
replicas; a hostile one could name millions), values by the catalogue's range."""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.catalog import FAMILIES
from exporter.catalog.router import BREAKER_STATES
from exporter.snapshot import Labels, Sample
from exporter.sources.engines.accounting import FamilyAccount, account
from exporter.sources.engines.exposition import parse
from exporter.sources.engines.page import MAX_PAGE_NAMES
from exporter.sources.routers.registry import SPECS, detect_kind
from exporter.sources.routers.table import RouterAlias, RouterSpec

MAX_BACKENDS = 1_024
"""Distinct backends one page may name; series of further backends are dropped (counted)."""
MAX_BACKEND_CHARS = 128
MAX_POLICY_CHARS = 64
_PARTS = ("_bucket", "_sum", "_count")
HISTOGRAMS = frozenset(f.name for f in FAMILIES.values() if f.source == "router" and f.type == "histogram")


class UnknownRouterError(ValueError):
    """The page matches no known router (and no kind was configured)."""


@dataclass(frozen=True, slots=True)
class RouterScrape:
    kind: str
    samples: tuple[Sample, ...]
    families: FamilyAccount
    policy: str = ""
    dropped: Mapping[str, int] = field(default_factory=dict)


def backend_name(value: str) -> str:
    """A router's name for a backend (a worker URL, host:port, a pod name) as the `backend` label:
    host:port where it is a URL (no scheme, credentials or path: the same replica whatever the
    router prints around it), bounded, printable."""
    text = value.strip()
    if "://" in text:
        try:
            parts = urllib.parse.urlsplit(text)
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            port = parts.port
            text = f"{host}:{port}" if port is not None else host
        except ValueError:
            pass
    text = "".join(ch for ch in text if ch.isprintable() and ch not in '"\\')
    return text[:MAX_BACKEND_CHARS] or "unknown"


def _routes(spec: RouterSpec) -> dict[str, list[RouterAlias]]:
    routes: dict[str, list[RouterAlias]] = {}
    for name, alias in spec.alias_items():
        if alias.type == "histogram":
            for part in _PARTS:
                routes.setdefault(name + part, []).append(alias)
        else:
            routes.setdefault(name, []).append(alias)
    return routes


def normalize(text: str, *, target: str, kind: str | None, max_series: int) -> RouterScrape:
    """The page's normalized samples (labels target, router, and the table's). Raises
    UnknownRouterError, and the engine parser's errors (ExpositionError, TooManyNames)."""
    kind = kind or detect_kind(text)
    if kind is None:
        raise UnknownRouterError("the page matches no known router (vllm-router, sglang-router, Dynamo's "
                                 "frontend, the inference extension's endpoint picker); set kind=")
    spec = SPECS[kind]
    routes = _routes(spec)
    wanted = frozenset(routes) | ({spec.policy_from[0]} if spec.policy_from else set())
    page = parse(text, keep=wanted.__contains__, max_samples=max_series, max_names=MAX_PAGE_NAMES)
    names = {sample[0] for sample in page.samples} | page.dropped_names
    families = account(spec.accounting, page.types, names)
    totals: dict[tuple[str, Labels], float] = {}
    backends: set[str] = set()
    # Each raw backend value is reduced once a page; once MAX_BACKENDS are named, a raw value not seen yet
    # is dropped without being parsed (a page of made-up backends costs a dict lookup a line).
    named: dict[str, str | None] = {}
    # The parser keeps at most max_series samples (a cardinality bomb); the rest it counts with those
    # of names the table does not read.
    dropped = {"cardinality": 1} if len(page.samples) >= max_series else {}
    policy = ""

    def drop(reason: str) -> None:
        dropped[reason] = dropped.get(reason, 0) + 1

    for name, raw_labels, value, _ in page.samples:
        labels = dict(raw_labels)
        if spec.policy_from and name.startswith(spec.policy_from[0]) and not policy:
            policy = labels.get(spec.policy_from[1], "")[:MAX_POLICY_CHARS]
        for alias in routes.get(name, ()):
            if alias.where is not None and labels.get(alias.where[0]) != alias.where[1]:
                continue
            if alias.where_not is not None and labels.get(alias.where_not[0], "") == alias.where_not[1]:
                continue
            if alias.removed is not None and value == alias.removed:
                continue  # the router's marker for a backend it removed: no series, and no error
            part = next((p for p in _PARTS if alias.type == "histogram" and name.endswith(p)), "")
            fam = FAMILIES[alias.family]
            out: dict[str, str] = {"target": target, "router": kind}
            over = False
            for label, role in spec.labels.items():
                if label in labels and role in fam.labels:
                    raw = labels[label]
                    if role == "backend":
                        if raw not in named:
                            named[raw] = None if len(backends) >= MAX_BACKENDS else backend_name(raw)
                            if named[raw] is not None:
                                backends.add(named[raw])  # type: ignore[arg-type]
                        found = named[raw]
                        if found is None or (found not in backends and len(backends) >= MAX_BACKENDS):
                            over = True
                            break
                        out[role] = found
                    else:
                        out[role] = spec.causes.get(raw.lower(), "other") if role == "cause" else raw[:MAX_POLICY_CHARS]
            if over:
                drop("cardinality")
                continue
            if alias.cause is not None:
                out["cause"] = alias.cause
            if alias.role is not None:
                out["role"] = alias.role
            if "cause" in fam.labels and "cause" not in out:
                out["cause"] = "other"
            if any(lbl not in out for lbl in fam.labels if lbl != "state"):
                drop("missing_label")
                continue
            if not math.isfinite(value) or value < 0:
                drop("out_of_range")
                continue
            if part == "_bucket":
                le = labels.get("le", "")
                try:
                    bound = float(le) * alias.scale if le not in ("+Inf", "inf", "Inf") else math.inf
                except ValueError:
                    drop("bad_bucket")
                    continue
                out["le"] = "+Inf" if bound == math.inf else repr(round(bound, 9)).removesuffix(".0")
            if part == "_sum":
                value *= alias.scale
            if alias.states is not None:
                current = alias.states.get(value)
                if current is None:
                    drop("out_of_range")
                    continue
                for state in BREAKER_STATES:
                    key = (alias.family, tuple(sorted({**out, "state": state}.items())))
                    totals[key] = max(totals.get(key, 0.0), 1.0 if state == current else 0.0)
                continue
            if fam.type == "gauge" and fam.unit == "bool":
                value = 1.0 if value > 0 else 0.0
            key = (alias.family + part, tuple(sorted(out.items())))
            totals[key] = totals.get(key, 0.0) + value
    # A histogram without its +Inf bucket (a summary's _sum and _count under a histogram's name: the Rust
    # routers' exporter writes some `histogram!`s as summaries) is not a histogram: left out whole.
    complete = {(name[: -len("_bucket")], tuple(kv for kv in labels if kv[0] != "le"))
                for (name, labels) in totals if name.endswith("_bucket") and ("le", "+Inf") in labels}
    samples = []
    for (name, series), value in totals.items():
        part = next((p for p in _PARTS if name.endswith(p) and name[: -len(p)] in HISTOGRAMS), "")
        if part and (name[: -len(part)], tuple(kv for kv in series if kv[0] != "le")) not in complete:
            if part == "_count":
                drop("not_a_histogram")
            continue
        samples.append(Sample(name, series, value))
    return RouterScrape(kind, tuple(samples), families, policy, dropped)
