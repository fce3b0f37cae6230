"""The twin's HTTP face on loopback: engine-format /metrics, /sim/* control endpoints and the
OpenAI-compatible /v1/* API (exporter/simulator/openai_api.py).

Runs in-process on the caller's event loop, served by the exporter's own HTTP server
(exporter/httpserver.py) on a socket we bind, so port 0 works and the port is known before
serving; or as `python -m exporter.simulator`. The twin advances in real time: a ticker and every
request bring it up to `speed x` wall-clock time elapsed since start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import exporter.jsonsafe as jsonsafe
from exporter.httpserver import LISTEN_BACKLOG, HttpServer, respond
from exporter.simulator.clock import RealtimeClock
from exporter.simulator.gpu import inject_fault, recover_faults
from exporter.simulator.openai_api import ApiLimits, OpenAIApi
from exporter.simulator.scenarios import SWITCH_SETTLE_S, get_scenario
from exporter.simulator.twin import Twin

Handler = Callable[[dict, Any], Awaitable[tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]]]
MAX_CONTROL_BODY = 4096  # a /sim/scenario body names one scenario, a /sim/gpu/<index>/fault body one fault
# POST /sim/gpu/<index>/fault and /recover: an NVML index (a few digits) or `all`.
GPU_CONTROL = re.compile(r"/sim/gpu/(all|[0-9]{1,4})/(fault|recover)")


class TwinApp:
    """The twin's routes as plain ASGI. Every handler is a coroutine on the event loop, one at a
    time with the ticker: run concurrently (in a thread pool), the engine scrape and /sim/gpu that
    arrive together each cycle would advance the twin at once and corrupt it (KV blocks leaked
    until the engine stalled)."""

    def __init__(self, clock: RealtimeClock, api_limits: ApiLimits | None = None) -> None:
        self.clock = clock
        # What a switch answers under `expect` (scenario name -> JSON); the demo, which knows its
        # exporter, adds where to look and its own windows (exporter.app.run_demo).
        self.expectation: Callable[[str], dict[str, Any]] = self._expectation
        self.on_switch: Callable[[dict[str, Any]], None] | None = None  # after each switch, with its answer
        # The API streams its responses, so its handlers are whole ASGI apps, not Handlers.
        self.api = OpenAIApi(clock, api_limits)
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/metrics"): self.metrics, ("GET", "/health"): self.health,
            ("GET", "/sim/gpu"): self.sim_gpu, ("GET", "/sim/host"): self.sim_host,
            ("POST", "/sim/scenario"): self.sim_scenario,
            ("POST", "/sim/restart"): self.sim_restart}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        method, path = scope["method"], scope["path"]
        key = ("GET" if method == "HEAD" else method, path)
        api = self.api.routes.get(key)
        if api is not None:
            await api(scope, receive, send)
            return
        handler = self.routes.get(key)
        if handler is None and GPU_CONTROL.fullmatch(path):
            handler = self.sim_gpu_control if key[0] == "POST" else None
            if handler is None:
                await respond(send, 405, b"method not allowed\n", b"text/plain", extra=[(b"allow", b"POST")])
                return
        if handler is None:
            allowed = [m for m, p in (*self.routes, *self.api.routes) if p == path]
            if allowed:
                await respond(send, 405, b"method not allowed\n", b"text/plain",
                              extra=[(b"allow", ", ".join(allowed).encode())])
            else:
                await respond(send, 404, b"not found\n", b"text/plain")
            return
        status, body, content_type, headers = await handler(scope, receive)
        await respond(send, status, b"" if method == "HEAD" else body, content_type, len(body), headers)

    async def metrics(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        self.clock.sync()
        twin = self.clock.twin
        headers = [(k.encode(), v.encode()) for k, v in twin.metrics_headers().items()]
        return 200, twin.metrics_text().encode(), twin.content_type.encode(), headers

    async def health(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        return 200, b"", b"text/plain", []

    async def sim_gpu(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        self.clock.sync()
        return _json(200, self.clock.twin.gpu_state())

    async def sim_host(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        self.clock.sync()
        return _json(200, self.clock.twin.host_state())

    async def sim_scenario(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        name: Any = query["name"][0] if "name" in query else None
        if name is None:
            try:
                body = jsonsafe.loads(await _read_body(receive, MAX_CONTROL_BODY) or b"{}")
            except ValueError:
                body = {}
            name = body.get("scenario") if isinstance(body, dict) else None
            backlog = body.get("backlog", "drop") if isinstance(body, dict) else "drop"
        else:
            backlog = query["backlog"][0] if "backlog" in query else "drop"
        if not name or not isinstance(name, str):
            return _json(400, {"error": "give ?name=S or a JSON body {\"scenario\": S}"})
        if backlog not in ("drop", "keep"):
            return _json(400, {"error": "backlog is drop (the default: the old traffic's requests are aborted) "
                                        "or keep (they run on under the new scenario)"})
        self.clock.sync()
        twin = self.clock.twin
        previous = twin.scenario.name
        try:
            aborted = twin.set_scenario(name, keep_backlog=backlog == "keep")
        except ValueError as e:
            return _json(409 if " needs " in str(e) else 400, {"error": str(e)})
        kept = backlog == "keep" or twin.pair is not None
        doc: dict[str, Any] = {
            "scenario": twin.scenario.name, "previous": previous, "twin_time_s": twin.now,
            "backlog": "kept" if kept else "dropped", "requests_aborted": aborted,
            "expect": self.expectation(twin.scenario.name)}
        if self.on_switch is not None:
            self.on_switch(doc)
        return _json(200, doc)

    async def sim_gpu_control(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        """POST /sim/gpu/<index>/fault {"kind": K, "code": N, "field": F}: the GPU (`all`: every GPU,
        and for nvml_error the library) fails as NVML shows it; /recover: it answers again."""
        match = GPU_CONTROL.fullmatch(scope["path"])
        assert match is not None  # routed here only on a match
        index = None if match.group(1) == "all" else int(match.group(1))
        self.clock.sync()
        models = self.clock.twin.gpu_models
        try:
            if match.group(2) == "recover":
                return _json(200, recover_faults(models, index))
            try:
                body = jsonsafe.loads(await _read_body(receive, MAX_CONTROL_BODY) or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict) or set(body) - {"kind", "code", "field"}:
                raise ValueError('give a JSON body {"kind": "lost" | "nvml_error" | "unsupported_field", '
                                 '"code": N (nvml_error), "field": F (unsupported_field, nvml_error)}')
            doc = inject_fault(models, index, str(body.get("kind")), code=body.get("code"),
                               field_name=body.get("field"))
        except LookupError as e:
            return _json(404, {"error": str(e)})
        except ValueError as e:
            return _json(400, {"error": str(e)})
        return _json(200, {**doc, "twin_time_s": self.clock.twin.now})

    def _expectation(self, name: str) -> dict[str, Any]:
        """A twin alone does not know its exporter: its answer assumes the default one (1 s interval)."""
        expect = get_scenario(name).expect
        return {} if expect is None else expect.describe(self.clock.speed, SWITCH_SETTLE_S)

    async def sim_restart(self, scope: dict, receive: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        self.clock.sync()
        twin = self.clock.twin
        twin.restart()
        return _json(200, {"restarts": twin.restarts, "twin_time_s": twin.now})


def _json(status: int, doc: Any) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    return status, json.dumps(doc).encode(), b"application/json", []


async def _read_body(receive: Any, cap: int) -> bytes:
    """The request body, or ValueError past `cap` bytes."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)
        body += message.get("body", b"")
        if len(body) > cap:
            raise ValueError("body too large")
        if not message.get("more_body"):
            return bytes(body)


def build_app(clock: RealtimeClock, api_limits: ApiLimits | None = None) -> TwinApp:
    return TwinApp(clock, api_limits)


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
    app: TwinApp
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
        await self.app.api.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self.ticker
        self.sock.close()


async def _tick(clock: RealtimeClock, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        clock.sync()


async def start_server(twin: Twin, *, host: str = "127.0.0.1", port: int = 0, speed: float = 1.0,
                       tick_s: float = 0.5, api_limits: ApiLimits | None = None) -> TwinServer:
    """Serving once this returns; no signal handlers (the host program owns Ctrl-C)."""
    clock = RealtimeClock(twin, speed=speed, offset=twin.now)
    sock = bind_socket(host, port)
    app = build_app(clock, api_limits)
    server = HttpServer(app)
    try:
        await server.start(sock)
    except BaseException:
        sock.close()
        raise
    return TwinServer(clock, sock, server, asyncio.create_task(_tick(clock, tick_s)), app)
