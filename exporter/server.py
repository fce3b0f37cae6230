"""The HTTP face: /metrics, /healthz, /readyz, /api/v1/snapshot, /api/v1/diagnosis and the status page at /.

Every handler only reads the Collector's latest finished result; none waits on a source.
/metrics concurrency is capped with an immediate 503 so a scrape storm cannot starve the loop."""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import HTMLResponse, JSONResponse

from exporter import __version__
from exporter.collect import Collector
from exporter.expose import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE


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


def snapshot_json(collector: Collector) -> dict[str, Any]:
    published = collector.latest
    if published is None:
        return {"ready": False, "sources": {}}
    snapshot = published.snapshot
    sources = {}
    for name, result in snapshot.results.items():
        health = collector.health[name]
        sources[name] = {
            "ok": result.ok,
            "error_reason": result.error_reason or None,
            "error": result.error_message or None,
            "duration_seconds": round(result.duration_s, 6),
            "last_success": health.last_success_ts,
            "errors_total": dict(health.errors),
            "attrs": dict(result.attrs),
            "samples": [
                {"name": s.name, "labels": dict(s.labels), "value": _json_number(s.value)} for s in result.samples
            ],
        }
    return {
        "ready": True,
        "version": __version__,
        "taken_at": snapshot.taken_at,
        "sources": sources,
        "derived": [{"name": s.name, "labels": dict(s.labels), "value": _json_number(s.value)}
                    for s in snapshot.derived],
    }


def diagnosis_json(collector: Collector) -> dict[str, Any]:
    """The deriver's verdicts (exporter/derive), or why there are none."""
    diagnose = getattr(collector.derive, "diagnosis", None)
    if diagnose is None:
        return {"ready": False, "status": "unknown", "targets": {}, "unreachable": [],
                "notes": ["derivations are not enabled in this exporter"]}
    return diagnose()


class MetricsEndpoint:
    """Serves /metrics as plain ASGI in front of FastAPI: the hot path is one dict lookup and a
    send of bytes rendered at collection time. The in-flight count covers the whole response,
    and everything runs on the event loop, so the counter needs no lock."""

    def __init__(self, app: Any, collector: Collector, max_concurrent: int) -> None:
        self.app = app
        self.collector = collector
        self.max_concurrent = max_concurrent
        self.in_flight = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/metrics":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_concurrent:
            self.collector.scrapes_rejected += 1
            await _send(send, 503, b"too many concurrent scrapes\n", b"text/plain")
            return
        self.in_flight += 1
        try:
            await self._serve(scope, send)
        finally:
            self.in_flight -= 1

    async def _serve(self, scope: dict, send: Any) -> None:
        if scope.get("method") not in ("GET", "HEAD"):
            await _send(send, 405, b"method not allowed\n", b"text/plain", extra=[(b"allow", b"GET, HEAD")])
            return
        published = self.collector.latest
        if published is None:
            await _send(send, 503, b"no collection finished yet\n", b"text/plain")
            return
        accept = b""
        for key, value in scope.get("headers", ()):
            if key == b"accept":
                accept = value
        if _wants_openmetrics(accept.decode("latin-1")):
            body, content_type = published.openmetrics(), OPENMETRICS_CONTENT_TYPE.encode()
        else:
            body, content_type = published.text, TEXT_CONTENT_TYPE.encode()
        await _send(send, 200, b"" if scope.get("method") == "HEAD" else body, content_type, len(body))


async def _send(send: Any, status: int, body: bytes, content_type: bytes, length: int | None = None,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body) if length is None else length).encode()),
               *(extra or ())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(collector: Collector, *, max_concurrent_scrapes: int = 4) -> MetricsEndpoint:
    app = FastAPI(title="llm-exporter", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.api_route("/healthz", methods=["GET", "HEAD"])  # probes and uptime checkers may use HEAD
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.api_route("/readyz", methods=["GET", "HEAD"])
    async def readyz() -> Response:
        if collector.ready:
            return Response("ready\n", media_type="text/plain")
        return Response("not ready: no collection finished yet\n", status_code=503, media_type="text/plain")

    @app.api_route("/api/v1/snapshot", methods=["GET", "HEAD"])
    async def snapshot() -> JSONResponse:
        return JSONResponse(snapshot_json(collector))

    @app.api_route("/api/v1/diagnosis", methods=["GET", "HEAD"])
    async def diagnosis() -> JSONResponse:
        return JSONResponse(diagnosis_json(collector))

    @app.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        from exporter.status_page import render as render_status

        refresh = max(2, min(60, round(collector.interval_s * 5)))
        return HTMLResponse(render_status(diagnosis_json(collector), refresh_s=refresh, version=__version__))

    return MetricsEndpoint(app, collector, max_concurrent_scrapes)


# Every endpoint is a GET; a body is never needed, so anything past a small cap is refused before
# it is read. Headers: uvicorn's h11 parser refuses a header block that is still incomplete past
# h11_max_incomplete_event_size (app.py), but one that arrives whole in a single read gets through
# it, so the guard also counts them.
MAX_BODY_BYTES = 16 * 1024
MAX_HEADER_BYTES = 16 * 1024
Authorize = Callable[[str, "bytes | None"], Awaitable[bool]]


class RequestGuard:
    """The outermost ASGI layer, in front of MetricsEndpoint and FastAPI: refuses oversized
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
            await _send(send, 431, b"request headers too large\n", b"text/plain")
            return
        for key, value in headers:
            if key == b"content-length":
                declared = int(value) if value.isdigit() else self.max_body_bytes + 1
            elif key == b"transfer-encoding":
                chunked = True
            elif key == b"authorization":
                authorization = value
        if declared is not None and declared > self.max_body_bytes:
            await _send(send, 413, b"request body too large\n", b"text/plain")
            return
        if self.authorize is not None and not await self.authorize(scope["path"], authorization):
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
                await _send(send, 413, b"request body too large\n", b"text/plain")
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
