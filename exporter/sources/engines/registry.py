"""Which engines exist and how a page is recognised as one of them.

The one place that names the engine kinds: the per-engine tables (data, see table.py), their
detection order and markers, and the coverage each table gives. normalize.py, config validation,
the docs (coverage.py, docs/metrics.md) and the dashboards read it from here. It imports only the
tables, so config can import it without pulling in the normalizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.sources.engines import llamacpp, lmdeploy, nim, sglang, tgi, triton, trtllm, vllm
from exporter.sources.engines.table import EngineSpec

__all__ = ["DETECTION_ORDER", "KINDS", "SPECS", "YIELDS_TO", "coverage", "detect_kind", "flavor", "matches", "role"]

SPECS: Mapping[str, EngineSpec] = MappingProxyType({
    spec.kind: spec
    for spec in (vllm.SPEC, sglang.SPEC, tgi.SPEC, llamacpp.SPEC, triton.SPEC, trtllm.SPEC, lmdeploy.SPEC,
                 nim.SPEC)
})
KINDS: tuple[str, ...] = tuple(SPECS)
"""Valid engine kinds (config validation uses this), in the docs' column order."""

# Most specific first: LMDeploy and NIM reuse vLLM's names; the unprefixed trtllm-serve names are
# NIM's too (trtllm-serve adds an `engine_type` label; NIM is only recognised by a NIM-only name).
# A NIM that also shows its backend's `vllm:` series is read as vLLM, which has more families, and
# so is Triton with the vLLM backend (its `vllm:*` series carry `model`; the vLLM table also reads
# Triton's core request counters).
DETECTION_ORDER: tuple[str, ...] = ("lmdeploy", "sglang", "llamacpp", "tgi", "trtllm", "vllm", "triton", "nim")

YIELDS_TO: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "triton": ("vllm",),
    "nim": ("trtllm", "vllm"),
})
"""Kind kept from the last page -> the more specific kinds that are checked again on every page,
because their names can join the kept kind's on the same page later: Triton registers the vLLM
backend's `vllm:*` families only when the model has loaded (its core `nv_inference_*` come first),
an idle NIM-looking page can turn out to be another engine once samples appear. Each listed kind
precedes the kept one in DETECTION_ORDER (checked at import), so this is what detect_kind would
choose; a few substring scans on these pages only."""


@dataclass(frozen=True, slots=True)
class _Needle:
    """A detection marker: any of `anywhere` occurs, or the page starts with `prefix`."""

    anywhere: tuple[str, ...]
    prefix: str | None


def _needle(marker: str) -> _Needle:
    if marker.startswith("\n"):
        bare = marker[1:]
        return _Needle((marker, "# TYPE " + bare), bare)
    return _Needle((marker,), None)


_MARKERS: Mapping[str, tuple[tuple[_Needle, ...], ...]] = MappingProxyType({
    kind: tuple(tuple(_needle(m) for m in marker) for marker in spec.markers) for kind, spec in SPECS.items()
})


def _check() -> None:
    if set(DETECTION_ORDER) != set(KINDS) or len(DETECTION_ORDER) != len(KINDS):
        raise ValueError(f"DETECTION_ORDER {DETECTION_ORDER} must list each of {KINDS} once")
    for kept, specific in YIELDS_TO.items():
        if any(DETECTION_ORDER.index(more) >= DETECTION_ORDER.index(kept) for more in specific):
            raise ValueError(f"YIELDS_TO[{kept!r}]: each kind must precede {kept!r} in DETECTION_ORDER")


_check()


def matches(text: str, kind: str) -> bool:
    """Whether the page carries one of `kind`'s markers (all substrings of any one marker)."""
    return any(all(_found(text, needle) for needle in marker) for marker in _MARKERS[kind])


def _found(text: str, needle: _Needle) -> bool:
    if needle.prefix is not None and text.startswith(needle.prefix):
        return True
    return any(part in text for part in needle.anywhere)


def detect_kind(text: str) -> str | None:
    """The engine kind of an exposition, from cheap substring checks; None when unknown."""
    for kind in DETECTION_ORDER:
        if matches(text, kind):
            return kind
    return None


def flavor(text: str, spec: EngineSpec) -> str:
    """The alias set a page of `spec`'s kind shows: the first flavor substring found."""
    for marker, name in spec.flavors:
        if marker in text:
            return name
    return spec.default_flavor


def role(text: str, spec: EngineSpec) -> str | None:
    """The PD role a page of `spec`'s kind names (catalog ROLES): the first role substring found;
    None when the page does not say."""
    for marker, name in spec.roles:
        if marker in text:
            return name
    return None


def coverage(kind: str) -> dict[str, list[str]]:
    """Normalized family -> the engine names feeding it, highest priority first."""
    spec = SPECS[kind]
    entries: dict[str, list[tuple[int, str]]] = {}
    for source, alias in spec.alias_items():
        shown = source + (f'{{{alias.where[0]}="{alias.where[1]}"}}' if alias.where else "")
        entries.setdefault(alias.family, []).append((alias.priority, shown))
    for product in spec.products:
        shown = (" + " if product.add else " x ").join(
            ("1/" if term.divide else "") + term.source
            + (f'{{{term.where[0]}="{term.where[1]}"}}' if term.where else "")
            + (f"[{term.label}]" if term.label else "")
            for term in product.terms)
        entries.setdefault(product.family, []).append((product.priority, shown))
    return {family: [name for _, name in sorted(items, key=lambda item: -item[0])]
            for family, items in entries.items()}
