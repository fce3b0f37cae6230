"""Real servers on loopback for tests: a programmable fake engine and helpers to run the exporter."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMETHEUS_TEXT = "text/plain; version=0.0.4"

def free_port() -> int:
    return free_ports(("port",))["port"]


def free_ports(names: Iterable[str]) -> dict[str, int]:
    """A distinct free port per name: each socket stays bound until all are chosen, since the kernel
    may hand a just-closed port out again (a stack once got one port for Alertmanager and Prometheus:
    Prometheus exited on the bind, and Alertmanager answered its readiness check)."""
    with contextlib.ExitStack() as held:
        socks = {name: held.enter_context(socket.socket()) for name in names}
        for sock in socks.values():
            sock.bind(("127.0.0.1", 0))
        return {name: sock.getsockname()[1] for name, sock in socks.items()}


@dataclass
class EngineBehaviour:
    """What the fake engine answers; tests change it while the server runs."""

    body: bytes = b""
    status: int = 200
    content_type: str = PROMETHEUS_TEXT
    delay_s: float = 0.0
    expect_authorization: str | None = None  # when set, any other Authorization gets 401
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (Location, ...)
    requests: int = 0
    headers_seen: list[dict[str, str]] = field(default_factory=list)

    @property
    def authorizations_seen(self) -> list[str | None]:
        return [headers.get("Authorization") for headers in self.headers_seen]


def send_body(handler: http.server.BaseHTTPRequestHandler, body: bytes, status: int = 200,
              content_type: str = PROMETHEUS_TEXT, headers: dict[str, str] | None = None) -> None:
    """One whole response with a Content-Length (keep-alive handlers need it)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def promtool_check_metrics(exposition: bytes) -> None:
    """`promtool check metrics` passes on `exposition`. `make test` installs promtool (Debian
    package prometheus), so a missing one fails rather than skips."""
    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH; `make test` installs it (Debian package prometheus)")
    out = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _Handler(http.server.BaseHTTPRequestHandler):
    behaviour: EngineBehaviour

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        behaviour = self.server.behaviour  # type: ignore[attr-defined]
        behaviour.requests += 1
        behaviour.headers_seen.append(dict(self.headers))
        if behaviour.delay_s:
            time.sleep(behaviour.delay_s)
        body, status = behaviour.body, behaviour.status
        expected = behaviour.expect_authorization
        if expected is not None and self.headers.get("Authorization") != expected:
            body, status = b"unauthorized\n", 401
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send_body(self, body, status, behaviour.content_type, behaviour.headers)

    def log_message(self, *args: object) -> None:
        return


class _KeepAliveHandler(_Handler):
    protocol_version = "HTTP/1.1"


@contextlib.contextmanager
def fake_engine(body: bytes = b"", *, tls: ssl.SSLContext | None = None, keep_alive: bool = False,
                **kwargs: object) -> Iterator[tuple[str, EngineBehaviour]]:
    """Serve `body` on http(s)://127.0.0.1:PORT/metrics from a thread; yields (url, behaviour).
    keep_alive: answer HTTP/1.1 and keep the connection open, as the real engines' servers do
    (uvicorn, axum, cpp-httplib); the default HTTP/1.0 closes after every response."""
    behaviour = EngineBehaviour(body=body, **kwargs)  # type: ignore[arg-type]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveHandler if keep_alive else _Handler)
    server.daemon_threads = True
    server.behaviour = behaviour  # type: ignore[attr-defined]
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}/metrics", behaviour
    finally:
        server.shutdown()
        server.server_close()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class QuietServer(http.server.ThreadingHTTPServer):
    """A threaded loopback server for fault-injecting fake engines."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-request (the exporter giving up on a fault) is expected."""


def serve_in_background(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[QuietServer, str]:
    """Start `handler` on a free loopback port in a daemon thread; returns (server, base URL)."""
    server = QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@contextlib.contextmanager
def background_process(command: list[str], ready_url: str, *, timeout: float = 30.0,
                       env: dict[str, str] | None = None, cwd: str | None = None) -> Iterator[subprocess.Popen]:
    """Start `command`, wait until `ready_url` answers 200 (or fail with the tail of its stderr),
    yield the process, then terminate it (kill after 10 s). Its stderr goes to a temporary file,
    not a pipe: a process logging into a pipe nobody reads blocks once 64 KiB are buffered
    (node_exporter logs a line per failing collector per scrape)."""
    import httpx

    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, cwd=cwd,
                                   env=env if env is not None else dict(os.environ))
        try:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready_url, timeout=1).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    stderr.seek(0)
                    raise RuntimeError(f"{command[0]} did not become ready: {stderr.read().decode()[-1000:]}")
                time.sleep(0.1)
            yield process
        finally:
            stop_process(process)


def http_status(url: str) -> int:
    """The status of a GET on `url`, 0 when nothing answered."""
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0


@contextlib.contextmanager
def exporter_run(*args: str, env: dict[str, str] | None = None,
                 ready_timeout_s: float = 20.0) -> Iterator[tuple[str, subprocess.Popen, Any]]:
    """`llm-exporter run` on a free loopback port (fast interval, no GPU or host source) until it is
    ready (its first cycle done, within `ready_timeout_s`): yields (base URL, process, its stderr as a
    temporary file to seek and read). `env`: added to the environment (LD_PRELOAD of libfaketime, say)."""
    import sys

    port = free_port()
    command = [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "200ms",
               "--gpu-backend", "none", "--no-host", *args]
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        base = f"http://127.0.0.1:{port}"
        try:
            if not wait_until(lambda: http_status(base + "/readyz") == 200, timeout=ready_timeout_s):
                stderr.seek(0)
                raise AssertionError(f"exporter never became ready: {stderr.read().decode()[-2000:]}")
            yield base, process, stderr
        finally:
            stop_process(process)
