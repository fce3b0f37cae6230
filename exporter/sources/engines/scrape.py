"""EngineSource: scrape one engine target's /metrics over HTTP and normalize it.

Every call is bounded: a per-target timeout covers connect, headers and body, and the body is
read in chunks and abandoned past the payload cap, so a 100 MB page or a slow drip cannot pin
memory or the loop."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Mapping
from types import MappingProxyType

import httpx

from exporter.config import EngineTarget, install_log_redaction, redact_url
from exporter.snapshot import Sample, labels_of
from exporter.sources.base import SourceData, SourceError
from exporter.sources.engines.auth import CredentialError, TargetAuth, client_verify
from exporter.sources.engines.exposition import ExpositionError
from exporter.sources.engines.normalize import NormalizerState, UnknownEngineError, normalize

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger("llm_exporter.engine")


class EngineSource:
    def __init__(
        self,
        target: EngineTarget,
        *,
        max_payload_bytes: int,
        max_series: int,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.target = target
        self.name = f"engine:{target.name}"
        self.max_payload_bytes = max_payload_bytes
        self.max_series = max_series
        # Credentials are built per request (a rotated token file is picked up on the next scrape)
        # and passed as a header, never stored in the client or anything that is reported.
        self._auth = TargetAuth(target)
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(target.timeout_s),
            follow_redirects=False,  # only the configured URL is ever fetched, and no token follows a redirect
            headers={"Accept": ACCEPT, "User-Agent": "llm-exporter"},
            limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
            verify=client_verify(target),
            trust_env=False,  # no proxy or netrc from the environment: only the configured URL and credentials
        )
        install_log_redaction(logging.getLogger("httpx"))  # it logs each request's URL, userinfo included
        parts = urllib.parse.urlsplit(target.url)
        if target.auth_kind != "none" and parts.scheme == "http" and parts.hostname not in _LOOPBACK:
            log.warning("target %s sends credentials over plain http to a non-loopback host", target.name)
        if target.insecure_skip_verify:
            log.warning("target %s: TLS certificate verification is off (insecure_skip_verify)", target.name)
        self._state = NormalizerState()
        self._last_kind = target.kind or "unknown"
        self._series_dropped = 0

    @property
    def attrs(self) -> Mapping[str, str]:
        # Reported in /api/v1/snapshot: the redacted URL and the kind of auth, never a secret or its file.
        return MappingProxyType({"kind": "engine", "target": self.target.name, "engine": self._last_kind,
                                 "url": redact_url(self.target.url), "auth": self.target.auth_kind})

    async def fetch(self) -> str:
        """GET the target's exposition as text, enforcing the timeout and the size cap."""
        deadline = time.monotonic() + self.target.timeout_s
        try:
            headers = self._auth.headers()
        except CredentialError as error:
            raise SourceError("credentials", f"cannot read the credentials: {error}") from None
        try:
            async with self._client.stream("GET", self.target.url, headers=headers) as response:
                if response.status_code != 200:
                    raise SourceError("http_status", f"HTTP {response.status_code} from {redact_url(self.target.url)}")
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > self.max_payload_bytes:
                    raise SourceError("too_large", f"Content-Length {declared} over the cap {self.max_payload_bytes}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_payload_bytes:
                        raise SourceError("too_large", f"body over the cap of {self.max_payload_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise SourceError("timeout", f"body not complete within {self.target.timeout_s:g}s")
                    chunks.append(chunk)
        except httpx.TimeoutException:
            raise SourceError("timeout", f"no answer within {self.target.timeout_s:g}s") from None
        except httpx.HTTPError as error:
            if "CERTIFICATE_VERIFY_FAILED" in str(error):  # the cause only; httpx's text is not echoed
                raise SourceError("tls", f"TLS certificate of {redact_url(self.target.url)} not trusted "
                                         "(set ca_file for a private CA)") from None
            raise SourceError("connection", f"{type(error).__name__} for {redact_url(self.target.url)}") from None
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError:
            raise SourceError("parse", "payload is not UTF-8 text") from None

    async def collect(self) -> SourceData:
        text = await self.fetch()
        try:
            scrape = normalize(text, target=self.target.name, kind=self.target.kind, state=self._state,
                               max_series=self.max_series)
        except ExpositionError as error:
            raise SourceError("parse", f"not a Prometheus exposition: {error}") from None
        except UnknownEngineError as error:
            raise SourceError("unknown_engine", str(error)) from None
        self._last_kind = scrape.kind
        self._series_dropped += scrape.dropped_series
        extra = [
            Sample("llm_engine_info", labels_of(target=self.target.name, engine=scrape.kind, flavor=scrape.flavor), 1.0),
            Sample("llm_exporter_series_dropped_total", labels_of(source=self.name), float(self._series_dropped)),
        ]
        attrs = {"engine": scrape.kind, "flavor": scrape.flavor, "model": scrape.model}
        return SourceData(scrape.samples + tuple(extra), attrs)

    async def close(self) -> None:
        await self._client.aclose()
