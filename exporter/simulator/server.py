"""The twin's HTTP face on loopback: engine-format /metrics plus /sim/* control endpoints.

Runs in-process on the caller's event loop, served by the exporter's own HTTP server
(exporter/httpserver.py) on a socket we bind, so port 0 works and the port is known before
serving; or as `python -m exporter.simulator`. The twin advances in real time: a ticker and every
request bring it up to `speed x` wall-clock time elapsed since start.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from exporter.httpserver import LISTEN_BACKLOG, HttpServer
from exporter.simulator.twin import Twin


@dataclass(slots=True)
class RealtimeClock:
    """Maps wall-clock time to twin time. `speed` > 1 runs the twin faster than real time."""

    twin: Twin
    speed: float = 1.0
    started: float = field(default_factory=time.monotonic)
    offset: float = 0.0

    def sync(self) -> None:
        self.twin.advance_to(self.offset + (time.monotonic() - self.started) * self.speed)


def build_app(clock: RealtimeClock) -> FastAPI:
    # Every handler that touches the twin is `async def`: it then runs on the event loop, one at a
    # time with the ticker. A plain `def` would run in FastAPI's thread pool, and two requests at
    # once (the engine scrape and /sim/gpu arrive together each cycle) would advance the twin
    # concurrently and corrupt it (KV blocks leaked until the engine stalled).
    app = FastAPI(title="llm-exporter twin", docs_url=None, redoc_url=None, openapi_url=None)
    twin = clock.twin

    @app.get("/metrics")
    async def metrics() -> Response:
        clock.sync()
        return Response(twin.metrics_text(), media_type=twin.content_type, headers=twin.metrics_headers())

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/sim/gpu")
    async def sim_gpu() -> Response:
        clock.sync()
        return JSONResponse(twin.gpu_state())

    @app.post("/sim/scenario")
    async def sim_scenario(request: Request) -> Response:
        name = request.query_params.get("name")
        if name is None:
            try:
                body = await request.json()
            except ValueError:
                body = {}
            name = body.get("scenario") if isinstance(body, dict) else None
        if not name or not isinstance(name, str):
            return JSONResponse({"error": "give ?name=S or a JSON body {\"scenario\": S}"}, status_code=400)
        clock.sync()
        try:
            twin.set_scenario(name)
        except ValueError as e:
            status = 409 if "needs at least" in str(e) else 400
            return JSONResponse({"error": str(e)}, status_code=status)
        return JSONResponse({"scenario": twin.scenario.name, "twin_time_s": twin.now})

    @app.post("/sim/restart")
    async def sim_restart() -> Response:
        clock.sync()
        twin.restart()
        return JSONResponse({"restarts": twin.restarts, "twin_time_s": twin.now})

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


@dataclass(slots=True)
class TwinServer:
    """A twin served on a socket, ticking in real time, inside the caller's event loop."""

    clock: RealtimeClock
    sock: socket.socket
    server: HttpServer
    ticker: asyncio.Task[None]
    stopped: bool = False

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.ticker.cancel()
        await self.server.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await self.ticker
        self.sock.close()


async def _tick(clock: RealtimeClock, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        clock.sync()


async def start_server(twin: Twin, *, host: str = "127.0.0.1", port: int = 0, speed: float = 1.0,
                       tick_s: float = 0.5) -> TwinServer:
    """Serving once this returns; no signal handlers (the host program owns Ctrl-C)."""
    clock = RealtimeClock(twin, speed=speed, offset=twin.now)
    sock = bind_socket(host, port)
    server = HttpServer(build_app(clock))
    try:
        await server.start(sock)
    except BaseException:
        sock.close()
        raise
    return TwinServer(clock, sock, server, asyncio.create_task(_tick(clock, tick_s)))
