"""The one HTTP/1.1 client: engine scrapes, the twin's state, doctor, the planner, the probe and the
load test all read through it. h11 (the framing the exporter's own server uses) writes the requests
and parses the answers; this module adds what a sidecar facing untrusted servers needs around it.

httpx costs 2.3-3.5 ms of CPU per fetch of a 43-69 KB page even over keep-alive (its
request/response models, httpcore's pool and anyio's stream layers); this client a fraction of
that (bench/bench_fetch.py), which a sidecar that scrapes every second needs. Two ways to use it:

- `HttpClient`: GETs one URL over one kept-alive connection and returns the whole body of a 200
  (engine pages, JSON documents). The connection is dropped on any error, on `Connection: close`,
  on an HTTP/1.0 or close-delimited answer and after KEEPALIVE_EXPIRY_S idle; one the server closed
  (or wrote to) while idle is noticed before it is used, and replaced by a fresh one. Like httpx,
  no retry once the request is out: an engine that drops the connection instead of answering is
  reported as down. Failures raise SourceError with the reasons EngineSource reports: timeout, dns
  (the resolver's own words in the message), connection, tls, http_status, too_large, credentials.
- `Connection` with `resolve` and `connect`: one exchange read piece by piece as it arrives (the
  probe's SSE stream, whose caller times each piece and keeps its own deadlines).

Bounds, for both: the response head (status line plus headers, every interim 1xx answer included)
under `max_head_bytes`, counted here since h11 bounds only an event still incomplete (its
max_incomplete_event_size, set to the same number, bounds a chunk-size line; the trailers are
counted here too); at most _MAX_INTERIM 1xx answers; HTTP/1.0 or 1.1 only; bodies by Content-Length, chunked or
read-until-close, with the whole-body reader abandoning one past its cap (at once when the declared
Content-Length is over it), and a compressed body capped after decoding. Time is the caller's
deadline (asyncio.timeout) over connect, TLS, request, head and body: a server that drips one byte
at a time is cut there, and each byte costs linear time (h11 resumes its scan where it stopped).
No redirects, no proxies, no .netrc, no environment: only the given URL is contacted, with the
headers the caller gives. Messages carry the redacted URL, never a header value.

A host name is resolved by a `Resolver`: its own thread, one lookup at a time, a lookup outliving
a deadline reused by the next call, so a hung resolver costs one thread and never the event loop's
shared executor (where the GPU, host and normalize work run).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import ipaddress
import socket
import ssl
import time
import urllib.parse
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import h11

from exporter.jsonsafe import JsonTooDeep
from exporter.jsonsafe import loads as json_loads
from exporter.redact import redact_url
from exporter.sources.base import SourceError

__all__ = ["KEEPALIVE_EXPIRY_S", "MAX_HEAD_BYTES", "BodyTooLarge", "ClosedEarly", "Connection", "HeadTooLarge",
           "Head", "header_list",
           "HttpClient", "Origin", "ProtocolError", "ResolveError", "Resolver", "connect", "error_hint",
           "get_json_object", "is_ip_literal", "parse_url", "printable", "request", "resolve"]

MAX_HEAD_BYTES = 64 * 1024  # status line + headers; also the longest chunk-size line and the trailers
MAX_ERROR_BODY = 4096  # read of an error answer, for its hint; a longer one gives no hint (HttpClient)
MAX_ERROR_HINT = 200  # characters of that hint in the error message (and so in logs and doctor)
# An idle connection older than this is not reused: under uvicorn's default keep-alive (5 s, also
# httpx's expiry), so a slow scrape interval never races the server closing it.
KEEPALIVE_EXPIRY_S = 4.0
_MAX_INTERIM = 16  # 1xx answers skipped before the real one
# One read from the socket: a whole 69 KB page in one piece, so one h11 Data event per fetch (each
# event costs h11 a few microseconds). The stream's buffer pauses the socket at twice this.
_READ_SIZE = 256 * 1024
_END = h11.EndOfMessage()  # immutable: one for every request
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x as we can read it."""


class HeadTooLarge(ProtocolError):
    """The response head (interim answers included) is over max_head_bytes."""


class ClosedEarly(Exception):
    """The server closed the connection before its answer was complete (or began)."""


class BodyTooLarge(Exception):
    """A body over the reader's cap (declared, received or decoded)."""


class ResolveError(Exception):
    """The host name did not resolve; the message is the resolver's."""


class Head(NamedTuple):
    """A response head, as much of it as the readers use."""

    status: int
    length: int | None  # Content-Length, when it frames the body (not with chunks)
    coding: bytes  # Content-Encoding, lower-cased; b"identity" when none


class Origin(NamedTuple):
    """What a URL says about where to connect and what to ask."""

    host: str  # lower-cased, IPv6 brackets removed
    port: int
    tls: bool
    host_header: str
    target: str  # path and query, quoted
    basic_auth: str | None  # user:password@ in the URL, as an Authorization value


def parse_url(url: str) -> Origin:
    """Raises ValueError (with the URL redacted) for anything but an http(s) URL with a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {redact_url(url)}")
    host = parts.hostname
    tls = parts.scheme == "https"
    default_port = 443 if tls else 80
    port = parts.port or default_port
    try:
        host_ascii = host.encode("ascii").decode("ascii")
    except UnicodeEncodeError:
        host_ascii = host.encode("idna").decode("ascii")
    host_header = f"[{host_ascii}]" if ":" in host_ascii else host_ascii
    if port != default_port:
        host_header += f":{port}"
    target = urllib.parse.quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        target += "?" + urllib.parse.quote(parts.query, safe=_QUERY_SAFE)
    basic = None
    if parts.username or parts.password:  # sent as basic auth (what httpx did)
        raw = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
        basic = "Basic " + base64.b64encode(raw.encode("utf-8")).decode("ascii")
    return Origin(host, port, tls, host_header, target, basic)


def header_list(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """Headers as h11 takes them. Raises ValueError naming a header (never its value) that h11
    would refuse: a line break or NUL, a name that is not a token, a non-Latin-1 character."""
    out = []
    for name, value in headers.items():
        try:
            out.append((name.encode("ascii"), value.encode("latin-1")))
        except UnicodeEncodeError:
            raise ValueError(f"header {name!r} is not Latin-1 text") from None
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"header {name!r} contains a line break or NUL")
    return out


def request(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> h11.Request:
    """A request head h11 has checked: ValueError for one it refuses (a header that is not a
    token, a value with surrounding blanks). The event is immutable, so a client asking the same
    thing every scrape builds it once (h11's checks are a good part of its CPU per fetch)."""
    try:
        return h11.Request(method=method, target=target, headers=headers)
    except h11.LocalProtocolError:
        raise ValueError("a request header h11 refuses") from None


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Resolver:
    """Resolves host names in one thread of its own, one lookup at a time. A lookup still running
    when its caller's deadline passed is kept and awaited by the next call for the same name
    instead of starting another, so a hung resolver costs this one thread and never piles up."""

    def __init__(self, thread_name: str = "resolve") -> None:
        self._thread_name = thread_name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: dict[tuple[str, int], asyncio.Future] = {}

    async def resolve(self, host: str, port: int) -> list[tuple[int, str]]:
        """(family, address) pairs; socket.gaierror (an OSError) when the name does not resolve."""
        loop = asyncio.get_running_loop()
        key = (host, port)
        lookup = self._pending.get(key)
        if lookup is None or lookup.get_loop() is not loop:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._thread_name)
            lookup = loop.run_in_executor(self._pool, socket.getaddrinfo, host, port, socket.AF_UNSPEC,
                                          socket.SOCK_STREAM)
            self._pending[key] = lookup
        try:
            infos = await asyncio.shield(lookup)  # a timeout leaves the lookup to finish for the next call
        finally:
            if lookup.done() and self._pending.get(key) is lookup:
                del self._pending[key]  # resolve afresh for the next connection
        # An IP address's text (typeshed's sockaddr also allows an AF_UNIX-style int: never here).
        return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # a hung lookup ends on its own
            self._pool = None
        self._pending.clear()


async def resolve(host: str, port: int, resolver: Resolver | None) -> list[tuple[int, str]]:
    """Where to connect: an IP literal as it is, a name through `resolver` (without one, the loop's
    getaddrinfo). Raises ResolveError with the resolver's words."""
    if is_ip_literal(host):
        return [(socket.AF_UNSPEC, host)]
    try:
        if resolver is not None:
            return await resolver.resolve(host, port)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos]
    except OSError as error:  # socket.gaierror: "Name or service not known", ...
        raise ResolveError(f"cannot resolve {host}: {error.strerror or error}") from None


async def connect(origin: Origin, addresses: Sequence[tuple[int, str]], ssl_context: ssl.SSLContext | None,
                  max_head_bytes: int = MAX_HEAD_BYTES) -> Connection:
    """A connection to the first address that takes one. A refused certificate (ssl.SSLError)
    ends the attempt; any other OSError tries the next address, as asyncio's own connect would, and
    the last one is raised. No address at all is a ResolveError."""
    if origin.tls and ssl_context is None:
        ssl_context = ssl.create_default_context()
    failure: OSError | None = None
    for family, address in addresses:
        try:
            reader, writer = await asyncio.open_connection(
                address, origin.port, ssl=ssl_context if origin.tls else None,
                server_hostname=origin.host if origin.tls else None, family=family, limit=_READ_SIZE)
        except ssl.SSLError:
            raise
        except OSError as error:
            failure = error
            continue
        return Connection(reader, writer, max_head_bytes)
    if failure is None:
        raise ResolveError(f"cannot resolve {origin.host}: no address")
    try:
        raise failure
    finally:
        del failure  # its traceback holds this frame: no cycle through the local


class Connection:
    """One connection and its h11 state: a request written, its answer read as a head then pieces."""

    __slots__ = ("reader", "writer", "loop", "idle_since", "max_head_bytes", "_h11", "_eof", "_both_framings")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self.idle_since = time.monotonic()
        self.max_head_bytes = max_head_bytes
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head_bytes)
        self._eof = False
        self._both_framings = False

    def send(self, request: h11.Request, body: bytes = b"") -> None:
        """Writes the request (see `request`; give Content-Length for a body)."""
        data = self._h11.send(request)
        if body:
            data += self._h11.send(h11.Data(data=body))
        data += self._h11.send(_END)
        self.writer.write(data)

    async def _receive(self) -> int:
        data = await self.reader.read(_READ_SIZE)
        if not data:
            self._eof = True
        self._h11.receive_data(data)
        return len(data)

    def _next(self) -> Any:
        try:
            return self._h11.next_event()
        except h11.RemoteProtocolError as error:
            if self._eof:
                raise ClosedEarly(str(error)) from None
            if error.error_status_hint == 431:  # h11's "Receive buffer too long"
                raise HeadTooLarge(f"a line over {self.max_head_bytes} bytes") from None
            raise ProtocolError(str(error)) from None

    async def read_head(self) -> Head:
        """The final response head, interim 1xx answers skipped. Every head byte counts against
        max_head_bytes: h11 alone bounds a head still incomplete, not one that came whole."""
        received = interim = 0
        if not self._h11.trailing_data[0]:  # nothing buffered: wait for bytes before asking h11
            received += await self._receive()
        while True:
            try:
                event = self._next()
            except HeadTooLarge:
                raise HeadTooLarge(f"response head over {self.max_head_bytes} bytes") from None
            if event is h11.NEED_DATA:
                if self._eof:
                    raise ClosedEarly("closed without an answer")
                received += await self._receive()
                continue
            # Only past the cap received can the head be over it (trailing_data copies the buffer).
            if received > self.max_head_bytes and received - len(self._h11.trailing_data[0]) > self.max_head_bytes:
                raise HeadTooLarge(f"response head over {self.max_head_bytes} bytes")
            if isinstance(event, h11.InformationalResponse):
                interim += 1
                if interim >= _MAX_INTERIM:
                    raise ProtocolError("too many interim answers")
                continue
            if not isinstance(event, h11.Response):
                raise ProtocolError("no response head")
            if event.http_version not in (b"1.1", b"1.0"):
                raise ProtocolError("not an HTTP/1.x answer")
            length = coding = None
            chunked = False
            for name, value in event.headers:  # h11 lower-cased the names and checked Content-Length
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    chunked = True
                elif name == b"content-encoding":
                    coding = value.strip().lower()
            # Both framings: h11 follows the chunks, but a proxy may have read the answer by its length.
            self._both_framings = chunked and length is not None
            return Head(event.status_code, None if chunked else length, coding or b"identity")

    async def read(self) -> bytes:
        """The next piece of the body, de-chunked, as it arrives; b"" at its end. The end of a
        close-delimited body is the server closing; any other framing cut short is ClosedEarly."""
        while True:
            event = self._next()
            if event is h11.NEED_DATA:
                await self._receive()
                continue
            if type(event) is h11.Data:
                return event.data
            # Trailers that came whole in one read passed h11's bound on an incomplete event.
            if (type(event) is h11.EndOfMessage and event.headers
                    and sum(len(name) + len(value) + 4 for name, value in event.headers) > self.max_head_bytes):
                raise ProtocolError(f"trailers over {self.max_head_bytes} bytes")
            return b""  # EndOfMessage (or ConnectionClosed, after a close-delimited end)

    async def read_body(self, head: Head, cap: int) -> bytes:
        """The whole body within `cap` bytes (decoded, if gzip or deflate came although we ask for
        identity); BodyTooLarge as soon as it is known to be over."""
        if head.length is not None:
            if head.length > cap:
                raise BodyTooLarge(f"Content-Length {head.length} over the cap {cap}")
            # Known and within the cap: wait for all of it before asking h11, which then hands it
            # over in one event instead of one per read (h11's events are most of the CPU a fetch costs).
            missing = head.length - len(self._h11.trailing_data[0])
            if missing > 0:
                try:
                    self._h11.receive_data(await self.reader.readexactly(missing))
                except asyncio.IncompleteReadError:
                    raise ClosedEarly("closed in the middle of the body") from None
        chunks: list[bytes] = []
        size = 0
        while piece := await self.read():
            size += len(piece)
            if size > cap:
                raise BodyTooLarge(f"body over the cap of {cap} bytes")
            chunks.append(piece)
        body = b"".join(chunks)
        if head.coding not in (b"identity", b""):
            body = _decode(head.coding, body, cap)
        return body

    def reusable(self) -> bool:
        """The exchange ended cleanly and both sides may go on (HTTP/1.1, no close, framed by length
        or chunks but not both: a proxy may have read such an answer differently)."""
        h = self._h11
        return h.our_state is h11.DONE and h.their_state is h11.DONE and not self._both_framings

    def park(self) -> None:
        """Ready for the next request, after a reusable() exchange."""
        self._h11.start_next_cycle()
        self.idle_since = time.monotonic()

    def usable(self) -> bool:
        """Whether a parked connection may carry the next request. Bytes that arrived while idle (a
        408 before the server hangs up, junk after a body) would be read as the next answer: such a
        connection is dropped. StreamReader has no public "buffered" accessor; _buffer has been
        there since Python 3.4."""
        return (self.loop is asyncio.get_running_loop() and not self.writer.transport.is_closing()
                and not self.reader.at_eof() and not getattr(self.reader, "_buffer", b"")
                and not self._h11.trailing_data[0]
                and time.monotonic() - self.idle_since < KEEPALIVE_EXPIRY_S)

    def abort(self) -> None:
        try:
            self.writer.transport.abort()
        except RuntimeError:  # left behind by an event loop now closed, which cannot run the close
            raw = getattr(self.writer.get_extra_info("socket"), "_sock", None)
            if raw is not None:
                raw.close()

    async def aclose(self) -> None:
        """A graceful close on this loop, else (or past 1 s) an abort."""
        if self.loop is not asyncio.get_running_loop():
            self.abort()
            return
        self.writer.close()
        try:
            async with asyncio.timeout(1.0):
                await self.writer.wait_closed()
        except (TimeoutError, OSError, ssl.SSLError):
            self.abort()


def _decode(coding: bytes, body: bytes, cap: int) -> bytes:
    if coding not in (b"gzip", b"x-gzip", b"deflate"):
        raise ProtocolError("unsupported Content-Encoding")
    wbits = 47 if coding != b"deflate" else zlib.MAX_WBITS  # 47: gzip or zlib header, detected
    try:
        out = zlib.decompressobj(wbits).decompress(body, cap + 1)
    except zlib.error:
        raise ProtocolError("bad compressed body") from None
    if len(out) > cap:
        raise BodyTooLarge(f"body over the cap of {cap} bytes")
    return out


def printable(text: str, most: int = MAX_ERROR_HINT) -> str:
    """One line of printable characters, shortened to `most`: server text bound for a log line."""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= most else text[:most - 3] + "..."


def error_hint(body: bytes, *, raw_text: bool) -> str:
    """What an error answer's JSON error document says (OpenAI style `{"error": {"message": ...}}`,
    `{"error": "..."}`, `{"detail": ...}`), as ": text", shortened and printable; "" when it says
    nothing. `raw_text`: a body that is not such a document is the hint itself (the probe's view);
    else a page (a proxy's or a web server's HTML) is a body, not a reason, and gives no hint."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json_loads(text)
    except ValueError:  # JsonTooDeep included: no structured reason
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error", doc.get("detail", doc.get("message")))
        message = error.get("message", "") if isinstance(error, dict) else error
        text = message if isinstance(message, str) else ""
    elif not raw_text:
        return ""
    text = printable(text)
    return f": {text}" if text else ""


class HttpClient:
    """GETs one URL over a kept-alive connection. Not for concurrent use by design, but safe:
    a second request while one is in flight opens its own connection."""

    def __init__(self, url: str, *, timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                 headers: Mapping[str, str] | None = None, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        self.origin = parse_url(url)
        self.timeout_s = timeout_s
        self.max_head_bytes = max_head_bytes
        self._shown = redact_url(url)
        self._tls = ssl_context
        self._target = self.origin.target.encode("ascii")
        # Host first, then the caller's fixed headers; per-request ones (Authorization) are appended.
        self._fixed = header_list({"Host": self.origin.host_header, "Accept-Encoding": "identity",
                                   **(headers or {})})
        self._last: tuple[tuple[tuple[str, str], ...], h11.Request] | None = None
        self._request(headers={})  # a fixed header h11 refuses is a ValueError here, not at the first GET
        self._idle: Connection | None = None
        self._closed = False
        self._resolver = Resolver("resolve")

    def _request(self, headers: Mapping[str, str]) -> h11.Request:
        """The fixed headers, then the per-request ones; user:password@ in the URL wins over an
        Authorization header. The last request event is kept while the headers stay the same."""
        if self.origin.basic_auth is not None:
            headers = {**{k: v for k, v in headers.items() if k.lower() != "authorization"},
                       "Authorization": self.origin.basic_auth}
        key = tuple(headers.items())
        if self._last is None or self._last[0] != key:
            try:
                event = request(b"GET", self._target, self._fixed + header_list(headers))
            except ValueError:
                raise SourceError("credentials", "a request header contains a line break or NUL") from None
            self._last = (key, event)
        return self._last[1]

    async def get(self, *, headers: Mapping[str, str] | None = None, max_body: int) -> bytes:
        """The body of a 200 answer; anything else raises SourceError."""
        event = self._request(headers or {})
        stage = "no answer"  # what a timeout interrupted, for its message
        conn: Connection | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                conn, self._idle = self._idle, None
                if conn is not None and not conn.usable():
                    conn.abort()
                    conn = None
                if conn is None:
                    stage = f"{self.origin.host} not resolved"
                    addresses = await resolve(self.origin.host, self.origin.port, self._resolver)
                    stage = "no answer"
                    try:
                        conn = await connect(self.origin, addresses, self._tls, self.max_head_bytes)
                    except ssl.SSLCertVerificationError:
                        raise
                    except (OSError, ssl.SSLError) as error:
                        raise _Failure("ConnectError") from error
                # No retry once the request is out, even on a kept connection: an engine that dies
                # mid-request must show as down, as it did with httpx. A connection the server
                # closed while idle is caught before it is used (usable(), above).
                conn.send(event)
                try:
                    head = await conn.read_head()
                except ConnectionError:
                    raise _Failure("ReadError") from None
                stage = "body not complete"
                if head.status != 200:
                    hint = await self._error_hint(conn, head)
                    raise SourceError("http_status", f"HTTP {head.status} from {self._shown}{hint}", head.status)
                body = await conn.read_body(head, max_body)
            if conn.reusable() and not self._closed and self._idle is None:
                conn.park()
                self._idle, conn = conn, None
            return body
        except TimeoutError:
            raise SourceError("timeout", f"{stage} within {self.timeout_s:g}s") from None
        except ResolveError as error:
            raise SourceError("dns", f"{error} (for {self._shown})") from None
        except _Failure as failure:
            raise SourceError("connection", f"{failure.name} for {self._shown}") from None
        except ssl.SSLCertVerificationError:
            raise SourceError("tls", f"TLS certificate of {self._shown} not trusted "
                                     "(set ca_file for a private CA)") from None
        except BodyTooLarge as error:
            raise SourceError("too_large", str(error)) from None
        except (ProtocolError, ClosedEarly):
            raise SourceError("connection", f"RemoteProtocolError for {self._shown}") from None
        except (OSError, ssl.SSLError):
            raise SourceError("connection", f"ReadError for {self._shown}") from None
        finally:
            if conn is not None:  # anything but a clean, reusable answer: the connection goes
                conn.abort()

    @staticmethod
    async def _error_hint(conn: Connection, head: Head) -> str:
        """The engine's words from an error answer (llama.cpp started without --metrics answers 501
        with the flag to add); "" for a page, a body past MAX_ERROR_BODY or a broken one."""
        try:
            body = await conn.read_body(head, MAX_ERROR_BODY)
        except (BodyTooLarge, ProtocolError, ClosedEarly, OSError):
            return ""
        return error_hint(body, raw_text=False)

    async def aclose(self) -> None:
        self._closed = True
        self._resolver.close()
        conn, self._idle = self._idle, None
        if conn is not None:
            await conn.aclose()


class _Failure(Exception):
    """A connection-level failure, named the way httpx named it (ConnectError, ReadError, ...)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


async def get_json_object(client: HttpClient, shown: str, max_body: int) -> dict[str, Any]:
    """GET one JSON object (the twin's /sim/gpu and /sim/host) within `max_body` bytes. Errors are
    SourceErrors naming `shown`, the redacted URL, since they reach logs and /api/v1/snapshot."""
    try:
        body = await client.get(max_body=max_body)
    except SourceError as e:
        raise SourceError(e.reason, e.message if shown in e.message else f"{shown}: {e.message}") from None
    try:
        doc = json_loads(body)
    except JsonTooDeep as e:
        raise SourceError("too_deep", f"{shown}: {e}") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise SourceError("parse", f"{shown}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SourceError("parse", f"{shown}: expected a JSON object")
    return doc
