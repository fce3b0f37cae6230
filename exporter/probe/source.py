"""ProbeSource: one `--probe`, a streaming completion every `every` seconds, as a Source.

The requests run in a background task the source owns, on their own schedule: a probe takes as
long as the engine takes (seconds under load), far longer than a collection cycle may. One request
is in flight at a time; the next starts `every` seconds after the previous one started, or at once
when it took longer. `collect()` only reports what the finished requests accumulated (cumulative
histograms and counters, like an engine's own), so it never waits and never fails: a failing probe
is `llm_probe_up 0` and `llm_probe_errors_total{reason}`, not a failed source. `close()` cancels
the task. The task starts with the first collection (on the collector's event loop).

Credentials: those of the engine target the probe belongs to, and only when the probe URL has that
target's scheme, host and port (ProbeTarget.same_origin): a secret goes nowhere it was not
configured for. Built per request, so a rotated token file is picked up; never logged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.utils import floatToGoString

from exporter import jsonsafe
from exporter.catalog.probe import E2E_BUCKETS, ERROR_REASONS, ITL_BUCKETS, TTFT_BUCKETS
from exporter.httpclient import HttpClient
from exporter.jsonsafe import JsonTooDeep
from exporter.redact import CredentialError, redact_url
from exporter.snapshot import Labels, Sample, make_labels
from exporter.sources.base import SourceData, SourceError, SourceKind
from exporter.sources.engines.auth import TargetAuth, client_context, ssl_context
from exporter.targets import ProbeTarget

from .client import CompletionTiming, Resolver, StreamLimits, make_prompt, stream_completion

log = logging.getLogger("llm_exporter.probe")

MAX_MODELS_BYTES = 256 * 1024  # GET /v1/models: a list of a few model cards
MAX_MODEL_NAME = 256
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

@dataclass(slots=True)
class Histogram:
    """A cumulative histogram of one family: counts per bound (not cumulative until emitted)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return

    def samples(self, name: str, labels: Labels) -> list[Sample]:
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=True):
            running += n
            out.append(Sample(name + "_bucket", make_labels((*labels, ("le", floatToGoString(bound)))), running))
        out.append(Sample(name + "_bucket", make_labels((*labels, ("le", "+Inf"))), float(self.count)))
        out.append(Sample(name + "_sum", labels, self.total))
        out.append(Sample(name + "_count", labels, float(self.count)))
        return out


@dataclass(slots=True)
class ProbeState:
    """What the finished requests accumulated; read by collect(), written by the probe task (one
    event loop, so no lock)."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    requests: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_REASONS, 0))
    completion_tokens: int = 0
    prompt_tokens: int = 0
    configured_prompt_tokens: int = 0  # counted for a success whose engine reports no usage
    in_flight: float = 0.0
    up: float | None = None  # None until the first request ends
    last_success: float | None = None
    last_reason: str = ""  # "" after a success: what the log said last

    def record(self, outcome: CompletionTiming, now: float) -> None:
        self.requests += 1
        if outcome.ok:
            self.up, self.last_success = 1.0, now
            if outcome.ttft_s is not None:
                self.ttft.observe(outcome.ttft_s)
            for gap in outcome.itl_s:
                self.itl.observe(gap)
            if outcome.e2e_s is not None:
                self.e2e.observe(outcome.e2e_s)
            self.completion_tokens += outcome.completion_tokens
            self.prompt_tokens += (outcome.prompt_tokens if outcome.prompt_tokens is not None
                                   else self.configured_prompt_tokens)
        else:
            self.up = 0.0
            reason = outcome.reason if outcome.reason in self.errors else "exception"
            self.errors[reason] += 1


def _failure(reason: str, message: str) -> CompletionTiming:
    now = time.monotonic()
    return CompletionTiming(ok=False, reason=reason, message=message, status=None, started_at=now, connect_s=None,
                            sent_at=None, response_at=None, token_times=(), ttft_s=None, itl_s=(), e2e_s=None,
                            prompt_tokens=None, completion_tokens=0, usage_reported=False)


class ProbeSource:
    kind = SourceKind.PROBE
    timeout_s: float | None = None  # collect() only reads the accumulated state

    def __init__(self, probe: ProbeTarget, *, engine_attrs: Callable[[], Mapping[str, str]] | None = None,
                 clock: Callable[[], float] = time.time,
                 stream: Callable[..., Awaitable[CompletionTiming]] = stream_completion) -> None:
        self.probe = probe
        self.name = f"probe:{probe.target}"
        self._engine_attrs = engine_attrs
        self._clock = clock
        self._stream = stream
        self.state = ProbeState(configured_prompt_tokens=probe.prompt_tokens)
        self._task: asyncio.Task | None = None
        self._resolver = Resolver()
        self._prompt = make_prompt(probe.prompt_tokens)
        self._model = probe.model
        self._limits = StreamLimits.for_tokens(probe.max_tokens)
        engine = probe.engine if probe.same_origin else None
        self._auth = TargetAuth(engine) if engine is not None else None
        # user:password@ in the engine target's URL (YAML or the environment) is its basic auth
        parts = urllib.parse.urlsplit(engine.url) if engine is not None else None
        self._url_auth = None
        if parts is not None and (parts.username or parts.password):
            raw = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
            self._url_auth = "Basic " + base64.b64encode(raw.encode("utf-8")).decode("ascii")
        https = probe.url.lower().startswith("https:")
        self._tls = (ssl_context(engine) if engine is not None else client_context()) if https else None
        self._models_client: HttpClient | None = None
        own = urllib.parse.urlsplit(probe.url)
        if probe.engine is not None and not probe.same_origin and probe.engine.auth_kind != "none":
            log.warning("probe %s: %s is not where target %s's credentials are configured for; sending none",
                        probe.target, redact_url(probe.url), probe.target)
        if engine is not None and engine.auth_kind != "none" and own.scheme == "http" and own.hostname not in _LOOPBACK:
            log.warning("probe %s sends credentials over plain http to a non-loopback host", probe.target)

    @property
    def attrs(self) -> Mapping[str, str]:
        # Reported in /api/v1/snapshot: never a secret or where it is kept.
        auth = "none" if self._auth is None and self._url_auth is None else (
            self._auth.kind if self._auth is not None and self._auth.kind != "none" else "basic_url")
        return MappingProxyType({"kind": self.kind.value, "target": self.probe.target,
                                 "url": redact_url(self.probe.url), "api": self.probe.api,
                                 "model": self._model or "", "auth": auth})

    def labels(self) -> Labels:
        pairs = {"target": self.probe.target}
        if self._engine_attrs is not None:
            pairs["engine"] = self._engine_attrs().get("engine", "unknown")
        if self._model:
            pairs["model"] = self._model
        return make_labels(pairs)

    async def collect(self) -> SourceData:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)
        state = self.state
        if state.up is None:  # nothing finished yet: no series rather than made-up zeros
            return SourceData((), self.attrs)
        labels = self.labels()
        out = [*state.ttft.samples("llm_probe_time_to_first_token_seconds", labels),
               *state.itl.samples("llm_probe_inter_token_latency_seconds", labels),
               *state.e2e.samples("llm_probe_e2e_request_latency_seconds", labels),
               Sample("llm_probe_requests_total", labels, float(state.requests)),
               *(Sample("llm_probe_errors_total", make_labels((*labels, ("reason", reason))), float(count))
                 for reason, count in state.errors.items()),
               Sample("llm_probe_completion_tokens_total", labels, float(state.completion_tokens)),
               Sample("llm_probe_prompt_tokens_total", labels, float(state.prompt_tokens)),
               Sample("llm_probe_in_flight", labels, state.in_flight),
               Sample("llm_probe_up", labels, state.up)]
        if state.last_success is not None:
            out.append(Sample("llm_probe_last_success_timestamp_seconds", labels, state.last_success))
        return SourceData(tuple(out), self.attrs)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            self.state.in_flight = 1.0
            try:
                outcome = await self.probe_once()
            except Exception as error:  # noqa: BLE001 - a bug must not end the probing
                log.debug("probe %s raised", self.probe.target, exc_info=error)
                outcome = _failure("exception", f"{type(error).__name__}: {error}")
                del error
            finally:
                self.state.in_flight = 0.0
            self.state.record(outcome, self._clock())
            self._log(outcome)
            await asyncio.sleep(max(0.0, began + self.probe.every_s - loop.time()))

    async def probe_once(self) -> CompletionTiming:
        """One request (after finding the model, the first time, when none is configured)."""
        try:
            headers = await self._headers()
        except CredentialError as error:
            return _failure("credentials", f"cannot read the credentials: {error}")
        if self._model is None:
            try:
                self._model = await self._discover_model(headers)
            except SourceError as error:
                reason = error.reason if error.reason in ERROR_REASONS else "protocol"
                return _failure(reason, f"GET /v1/models: {error.message}")
        outcome = await self._stream(self.probe.url, api=self.probe.api, model=self._model, prompt=self._prompt,
                                     max_tokens=self.probe.max_tokens, timeout_s=self.probe.timeout_s,
                                     headers=headers, limits=self._limits, ssl_context=self._tls,
                                     resolver=self._resolver)
        if not outcome.ok and outcome.status == 404 and self.probe.model is None:
            self._model = None  # the engine may have been restarted with another model: look again
        return outcome

    async def _headers(self) -> dict[str, str]:
        if self._url_auth is not None:
            return {"Authorization": self._url_auth}
        return await self._auth.headers() if self._auth is not None else {}

    async def _discover_model(self, headers: Mapping[str, str]) -> str:
        """The first model id of GET /v1/models (every OpenAI-compatible server has it)."""
        if self._models_client is None:
            self._models_client = HttpClient(self.probe.url + "/v1/models", timeout_s=self.probe.timeout_s,
                                             ssl_context=self._tls,
                                             headers={"Accept": "application/json", "User-Agent": "llm-exporter-probe"})
        body = await self._models_client.get(headers=headers, max_body=MAX_MODELS_BYTES)
        try:
            doc = jsonsafe.loads(body)
        except JsonTooDeep as error:
            raise SourceError("too_deep", f"/v1/models: {error}") from None
        except ValueError:
            raise SourceError("protocol", "not JSON") from None
        data = doc.get("data") if isinstance(doc, dict) else None
        first = data[0] if isinstance(data, list) and data else None
        model = first.get("id") if isinstance(first, dict) else None
        if not isinstance(model, str) or not model or len(model) > MAX_MODEL_NAME or not model.isprintable():
            raise SourceError("protocol", "no model id in the answer")
        return model

    def _log(self, outcome: CompletionTiming) -> None:
        """One line when the probe starts failing or changes reason, one when it recovers."""
        state = self.state
        reason = "" if outcome.ok else outcome.reason
        if reason == state.last_reason:
            return
        if reason:
            log.warning("probe %s failing: %s: %s", self.probe.target, reason, outcome.message)
        else:
            log.info("probe %s recovered", self.probe.target)
        state.last_reason = reason

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._resolver.close()
        if self._models_client is not None:
            await self._models_client.aclose()
