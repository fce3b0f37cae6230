"""exporter/httpclient.py against real loopback servers that write raw HTTP/1.x bytes:
body framings, keep-alive reuse and recovery, every bound (headers, payload cap, deadline), no
redirects, TLS trust, and broken answers, each failing with the reason EngineSource reports."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import trustme

from exporter import httpclient as http_module
from exporter.httpclient import HttpClient
from exporter.sources.base import SourceError
from exporter.sources.engines.auth import ssl_context
from exporter.targets import EngineTarget

BODY = b"".join(b'vllm:num_requests_running{model_name="m",engine="%d"} %d\n' % (i, i) for i in range(1200))

# handler(connection socket, request head, index of the request on this connection) -> keep the connection?
Handler = Callable[[socket.socket, bytes, int], bool]


class RawServer:
    """Accepts connections on loopback, counts them, and hands every request to `handler`."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler, self.tls = handler, tls
        self.accepts = 0
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._stop = False

    def url(self, path: str = "/metrics") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        while not self._stop:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.accepts += 1
            thread = threading.Thread(target=self._connection, args=(sock,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _connection(self, sock: socket.socket) -> None:
        self._sockets.append(sock)
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
                self._sockets.append(sock)
            buffer, index = b"", 0
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                self.requests.append(head)
                if not self.handler(sock, head, index):
                    return
                index += 1
        except (OSError, ssl.SSLError):
            return
        finally:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> RawServer:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


def answer(body: bytes = BODY, *, status: str = "200 OK", headers: tuple[str, ...] = (),
           keep: bool = True) -> Handler:
    """A Content-Length answer."""
    def handler(sock: socket.socket, head: bytes, index: int) -> bool:
        extra = "".join(f"{h}\r\n" for h in headers)
        sock.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body)
        return keep
    return handler


def fetch(url: str, times: int = 1, *, timeout: float = 2.0, cap: int = 1 << 20,
          context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None,
          between: Callable[[int], None] | None = None) -> list[bytes]:
    client = HttpClient(url, timeout_s=timeout, ssl_context=context,
                        headers={"Accept": "text/plain", "User-Agent": "llm-exporter"})

    async def run() -> list[bytes]:
        try:
            out = []
            for i in range(times):
                if between is not None and i:
                    await asyncio.to_thread(between, i)
                out.append(await client.get(headers=headers, max_body=cap))
            return out
        finally:
            await client.aclose()
    return asyncio.run(run())


def failure(url: str, **kwargs: object) -> SourceError:
    with pytest.raises(SourceError) as caught:
        fetch(url, **kwargs)  # type: ignore[arg-type]
    return caught.value


def test_content_length_body_and_request_headers():
    with RawServer(answer()) as server:
        assert fetch(server.url("/metrics?x=1"), headers={"Authorization": "Bearer t0k"}) == [BODY]
    head = server.requests[0].decode()
    lines = head.split("\r\n")
    assert lines[0] == "GET /metrics?x=1 HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["Host"] == f"127.0.0.1:{server.port}"
    assert fields["Accept"] == "text/plain" and fields["User-Agent"] == "llm-exporter"
    assert fields["Authorization"] == "Bearer t0k"
    assert fields["Accept-Encoding"] == "identity"
    assert "Proxy-Authorization" not in fields


def test_url_userinfo_is_sent_as_basic_auth_and_not_in_the_host_header():
    with RawServer(answer()) as server:
        fetch(server.url().replace("http://", "http://al%40ice:p%3Ass@"))
    fields = dict(line.split(": ", 1) for line in server.requests[0].decode().split("\r\n")[1:])
    assert fields["Authorization"] == "Basic " + base64.b64encode(b"al@ice:p:ss").decode()
    assert fields["Host"] == f"127.0.0.1:{server.port}"


def test_chunked_body_with_extensions_and_trailers():
    def chunked(sock, head, index):
        parts = [BODY[:1000], BODY[1000:1001], BODY[1001:]]
        out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        out += b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-Trailer: yes\r\n\r\n"
        for i in range(0, len(out), 7000):  # in several TCP writes
            sock.sendall(out[i:i + 7000])
        return True
    with RawServer(chunked) as server:
        assert fetch(server.url(), times=3) == [BODY] * 3
    assert server.accepts == 1  # a chunked answer leaves the connection reusable


def test_http10_close_delimited_body():
    def http10(sock, head, index):
        sock.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY)
        return False  # the end of the body is the end of the connection
    with RawServer(http10) as server:
        assert fetch(server.url(), times=2) == [BODY, BODY]
    assert server.accepts == 2


def test_keep_alive_reuses_one_connection():
    with RawServer(answer()) as server:
        assert fetch(server.url(), times=25) == [BODY] * 25
    assert server.accepts == 1 and len(server.requests) == 25


def test_one_client_across_event_loops():
    # A kept connection belongs to the loop that opened it; a later loop opens its own.
    with RawServer(answer()) as server:
        client = HttpClient(server.url(), timeout_s=2)
        assert asyncio.run(client.get(max_body=1 << 20)) == BODY  # the loop ends with the connection kept

        async def again() -> bytes:
            try:
                return await client.get(max_body=1 << 20)
            finally:
                await client.aclose()
        assert asyncio.run(again()) == BODY
    assert server.accepts == 2


def test_connection_close_header_is_honoured():
    with RawServer(answer(headers=("Connection: close",), keep=False)) as server:
        assert fetch(server.url(), times=3) == [BODY] * 3
    assert server.accepts == 3


def test_server_closing_an_idle_keep_alive_connection_is_survived():
    # The server closes after each answer without saying so: the client notices the idle close
    # before reusing the connection and opens a new one, without a failed fetch.
    with RawServer(answer(keep=False)) as server:
        assert fetch(server.url(), times=4, between=lambda i: time.sleep(0.05)) == [BODY] * 4
    assert server.accepts == 4 and len(server.requests) == 4


def test_an_idle_connection_is_not_reused_past_the_expiry(monkeypatch):
    monkeypatch.setattr(http_module, "KEEPALIVE_EXPIRY_S", 0.1)
    with RawServer(answer()) as server:
        assert fetch(server.url(), times=3, between=lambda i: time.sleep(0.2)) == [BODY] * 3
    assert server.accepts == 3


@pytest.mark.parametrize("after_body", [
    b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",  # then hangs up
    b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTALE\n",  # a stray answer, connection kept
])
def test_bytes_that_arrive_on_an_idle_connection_are_never_read_as_the_next_answer(after_body):
    def handler(sock: socket.socket, head: bytes, index: int) -> bool:
        answer()(sock, head, index)
        if index == 0:
            time.sleep(0.01)
            sock.sendall(after_body)
            return b"close" not in after_body
        return True
    with RawServer(handler) as server:
        assert fetch(server.url(), times=2, between=lambda i: time.sleep(0.1)) == [BODY, BODY]
    assert server.accepts == 2


def test_a_hung_resolver_holds_one_lookup_in_the_clients_own_thread(monkeypatch):
    real, release, lookups = socket.getaddrinfo, threading.Event(), []

    def hung_resolver(host, *args, **kwargs):
        if host == "engine.example":
            lookups.append(threading.current_thread().name)
            release.wait(10)
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hung_resolver)
    with RawServer(answer()) as server:
        client = HttpClient(f"http://engine.example:{server.port}/metrics", timeout_s=0.2)

        async def run() -> bytes:
            for _ in range(10):  # more cycles than the default executor has threads
                with pytest.raises(SourceError) as caught:
                    await client.get(max_body=1 << 20)
                assert caught.value.reason == "timeout"
                assert caught.value.message == "engine.example not resolved within 0.2s"
                await asyncio.wait_for(asyncio.to_thread(lambda: None), 1.0)  # the shared pool is free
            release.set()
            try:
                return await client.get(max_body=1 << 20)  # the one lookup, finished, is used
            finally:
                await client.aclose()
        assert asyncio.run(run()) == BODY
    assert len(lookups) == 1 and lookups[0].startswith("resolve"), lookups
    assert server.requests[0].split(b"\r\n")[1] == f"Host: engine.example:{server.port}".encode()


def offline_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    """socket.getaddrinfo that answers loopback names and refuses names under .invalid as the OS
    resolver does ("Name or service not known"). .invalid never resolves (RFC 6761), but the
    system resolver would still ask the configured DNS server: traffic off this machine."""
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if str(host).endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        assert host in ("127.0.0.1", "localhost", "::1"), f"a test looked up {host}"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


def test_a_host_name_that_does_not_resolve_is_reason_dns_with_the_resolvers_message(monkeypatch):
    offline_resolver(monkeypatch)
    error = failure("http://user:secret@no-such-host.invalid:9/metrics")
    assert error.reason == "dns", error.message
    assert "cannot resolve no-such-host.invalid: Name or service not known" in error.message
    assert "secret" not in error.message


def test_a_kept_connection_dropped_instead_of_answered_is_reported_not_retried():
    # An engine dying mid-request must show as down (as with httpx), not be papered over by a retry.
    def first_only(sock, head, index):
        if index == 0:
            return answer()(sock, head, index)
        return False  # close without a word
    with RawServer(first_only) as server:
        client = HttpClient(server.url(), timeout_s=2)

        async def run():
            assert await client.get(max_body=1 << 20) == BODY
            with pytest.raises(SourceError) as caught:
                await client.get(max_body=1 << 20)
            assert caught.value.reason == "connection" and "RemoteProtocolError" in caught.value.message
            assert await client.get(max_body=1 << 20) == BODY  # the next one reconnects
            await client.aclose()
        asyncio.run(run())
    assert server.accepts == 2 and len(server.requests) == 3


def test_a_fresh_connection_closed_without_an_answer_fails():
    with RawServer(lambda sock, head, index: False) as server:
        error = failure(server.url())
    assert error.reason == "connection" and server.accepts == 1


def test_connection_refused():
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    error = failure(f"http://127.0.0.1:{port}/metrics")
    assert error.reason == "connection" and "ConnectError" in error.message


def test_a_non_200_drops_the_connection_and_the_next_fetch_recovers():
    statuses = iter(["503 Service Unavailable", "200 OK"])
    with RawServer(lambda sock, head, index: answer(status=next(statuses))(sock, head, index)) as server:
        client = HttpClient(server.url(), timeout_s=2)

        async def run():
            with pytest.raises(SourceError) as caught:
                await client.get(max_body=1 << 20)
            assert caught.value.reason == "http_status" and "HTTP 503" in caught.value.message
            assert await client.get(max_body=1 << 20) == BODY
            await client.aclose()
        asyncio.run(run())
    assert server.accepts == 2


LLAMACPP_501 = (b'{"error":{"code":501,"message":"This server does not support metrics endpoint. '
                b'Start it with `--metrics`","type":"not_supported_error"}}')


@pytest.mark.parametrize(("body", "hint"), [
    (LLAMACPP_501, ": This server does not support metrics endpoint. Start it with `--metrics`"),
    (b"plain\x1b[31m words\r\nsecond line", ""),  # not a JSON error document: a body, not a reason
    (b"<html><body><h1>404 Not Found</h1></body></html>", ""),
    (b'{"error": "bad\\u001b[31m words\\r\\nsecond line"}', ": bad [31m words second line"),  # printable, one line
    (b'{"error": "' + b"x" * 400 + b'"}', ": " + "x" * 197 + "..."),  # shortened
    (b"y" * 5000, ""),  # over MAX_ERROR_BODY: not read, no hint
    (b"", ""),
])
def test_an_error_answer_says_what_the_engine_said_shortened_and_printable(body, hint):
    with RawServer(answer(body, status="501 Not Implemented")) as server:
        error = failure(server.url())
    assert error.reason == "http_status" and error.status == 501
    assert error.message == f"HTTP 501 from {server.url()}{hint}"


def test_oversized_headers_are_refused():
    def huge(sock, head, index):
        sock.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"a" * (70 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok")
        return True
    with RawServer(huge) as server:
        error = failure(server.url())
    assert error.reason == "connection"


def test_many_header_lines_under_the_limit_are_fine():
    with RawServer(answer(headers=tuple(f"X-H{i}: {'v' * 50}" for i in range(500)))) as server:
        assert fetch(server.url()) == [BODY]


@pytest.mark.parametrize("framing", ["content-length", "chunked", "close"])
def test_a_body_over_the_cap_is_refused(framing):
    big = BODY * 40  # ~1.3 MB, cap 64 KiB

    def handler(sock, head, index):
        if framing == "content-length":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))  # the body never comes
            time.sleep(1)
            return False
        if framing == "chunked":
            sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(big), 16384):
                part = big[i:i + 16384]
                sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            sock.sendall(b"0\r\n\r\n")
            return True
        sock.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + big)
        return False
    with RawServer(handler) as server:
        error = failure(server.url(), cap=64 * 1024)
    # Refused as soon as it was known: with Content-Length, before a body that never comes (waiting
    # for it would end in the server's hang-up, reason `connection`, or the 2 s timeout).
    assert error.reason == "too_large", error.message


def test_a_gzip_body_is_decoded_and_capped_after_decoding():
    packed = gzip.compress(BODY * 40)
    with RawServer(answer(packed, headers=("Content-Encoding: gzip",))) as server:
        assert fetch(server.url(), cap=8 << 20) == [BODY * 40]
        assert failure(server.url(), cap=len(BODY) * 10).reason == "too_large"


@pytest.mark.parametrize(("first", "rest", "step", "pause", "timeout", "stage"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", b"x" * 2000, 10, 0.02, 0.3, "body not complete"),
    (b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 1, 1.0, 1.5, "no answer"),  # a byte a second
])
def test_a_slow_drip_is_cut_at_the_deadline(first, rest, step, pause, timeout, stage):
    def drip(sock, head, index):
        with contextlib.suppress(OSError):
            sock.sendall(first)
            for i in range(0, len(rest), step):
                sock.sendall(rest[i:i + step])
                time.sleep(pause)
        return False
    with RawServer(drip) as server:
        started = time.monotonic()
        error = failure(server.url(), timeout=timeout)
        elapsed = time.monotonic() - started
    assert error.reason == "timeout" and f"{stage} within {timeout:g}s" in error.message
    assert elapsed < timeout + 1.5  # the drip would last 4 s or more: cut at the deadline, not read to the end


def test_no_answer_is_a_timeout():
    with RawServer(lambda sock, head, index: time.sleep(1.5) or False) as server:
        error = failure(server.url(), timeout=0.2)
    assert error.reason == "timeout" and "no answer within 0.2s" in error.message


def test_redirects_are_not_followed():
    with RawServer(answer()) as target, RawServer(
            answer(b"", status="302 Found", headers=(f"Location: {target.url('/elsewhere')}",))) as server:
        error = failure(server.url(), headers={"Authorization": "Bearer secret"})
    assert error.reason == "http_status" and "HTTP 302" in error.message
    assert len(server.requests) == 1 and target.accepts == 0


@pytest.mark.parametrize("status_line", [b"garbage\r\n", b"HTTP/2 200\r\n", b"HTTP/1.1 2000 OK\r\n",
                                         b"ICY 200 OK\r\n", b"HTTP/1.1 200 OK\r\n bad fold\r\n",
                                         b"HTTP/1.2 200 OK\r\n", b"HTTP/0.9 200 OK\r\n"])  # h11 takes any 1.x
def test_a_garbage_status_line_is_a_connection_error(status_line):
    def garbage(sock, head, index):
        sock.sendall(status_line + b"Content-Length: 2\r\n\r\nok")
        return True
    with RawServer(garbage) as server:
        error = failure(server.url())
    assert error.reason == "connection" and "RemoteProtocolError" in error.message


@pytest.mark.parametrize("framing", [b"Content-Length: abc\r\n", b"Content-Length: 2, 3\r\n",
                                     b"Transfer-Encoding: gzip\r\n",
                                     b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_bad_framing_is_a_connection_error(framing):
    def bad(sock, head, index):
        sock.sendall(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\nok")
        time.sleep(0.2)
        return False
    with RawServer(bad) as server:
        assert failure(server.url()).reason == "connection"


def test_interim_1xx_answers_are_skipped():
    def early_hints(sock, head, index):
        sock.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
        return answer()(sock, head, index)
    with RawServer(early_hints) as server:
        assert fetch(server.url()) == [BODY]


@contextlib.contextmanager
def tls_server(ca: trustme.CA, tmp_path) -> Iterator[RawServer]:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    with RawServer(answer(), tls=server_context) as server:
        yield server


def test_tls_with_a_private_ca_keeps_the_connection_alive(tmp_path):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    with tls_server(ca, tmp_path) as server:
        target = EngineTarget(url=server.url(), name="t", ca_file=str(tmp_path / "ca.pem"))
        assert fetch(server.url(), times=5, context=ssl_context(target)) == [BODY] * 5
    assert server.accepts == 1


def test_tls_insecure_skip_verify_and_untrusted_certificates(tmp_path):
    ca, other = trustme.CA(), trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    with tls_server(ca, tmp_path) as server:
        insecure = ssl_context(EngineTarget(url=server.url(), name="t", insecure_skip_verify=True))
        assert fetch(server.url(), context=insecure) == [BODY]
        for context in (ssl_context(EngineTarget(url=server.url(), name="t")),  # the default bundle
                        ssl_context(EngineTarget(url=server.url(), name="t", ca_file=str(tmp_path / "other.pem")))):
            error = failure(server.url(), context=context)
            assert error.reason == "tls" and "ca_file" in error.message
    assert len(server.requests) == 1  # refused handshakes never got as far as a request


def test_tls_certificate_for_another_host_is_refused(tmp_path):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("engine.example").configure_cert(server_context)
    with RawServer(answer(), tls=server_context) as server:
        context = ssl_context(EngineTarget(url=server.url(), name="t", ca_file=str(tmp_path / "ca.pem")))
        assert failure(server.url(), context=context).reason == "tls"


def test_the_environment_is_ignored(monkeypatch):
    with RawServer(answer()) as server:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("NO_PROXY", "")
        assert fetch(server.url()) == [BODY]


# --- hostile servers against the h11 framing: each bound holds, by bytes and by time ---------------

def test_endless_header_lines_stop_at_the_head_cap_not_the_deadline():
    def endless(sock, head, index):
        sock.sendall(b"HTTP/1.1 200 OK\r\n")
        with contextlib.suppress(OSError):
            for i in range(100_000):  # 2.4 MB of headers if nobody stopped reading
                sock.sendall(b"X-Endless-%06d: %s\r\n" % (i, b"v" * 8))
        return False
    with RawServer(endless) as server:
        started = time.monotonic()
        error = failure(server.url(), timeout=5.0)
    assert error.reason == "connection" and "RemoteProtocolError" in error.message
    assert time.monotonic() - started < 3.0  # refused at the cap, not at the 5 s deadline


def test_a_whole_head_over_the_cap_in_one_write_is_refused():
    # h11 alone bounds only an incomplete head; one that arrives complete is counted here.
    def whole(sock, head, index):
        filler = b"".join(b"X-F%d: %s\r\n" % (i, b"a" * 100) for i in range(700))  # ~75 KB of short lines
        sock.sendall(b"HTTP/1.1 200 OK\r\n" + filler + b"Content-Length: 2\r\n\r\nok")
        return True
    with RawServer(whole) as server:
        assert failure(server.url()).reason == "connection"


def test_more_interim_answers_than_allowed_are_refused():
    def chatty(sock, head, index):
        sock.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" * 16)
        return answer()(sock, head, index)
    with RawServer(chatty) as server:
        assert failure(server.url()).reason == "connection"


@pytest.mark.parametrize(("chunks", "reason"), [
    (b"100000\r\nshort\r\n", "connection"),  # a 1 MiB chunk that ends after 5 bytes and a hang-up
    (b"fffffffffff\r\n" + b"x" * 70_000, "too_large"),  # a chunk size far past the cap, its data coming
    (b"5\r\nhelloXX0\r\n\r\n", "connection"),  # the chunk's data not followed by CRLF
    (b"1" * 70_000, "connection"),  # a chunk-size line that never ends
    (b"0\r\n" + b"X-T: " + b"t" * 70_000 + b"\r\n\r\n", "connection"),  # endless trailers
])
def test_chunk_size_lies_are_refused(chunks, reason):
    def liar(sock, head, index):
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
        return False
    with RawServer(liar) as server:
        error = failure(server.url(), cap=64 * 1024)
    assert error.reason == reason, error.message
    assert server.accepts == 1


def test_a_content_length_body_cut_short_is_a_connection_error():
    def short(sock, head, index):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + BODY[:100])
        return False
    with RawServer(short) as server:
        error = failure(server.url())
    assert error.reason == "connection" and "RemoteProtocolError" in error.message


def test_an_answer_framed_both_by_chunks_and_by_length_is_read_by_the_chunks_and_not_kept():
    def both(sock, head, index):
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
                     b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))
        return True
    with RawServer(both) as server:
        assert fetch(server.url(), times=2) == [BODY, BODY]
    assert server.accepts == 2  # a proxy may have read it by its length: the connection is not reused


def test_a_header_h11_refuses_is_a_credentials_error_and_never_sent():
    with RawServer(answer()) as server:
        error = failure(server.url(), headers={"Authorization": "Bearer t0k\r\nX-Injected: 1"})
    assert error.reason == "credentials" and "t0k" not in error.message
    assert server.requests == []
    with pytest.raises(ValueError, match="Accept"):
        HttpClient("http://127.0.0.1:9/metrics", timeout_s=1, headers={"Accept": "a\nb"})
