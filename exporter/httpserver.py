"""The exporter's HTTP/1.1 front end: asyncio plus h11, serving the ASGI app (RequestGuard ->
MetricsEndpoint -> HealthEndpoints, exporter/endpoints.py) on the socket that bind_listener made.

It replaced uvicorn, which could not be made to hold up against hostile clients:

- uvicorn's `limit_concurrency` counts open connections, not requests: about 255 idle or
  slowloris connections (plain or TLS) made every endpoint, /healthz included, answer 503.
- No timeout applied before a request completed: no header-read timeout, no idle timeout before
  the first request, and no write timeout, so those connections were never closed.
- A response was handed to the transport whole, so every reader that stopped reading a multi-MB
  /metrics pinned its own copy of the page (200 readers: 1.2 GB).
- Its main loop woke 10 times a second (a subclass brought it to once); this one has no timer.

What this front end does instead:

- Open connections are bounded (MAX_CONNECTIONS, lowered to fit RLIMIT_NOFILE), separately from
  the in-flight request caps in MetricsEndpoint. At the bound, a new connection closes the oldest
  one that is not being served (in its TLS handshake, or waiting for or reading a request head),
  else the oldest one stalled on a client that does not read its response, and takes its slot;
  only when every slot is in the app (bounded by the request caps) is the new one closed at once.
  Reserving slots for probes would not work: before its request head arrives a kubelet probe
  looks like any other connection, so an attacker fills reserved slots too. Evicting the oldest
  waiting connection keeps every newcomer able to get in, and a real client sends its request
  right after connecting, long before 512 newer connections arrive; work in progress is never
  dropped for a newcomer.
- Every phase has a deadline: the TLS handshake (TLS_HANDSHAKE_TIMEOUT_S), the whole first
  request head from the moment the connection is ready and every later head from its first byte
  (HEADER_TIMEOUT_S), the idle time between requests (IDLE_TIMEOUT_S), and each write that makes
  no progress because the client stopped reading (WRITE_TIMEOUT_S).
- Bytes are read only as a request needs them: one READ_BYTES read at a time into a buffer the
  server shares, and once a cycle is past its head, reading pauses after every read until the
  task asks for more. A connection holds at most a head plus one read that nothing asked for.
- Bodies go out in SEND_SLICE_BYTES slices of a memoryview of the shared page under the
  transport's flow control (WRITE_HIGH_WATER_BYTES), so a connection holds at most a slice plus
  the high-water mark of its response beyond the one page all readers share. What a slow reader
  has not taken when the app finishes is left to the connection (the app's request slot is free
  for the next scrape), within MAX_DEFERRED_BYTES of distinct bodies in all.
- A request whose body framing is ambiguous (RFC 9112 6.1, 6.3: Transfer-Encoding with
  Content-Length or on HTTP/1.0, or not exactly one chunked; differing Content-Length values) is
  answered 400 and closed, and nothing after its head is parsed (framing_problem).
- Every connection it closes on its own is counted by reason
  (llm_exporter_http_connections_rejected_total) next to a gauge of open connections; the
  collector exports them through its extra_health hook.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import http
import logging
import os
import resource
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from exporter.snapshot import Sample, labels_of

log = logging.getLogger("llm_exporter.http")

# Prometheus, kubelet and a few people keep a handful of connections each; 512 leaves room for a
# fleet of scrapers while bounding file descriptors and per-connection memory (~150 KiB at most).
MAX_CONNECTIONS = 512
# File descriptors kept for everything else (engine connections, /proc and /sys files, NVML).
FD_RESERVE = 64
# The kernel's accept queue: connections arriving faster than the loop accepts them wait here.
LISTEN_BACKLOG = 1024
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# A request head is a few hundred bytes sent at once; 10 s is forgiving of any real client.
HEADER_TIMEOUT_S = 10.0
# Between requests on a keep-alive connection (uvicorn's timeout_keep_alive was 30 s too).
IDLE_TIMEOUT_S = 30.0
# How long a write may wait for the client to read before the connection is dropped. Progress
# resets it, so a slow but reading client is served; Prometheus gives up on a scrape after 10 s.
WRITE_TIMEOUT_S = 10.0
# The request line plus headers (h11 refuses a longer head with 431); RequestGuard checks again.
MAX_HEADER_BYTES = 16 * 1024
# Request body bytes the app did not read that are read and dropped to keep a connection alive
# (over it the connection is closed); every endpoint is a GET, so this only happens after a 413.
MAX_UNREAD_BODY_BYTES = 64 * 1024
# The most one read takes from a socket, into one buffer the whole server shares (the loop reads one
# socket at a time). asyncio's own reads take up to 256 KiB into a new bytes object each: a flood of
# connections whose data arrived while the loop was busy was read at once, 256 KiB apiece, before
# any request asked for it, and the heap kept the peak (the twin: +56 MB for 160 stalled bodies
# under a 32 MiB body budget, +36 MB with this bound; tests/test_simulator_openai.py).
READ_BYTES = 16 * 1024
# What one write hands the transport: a write the kernel does not take whole is copied into the
# transport's buffer, so this bounds the copy a slow reader costs. Over plain TCP a large body goes to
# the socket first, as much as the kernel takes at once (Connection._send_direct): a 340 KB page in
# 64 KiB transport writes had a p99 of 47-49 ms over five `make bench` runs (node_exporter's: 22-35
# ms), in one write 5.5-9 ms.
SEND_SLICE_BYTES = 64 * 1024
MAX_SEND_BYTES = 8 * 1024 * 1024  # one direct write: a few times the largest page
WRITE_HIGH_WATER_BYTES = 64 * 1024
WRITE_LOW_WATER_BYTES = 16 * 1024
# Response bodies left to slow readers after the app is done with them, counted once per distinct
# body (all readers of one cycle's /metrics share its bytes): a few cycles of a multi-MB page.
# Past it a response is written before the app returns, so it keeps its request slot and the
# in-flight caps in MetricsEndpoint bound the rest.
MAX_DEFERRED_BYTES = 32 * 1024 * 1024
# On stop, requests being served get this long to finish; waiting connections close at once.
STOP_GRACE_S = 3.0
# Refused framing is logged at most this often: a smuggling scan is thousands of requests, and each
# is counted in llm_exporter_http_connections_rejected_total{reason="bad_framing"} anyway.
FRAMING_LOG_INTERVAL_S = 10.0
# h11's own refusals that are about body framing (differing Content-Length values, a Transfer-Encoding
# other than chunked, two Transfer-Encoding fields): counted as bad_framing, not bad_request. Its
# messages are the only way to tell; tests/test_hardening_http.py sends each case, so an h11 that
# rewords one fails there.
_H11_FRAMING_ERRORS = frozenset({"conflicting Content-Length headers", "bad Content-Length",
                                 "multiple Transfer-Encoding headers", "Only Transfer-Encoding: chunked is supported"})

# Why the server closed a connection it had accepted (the label values of
# llm_exporter_http_connections_rejected_total).
REASONS = ("too_many", "evicted", "tls_handshake", "idle_timeout", "header_timeout", "write_timeout",
           "bad_request", "bad_framing")

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
_PHRASES = {status.value: status.phrase.encode() for status in http.HTTPStatus}


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = MAX_CONNECTIONS
    tls_handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    write_timeout_s: float = WRITE_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES
    max_deferred_bytes: int = MAX_DEFERRED_BYTES

    @classmethod
    def from_module(cls) -> Limits:
        """The module constants as they are now (tests lower them with monkeypatch)."""
        return cls(MAX_CONNECTIONS, TLS_HANDSHAKE_TIMEOUT_S, HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, WRITE_TIMEOUT_S,
                   MAX_HEADER_BYTES, MAX_DEFERRED_BYTES)


def fd_bounded(max_connections: int) -> int:
    """The connection bound, lowered so that it fits the process's file descriptor limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE))


def framing_problem(request: h11.Request) -> str | None:
    """Why the body framing of `request` is refused, or None. h11 has already refused differing
    Content-Length values and any Transfer-Encoding but one `chunked` (and folds identical
    Content-Length repeats into one, as RFC 9112 6.3 allows); what it lets through and the RFC
    says to treat as faulty is checked here."""
    encoding = length = False
    for name, _value in request.headers:
        encoding = encoding or name == b"transfer-encoding"
        length = length or name == b"content-length"
    if encoding and length:
        # h11 follows Transfer-Encoding and ignores Content-Length; a proxy in front may do the
        # opposite, and then the chunked body's tail is a request it never saw (section 6.3).
        return "Transfer-Encoding together with Content-Length"
    if encoding and request.http_version == b"1.0":
        return "Transfer-Encoding in an HTTP/1.0 request"  # section 6.1: the framing is faulty
    return None


class HttpServer:
    """Accepts connections on one listening socket and runs each request through `app`."""

    def __init__(self, app: ASGIApp, *, ssl_context: ssl.SSLContext | None = None,
                 limits: Limits | None = None) -> None:
        self.app = app
        self.ssl_context = ssl_context
        self.limits = limits or Limits.from_module()
        self.max_connections = fd_bounded(self.limits.max_connections)
        if self.max_connections < self.limits.max_connections:
            log.warning("HTTP connections capped at %d, not %d: the file descriptor limit (ulimit -n) is too low",
                        self.max_connections, self.limits.max_connections)
        self.closed = dict.fromkeys(REASONS, 0)
        self._framing_unlogged = 0
        self._framing_logged_at = -float("inf")
        self.connections: set[_Connection] = set()
        # Connections not being served (handshake, waiting for or reading a head), oldest first,
        # and those waiting for their client to read: the ones a newcomer may displace. A dict
        # keeps insertion order and removes in O(1).
        self._waiting: dict[_Connection, None] = {}
        self._stalled: dict[_Connection, None] = {}
        self._server: asyncio.Server | None = None
        self._deferred: dict[int, list[Any]] = {}  # id(body) -> [body, connections writing it]
        self.deferred_bytes = 0
        self._stopping = False
        self._saturated = False
        self.read_buffer = memoryview(bytearray(READ_BYTES))
        self._date_second = -1
        self._date = b""

    async def start(self, sock: Any) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=sock, backlog=LISTEN_BACKLOG)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop accepting, close waiting connections now and the rest once their response is out."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        every = {c.task for c in self.connections if c.task is not None}
        for conn in list(self._waiting):
            conn.abort(None)
        busy = {c.task for c in self.connections if c.task is not None}
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for conn in list(self.connections):
            conn.abort(None)
        left = {task for task in every if not task.done()}
        if left:  # aborted: they only have to notice
            await asyncio.wait(left, timeout=1.0)

    def samples(self) -> list[Sample]:
        out = [Sample("llm_exporter_http_connections_open", (), float(len(self.connections))),
               Sample("llm_exporter_http_connections_limit", (), float(self.max_connections))]
        out += [Sample("llm_exporter_http_connections_rejected_total", labels_of(reason=reason), float(count))
                for reason, count in self.closed.items()]
        return out

    # --- bookkeeping, called by connections -----------------------------------------------------

    def admit(self, conn: _Connection) -> bool:
        if self._stopping:
            return False
        if len(self.connections) >= self.max_connections:
            victim = next(iter(self._waiting), None) or next(iter(self._stalled), None)
            if not self._saturated:
                self._saturated = True
                log.warning("HTTP connections at the limit (%d): each new one closes the oldest idle one (or one "
                            "stalled on a client that does not read), or is closed when all are in a request",
                            self.max_connections)
            if victim is None:
                self.closed["too_many"] += 1
                return False
            victim.abort("evicted")
        self.connections.add(conn)
        self._waiting[conn] = None
        return True

    def set_waiting(self, conn: _Connection, waiting: bool) -> None:
        if waiting:
            if conn in self.connections:
                self._waiting.pop(conn, None)
                self._waiting[conn] = None  # to the end: now the youngest waiter
        else:
            self._waiting.pop(conn, None)

    def set_stalled(self, conn: _Connection, stalled: bool) -> None:
        if stalled and conn in self.connections:
            self._stalled[conn] = None
        else:
            self._stalled.pop(conn, None)

    def forget(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        self._waiting.pop(conn, None)
        self._stalled.pop(conn, None)
        if self._saturated and len(self.connections) <= self.max_connections // 2:
            self._saturated = False
            log.info("HTTP connections back under the limit (%d open)", len(self.connections))

    def defer(self, body: Any) -> bool:
        """Take a reference on `body` for a connection that finishes writing it on its own; False
        when that would put the distinct deferred bodies over the budget."""
        entry = self._deferred.get(id(body))
        if entry is not None:
            entry[1] += 1
            return True
        if self.deferred_bytes + len(body) > self.limits.max_deferred_bytes:
            return False
        self._deferred[id(body)] = [body, 1]  # holding it keeps its id unique while listed
        self.deferred_bytes += len(body)
        return True

    def release(self, body: Any) -> None:
        entry = self._deferred[id(body)]
        entry[1] -= 1
        if entry[1] == 0:
            del self._deferred[id(body)]
            self.deferred_bytes -= len(body)

    def framing_refused(self, peer: Any, problem: str) -> None:
        """Log a refused request framing: the first at once, then at most one line per
        FRAMING_LOG_INTERVAL_S with how many were refused since (the counter has each one)."""
        self._framing_unlogged += 1
        now = time.monotonic()
        if now - self._framing_logged_at < FRAMING_LOG_INTERVAL_S:
            return
        since = "" if self._framing_logged_at == -float("inf") else f" in the last {now - self._framing_logged_at:.0f}s"
        log.warning("HTTP request refused (400) and its connection closed: ambiguous body framing (%s, from %s; "
                    "%d refused%s), how a request is smuggled past a proxy that frames it otherwise. This line "
                    "comes at most every %gs; llm_exporter_http_connections_rejected_total{reason=\"bad_framing\"} "
                    "counts each one", problem, _peer_text(peer), self._framing_unlogged, since, FRAMING_LOG_INTERVAL_S)
        self._framing_unlogged = 0
        self._framing_logged_at = now

    def date_header(self) -> bytes:
        # Formatted at most once a second, on demand: no timer wakes the process to refresh it.
        now = int(time.time())
        if now != self._date_second:
            self._date_second, self._date = now, email.utils.formatdate(now, usegmt=True).encode()
        return self._date


def _peer_text(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "an unknown peer"


class _Closed(Exception):
    """The connection is done (closed by the peer, a timeout, or an error already answered)."""


class _Connection(asyncio.BufferedProtocol):
    """One client connection: the protocol callbacks feed h11; a task per connection reads
    requests, runs the app and writes responses under the deadlines in Limits."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = asyncio.get_running_loop()
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        self.transport: Any = None
        self.task: asyncio.Task | None = None
        self.tls = False
        self.peer: Any = None
        self.local: Any = None
        self._connected = False  # connection_made/connection_lost apply to this protocol
        self._lost = self.loop.create_future()
        self._eof = False
        self._data_waiter: asyncio.Future | None = None
        self._drain_waiter: asyncio.Future | None = None
        self._queue: collections.deque[Any] = collections.deque()  # output the transport has not taken yet
        self._deferred: Any = None  # the body the queue still refers to, once the app is done with it
        self._write_paused = False
        self._reading_paused = False
        self._cycle_bytes = 0  # bytes received since the current request cycle began
        self._first_byte_at = 0.0
        self._reason: str | None = None  # set once, when the server closes the connection on its own
        self._aborted = False

    # --- protocol callbacks ------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if not self.server.admit(self):
            transport.abort()
            return
        self._connected = True
        self.peer = transport.get_extra_info("peername")
        self.local = transport.get_extra_info("sockname")
        transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)
        if self.server.ssl_context is not None:
            # Not a byte may be read before start_tls takes over the transport: a ClientHello
            # read here would be lost to the TLS layer.
            transport.pause_reading()
        self.task = self.loop.create_task(self._run())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._eof:
            return
        if self._cycle_bytes == 0:
            self._first_byte_at = self.loop.time()
        self._cycle_bytes += nbytes
        # h11 copies it out at once; it takes any bytes-like object though typed `bytes`.
        self.h11.receive_data(self.server.read_buffer[:nbytes])  # type: ignore[arg-type]
        if self._cycle_bytes > self.limits.max_header_bytes and not self._reading_paused:
            # Past any head: read on only when the task needs data (h11 refuses an oversized
            # head; a body or what a client pipelines waits in the kernel, not here).
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake(self._data_waiter)

    def eof_received(self) -> bool:
        self._peer_eof()
        return not self.tls  # keep a half-closed plain connection open to send the response

    def connection_lost(self, exc: Exception | None) -> None:
        self._peer_eof()
        if not self._lost.done():
            self._lost.set_result(None)
        self._wake(self._drain_waiter)
        self.server.forget(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake(self._drain_waiter)

    def _peer_eof(self) -> None:
        if not self._eof:
            self._eof = True
            self.h11.receive_data(b"")
        self._wake(self._data_waiter)

    @staticmethod
    def _wake(waiter: asyncio.Future | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abort(self, reason: str | None) -> None:
        """Drop the connection now, counting `reason` (None: not a rejection, e.g. at stop)."""
        if reason is not None and self._reason is None and not self._lost.done():
            self._reason = reason
            self.server.closed[reason] += 1
        self._aborted = True
        self.server.forget(self)
        if self.transport is not None:
            self.transport.abort()
        self._wake(self._data_waiter)
        self._wake(self._drain_waiter)

    # --- the connection task -----------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            if self.server.ssl_context is not None:
                await self._handshake(self.server.ssl_context)
            first, ready_at = True, self.loop.time()
            while True:
                request = await self._read_head(first, ready_at)
                if request is None:
                    break
                self.server.set_waiting(self, False)
                if not await self._respond(request) or self.server._stopping:
                    break
                self.server.set_waiting(self, True)
                first, ready_at = False, self.loop.time()
        except _Closed:
            pass
        except Exception:  # noqa: BLE001 - one connection's surprise must not reach the loop
            log.exception("HTTP connection from %s failed", self.peer)
            self.abort(None)
        finally:
            await self._close()
            self.server.forget(self)

    async def _handshake(self, context: ssl.SSLContext) -> None:
        try:
            transport = await self.loop.start_tls(
                self.transport, self, context, server_side=True,
                ssl_handshake_timeout=self.limits.tls_handshake_timeout_s)
        except (OSError, ValueError, RuntimeError):
            # A failed or timed-out handshake (ssl.SSLError and ConnectionAbortedError are
            # OSErrors); start_tls has closed the raw transport. Evicted ones are counted already.
            if self._reason is None and not self.server._stopping:
                self._reason = "tls_handshake"
                self.server.closed["tls_handshake"] += 1
            self._connected = False  # _run forgets it
            raise _Closed from None
        if transport is None:  # the transport was closed during the handshake
            self._connected = False
            raise _Closed
        self.transport, self.tls = transport, True
        transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)

    async def _wait_data(self, deadline: float, reason: str) -> None:
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        self._data_waiter = self.loop.create_future()
        try:
            async with asyncio.timeout_at(deadline):
                await self._data_waiter
        except TimeoutError:
            if reason == "idle_timeout" and not self._lost.done():
                # Nothing pending and no request begun: a clean close (FIN), which a keep-alive
                # client expects; it counts all the same.
                self._reason = reason
                self.server.closed[reason] += 1
                raise _Closed from None
            self.abort(reason)
            raise _Closed from None
        finally:
            self._data_waiter = None
        if self._aborted:  # evicted or stopped while waiting
            raise _Closed

    async def _read_head(self, first: bool, ready_at: float) -> h11.Request | None:
        """The next request head, or None when the client closed the connection cleanly."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as error:
                if str(error) in _H11_FRAMING_ERRORS:
                    self._refuse_framing(str(error))
                else:
                    self._reject(error.error_status_hint or 400, b"bad request\n")
                raise _Closed from None
            if isinstance(event, h11.Request):
                problem = framing_problem(event)
                if problem is not None:
                    # RFC 9112 6.1 and 6.3: a body framed two ways is how a request is smuggled past a
                    # proxy that reads the other framing. Answer once, close, never parse what follows.
                    self._refuse_framing(problem)
                    raise _Closed
                return event
            if event is not h11.NEED_DATA:
                return None  # ConnectionClosed, or PAUSED after an unexpected state
            if self._eof or self._lost.done():
                return None
            if self._cycle_bytes == 0:
                # Nothing yet: a new connection gets the header timeout, a kept-alive one the idle one.
                deadline = ready_at + (self.limits.header_timeout_s if first else self.limits.idle_timeout_s)
                reason = "idle_timeout"
            else:
                start = ready_at if first else max(ready_at, self._first_byte_at)
                deadline, reason = start + self.limits.header_timeout_s, "header_timeout"
            await self._wait_data(deadline, reason)

    def _refuse_framing(self, problem: str) -> None:
        # 400 whatever h11 hinted (it says 501 for any Transfer-Encoding but chunked): section 6.3
        # wants 400 when the body's length cannot be determined reliably.
        self._reject(400, f"bad request: {problem}\n".encode(), "bad_framing")
        self.server.framing_refused(self.peer, problem)

    def _reject(self, status: int, body: bytes, reason: str = "bad_request") -> None:
        """Answer a request refused before the app (malformed, a head over the cap, ambiguous
        framing) and close."""
        self.server.closed[reason] += 1
        self._reason = reason
        head = (f"HTTP/1.1 {status} ".encode() + _PHRASES.get(status, b"") + b"\r\ncontent-type: text/plain\r\n"
                + f"content-length: {len(body)}\r\n".encode() + b"connection: close\r\ndate: "
                + self.server.date_header() + b"\r\n\r\n")
        self.transport.write(head + body)

    async def _respond(self, request: h11.Request) -> bool:
        """Run the app for one request; True when the connection can take another."""
        exchange = _Exchange(self, request)
        try:
            await self.server.app(exchange.scope(), exchange.receive, exchange.send)
        except _Closed:
            raise
        except Exception:  # noqa: BLE001 - an app bug answers 500, the server goes on
            log.exception("error answering %s %s", request.method.decode(), exchange.path)
            if exchange.started:
                self.abort(None)
                raise _Closed from None
        await self.flush()
        if self.gone:
            raise _Closed
        if not exchange.started:
            await exchange.send({"type": "http.response.start", "status": 500,
                                 "headers": [(b"content-type", b"text/plain"), (b"content-length", b"15")]})
            await exchange.send({"type": "http.response.body", "body": b"internal error\n"})
        elif not exchange.complete:
            self.abort(None)  # the app stopped half-way through a body
            raise _Closed
        if self.h11.our_state is not h11.DONE:
            return False
        if self.h11.their_state is h11.SEND_BODY and not await self._discard_body():
            return False
        if self.h11.their_state is not h11.DONE:
            return False
        self.h11.start_next_cycle()
        # A pipelined next request already here: its header timeout runs from now (_read_head).
        self._cycle_bytes = len(self.h11.trailing_data[0])
        return True

    async def _discard_body(self) -> bool:
        """Read and drop a request body the app left unread, up to a cap; True when it ended."""
        dropped, deadline = 0, self.loop.time() + self.limits.header_timeout_s
        while dropped <= MAX_UNREAD_BODY_BYTES:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:
                return False
            if isinstance(event, h11.EndOfMessage):
                return True
            if isinstance(event, h11.Data):
                dropped += len(event.data)
            elif event is h11.NEED_DATA:
                if self._eof or self._lost.done():
                    return False
                await self._wait_data(deadline, "header_timeout")
            else:
                return False
        return False

    async def output(self, parts: list[Any], *, last: bool = False, body: Any = None) -> None:
        """Write `parts` in slices as fast as the transport takes them. What it will not take yet
        is, for a response's `last` message within the deferred budget, left to flush() after the
        app returns; otherwise the app waits here for the client (flush)."""
        if self.gone:
            return
        self._queue.extend(part for part in parts if len(part))
        self._pump()
        if not self._queue:
            return
        if last and body is not None and self._deferred is None and self.server.defer(body):
            self._deferred = body
            return
        await self.flush()

    def _pump(self) -> None:
        queue, transport = self._queue, self.transport
        while queue and not self._write_paused:
            item = queue[0]
            if len(item) > SEND_SLICE_BYTES:
                view = item if isinstance(item, memoryview) else memoryview(item)
                sent = self._send_direct(view)
                if sent:
                    queue[0] = view[sent:]
                    if sent == len(view):
                        queue.popleft()
                    continue
                transport.write(view[:SEND_SLICE_BYTES])
                queue[0] = view[SEND_SLICE_BYTES:]
            else:
                transport.write(item)
                queue.popleft()

    def _send_direct(self, view: memoryview) -> int:
        """Hand the kernel as much of `view` as its send buffer takes now, while the transport holds
        nothing back (so the order stays): no copy here, and one system call for a page the reader
        keeps up with. 0 when it takes nothing, over TLS, or when the transport is buffering; the
        caller then writes a slice through the transport's flow control."""
        if self.tls or self.transport.get_write_buffer_size():
            return 0
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return 0
        try:
            return os.write(sock.fileno(), view[:MAX_SEND_BYTES])
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:  # the peer is gone: the transport notices and says so on its next write
            return 0

    async def flush(self) -> None:
        """Write out the queue under flow control: each wait for the client to read may last
        WRITE_TIMEOUT_S, then the connection is dropped."""
        try:
            while self._queue and not self.gone:
                if self._write_paused:
                    self._drain_waiter = self.loop.create_future()
                    self.server.set_stalled(self, True)
                    try:
                        async with asyncio.timeout(self.limits.write_timeout_s):
                            await self._drain_waiter
                    except TimeoutError:
                        self.abort("write_timeout")
                        break
                    finally:
                        self._drain_waiter = None
                        self.server.set_stalled(self, False)
                self._pump()
        finally:
            if self.gone:
                self._queue.clear()
            if self._deferred is not None and not self._queue:
                self.server.release(self._deferred)
                self._deferred = None

    @property
    def gone(self) -> bool:
        return self._aborted or self._lost.done()

    async def _close(self) -> None:
        """Close (flushing what is buffered) and wait until the connection is gone; a client that
        does not read the rest within the write timeout is dropped."""
        if not self._connected:
            return
        if not self.gone:
            await self.flush()
        self._queue.clear()
        if self._deferred is not None:
            self.server.release(self._deferred)
            self._deferred = None
        if not self.transport.is_closing():
            self.transport.close()
        if self._lost.done():
            return
        try:
            async with asyncio.timeout(self.limits.write_timeout_s):
                await asyncio.shield(self._lost)
        except TimeoutError:
            # Unsent response bytes: the client stopped reading. An empty buffer: a TLS peer that
            # never answered close_notify, not worth a count.
            pending = self.transport.get_write_buffer_size() > 0
            self.abort("write_timeout" if pending else None)


class _Exchange:
    """One request/response on a connection: the ASGI scope, receive and send."""

    def __init__(self, conn: _Connection, request: h11.Request) -> None:
        self.conn = conn
        self.request = request
        raw_path, _, self.query = request.target.partition(b"?")
        self.raw_path = raw_path
        self.path = urllib.parse.unquote(raw_path.decode("ascii", "replace"))
        self.head = request.method == b"HEAD"
        self.started = False
        self.complete = False
        self._pending_head: bytes | None = None
        self._body_done = False

    def scope(self) -> dict:
        conn = self.conn
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.request.http_version.decode(),
            "server": conn.local[:2] if conn.local else None,
            "client": conn.peer[:2] if conn.peer else None,
            "scheme": "https" if conn.tls else "http",
            "method": self.request.method.decode("ascii"),
            "root_path": "",
            "path": self.path,
            "raw_path": self.raw_path,
            "query_string": self.query,
            "headers": list(self.request.headers),
        }

    async def receive(self) -> dict:
        conn = self.conn
        if self._body_done or self.complete or conn.gone:
            if not conn.gone:
                await asyncio.shield(conn._lost)
            return {"type": "http.disconnect"}
        if conn.h11.they_are_waiting_for_100_continue:
            await conn.output([conn.h11.send(h11.InformationalResponse(status_code=100, headers=[]))])
        deadline = conn.loop.time() + conn.limits.header_timeout_s
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError:
                conn.abort("bad_request")
                return {"type": "http.disconnect"}
            if isinstance(event, h11.Data):
                return {"type": "http.request", "body": bytes(event.data), "more_body": True}
            if isinstance(event, h11.EndOfMessage):
                self._body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if event is not h11.NEED_DATA or conn._eof or conn.gone:
                return {"type": "http.disconnect"}
            try:
                await conn._wait_data(deadline, "header_timeout")  # a body trickled in too slowly
            except _Closed:
                return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        conn = self.conn
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            headers = [*message.get("headers", ()), (b"date", conn.server.date_header())]
            status = message["status"]
            self._pending_head = conn.h11.send(h11.Response(status_code=status, headers=headers,
                                                            reason=_PHRASES.get(status, b"")))
            return
        if kind != "http.response.body":
            return
        if not self.started or self.complete:
            raise RuntimeError("http.response.body without a response start, or after the end")
        body = b"" if self.head else message.get("body", b"")
        more = bool(message.get("more_body", False))
        head, self._pending_head = self._pending_head or b"", None
        # h11 frames the body (content-length: passed through as is; chunked: a size line and
        # CRLF around it) without copying it; output() slices it.
        # (h11 returns None only for a ConnectionClosed event, never for Data)
        parts = [head, *((conn.h11.send_with_data_passthrough(h11.Data(data=body)) or ()) if body else ())]
        if not more:
            parts.append(conn.h11.send(h11.EndOfMessage()))
            self.complete = True
        if len(body) <= SEND_SLICE_BYTES:
            parts, body = [b"".join(parts)], None  # the common small response: one write, one syscall
        await conn.output(parts, last=not more, body=body if body is not None else parts[0])


async def respond(send: Any, status: int, body: bytes, content_type: bytes, length: int | None = None,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a whole response through an ASGI `send`. `length`: the Content-Length to declare when
    `body` is empty for a HEAD."""
    size = len(body) if length is None else length
    headers = [(b"content-type", content_type), (b"content-length", str(size).encode()), *(extra or ())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
