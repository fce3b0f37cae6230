"""The probe's streaming client (exporter/probe/client.py) against a real loopback server.

`OpenAIStub` is an OpenAI-style streaming server on its own thread and event loop, answering
`/v1/completions` and `/v1/chat/completions` with SSE chunks at controlled delays (or in one of the
hostile ways of `MODES`), and `/v1/models`. tests/test_probe_run.py runs the real exporter against it.

Timing assertions are lower bounds and orderings with generous upper bounds: the machine is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import pytest

from exporter.probe.client import (
    CompletionTiming,
    Resolver,
    StreamLimits,
    endpoint_url,
    make_prompt,
    request_body,
    stream_completion,
)
from exporter.probe.source import ProbeState

MiB = 1 << 20
MODES = ("ok", "silent", "endless_line", "endless_chunks", "redirect", "bad_json", "status_500", "stream_error",
         "empty", "hidden_tokens", "huge_head", "reset", "slow_drip", "endless_chunk_size", "short_body",
         "gzip", "drip_head")


@dataclass
class StubConfig:
    mode: str = "ok"
    ttft_s: float = 0.2
    itl_s: float = 0.05
    tokens: int = 8
    usage: bool = True
    usage_sent: dict | None = None  # sent as the usage object instead of the true counts, when set
    model: str = "stub-model"
    metrics: bytes = b""  # GET /metrics answers this (an engine's exposition), when set


@dataclass
class OpenAIStub:
    """A loopback OpenAI-compatible streaming server. `config` may be changed while it runs."""

    config: StubConfig = field(default_factory=StubConfig)
    requests: list[tuple[str, str, dict[str, str], dict]] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OpenAIStub:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", self.port), self._loop).result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def seen(self) -> list[tuple[str, str, dict[str, str], dict]]:
        with self._lock:
            return list(self.requests)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            doc = json.loads(body) if body else {}
            with self._lock:
                self.requests.append((method, path, headers, doc))
            cfg = self.config
            if path == "/metrics" and cfg.metrics:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n%s" % (len(cfg.metrics), cfg.metrics))
                await writer.drain()
            elif path == "/v1/models":
                await self._send(writer, 200, json.dumps({"object": "list", "data": [{"id": cfg.model}]}).encode())
            elif path in ("/v1/completions", "/v1/chat/completions"):
                await self._stream(writer, cfg, chat=path.endswith("chat/completions"), doc=doc)
            else:
                await self._send(writer, 404, b'{"error": {"message": "no such path"}}')
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, extra: str = "") -> None:
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                     f"{extra}Connection: close\r\n\r\n".encode() + body)
        await writer.drain()

    @staticmethod
    async def _event(writer: asyncio.StreamWriter, payload: bytes) -> None:
        """One SSE event as one HTTP chunk, sent at once."""
        data = b"data: " + payload + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, cfg: StubConfig, *, chat: bool, doc: dict) -> None:
        mode = cfg.mode
        if mode == "silent":
            await asyncio.sleep(3600)
        if mode == "redirect":
            return await self._send(writer, 302, b"", "Location: http://127.0.0.1:1/elsewhere\r\n")
        if mode == "status_500":
            return await self._send(writer, 500, b'{"error": {"message": "engine exploded\\nbadly"}}')
        if mode == "deep_error":
            return await self._send(writer, 500, b'{"error": ' * 20_000)
        if mode == "reset":
            return
        if mode == "drip_head":  # the status line one byte a second
            for byte in b"HTTP/1.1 200 OK\r\n":
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
        if mode == "short_body":  # a Content-Length the body never reaches, then a hang-up
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 5000\r\n\r\n"
                         b'data: {"choices": [{"text": "a"}]}\n\n')
            return await writer.drain()
        if mode == "gzip":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n0123456789")
            return await writer.drain()
        if mode == "huge_head":
            writer.write(b"HTTP/1.1 200 OK\r\nX-Junk: " + b"j" * (200 * 1024) + b"\r\n\r\n")
            return await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        if mode == "endless_line":
            junk = b"x" * 65536
            writer.write(b"%x\r\ndata: \r\n" % 6)
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(junk), junk))
                await writer.drain()
        if mode == "endless_chunk_size":  # a chunk-size line that never ends
            while True:
                writer.write(b"1" * 65536)
                await writer.drain()
        if mode == "endless_chunks":
            while True:
                await self._event(writer, b'{"choices": [{"index": 0, "text": "a"}]}')
        if mode == "bad_json":
            return await self._event(writer, b'{"choices": [{"text": "a"')
        if mode == "deep_json":  # json.loads raised RecursionError on this (reason "exception")
            return await self._event(writer, b"[" * 50_000)
        if mode == "utf16_deep_json":  # as deep, in UTF-16 (json.loads reads it) behind a 0x22 byte
            return await self._event(writer, ('["\u0122",' + "[" * 20_000).encode("utf-16-le"))
        if mode == "stream_error":
            await self._event(writer, b'{"choices": [{"text": "a"}]}')
            return await self._event(writer, b'{"error": {"message": "out of memory", "code": 500}}')
        if mode == "slow_drip":  # one byte at a time, forever: the total deadline ends it
            while True:
                writer.write(b"1\r\nx\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
        if chat:  # the role comes first and carries no text
            await self._event(writer, b'{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}')
        if mode == "hidden_tokens":  # llama.cpp: every token held back as incomplete UTF-8, then the end
            await asyncio.sleep(cfg.ttft_s)
            await self._event(writer, b'{"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}')
        elif mode != "empty":
            await asyncio.sleep(cfg.ttft_s)
            for i in range(cfg.tokens):
                if i:
                    await asyncio.sleep(cfg.itl_s)
                piece = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
                await self._event(writer, json.dumps({"choices": [{"index": 0, **piece}]}).encode())
        if cfg.usage:
            text = doc["messages"][-1]["content"] if chat else doc.get("prompt", "")
            prompt = len(str(text).split())
            usage = cfg.usage_sent or {"prompt_tokens": prompt,
                                       "completion_tokens": cfg.tokens if mode != "empty" else 0}
            await self._event(writer, json.dumps({"choices": [], "usage": usage}).encode())
        await self._event(writer, b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


@contextlib.contextmanager
def stub(**config: object) -> Iterator[OpenAIStub]:
    server = OpenAIStub(StubConfig(**config)).start()  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def call(url: str, *, api: str = "completions", timeout_s: float = 5.0, max_tokens: int = 8,
         limits: StreamLimits | None = None, headers: dict[str, str] | None = None) -> CompletionTiming:
    async def run() -> CompletionTiming:
        resolver = Resolver()
        try:
            return await stream_completion(url, api=api, model="stub-model", prompt=make_prompt(12),
                                           max_tokens=max_tokens, timeout_s=timeout_s, headers=headers,
                                           limits=limits, resolver=resolver)
        finally:
            resolver.close()

    return asyncio.run(run())


# ---------------------------------------------------------------------------------------------
# Well-behaved servers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_ttft_itl_and_usage_are_measured_against_the_servers_delays(api):
    ttft, itl, tokens = 0.2, 0.05, 8
    with stub(ttft_s=ttft, itl_s=itl, tokens=tokens) as server:
        result = call(server.url, api=api, headers={"Authorization": "Bearer probe-secret"})
        method, path, headers, doc = server.seen()[-1]
    assert result.ok, result
    assert (result.reason, result.status) == ("", 200)
    # The request the engines expect: streaming, usage asked for, exactly max_tokens.
    assert (method, path) == ("POST", "/v1/chat/completions" if api == "chat" else "/v1/completions")
    assert headers["authorization"] == "Bearer probe-secret" and headers["accept"] == "text/event-stream"
    assert doc["stream"] is True and doc["stream_options"] == {"include_usage": True}
    assert doc["max_tokens"] == 8 and doc["ignore_eos"] is True and doc["model"] == "stub-model"
    assert ("messages" in doc) == (api == "chat") and ("prompt" in doc) == (api != "chat")
    # TTFT: at least the server's delay (it waits after reading the request); generous above.
    # The client's clock starts once its write returns; the server may have read the request and begun
    # its delay a moment before (a loaded machine): a few milliseconds of slack below.
    assert ttft - 0.01 <= result.ttft_s < ttft + 1.0, result.ttft_s
    assert len(result.itl_s) == tokens - 1 and len(result.token_times) == tokens
    # One gap can be short when the chunk before it was read late (a busy machine); their sum, from
    # the first text chunk to the last, cannot be.
    assert sum(result.itl_s) >= (tokens - 1) * itl - 0.005, result.itl_s
    assert itl - 0.005 <= statistics.median(result.itl_s) < itl + 0.2, result.itl_s
    assert result.e2e_s >= result.ttft_s + sum(result.itl_s) - 1e-9
    assert list(result.token_times) == sorted(result.token_times)
    assert result.sent_at <= result.response_at <= result.token_times[0]
    assert result.connect_s is not None and result.connect_s < 1.0
    assert (result.prompt_tokens, result.completion_tokens, result.usage_reported) == (12, tokens, True)
    print(f"\n{api}: ttft {result.ttft_s * 1000:.1f} ms (server {ttft * 1000:.0f}), itl mean "
          f"{statistics.mean(result.itl_s) * 1000:.1f} ms max {max(result.itl_s) * 1000:.1f} ms (server "
          f"{itl * 1000:.0f}), e2e {result.e2e_s * 1000:.1f} ms")


def test_without_usage_the_text_chunks_are_counted():
    with stub(ttft_s=0.0, itl_s=0.0, tokens=5, usage=False) as server:
        result = call(server.url)
    assert result.ok
    assert (result.prompt_tokens, result.completion_tokens, result.usage_reported) == (None, 5, False)


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 10 ** 400, "completion_tokens": 10 ** 400},  # not even a float
    {"prompt_tokens": 10 ** 6, "completion_tokens": 9},  # more than a short prompt or max_tokens=8 can cost
    {"prompt_tokens": -1, "completion_tokens": True},
])
def test_usage_past_what_the_request_can_cost_is_ignored(usage):
    """The server's usage is remote input, and the verdict subtracts the probe's tokens from the
    engine's work: an inflated count would hide real traffic. The text chunks are counted instead."""
    with stub(ttft_s=0.0, itl_s=0.0, tokens=5, usage_sent=usage) as server:
        result = call(server.url, max_tokens=8)
    assert result.ok
    assert (result.prompt_tokens, result.completion_tokens, result.usage_reported) == (None, 5, False)
    state = ProbeState(configured_prompt_tokens=16)
    state.record(result, 0.0)
    assert (state.prompt_tokens, state.completion_tokens) == (16, 5)


def test_a_stream_without_text_is_empty():
    with stub(mode="empty") as server:
        result = call(server.url)
    assert (result.ok, result.reason) == (False, "empty")
    assert result.ttft_s is None and result.itl_s == ()


def test_tokens_counted_but_none_visible_time_the_first_output_at_the_last_chunk():
    """A live llama.cpp answered 25 of 1,290 requests with 16 tokens counted in usage and no text in
    any chunk (bytes that never complete a UTF-8 character are held back). The engine served them:
    success, with the first visible output (the final chunk) as TTFT and no token gaps."""
    with stub(mode="hidden_tokens", ttft_s=0.05, tokens=16) as server:
        result = call(server.url, max_tokens=16)  # as asked of that llama.cpp (usage past it is ignored)
    assert result.ok, result
    assert result.completion_tokens == 16 and result.itl_s == ()
    assert result.ttft_s is not None and result.ttft_s >= 0.05 - 0.01  # slack: see the test above


def test_endpoint_urls_and_the_request_body():
    assert endpoint_url("http://h:8000", "completions") == "http://h:8000/v1/completions"
    assert endpoint_url("http://h:8000/v1/", "chat") == "http://h:8000/v1/chat/completions"
    assert endpoint_url("http://h/proxy/", "chat") == "http://h/proxy/v1/chat/completions"
    body = request_body("completions", model=None, prompt="p", max_tokens=3)
    assert "model" not in body and body["prompt"] == "p"
    assert len(make_prompt(32).split()) == 32


# ---------------------------------------------------------------------------------------------
# Hostile or broken servers: each bounded in time and bytes, each a bounded reason
# ---------------------------------------------------------------------------------------------
def test_a_server_that_never_answers_times_out_at_the_deadline():
    with stub(mode="silent") as server:
        started = time.monotonic()
        result = call(server.url, timeout_s=0.5)
        took = time.monotonic() - started
    assert (result.ok, result.reason) == (False, "timeout")
    assert "no answer" in result.message
    assert 0.5 <= took < 3.0


@pytest.mark.parametrize("mode", ["silent", "drip_head"])  # no byte; a status line one byte a second
def test_the_first_byte_deadline_is_its_own(mode):
    with stub(mode=mode) as server:
        started = time.monotonic()
        result = call(server.url, timeout_s=10, limits=StreamLimits(first_byte_timeout_s=0.3))
        took = time.monotonic() - started
    assert (result.ok, result.reason) == (False, "timeout") and "0.3s of the request" in result.message
    assert took < 3.0


def test_a_server_dripping_bytes_for_ever_ends_at_the_total_deadline():
    with stub(mode="slow_drip") as server:
        started = time.monotonic()
        result = call(server.url, timeout_s=0.6)
        took = time.monotonic() - started
    assert (result.ok, result.reason) == (False, "timeout") and "stream not complete" in result.message
    assert took < 3.0


def test_an_endless_sse_line_stops_at_the_line_cap():
    with stub(mode="endless_line") as server:
        result = call(server.url, limits=StreamLimits(max_line_bytes=256 * 1024))
    assert (result.ok, result.reason) == (False, "too_large"), result
    assert "SSE" in result.message


def test_endless_chunks_stop_at_the_event_cap():
    with stub(mode="endless_chunks") as server:
        result = call(server.url, max_tokens=8)
    assert (result.ok, result.reason) == (False, "too_large"), result
    assert "events" in result.message  # 4 x 8 + 64 events for 8 tokens


def test_endless_chunks_stop_at_the_byte_cap_too():
    with stub(mode="endless_chunks") as server:
        result = call(server.url, limits=StreamLimits(max_body_bytes=100_000, max_events=10**9))
    assert (result.ok, result.reason) == (False, "too_large") and "bytes" in result.message


def test_a_redirect_is_not_followed():
    with stub(mode="redirect") as server:
        result = call(server.url)
        seen = server.seen()
    assert (result.ok, result.reason, result.status) == (False, "http_status", 302)
    assert "not followed" in result.message
    assert len(seen) == 1  # nothing else was asked (and port 1 refuses anyway)


def test_a_chunk_that_is_not_json_is_a_protocol_error():
    with stub(mode="bad_json") as server:
        result = call(server.url)
    assert (result.ok, result.reason) == (False, "protocol")


def test_an_http_500_is_http_status_with_the_servers_words_made_printable():
    with stub(mode="status_500") as server:
        result = call(server.url)
    assert (result.ok, result.reason, result.status) == (False, "http_status", 500)
    assert result.message == "HTTP 500: engine exploded badly"


def test_an_error_object_in_the_stream_is_stream_error():
    with stub(mode="stream_error") as server:
        result = call(server.url)
    assert (result.ok, result.reason) == (False, "stream_error") and "out of memory" in result.message


def test_an_oversized_response_head_is_too_large():
    with stub(mode="huge_head") as server:
        result = call(server.url)
    assert (result.ok, result.reason) == (False, "too_large") and "head" in result.message


def test_an_endless_chunk_size_line_stops_at_the_head_cap():
    with stub(mode="endless_chunk_size") as server:
        started = time.monotonic()
        result = call(server.url, timeout_s=5.0)
    assert (result.ok, result.reason) == (False, "protocol"), result
    assert result.message == "chunk-size line over 65536 bytes"
    assert time.monotonic() - started < 3.0  # the cap ended it, not the deadline


def test_a_body_shorter_than_its_content_length_is_a_connection_error():
    with stub(mode="short_body") as server:
        result = call(server.url)
    assert (result.ok, result.reason) == (False, "connection"), result
    assert result.message == "connection closed: stream not complete"


def test_a_compressed_stream_is_refused():
    with stub(mode="gzip") as server:
        result = call(server.url)
    assert (result.ok, result.reason, result.status) == (False, "protocol", 200)
    assert "Content-Encoding" in result.message


def test_a_connection_closed_without_an_answer_and_a_refused_one_are_connection_errors():
    with stub(mode="reset") as server:
        result = call(server.url)
    assert (result.ok, result.reason) == (False, "connection"), result
    with stub() as server:
        url = server.url
    refused = call(url)  # stopped: nothing listens there now
    assert (refused.ok, refused.reason) == (False, "connection")
    assert "cannot connect" in refused.message


def test_a_name_that_does_not_resolve_is_dns():
    result = call("http://no-such-host.invalid:9", timeout_s=5)
    assert (result.ok, result.reason) in ((False, "dns"), (False, "timeout")), result  # an offline resolver may hang


def test_hostile_streams_leave_memory_bounded():
    """RSS before and after each endless case run ten times: the caps, not the server, end them,
    and what one call held is freed when it returns."""
    me = psutil.Process()
    growth = {}
    with stub() as server:
        for mode in ("endless_line", "endless_chunks", "slow_drip", "endless_chunk_size"):
            server.config.mode = mode
            call(server.url, timeout_s=0.5)  # warm-up: the allocator's arenas, the kernel buffers
            gc.collect()
            before = me.memory_info().rss
            for _ in range(10):
                result = call(server.url, timeout_s=0.5)
                assert not result.ok
            gc.collect()
            growth[mode] = me.memory_info().rss - before
    print("\nRSS growth over 10 hostile calls: " + ", ".join(f"{m} {g / MiB:.2f} MiB" for m, g in growth.items()))
    assert all(g < 4 * MiB for g in growth.values()), growth
