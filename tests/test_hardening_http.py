"""Hostile HTTP clients against the exporter's own server (exporter/httpserver.py), over real
sockets on loopback: idle and slowloris connections (plain and TLS) must not lock out /healthz,
/readyz or /metrics and must be timed out and counted; readers that stop reading must neither pin
memory nor hold the scrape slots; the JSON and HTML pages are built once per cycle and capped;
SIGHUP/SIGUSR1/SIGUSR2 do not end the process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
import trustme
from prometheus_client.parser import text_string_to_metric_families

from exporter import endpoints, httpserver
from exporter.collect import Collector
from exporter.config import Config
from exporter.snapshot import Sample, labels_of
from exporter.sources.base import SourceData, SourceKind
from tests.exporter_process import running_exporter
from tests.support import fake_engine, free_port, stop_process, wait_until
from tests.test_collect import ScriptedSource
from tests.test_security import _client, _hash, _server_cert, _write_yaml

CONFIG = Config(listen_host="127.0.0.1", listen_port=0, interval_s=0.2, gpu_backend="none", host_enabled=False)
PARTIAL_HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


class ManySource:
    """A source with `n` series, for pages of several MB."""

    kind = SourceKind.OTHER
    timeout_s = None

    def __init__(self, name: str, n: int) -> None:
        self.name = name
        self.attrs: dict[str, str] = {}
        self.samples = tuple(Sample("llm_requests_running", labels_of(target=f"{name}-{i:06d}-" + "x" * 60), float(i))
                             for i in range(n))

    async def collect(self) -> SourceData:
        return SourceData(self.samples)

    async def close(self) -> None:
        return


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _samples(base: str, verify: ssl.SSLContext | bool = True) -> dict[tuple[str, tuple], float]:
    text = httpx.get(base + "/metrics", timeout=10, verify=verify).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _closed(base: str, reason: str, verify: ssl.SSLContext | bool = True) -> float:
    return _samples(base, verify).get(("llm_exporter_http_connections_rejected_total", (("reason", reason),)), 0.0)


def _web_tls(folder) -> tuple[Config, ssl.SSLContext]:
    ca = trustme.CA()
    web = folder / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, folder)})
    return Config(**{**{f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}, "web_config_file": str(web)}), \
        _client(ca)


@pytest.fixture(params=["plain", "tls"])
def exporter(request, tmp_path):
    """(base URL, client TLS context or None) of an in-process exporter, plain or with TLS."""
    config, tls = (CONFIG, None) if request.param == "plain" else _web_tls(tmp_path)
    with running_exporter(config, [ScriptedSource("a", 4)], tls=tls) as base:
        yield base, tls


async def _connect_idle(port: int, n: int) -> list[asyncio.StreamWriter]:
    """TCP connections that send nothing (on a TLS port: not even a ClientHello)."""
    return [(await asyncio.open_connection("127.0.0.1", port))[1] for _ in range(n)]


async def _connect_slowloris(port: int, n: int, tls: ssl.SSLContext | None) -> list[tuple]:
    """Connections that send part of a request head and then nothing (after the TLS handshake)."""
    async def one() -> tuple:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls,
                                                       server_hostname="127.0.0.1" if tls else None)
        writer.write(PARTIAL_HEAD)
        await writer.drain()
        return reader, writer

    out = []
    for _ in range(0, n, 25):
        out += await asyncio.gather(*(one() for _ in range(min(25, n - len(out)))))
    return out


async def _closed_by_server(reader: asyncio.StreamReader, timeout: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            try:
                while await reader.read(65536):
                    pass
            except (OSError, ssl.SSLError):
                pass
            return True
    return False


def _abort_all(writers) -> None:
    for writer in writers:
        writer.transport.abort()


def test_idle_and_slowloris_connections_leave_probes_and_metrics_answering(exporter):
    base, tls = exporter
    port = _port(base)
    # The timeouts are far off: the probes must get through because of the connection bound and
    # eviction, not because the attackers timed out. (They are read when a server starts, so
    # this one keeps its 10 s; the test ends well before.)
    started = time.monotonic()

    async def scenario() -> None:
        idle = await _connect_idle(port, 300)
        slow = await _connect_slowloris(port, 300, tls)
        try:
            async with httpx.AsyncClient(verify=tls or True) as client:
                for path in ("/healthz", "/readyz", "/metrics"):
                    response = await client.get(base + path, timeout=5)
                    assert response.status_code == 200, (path, response.status_code)
            assert time.monotonic() - started < httpserver.HEADER_TIMEOUT_S
        finally:
            _abort_all(idle)
            _abort_all(w for _, w in slow)

    asyncio.run(scenario())
    assert wait_until(lambda: _closed(base, "evicted", tls or True) > 0, timeout=5)
    samples = _samples(base, tls or True)
    assert samples[("llm_exporter_http_connections_limit", ())] == 512
    assert samples[("llm_exporter_http_connections_open", ())] <= 512


@pytest.fixture
def short_timeouts(monkeypatch):
    for name in ("HEADER_TIMEOUT_S", "IDLE_TIMEOUT_S", "WRITE_TIMEOUT_S"):
        monkeypatch.setattr(httpserver, name, 1.0)
    # Longer: on a loaded machine 50 real handshakes must finish within it.
    monkeypatch.setattr(httpserver, "TLS_HANDSHAKE_TIMEOUT_S", 3.0)


@pytest.fixture
def exporter_short(short_timeouts, request, tmp_path):
    config, tls = (CONFIG, None) if request.param == "plain" else _web_tls(tmp_path)
    with running_exporter(config, [ScriptedSource("a", 4)], tls=tls) as base:
        yield base, tls


@pytest.mark.parametrize("exporter_short", ["plain", "tls"], indirect=True)
def test_idle_slow_and_trickling_connections_are_closed_by_the_timeouts_and_counted(exporter_short):
    base, tls = exporter_short
    port = _port(base)

    async def trickle(writer: asyncio.StreamWriter) -> None:
        # One byte every 0.2 s: each byte is progress, but the head's deadline does not move.
        with contextlib.suppress(OSError, ssl.SSLError):
            for byte in PARTIAL_HEAD * 10:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)

    async def scenario() -> None:
        raw = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        slow = await _connect_slowloris(port, 40, tls)
        tricklers = await _connect_slowloris(port, 10, tls)
        trickling = [asyncio.create_task(trickle(w)) for _, w in tricklers]
        kept_alive, keep_writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls,
                                                                server_hostname="127.0.0.1" if tls else None)
        keep_writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await kept_alive.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200 OK\r\n")
        try:
            everyone = [r for r, _ in raw] + [r for r, _ in slow] + [r for r, _ in tricklers] + [kept_alive]
            closed = await asyncio.gather(*(_closed_by_server(r, 8) for r in everyone))
            assert all(closed), f"{closed.count(False)} of {len(closed)} connections still open"
        finally:
            for task in trickling:
                task.cancel()
            _abort_all([w for _, w in raw] + [w for _, w in slow] + [w for _, w in tricklers] + [keep_writer])

    asyncio.run(scenario())
    verify = tls or True
    # The counters are exported with the next collection cycle (0.2 s), hence the waits.
    assert wait_until(lambda: _closed(base, "header_timeout", verify) >= 50, timeout=5)  # slowloris and tricklers
    assert wait_until(lambda: _closed(base, "idle_timeout", verify) >= (1 if tls else 41), timeout=5)  # + kept-alive
    if tls:  # raw TCP on the TLS port: no ClientHello
        assert wait_until(lambda: _closed(base, "tls_handshake", verify) >= 40, timeout=5)
    assert wait_until(lambda: _samples(base, verify)[("llm_exporter_http_connections_open", ())] <= 2, timeout=5)


def test_connections_over_the_bound_evict_idle_ones_and_refuse_only_when_all_are_busy(monkeypatch):
    monkeypatch.setattr(httpserver, "MAX_CONNECTIONS", 20)
    with running_exporter(CONFIG, [ScriptedSource("a")]) as base:
        port = _port(base)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        try:
            assert httpx.get(base + "/healthz", timeout=5).status_code == 200
            open_now = wait_until(lambda: sum(_is_closed(s) for s in idle) >= 10, timeout=5)
            assert open_now, "the oldest idle connections were not closed to admit new ones"
            assert all(not _is_closed(s) for s in idle[-10:])  # the newest ones were kept
        finally:
            for sock in idle:
                sock.close()
        assert wait_until(lambda: _closed(base, "evicted") >= 10, timeout=5)
        assert _closed(base, "too_many") == 0  # nobody was serving a request: no newcomer refused


def test_readers_stalled_on_a_big_page_give_way_to_a_new_connection(monkeypatch):
    monkeypatch.setattr(httpserver, "MAX_CONNECTIONS", 10)
    config = Config(**{**{f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}, "interval_s": 1.0})
    with running_exporter(config, [ManySource("big", 60_000)]) as base:
        assert len(httpx.get(base + "/metrics", timeout=10).content) > 6_000_000
        stalled = [_stalled_reader(_port(base)) for _ in range(10)]
        try:
            time.sleep(0.5)  # their responses are stuck behind full socket buffers
            assert httpx.get(base + "/healthz", timeout=5).status_code == 200
            assert wait_until(lambda: _closed(base, "evicted") >= 1, timeout=5)
        finally:
            for sock in stalled:
                sock.close()


def _stalled_reader(port: int) -> socket.socket:
    """Asks for /metrics and never reads (a small receive buffer, so the server's fills soon)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def test_a_new_connection_is_refused_at_once_only_when_every_slot_is_in_the_app():
    async def scenario() -> None:
        release = asyncio.Event()

        async def app(scope: dict, receive, send) -> None:
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
            await send({"type": "http.response.body", "body": b"ok\n"})

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        http = httpserver.HttpServer(app, limits=httpserver.Limits(max_connections=3))
        await http.start(listener)
        port = listener.getsockname()[1]
        busy = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append((reader, writer))
        for _ in range(100):  # until all three are in the app
            if not http._waiting:
                break
            await asyncio.sleep(0.02)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed_by_server(reader, 2)
        assert http.closed["too_many"] == 1 and http.closed["evicted"] == 0
        release.set()
        for reader, _ in busy:
            assert (await reader.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200 OK\r\n")
        _abort_all([writer, *(w for _, w in busy)])
        await http.stop()
        assert not http.connections

    asyncio.run(scenario())


def _is_closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_keep_alive_pipelining_half_close_and_date_header():
    with running_exporter(CONFIG, [ScriptedSource("a")]) as base:
        with socket.create_connection(("127.0.0.1", _port(base)), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nHEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)  # half-closed: the answers must still come
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        responses = data.split(b"HTTP/1.1 ")[1:]
        assert [r.split(b"\r\n", 1)[0] for r in responses] == [b"200 OK"] * 3
        assert all(b"\r\ndate: " in r.lower() for r in responses)
        assert responses[1].endswith(b"\r\n\r\n")  # HEAD: headers only
        assert b"connection: close" in responses[2].lower()


def test_a_client_that_stops_reading_is_dropped_and_does_not_hold_the_scrape_slots(monkeypatch):
    monkeypatch.setattr(httpserver, "WRITE_TIMEOUT_S", 1.0)
    config = Config(**{**{f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}, "interval_s": 1.0})
    with running_exporter(config, [ManySource("big", 60_000)]) as base:
        page = httpx.get(base + "/metrics", timeout=10).content
        assert len(page) > 6_000_000
        stalled = [_stalled_reader(_port(base)) for _ in range(8)]  # twice the 4 scrape slots
        try:
            time.sleep(0.3)
            assert httpx.get(base + "/metrics", timeout=10).status_code == 200  # not 503: slots are free
            assert wait_until(lambda: _closed(base, "write_timeout") >= 8, timeout=10)
        finally:
            for sock in stalled:
                sock.close()


def _vllm_page(k: int, n: int = 9000) -> bytes:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",model_name="org/model-{k}-{i:05d}-with-a-long-name"}} {i}.0'
              for i in range(n)]
    return ("\n".join(lines) + "\n").encode()


def test_slow_readers_of_a_multi_megabyte_metrics_page_do_not_pin_a_copy_each():
    """`llm-exporter run` with four engines of 9,000 series (a 4 MB /metrics); 100 clients ask for
    it and read nothing. Before: each pinned the unsent rest of the page (100 readers: +150 MB)."""
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(fake_engine(_vllm_page(k), keep_alive=True))[0] for k in range(4)]
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        engines = [a for i, url in enumerate(urls) for a in ("--engine", f"{url},name=e{i}")]
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}",
                                    *engines, "--gpu-backend", "none", "--no-host", "--interval", "5s"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(stop_process, process)
        # Ready once a cycle has finished; big once a cycle has read all four engines.
        assert wait_until(lambda: _status(base + "/readyz") == 200, timeout=30)
        assert wait_until(lambda: len(httpx.get(base + "/metrics", timeout=10).content) > 3_000_000, timeout=30)
        for _ in range(2):  # warm: the page rendered, the connection path exercised
            httpx.get(base + "/metrics", timeout=10)
        exporter = psutil.Process(process.pid)
        before = exporter.memory_info().rss
        readers = [_stalled_reader(port) for _ in range(100)]
        stack.callback(lambda: [s.close() for s in readers])
        time.sleep(1.5)
        normal = httpx.get(base + "/metrics", timeout=10)
        assert normal.status_code == 200 and len(normal.content) > 1_000_000
        growth = exporter.memory_info().rss - before
        assert growth < 50_000_000, f"RSS grew {growth / 1e6:.1f} MB with 100 stalled readers"


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.HTTPError:
        return 0


def test_snapshot_flood_is_served_from_one_render_per_cycle_and_leaves_metrics_and_healthz_answering(monkeypatch):
    renders: list[str] = []
    real = endpoints.render_page

    def counting(page, inputs, max_bytes):
        renders.append(page)
        return real(page, inputs, max_bytes)

    monkeypatch.setattr(endpoints, "render_page", counting)
    config = Config(**{**{f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}, "interval_s": 0.5})
    with running_exporter(config, [ManySource("big", 9000)]) as base:
        cycles_before = _samples(base)[("llm_exporter_collections_total", ())]
        renders.clear()
        stop = threading.Event()
        statuses: list[int] = []

        def flood() -> None:
            with httpx.Client(timeout=10) as client:
                while not stop.is_set():
                    statuses.append(client.get(base + "/api/v1/snapshot").status_code)

        threads = [threading.Thread(target=flood) for _ in range(8)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(10):
                assert httpx.get(base + "/metrics", timeout=5).status_code == 200
                assert httpx.get(base + "/healthz", timeout=5).status_code == 200
                time.sleep(0.2)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=20)
        cycles = _samples(base)[("llm_exporter_collections_total", ())] - cycles_before
        served = statuses.count(200)
        assert set(statuses) <= {200, 503} and served > len(renders)
        assert renders.count("snapshot") <= cycles + 1, (renders.count("snapshot"), cycles, served)
        key = ("llm_exporter_http_requests_rejected_total", (("path", "/api/v1/snapshot"), ("reason", "too_many")))
        assert wait_until(lambda: _samples(base).get(key, 0.0) == statuses.count(503), timeout=5)  # next cycle


def test_pages_over_the_byte_cap_are_cut_down_or_refused_and_counted():
    collector = Collector([ManySource("big", 2000)], interval_s=1.0)
    endpoint = endpoints.create_app(collector, max_page_bytes=50_000)
    transport = httpx.ASGITransport(app=endpoint)

    async def scenario() -> None:
        await collector.collect_once()
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            snapshot = await client.get("/api/v1/snapshot")
            assert snapshot.status_code == 200 and len(snapshot.content) <= 50_000
            doc = snapshot.json()
            assert doc["truncated"] is True and "over this endpoint's cap of 50000" in doc["notes"][0]
            assert doc["sources"]["big"]["samples_omitted"] == 2000 and "samples" not in doc["sources"]["big"]
            assert (await client.get("/api/v1/diagnosis")).status_code == 200  # small: untouched
        samples = {(s.name, s.labels): s.value for s in endpoint.samples()}
        assert samples[("llm_exporter_http_requests_rejected_total",
                        (("path", "/api/v1/snapshot"), ("reason", "too_large")))] == 1
        tiny = endpoints.create_app(collector, max_page_bytes=64)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=tiny), base_url="http://t") as client:
            for path in ("/api/v1/snapshot", "/api/v1/diagnosis", "/"):
                refused = await client.get(path)
                assert refused.status_code == 503 and b"cap" in refused.content, path

    asyncio.run(scenario())


# --- signals ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def _run_with_log(folder, *args: str):
    """`llm-exporter run` logging to a file (not a pipe nobody reads); yields (process, base, read_log)."""
    port = free_port()
    log_path = folder / "exporter.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}",
                                    "--interval", "200ms", "--gpu-backend", "none", "--no-host", *args],
                                   stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _status(base + "/readyz") == 200, timeout=20), log_path.read_text()
        yield process, base, log_path.read_text
    finally:
        stop_process(process)
    assert process.returncode == 0, log_path.read_text()


def test_sighup_reloads_the_web_config_and_usr1_usr2_are_ignored(tmp_path):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("one")}})
    with _run_with_log(tmp_path, "--web.config.file", str(web)) as (process, base, read_log):
        process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reloaded (SIGHUP" in read_log(), timeout=10), read_log()
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            process.send_signal(signum)
        assert wait_until(lambda: read_log().count("reloaded (SIGHUP") == 2, timeout=10), read_log()
        text = read_log()
        assert "SIGUSR1 received and ignored" in text and "SIGUSR2 received and ignored" in text
        assert f"web config {web} reloaded (SIGHUP" in text
        assert process.poll() is None
        assert httpx.get(base + "/metrics", auth=("prometheus", "one"), timeout=5).status_code == 200


def test_sighup_without_a_web_config_says_there_is_nothing_to_reload(tmp_path):
    with _run_with_log(tmp_path) as (process, base, read_log):
        process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "nothing to reload" in read_log(), timeout=10), read_log()
        assert process.poll() is None and _status(base + "/healthz") == 200


# --- request framing (issue 27: RFC 9112 sections 6.1 and 6.3) ------------------------------------

SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
_SMUGGLING_CL = str(5 + len(SMUGGLED)).encode()  # what a Content-Length proxy takes for the body
# name -> (HTTP version, framing fields, the reason the refusal is counted under)
FRAMINGS = {
    "te_and_cl": (b"1.1", b"Transfer-Encoding: chunked\r\nContent-Length: " + _SMUGGLING_CL + b"\r\n", "bad_framing"),
    "cl_and_te": (b"1.1", b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "bad_framing"),
    "two_content_lengths": (b"1.1", b"Content-Length: 5\r\nContent-Length: " + _SMUGGLING_CL + b"\r\n", "bad_framing"),
    "content_length_list": (b"1.1", b"Content-Length: 5, " + _SMUGGLING_CL + b"\r\n", "bad_framing"),
    "content_length_signed": (b"1.1", b"Content-Length: +" + _SMUGGLING_CL + b"\r\n", "bad_framing"),
    "two_transfer_encodings": (b"1.1", b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "bad_framing"),
    "te_not_chunked": (b"1.1", b"Transfer-Encoding: gzip, chunked\r\n", "bad_framing"),
    "te_chunked_not_final": (b"1.1", b"Transfer-Encoding: chunked, identity\r\n", "bad_framing"),
    "te_identity_and_cl": (b"1.1", b"Transfer-Encoding: identity\r\nContent-Length: " + _SMUGGLING_CL + b"\r\n",
                           "bad_framing"),
    "te_on_http_1_0": (b"1.0", b"Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n", "bad_framing"),
    "te_with_space": (b"1.1", b"Transfer-Encoding : chunked\r\n", "bad_request"),  # not a header line at all
}


def _exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send `data` on a fresh connection; what came back within 5 s, and whether the server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        got, closed = b"", False
        deadline = time.monotonic() + 5
        sock.settimeout(0.5)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if got:
                    break
                continue
            if not chunk:
                closed = True
                break
            got += chunk
    return got, closed


def test_conflicting_framing_is_refused_once_and_the_connection_closed(tmp_path):
    """Behind a proxy that frames by Content-Length, a second request hidden in the body is request
    smuggling: the exporter answers once (400) and closes, never parses what follows, counts each
    refusal as bad_framing and logs the first at once (then one line per 10 s at most). Before: TE
    with CL (and TE on HTTP/1.0) got 200 for the hidden request too, the rest 400 or 501 as any
    bad request, and no log line."""
    with _run_with_log(tmp_path) as (_process, base, read_log):
        outcomes = {}
        for name, (version, fields, _reason) in sorted(FRAMINGS.items()):
            request = b"GET /metrics HTTP/" + version + b"\r\nHost: x\r\n" + fields + b"\r\n0\r\n\r\n" + SMUGGLED
            got, closed = _exchange(_port(base), request)
            outcomes[name] = ([r.split(b"\r\n", 1)[0] for r in got.split(b"HTTP/1.1 ")[1:]],
                              b"connection: close" in got.lower(), closed)
        assert _status(base + "/healthz") == 200  # it keeps serving everyone else
        expected = {reason: sum(r == reason for *_, r in FRAMINGS.values())
                    for reason in ("bad_framing", "bad_request")}
        # Counted by the next collection cycle.
        assert wait_until(lambda: {reason: _closed(base, reason) for reason in expected} == expected, timeout=10), \
            ({reason: _closed(base, reason) for reason in expected}, outcomes)
        lines = [line for line in read_log().splitlines() if "ambiguous body framing" in line]
    assert all(outcome == ([b"400 Bad Request"], True, True) for outcome in outcomes.values()), outcomes
    assert len(lines) == 1 and 'reason="bad_framing"' in lines[0], lines


def test_a_plain_chunked_or_content_length_request_is_still_served_and_kept_alive(tmp_path):
    with _run_with_log(tmp_path) as (_process, base, _log):
        got, closed = _exchange(_port(base), b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
                                b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert [r.split(b"\r\n", 1)[0] for r in got.split(b"HTTP/1.1 ")[1:]] == [b"200 OK"] * 2
    assert not closed
