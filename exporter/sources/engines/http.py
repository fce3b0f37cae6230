"""A small HTTP/1.1 GET client for engine scrapes, on plain asyncio streams.

httpx costs 2.3-3.5 ms of CPU per fetch of a 43-69 KB page even over keep-alive (its
request/response models, httpcore's pool and anyio's stream layers), this ~0.4 ms, kernel time
included (bench/bench_fetch.py); a sidecar that scrapes every second cannot afford the first.
This client does only what a scrape needs:

- one keep-alive connection per target, dropped on any error, on `Connection: close`, on an
  HTTP/1.0 or close-delimited answer and after 4 s idle; one the server closed while idle is
  noticed before it is used, and replaced by a fresh one. Like httpx, no retry once the request
  is out: an engine that drops the connection instead of answering is reported as down;
- bounded parsing: status line plus headers (and chunk-size lines, and trailers) under
  MAX_HEAD_BYTES; bodies by Content-Length, chunked or read-until-close, abandoned past the
  payload cap; one deadline (asyncio.timeout) over connect, TLS, request, headers and body;
- no redirects, no proxies, no .netrc, no environment at all: only the configured URL is ever
  fetched, with the credentials given by the caller;
- a host name is resolved in the client's own thread, one lookup at a time, so a hung resolver
  costs one thread per target and never the event loop's shared executor;
- failures raise SourceError with the reasons EngineSource reports: timeout, dns (the host name
  does not resolve; the resolver's own words in the message), connection, tls, http_status,
  too_large. Messages carry the redacted URL, never a header value.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import ipaddress
import re
import socket
import ssl
import time
import urllib.parse
import zlib
from collections.abc import Mapping
from typing import Any

from exporter import jsonsafe
from exporter.jsonsafe import JsonTooDeep
from exporter.redact import redact_url
from exporter.sources.base import SourceError

MAX_HEAD_BYTES = 64 * 1024  # status line + headers; also the longest chunk-size or trailer line
MAX_ERROR_BODY = 4096  # read of an error answer, for its hint; a longer one gives no hint
MAX_ERROR_HINT = 200  # characters of that hint in the error message (and so in logs and doctor)
# An idle connection older than this is not reused: under uvicorn's default keep-alive (5 s, also
# httpx's expiry), so a slow scrape interval never races the server closing it.
KEEPALIVE_EXPIRY_S = 4.0
_MAX_INTERIM = 16  # 1xx answers skipped before the real one
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


class _ProtocolError(Exception):
    """The server's answer is not HTTP/1.x as we can read it (reason `connection`)."""


class _ResolveError(Exception):
    """The host name did not resolve (reason `dns`); the message is the resolver's."""


class _Connection:
    __slots__ = ("reader", "writer", "idle_since", "loop")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = time.monotonic()
        self.loop = asyncio.get_running_loop()

    def usable(self) -> bool:
        # Bytes that arrived while idle (a 408 before the server hangs up, junk after a body) would
        # be read as the next answer: such a connection is dropped. StreamReader has no public
        # "buffered" accessor; _buffer has been there since Python 3.4.
        return (self.loop is asyncio.get_running_loop() and not self.writer.transport.is_closing()
                and not self.reader.at_eof() and not getattr(self.reader, "_buffer", b"")
                and time.monotonic() - self.idle_since < KEEPALIVE_EXPIRY_S)

    def abort(self) -> None:
        try:
            self.writer.transport.abort()
        except RuntimeError:  # left behind by an event loop now closed, which cannot run the close
            raw = getattr(self.writer.get_extra_info("socket"), "_sock", None)
            if raw is not None:
                raw.close()


class HttpClient:
    """GETs one URL over a kept-alive connection. Not for concurrent use by design, but safe:
    a second request while one is in flight opens its own connection."""

    def __init__(self, url: str, *, timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                 headers: Mapping[str, str] | None = None, max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {redact_url(url)}")
        self.timeout_s = timeout_s
        self.max_head_bytes = max_head_bytes
        self._shown = redact_url(url)
        self._host = parts.hostname  # lower-cased, IPv6 brackets removed
        self._tls = ssl_context if parts.scheme == "https" else None
        if self._tls is None and parts.scheme == "https":
            self._tls = ssl.create_default_context()
        default_port = 443 if parts.scheme == "https" else 80
        self._port = parts.port or default_port
        try:
            host_ascii = self._host.encode("ascii").decode("ascii")
        except UnicodeEncodeError:
            host_ascii = self._host.encode("idna").decode("ascii")
        host_header = f"[{host_ascii}]" if ":" in host_ascii else host_ascii
        if self._port != default_port:
            host_header += f":{self._port}"
        target = urllib.parse.quote(parts.path or "/", safe=_PATH_SAFE)
        if parts.query:
            target += "?" + urllib.parse.quote(parts.query, safe=_QUERY_SAFE)
        fixed = {"Host": host_header, "Accept-Encoding": "identity", **(headers or {})}
        # user:password@ in the URL is sent as basic auth (what httpx did), and wins over a header
        self._userinfo: str | None = None
        if parts.username or parts.password:
            raw = f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
            self._userinfo = "Basic " + base64.b64encode(raw.encode("utf-8")).decode("ascii")
        self._head = f"GET {target} HTTP/1.1\r\n".encode("ascii") + self._encode_headers(fixed)
        self._idle: _Connection | None = None
        self._closed = False
        self._literal = is_ip_literal(self._host)
        self._resolver: concurrent.futures.ThreadPoolExecutor | None = None
        self._resolving: asyncio.Future | None = None

    @staticmethod
    def _encode_headers(headers: Mapping[str, str]) -> bytes:
        lines = []
        for name, value in headers.items():
            if any(c in name or c in value for c in "\r\n\0"):
                raise ValueError(f"header {name!r} contains a line break or NUL")  # never its value
            lines.append(f"{name}: {value}\r\n")
        return "".join(lines).encode("latin-1")

    def _request(self, headers: Mapping[str, str]) -> bytes:
        """The request bytes: the fixed headers, then the per-request ones (Authorization)."""
        if self._userinfo is not None:
            headers = {**{k: v for k, v in headers.items() if k.lower() != "authorization"},
                       "Authorization": self._userinfo}
        if not headers:
            return self._head + b"\r\n"
        try:
            return self._head + self._encode_headers(headers) + b"\r\n"
        except ValueError:
            raise SourceError("credentials", "a request header contains a line break or NUL") from None

    async def _connect(self, addresses: list[tuple[int, str]]) -> _Connection:
        tls_name = self._host if self._tls else None
        failure: OSError | None = None
        for family, address in addresses:
            try:
                reader, writer = await asyncio.open_connection(
                    address, self._port, ssl=self._tls, server_hostname=tls_name, family=family,
                    limit=self.max_head_bytes)
            except ssl.SSLCertVerificationError:
                raise
            except OSError as error:  # the next address, as asyncio's own connect would
                failure = error
                continue
            return _Connection(reader, writer)
        if failure is None:
            raise _ResolveError(f"cannot resolve {self._host}: no address")
        try:
            raise failure
        finally:
            del failure  # its traceback holds this frame: no cycle through the local

    async def _resolve(self) -> list[tuple[int, str]]:
        """(family, address) for the host name, resolved in this client's own thread, one lookup
        at a time. asyncio would resolve in the loop's default executor, where a hung resolver
        (a lookup outlives our deadline) would pile up one stuck lookup per cycle and starve the
        GPU, host and normalize work that shares that pool."""
        loop = asyncio.get_running_loop()
        if self._resolving is None or self._resolving.get_loop() is not loop:
            if self._resolver is None:
                self._resolver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="resolve")
            self._resolving = loop.run_in_executor(self._resolver, socket.getaddrinfo, self._host, self._port,
                                                   socket.AF_UNSPEC, socket.SOCK_STREAM)
        lookup = self._resolving
        try:
            infos = await asyncio.shield(lookup)  # a timeout leaves the lookup to finish for the next cycle
        except OSError as error:  # socket.gaierror: "Name or service not known", ...
            raise _ResolveError(f"cannot resolve {self._host}: {error.strerror or error}") from None
        finally:
            if lookup.done() and self._resolving is lookup:
                self._resolving = None  # resolve afresh for the next connection
        return [(family, sockaddr[0]) for family, _, _, _, sockaddr in infos]

    async def get(self, *, headers: Mapping[str, str] | None = None, max_body: int) -> bytes:
        """The body of a 200 answer; anything else raises SourceError."""
        request = self._request(headers or {})
        stage = "no answer"  # what a timeout interrupted, for its message
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                conn, self._idle = self._idle, None
                if conn is not None and not conn.usable():
                    conn.abort()
                    conn = None
                if conn is None:
                    stage = f"{self._host} not resolved"
                    addresses: list[tuple[int, str]] = ([(socket.AF_UNSPEC, self._host)] if self._literal
                                                        else await self._resolve())
                    stage = "no answer"
                    try:
                        conn = await self._connect(addresses)
                    except ssl.SSLCertVerificationError:
                        raise
                    except (OSError, ssl.SSLError) as error:
                        raise _Failure("ConnectError") from error
                # No retry once the request is out, even on a kept connection: an engine that dies
                # mid-request must show as down, as it did with httpx. A connection the server
                # closed while idle is caught before it is used (usable(), above).
                conn.writer.write(request)
                try:
                    status, version, fields = await self._read_head(conn.reader)
                except asyncio.IncompleteReadError:
                    raise _Failure("RemoteProtocolError") from None  # closed without an answer
                except ConnectionError:
                    raise _Failure("ReadError") from None
                stage = "body not complete"
                if status != 200:
                    hint = await self._error_hint(conn.reader, version, fields)
                    raise SourceError("http_status", f"HTTP {status} from {self._shown}{hint}", status)
                body, reusable = await self._read_body(conn.reader, version, fields, max_body)
            if reusable and not self._closed and self._idle is None:
                conn.idle_since = time.monotonic()
                self._idle, conn = conn, None
            return body
        except TimeoutError:
            raise SourceError("timeout", f"{stage} within {self.timeout_s:g}s") from None
        except _ResolveError as error:
            raise SourceError("dns", f"{error} (for {self._shown})") from None
        except _Failure as failure:
            raise SourceError("connection", f"{failure.name} for {self._shown}") from None
        except ssl.SSLCertVerificationError:
            raise SourceError("tls", f"TLS certificate of {self._shown} not trusted "
                                     "(set ca_file for a private CA)") from None
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, _ProtocolError):
            raise SourceError("connection", f"RemoteProtocolError for {self._shown}") from None
        except (OSError, ssl.SSLError):
            raise SourceError("connection", f"ReadError for {self._shown}") from None
        finally:
            if conn is not None:  # anything but a clean, reusable answer: the connection goes
                conn.abort()

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[int, bytes, dict[bytes, bytes]]:
        for _ in range(_MAX_INTERIM):
            head = await reader.readuntil(b"\r\n\r\n")  # LimitOverrunError past max_head_bytes
            lines = head[:-4].split(b"\r\n")
            parts = lines[0].split(b" ", 2)
            if (len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or len(parts[1]) != 3
                    or not parts[1].isdigit()):
                raise _ProtocolError("bad status line")
            status = int(parts[1])
            fields: dict[bytes, bytes] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
                    raise _ProtocolError("bad header line")
                key = name.lower()
                value = value.strip(b" \t")
                fields[key] = fields[key] + b", " + value if key in fields else value
            if not 100 <= status < 200:
                return status, parts[0], fields
        raise _ProtocolError("too many interim answers")

    async def _error_hint(self, reader: asyncio.StreamReader, version: bytes, fields: dict[bytes, bytes]) -> str:
        """What an error answer's JSON error document says (OpenAI style `{"error": {"message": ...}}`,
        `{"error": "..."}`, `{"detail": ...}`), shortened and made printable: llama.cpp started without
        --metrics answers 501 with the flag to add. Empty for anything else: a page (a proxy's or a
        web server's HTML) is a body, not a reason, and never reaches an error line."""
        try:
            body, _ = await self._read_body(reader, version, fields, MAX_ERROR_BODY)
        except (SourceError, _ProtocolError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return ""
        text = body.decode("utf-8", "replace")
        try:
            doc = jsonsafe.loads(text)
        except ValueError:  # JsonTooDeep included: no structured reason, no hint
            return ""
        if not isinstance(doc, dict):
            return ""
        error = doc.get("error", doc.get("detail", doc.get("message")))
        message = error.get("message", "") if isinstance(error, dict) else error
        text = message if isinstance(message, str) else ""
        text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
        if len(text) > MAX_ERROR_HINT:
            text = text[:MAX_ERROR_HINT - 3] + "..."
        return f": {text}" if text else ""

    async def _read_body(self, reader: asyncio.StreamReader, version: bytes, fields: dict[bytes, bytes],
                         cap: int) -> tuple[bytes, bool]:
        reusable = version == b"HTTP/1.1" and b"close" not in fields.get(b"connection", b"").lower()
        encoding = fields.get(b"transfer-encoding")
        length = fields.get(b"content-length")
        if encoding is not None:
            if encoding.strip().lower() != b"chunked":
                raise _ProtocolError("unsupported Transfer-Encoding")
            body = await self._read_chunked(reader, cap)
            reusable = reusable and length is None
        elif length is not None:
            values = {v.strip() for v in length.split(b",")}
            if len(values) != 1 or not (declared := values.pop()).isdigit():
                raise _ProtocolError("bad Content-Length")
            if int(declared) > cap:
                raise SourceError("too_large", f"Content-Length {declared.decode()} over the cap {cap}")
            body = await reader.readexactly(int(declared))
        else:  # delimited by the end of the connection
            chunks: list[bytes] = []
            size = 0
            while chunk := await reader.read(1 << 16):
                size += len(chunk)
                if size > cap:
                    raise SourceError("too_large", f"body over the cap of {cap} bytes")
                chunks.append(chunk)
            body, reusable = b"".join(chunks), False
        coding = fields.get(b"content-encoding", b"identity").strip().lower()
        if coding not in (b"identity", b""):  # we ask for identity; decode gzip/deflate if sent anyway
            body = _decode(coding, body, cap)
        return body, reusable

    async def _read_chunked(self, reader: asyncio.StreamReader, cap: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            digits = line[:-2].split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(digits):
                raise _ProtocolError("bad chunk size")
            n = int(digits, 16)
            if n == 0:
                break
            size += n
            if size > cap:
                raise SourceError("too_large", f"body over the cap of {cap} bytes")
            data = await reader.readexactly(n + 2)
            if data[-2:] != b"\r\n":
                raise _ProtocolError("chunk not terminated")
            chunks.append(data[:-2])
        trailer = 0
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            trailer += len(line)
            if trailer > self.max_head_bytes:
                raise _ProtocolError("trailers too long")
        return b"".join(chunks)

    async def aclose(self) -> None:
        self._closed = True
        if self._resolver is not None:
            self._resolver.shutdown(wait=False, cancel_futures=True)  # a hung lookup ends on its own
            self._resolver = None
        conn, self._idle = self._idle, None
        if conn is None:
            return
        if conn.loop is not asyncio.get_running_loop():
            conn.abort()
            return
        conn.writer.close()
        try:
            async with asyncio.timeout(1.0):
                await conn.writer.wait_closed()
        except (TimeoutError, OSError, ssl.SSLError):
            conn.abort()


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Failure(Exception):
    """A connection-level failure, named the way httpx named it (ConnectError, ReadError, ...)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _decode(coding: bytes, body: bytes, cap: int) -> bytes:
    if coding not in (b"gzip", b"x-gzip", b"deflate"):
        raise _ProtocolError("unsupported Content-Encoding")
    wbits = 47 if coding != b"deflate" else zlib.MAX_WBITS  # 47: gzip or zlib header, detected
    try:
        inflater = zlib.decompressobj(wbits)
        out = inflater.decompress(body, cap + 1)
    except zlib.error:
        raise _ProtocolError("bad compressed body") from None
    if len(out) > cap:
        raise SourceError("too_large", f"body over the cap of {cap} bytes")
    return out


async def get_json_object(client: HttpClient, shown: str, max_body: int) -> dict[str, Any]:
    """GET one JSON object (the twin's /sim/gpu and /sim/host) within `max_body` bytes. Errors are
    SourceErrors naming `shown`, the redacted URL, since they reach logs and /api/v1/snapshot."""
    try:
        body = await client.get(max_body=max_body)
    except SourceError as e:
        raise SourceError(e.reason, e.message if shown in e.message else f"{shown}: {e.message}") from None
    try:
        doc = jsonsafe.loads(body)
    except JsonTooDeep as e:
        raise SourceError("too_deep", f"{shown}: {e}") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise SourceError("parse", f"{shown}: not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise SourceError("parse", f"{shown}: expected a JSON object")
    return doc

