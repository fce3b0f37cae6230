"""RouterSource: scrape one router target's /metrics and normalize it (exporter/sources/routers/).

The fetch is the engine source's (one bounded HTTP client, credentials per request, the payload cap):
a router target takes the same options as an engine target (exporter/targets.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

from exporter.redact import redact_url
from exporter.snapshot import Sample, labels_of
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.engines.exposition import ExpositionError, TooManyNames
from exporter.sources.engines.scrape import LOG_UNACCOUNTED, EngineSource
from exporter.sources.routers.normalize import UnknownRouterError, normalize
from exporter.targets import EngineTarget


class RouterSource(EngineSource):
    kind = SourceKind.ROUTER
    layer = "router"
    docs = "docs/routers.md"

    def __init__(self, target: EngineTarget, *, max_payload_bytes: int, max_series: int) -> None:
        super().__init__(target, max_payload_bytes=max_payload_bytes, max_series=max_series)
        self.name = f"router:{target.name}"
        self._last_router = target.kind or "unknown"
        self._dropped: dict[str, int] = {}

    @property
    def attrs(self) -> Mapping[str, str]:
        return MappingProxyType({"kind": self.kind.value, "target": self.target.name, "router": self._last_router,
                                 "url": redact_url(self.target.url), "auth": self.target.auth_kind})

    async def collect(self) -> SourceData:
        text = await self.fetch()
        try:
            # A worker thread: a large page must not hold up /metrics (the engine source's reason).
            scrape = await asyncio.to_thread(normalize, text, target=self.target.name, kind=self.target.kind,
                                             max_series=self.max_series)
        except ExpositionError as error:
            raise SourceError("parse", f"not a Prometheus exposition: {error}") from None
        except UnknownRouterError as error:
            raise SourceError("unknown_router", str(error)) from None
        except TooManyNames as error:
            raise SourceError("too_many_families", str(error)) from None
        del text
        self._last_router = scrape.kind
        self._note_families(scrape)
        for reason, count in scrape.dropped.items():
            self._dropped[reason] = self._dropped.get(reason, 0) + count
        extra = [
            Sample("llm_router_info", labels_of(target=self.target.name, router=scrape.kind, policy=scrape.policy),
                   1.0),
            *(Sample("llm_exporter_engine_families", labels_of(target=self.target.name, engine=scrape.kind,
                                                                state=state), float(count))
              for state, count in scrape.families.counts().items()),
            *(Sample("llm_exporter_series_dropped_total", labels_of(source=self.name, reason=reason), float(count))
              for reason, count in self._dropped.items()),
            Sample("llm_exporter_log_lines_suppressed_total",
                   labels_of(source=self.name, reason=LOG_UNACCOUNTED), float(self._log.suppressed[LOG_UNACCOUNTED])),
        ]
        attrs = {"router": scrape.kind, "policy": scrape.policy, "url": redact_url(self.target.url),
                 "unaccounted_families": " ".join(scrape.families.names)}
        return SourceData(scrape.samples + tuple(extra), attrs)
