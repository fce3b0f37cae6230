"""The HTTP face: /metrics, /healthz, /readyz, /api/v1/snapshot, /api/v1/diagnosis and the status page at /.

Every handler only reads the Collector's latest finished result; none waits on a source.
/metrics concurrency is capped with an immediate 503 so a scrape storm cannot starve the loop; the
JSON and HTML pages have a cap of their own of the same size (a snapshot flood must not take the
slots Prometheus needs) and are each built once per collection cycle, in a worker thread, by the
first request that asks (PageCache), with a byte cap (MAX_PAGE_BYTES)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from exporter import __version__
from exporter.collect import Collector, HealthView
from exporter.expose import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE
from exporter.httpserver import respond
from exporter.snapshot import Sample, labels_of

# Named before the module was (server.py): log lines and the filters set on them stay as they were.
log = logging.getLogger("llm_exporter.server")

# A snapshot is ~130 bytes per sample (1.2 MB for a 9,000-series engine). 8 MiB holds several
# engines at that size; the cap bounds each response and the one cached copy per page. Over it the
# snapshot drops its per-source samples (counted, with a note; /metrics has them all) and the
# diagnosis and status page answer 503 saying why.
MAX_PAGE_BYTES = 8 * 1024 * 1024
PAGES = {"/api/v1/snapshot": "snapshot", "/api/v1/diagnosis": "diagnosis", "/": "status_page"}
PAGE_REJECT_REASONS = ("too_many", "too_large")
JSON_CONTENT_TYPE = b"application/json"
HTML_CONTENT_TYPE = b"text/html; charset=utf-8"


@functools.lru_cache(maxsize=32)  # scrapers send the same Accept header every time
def _wants_openmetrics(accept: str) -> bool:
    """OpenMetrics when the client rates it above zero and at least as high as the text format
    (Prometheus asks for it at q=0.5 before text/plain at q=0.3); media types are case-blind."""
    openmetrics = text = 0.0
    for item in accept.lower().split(","):
        media, *params = item.split(";")
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.strip()
        if media == "application/openmetrics-text":
            openmetrics = max(openmetrics, quality)
        elif media in ("text/plain", "text/*", "*/*"):
            text = max(text, quality)
    return openmetrics > 0 and openmetrics >= text


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


_NO_HEALTH = HealthView(None, {})


def _snapshot_doc(snapshot: Any, health: Mapping[str, HealthView], with_samples: bool = True) -> dict[str, Any]:
    """Reads only the immutable snapshot and the health copy: safe off the event loop."""
    sources = {}
    for name, result in snapshot.results.items():
        last_success, errors = health.get(name, _NO_HEALTH)
        entry = {
            "ok": result.ok,
            "error_reason": result.error_reason or None,
            "error": result.error_message or None,
            "duration_seconds": round(result.duration_s, 6),
            "last_success": last_success,
            "errors_total": errors,
            "attrs": dict(result.attrs),
        }
        if with_samples:
            entry["samples"] = [{"name": s.name, "labels": dict(s.labels), "value": _json_number(s.value)}
                                for s in result.samples]
        else:
            entry["samples_omitted"] = len(result.samples)
        sources[name] = entry
    return {
        "ready": True,
        "version": __version__,
        "taken_at": snapshot.taken_at,
        "sources": sources,
        "derived": [{"name": s.name, "labels": dict(s.labels), "value": _json_number(s.value)}
                    for s in snapshot.derived] if with_samples else [],
    }


def diagnosis_json(collector: Collector) -> dict[str, Any]:
    """The deriver's verdicts (exporter/derive), or why there are none."""
    diagnosis = collector.diagnosis()
    if diagnosis is None:
        return {"ready": False, "status": "unknown", "targets": {}, "unreachable": [],
                "notes": ["derivations are not enabled in this exporter"]}
    return diagnosis


def _dump_json(doc: Any) -> bytes:
    # As Starlette's JSONResponse renders it (NaN refused: a sample's is written as a string).
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


def _status_refresh_s(interval_s: float) -> int:
    return max(2, min(60, round(interval_s * 5)))


def _render_status_page(diagnosis: dict[str, Any], refresh_s: int) -> bytes:
    from exporter.status_page import render as render_status

    return render_status(diagnosis, refresh_s=refresh_s, version=__version__).encode()


def render_page(page: str, inputs: Any, max_bytes: int) -> tuple[int, bytes, bool]:
    """Build one page from inputs captured on the loop (see PageCache); runs in a worker thread.
    Returns (status, body, over_cap) with the body never over `max_bytes`; over_cap when the full
    page would have been (the snapshot is then cut down, the others refused)."""
    if page == "snapshot":
        if inputs is None:
            return 200, _dump_json({"ready": False, "sources": {}}), False
        snapshot, health = inputs
        body = _dump_json(_snapshot_doc(snapshot, health))
        if len(body) <= max_bytes:
            return 200, body, False
        doc = _snapshot_doc(snapshot, health, with_samples=False)
        doc["truncated"] = True
        doc["notes"] = [f"the snapshot is {len(body)} bytes, over this endpoint's cap of {max_bytes}: per-source "
                        "samples and derived samples are omitted (samples_omitted counts them); /metrics has them all"]
        body = _dump_json(doc)
        if len(body) <= max_bytes:
            return 200, body, True
        return 503, _dump_json({"ready": True, "error": f"the snapshot is over this endpoint's cap of {max_bytes} "
                                                        "bytes even without samples; /metrics has the data"}), True
    if page == "diagnosis":
        body = _dump_json(inputs)
        if len(body) <= max_bytes:
            return 200, body, False
        return 503, _dump_json({"ready": True, "error": f"the diagnosis is {len(body)} bytes, over this endpoint's "
                                                        f"cap of {max_bytes}; /metrics has the derived series"}), True
    diagnosis, refresh_s = inputs
    body = _render_status_page(diagnosis, refresh_s)
    if len(body) <= max_bytes:
        return 200, body, False
    return 503, (f"<!doctype html><title>llm-exporter</title><p>The status page is {len(body)} bytes, over its cap "
                 f"of {max_bytes}. <a href=\"/metrics\">/metrics</a> and <a href=\"/api/v1/diagnosis\">"
                 "/api/v1/diagnosis</a> have the data.</p>\n").encode(), True


class PageCache:
    """The snapshot, diagnosis and status page of one Published result, each built at most once:
    by the first request for it after a cycle, in a worker thread (a 1 MB JSON page takes tens of
    ms, which on the event loop would stall /metrics and the engine scrapes), and shared by every
    request until the next cycle publishes. What the thread reads is captured on the loop first:
    the snapshot is immutable, the per-source health and the deriver's diagnosis are copied or
    built there (the deriver caches its diagnosis per cycle)."""

    def __init__(self, collector: Collector, max_bytes: int = MAX_PAGE_BYTES) -> None:
        self.collector = collector
        self.max_bytes = max_bytes
        self.renders = dict.fromkeys(PAGES.values(), 0)  # builds per page, for tests and benchmarks
        self.too_large = dict.fromkeys(PAGES.values(), 0)
        self._for: Any = None
        self._pages: dict[str, asyncio.Future] = {}
        self._state: dict[str, str] = {}  # page -> "ok", "too_large" or "error", for one log line per change

    async def get(self, page: str) -> tuple[int, bytes]:
        published = self.collector.published()
        if published is None:  # before the first cycle: a few hundred bytes, not worth a thread
            status, body, _ = render_page(page, self._inputs(page, None), self.max_bytes)
            return status, body
        if published is not self._for:
            self._for, self._pages = published, {}
        future = self._pages.get(page)
        if future is None:
            self.renders[page] += 1
            inputs = self._inputs(page, published)
            future = self._pages[page] = asyncio.ensure_future(
                asyncio.to_thread(render_page, page, inputs, self.max_bytes))
            future.add_done_callback(functools.partial(self._rendered, page))
        try:
            status, body, over_cap = await asyncio.shield(future)
        except Exception as error:  # noqa: BLE001 - logged once by _rendered; the server goes on
            return 500, f"could not render {page}: {type(error).__name__}: {error}\n".encode()
        if over_cap:
            self.too_large[page] += 1
        return status, body

    def _inputs(self, page: str, published: Any) -> Any:
        if page == "snapshot":
            if published is None:
                return None
            return published.snapshot, self.collector.health_view()
        diagnosis = diagnosis_json(self.collector)
        if page == "diagnosis":
            return diagnosis
        return diagnosis, _status_refresh_s(self.collector.interval_s)

    def _rendered(self, page: str, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        error = future.exception()
        state = "error" if error is not None else ("too_large" if future.result()[2] else "ok")
        previous, self._state[page] = self._state.get(page, "ok"), state
        if state == previous:
            return
        if state == "error":
            log.error("rendering %s failed: %s: %s", page, type(error).__name__, error)
        elif state == "too_large":
            log.warning("%s is over its %d-byte cap: %s until it fits", page, self.max_bytes,
                        "answering without samples" if page == "snapshot" else "answering 503")
        else:
            log.info("%s renders again", page)


class MetricsEndpoint:
    """Serves /metrics, and the JSON and HTML pages, as plain ASGI in front of the probes: the hot
    path is one dict lookup and a send of bytes rendered once per cycle. Each in-flight count
    covers the render and the hand-off of the body to the server (which finishes writing it to a
    slow reader on its own, within a memory budget: exporter/httpserver.py), and everything runs
    on the event loop, so the counters need no lock. The pages have a cap of their own, as large
    as the /metrics one: a flood of /api/v1/snapshot is refused without taking the slots
    Prometheus needs."""

    def __init__(self, app: Any, collector: Collector, max_concurrent: int,
                 max_page_bytes: int = MAX_PAGE_BYTES) -> None:
        self.app = app
        self.collector = collector
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.pages_in_flight = 0
        self.pages = PageCache(collector, max_page_bytes)
        self.pages_rejected = dict.fromkeys(PAGES.values(), 0)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in PAGES:
            await self._serve_page(scope, send, PAGES[path])
            return
        if path != "/metrics":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_concurrent:
            self.collector.count_rejected()
            await respond(send, 503, b"too many concurrent scrapes\n", b"text/plain")
            return
        self.in_flight += 1
        try:
            await self._serve(scope, send)
        finally:
            self.in_flight -= 1

    async def _serve(self, scope: dict, send: Any) -> None:
        if scope.get("method") not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed\n", b"text/plain", extra=[(b"allow", b"GET, HEAD")])
            return
        published = self.collector.published()
        if published is None:
            await respond(send, 503, b"no collection finished yet\n", b"text/plain")
            return
        accept = b""
        for key, value in scope.get("headers", ()):
            if key == b"accept":
                accept = value
        if _wants_openmetrics(accept.decode("latin-1")):
            body, content_type = published.openmetrics(), OPENMETRICS_CONTENT_TYPE.encode()
        else:
            body, content_type = published.text, TEXT_CONTENT_TYPE.encode()
        await respond(send, 200, b"" if scope.get("method") == "HEAD" else body, content_type, len(body))

    async def _serve_page(self, scope: dict, send: Any, page: str) -> None:
        if scope.get("method") not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed\n", b"text/plain", extra=[(b"allow", b"GET, HEAD")])
            return
        if self.pages_in_flight >= self.max_concurrent:
            self.pages_rejected[page] += 1
            await respond(send, 503, b"too many concurrent requests\n", b"text/plain")
            return
        self.pages_in_flight += 1
        try:
            status, body = await self.pages.get(page)
            content_type = HTML_CONTENT_TYPE if page == "status_page" else JSON_CONTENT_TYPE
            if status == 500:
                content_type = b"text/plain"
            await respond(send, status, b"" if scope.get("method") == "HEAD" else body, content_type, len(body))
        finally:
            self.pages_in_flight -= 1

    def samples(self) -> list[Sample]:
        """llm_exporter_http_requests_rejected_total: the pages' twin of scrapes_rejected_total."""
        counts = {"too_many": self.pages_rejected, "too_large": self.pages.too_large}
        return [Sample("llm_exporter_http_requests_rejected_total", labels_of(path=path, reason=reason),
                       float(counts[reason][page]))
                for path, page in PAGES.items() for reason in PAGE_REJECT_REASONS]


def create_app(collector: Collector, *, max_concurrent_scrapes: int = 4,
               max_page_bytes: int | None = None) -> MetricsEndpoint:
    """/metrics, the pages, /healthz and /readyz. `max_page_bytes`: default MAX_PAGE_BYTES, read
    at each call (tests lower it)."""
    return MetricsEndpoint(HealthEndpoints(collector), collector, max_concurrent_scrapes,
                           MAX_PAGE_BYTES if max_page_bytes is None else max_page_bytes)


class HealthEndpoints:
    """/healthz (the process answers) and /readyz (a collection has finished), GET or HEAD:
    probes and uptime checkers may use HEAD. Anything else is 404."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path, method = scope["path"], scope.get("method")
        if path not in ("/healthz", "/readyz"):
            await respond(send, 404, b"not found\n", b"text/plain")
            return
        if method not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed\n", b"text/plain", extra=[(b"allow", b"GET, HEAD")])
            return
        if path == "/healthz":
            status, body = 200, b"ok\n"
        elif self.collector.ready:
            status, body = 200, b"ready\n"
        else:
            status, body = 503, b"not ready: no collection finished yet\n"
        await respond(send, status, b"" if method == "HEAD" else body, b"text/plain", len(body))


# Every endpoint is a GET; a body is never needed, so anything past a small cap is refused before
# it is read. Headers: the h11 parser (exporter/httpserver.py) refuses a header block that is still
# incomplete past its max_incomplete_event_size, but one that arrives whole in a single read gets
# through it, so the guard also counts them.
MAX_BODY_BYTES = 16 * 1024
MAX_HEADER_BYTES = 16 * 1024
# True: go on; False: 401; None: the credentials could not be checked now (too many checks
# waiting, see exporter/webconfig.py): 503 at once.
Authorize = Callable[[str, "bytes | None"], Awaitable["bool | None"]]


class RequestGuard:
    """The outermost ASGI layer, in front of MetricsEndpoint: refuses oversized
    headers (431) or body (413) and, when `authorize` is set (basic auth from the web config), a request without
    valid credentials (401 with WWW-Authenticate). /healthz and /readyz stay open (the authorize
    function decides; see exporter/webconfig.py). Query strings are never read here or below for
    anything but content negotiation: no request parameter can make the exporter fetch a URL."""

    def __init__(self, app: Any, *, authorize: Authorize | None = None, realm: str = 'Basic realm="llm-exporter"',
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.authorize = authorize
        self.realm = realm.encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, chunked, authorization = None, False, None
        headers = scope.get("headers", ())
        if sum(len(k) + len(v) + 4 for k, v in headers) + len(scope.get("raw_path") or b"") \
                + len(scope.get("query_string") or b"") > MAX_HEADER_BYTES:
            await respond(send, 431, b"request headers too large\n", b"text/plain")
            return
        for key, value in headers:
            if key == b"content-length":
                declared = int(value) if value.isdigit() else self.max_body_bytes + 1
            elif key == b"transfer-encoding":
                chunked = True
            elif key == b"authorization":
                authorization = value
        if declared is not None and declared > self.max_body_bytes:
            await respond(send, 413, b"request body too large\n", b"text/plain")
            return
        allowed = True if self.authorize is None else await self.authorize(scope["path"], authorization)
        if allowed is None:
            await respond(send, 503, b"too many authentication checks in progress\n", b"text/plain",
                        extra=[(b"retry-after", b"1")])
            return
        if not allowed:
            await _send_401(send, self.realm)
            return
        if chunked:
            receive = await self._buffer_body(receive, send)
            if receive is None:
                return
        await self.app(scope, receive, send)

    async def _buffer_body(self, receive: Any, send: Any) -> Any:
        """Read a chunked body up to the cap; None when it was refused or the client went away."""
        messages, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            total += len(message.get("body", b""))
            if total > self.max_body_bytes:
                await respond(send, 413, b"request body too large\n", b"text/plain")
                return None
            messages.append(message)
            if not message.get("more_body"):
                break

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        return replay


async def _send_401(send: Any, realm: bytes) -> None:
    body = b"unauthorized\n"
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", realm)]})
    await send({"type": "http.response.body", "body": body})
