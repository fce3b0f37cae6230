"""Which routers exist and how a page is recognised as one of them: the one place that names the
router kinds (config validation, the docs and the normalizer read them from here)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from exporter.sources.routers import dynamo, gie, sglang_router, vllm_router
from exporter.sources.routers.table import RouterSpec

SPECS: Mapping[str, RouterSpec] = MappingProxyType({
    spec.kind: spec for spec in (vllm_router.SPEC, sglang_router.SPEC, dynamo.SPEC, gie.SPEC)
})
KINDS: tuple[str, ...] = tuple(SPECS)

for _spec in SPECS.values():
    _spec.check()


def detect_kind(text: str) -> str | None:
    """The router kind of a page from its family prefixes; None when unknown."""
    for kind, spec in SPECS.items():
        if any(marker in text for marker in spec.markers):
            return kind
    return None
