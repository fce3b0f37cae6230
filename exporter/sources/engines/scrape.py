"""EngineSource: scrape one engine target's /metrics over HTTP and normalize it.

Every call is bounded: a per-target timeout covers connect, headers and body, and the body is
read in chunks and abandoned past the payload cap, so a 100 MB page or a slow drip cannot pin
memory or the loop."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol, TypeVar

from exporter.catalog import family_of
from exporter.httpclient import HttpClient
from exporter.logstate import StateLog, quote_names
from exporter.redact import CredentialError, redact_url
from exporter.snapshot import Labels, Sample, labels_of, make_labels
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.engines.accounting import FamilyAccount
from exporter.sources.engines.auth import TargetAuth, ssl_context
from exporter.sources.engines.drops import CARDINALITY
from exporter.sources.engines.exposition import ExpositionError
from exporter.sources.engines.normalize import NormalizedScrape
from exporter.sources.engines.page import TooManyFamiliesError, UnknownEngineError
from exporter.sources.engines.replay import normalize_if_unchanged, normalize_with_memo
from exporter.sources.engines.state import NormalizerState
from exporter.targets import EngineTarget

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
# A page whose last normalize took under this much CPU, and that has not grown, is tried on the
# event loop, replaying the last page's plan (handing it to a worker thread costs about as much as
# that replay). Anything needing the full pass, and new, grown or slow pages (a cardinality bomb
# takes seconds), goes to a thread, so /metrics waits at most for one parse of a known-size page.
INLINE_MAX_CPU_S = 0.003
INLINE_MAX_GROWTH = 1.1
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_Scrape = TypeVar("_Scrape", NormalizedScrape, NormalizedScrape | None)  # what a normalize pass returns

log = logging.getLogger("llm_exporter.engine")


class Accounted(Protocol):
    """A normalized page as the unaccounted-families log line reads it (an engine's or a router's)."""

    @property
    def kind(self) -> str: ...

    @property
    def families(self) -> FamilyAccount: ...

# The `reason` of llm_exporter_log_lines_suppressed_total: which state-change line was held back.
LOG_UNACCOUNTED = "unaccounted_families"
LOG_DROPS = "series_dropped"
LOG_ROLE = "role_conflict"
LOG_REASONS = (LOG_UNACCOUNTED, LOG_DROPS, LOG_ROLE)


class ModelLabels:
    """The target's `model` option as the `model` label of every engine series whose family has one,
    for pages that name no model (llama.cpp). The engine's label sets repeat every cycle, so each
    rewrite is kept for the next page; only the last page's are kept, so what this holds between
    cycles is bounded by that page (max_series and the payload's byte cap), not by a count of its own."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, Labels], Labels] = {}

    def fill(self, samples: tuple[Sample, ...], model: str) -> tuple[Sample, ...]:
        last, kept = self._last, {}
        out = []
        for sample in samples:
            key = (sample.name, sample.labels)
            labels = last.get(key)
            if labels is None:
                family = family_of(sample.name)
                has = family is not None and "model" in family.labels and all(k != "model" for k, _ in sample.labels)
                labels = make_labels((*sample.labels, ("model", model))) if has else sample.labels
            kept[key] = labels
            out.append(sample if labels is sample.labels else sample._replace(labels=labels))
        self._last = kept
        return tuple(out)


class EngineSource:
    kind = SourceKind.ENGINE
    layer = "engine"  # what its log lines call the target's families, and where they are documented
    docs = "docs/engines.md"

    def __init__(
        self,
        target: EngineTarget,
        *,
        max_payload_bytes: int,
        max_series: int,
        client: HttpClient | None = None,
    ) -> None:
        self.target = target
        self.name = f"engine:{target.name}"
        self.timeout_s: float | None = target.timeout_s
        self.max_payload_bytes = max_payload_bytes
        self.max_series = max_series
        # Credentials are built per request (a rotated token file is picked up on the next scrape)
        # and passed as a header, never stored in the client or anything that is reported.
        self._auth = TargetAuth(target)
        # One kept-alive connection, no redirects (only the configured URL is ever fetched, and no
        # token follows a redirect), nothing from the environment (no proxy, .netrc or CA path):
        # see exporter/httpclient.py.
        self._client = client or HttpClient(
            target.url, timeout_s=target.timeout_s,
            ssl_context=ssl_context(target) if target.url.lower().startswith("https:") else None,
            headers={"Accept": ACCEPT, "User-Agent": "llm-exporter"})
        parts = urllib.parse.urlsplit(target.url)
        if target.auth_kind != "none" and parts.scheme == "http" and parts.hostname not in _LOOPBACK:
            log.warning("target %s sends credentials over plain http to a non-loopback host", target.name)
        if target.insecure_skip_verify:
            log.warning("target %s: TLS certificate verification is off (insecure_skip_verify)", target.name)
        self._state = NormalizerState()
        self._model_labels = ModelLabels()
        self._last_normalize: tuple[int, float] | None = None  # (page characters, CPU seconds)
        self._last_kind = target.kind or "unknown"
        # Series dropped since the start, by reason (cardinality always shown, 0 until it happens).
        self._series_dropped: dict[str, int] = {CARDINALITY: 0}
        # A line when a drop reason starts or stops, the unaccounted families or a role conflict
        # change: each rate-limited per key, what it held back counted (exporter/logstate.py).
        self._log = StateLog(reasons=LOG_REASONS)

    @property
    def attrs(self) -> Mapping[str, str]:
        # Reported in /api/v1/snapshot: the redacted URL and the kind of auth, never a secret or its file.
        return MappingProxyType({"kind": self.kind.value, "target": self.target.name, "engine": self._last_kind,
                                 "url": redact_url(self.target.url), "auth": self.target.auth_kind})

    async def fetch(self) -> str:
        """GET the target's exposition as text, enforcing the timeout and the size cap."""
        try:
            headers = await self._auth.headers()
        except CredentialError as error:
            raise SourceError("credentials", f"cannot read the credentials: {error}") from None
        # timeout (connect + headers + body), dns, http_status, too_large, tls, connection
        body = await self._client.get(headers=headers, max_body=self.max_payload_bytes)
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as error:
            at = error.start
        # Raised outside the handler and without the body: the UnicodeDecodeError holds the whole
        # page, and as this error's __context__ (or through this frame) it would live as long.
        del body
        raise SourceError("parse", f"payload is not UTF-8 text (byte {at})")

    def normalize_inline(self, size: int) -> bool:
        """Whether a page of `size` characters is cheap enough to normalize on the event loop."""
        last = self._last_normalize
        return last is not None and last[1] < INLINE_MAX_CPU_S and size <= last[0] * INLINE_MAX_GROWTH

    def _normalize(self, text: str) -> NormalizedScrape:
        return self._timed(normalize_with_memo, text)

    def _normalize_if_unchanged(self, text: str) -> NormalizedScrape | None:
        """The replay of an unchanged page, or None (exporter/sources/engines/replay.py)."""
        return self._timed(normalize_if_unchanged, text)

    def _timed(self, how: Callable[..., _Scrape], text: str) -> _Scrape:
        """`how` on the page, its CPU time noted for normalize_inline."""
        started = time.thread_time()
        try:
            return how(text, target=self.target.name, kind=self.target.kind, state=self._state,
                       max_series=self.max_series)
        finally:
            self._last_normalize = (len(text), time.thread_time() - started)

    async def collect(self) -> SourceData:
        text = await self.fetch()
        try:
            # Otherwise in a worker thread: a page of many distinct series (a cardinality bomb under
            # the payload cap) takes seconds to parse, which on the event loop would hold up every
            # /metrics request. The Collector never runs two collections of one source at once,
            # so the state is only ever used by one thread at a time.
            scrape = self._normalize_if_unchanged(text) if self.normalize_inline(len(text)) else None
            if scrape is None:
                scrape = await asyncio.to_thread(self._normalize, text)
        except ExpositionError as error:
            raise SourceError("parse", f"not a Prometheus exposition: {error}") from None
        except UnknownEngineError as error:
            raise SourceError("unknown_engine", str(error)) from None
        except TooManyFamiliesError as error:
            raise SourceError("too_many_families", str(error)) from None
        self._last_kind = scrape.kind
        self._count_drops(scrape)
        self._note_families(scrape)
        families = scrape.families
        role = self._role(scrape)
        samples, model = scrape.samples, scrape.model
        if not model and self.target.model:
            samples, model = self._model_labels.fill(samples, self.target.model), self.target.model
        extra = [
            Sample("llm_engine_info",
                   labels_of(target=self.target.name, engine=scrape.kind, flavor=scrape.flavor, role=role), 1.0),
            *(Sample("llm_exporter_series_dropped_total", labels_of(source=self.name, reason=reason), float(count))
              for reason, count in self._series_dropped.items()),
            *(Sample("llm_exporter_engine_families", labels_of(target=self.target.name, engine=scrape.kind,
                                                                state=state), float(count))
              for state, count in families.counts().items()),
            *(Sample("llm_exporter_log_lines_suppressed_total", labels_of(source=self.name, reason=reason),
                     float(count))
              for reason, count in self._log.suppressed.items()),
        ]
        attrs = {"engine": scrape.kind, "flavor": scrape.flavor, "model": model, "role": role,
                 "unaccounted_families": " ".join(families.names)}
        return SourceData(samples + tuple(extra), attrs)

    def _role(self, scrape: NormalizedScrape) -> str:
        """The instance's PD role: the page's where it names one (the engine knows what it runs as),
        else the target's `role` option, else `both`. A page that contradicts the option is logged
        once per change (at most one line a minute): the option is stale or names the wrong target."""
        declared = self.target.role
        if scrape.role is None:
            return declared or "both"
        conflict = (declared, scrape.role) if declared is not None and declared != scrape.role else None

        def write(suffix: str) -> None:
            if conflict is not None:
                log.warning("target %s: the page says role %s, the target's role option %s: the page's is "
                            "used%s", self.target.name, conflict[1], conflict[0], suffix)

        self._log.update("role", conflict, LOG_ROLE, write)
        return scrape.role

    def _note_families(self, scrape: Accounted) -> None:
        """A log line when the set of families the engine table does not account for changes (an
        engine upgrade, a feature switched on), not on every cycle; a page whose made-up names change
        every cycle writes one a minute, naming a few hundred characters of them."""
        families = scrape.families

        def write(suffix: str) -> None:
            if families.names:
                log.warning("target %s: %d %s families neither mapped nor ignored by the %s table (a new "
                            "release?): %s; see %s%s", self.target.name, families.unaccounted, self.layer,
                            scrape.kind, quote_names(families.names, families.unaccounted), self.docs, suffix)
            else:
                log.info("target %s: every %s family is accounted for again%s", self.target.name, self.layer, suffix)

        self._log.update("unaccounted", families.names, LOG_UNACCOUNTED, write, initial=())

    def _count_drops(self, scrape: NormalizedScrape) -> None:
        """Add the page's dropped series to the counters; log when a reason starts (with the page's
        notes, which say what) and when it stops, not on every cycle: at most a line a minute per
        reason (the reasons are the normalizer's fixed vocabulary)."""
        drops = scrape.drops
        for reason, count in drops.items():
            self._series_dropped[reason] = self._series_dropped.get(reason, 0) + count
        for reason in self._series_dropped:
            dropping = reason in drops

            def write(suffix: str, reason: str = reason, dropping: bool = dropping) -> None:
                if dropping:
                    log.warning("target %s: dropping series (%s): %d this scrape; %s%s", self.target.name, reason,
                                drops[reason], "; ".join(scrape.notes)[:500] or "no notes", suffix)
                else:
                    log.info("target %s: no longer dropping series (%s)%s", self.target.name, reason, suffix)

            self._log.update("drop:" + reason, dropping, LOG_DROPS, write, initial=False)

    async def close(self) -> None:
        await self._client.aclose()
