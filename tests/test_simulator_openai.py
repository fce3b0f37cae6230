"""The twin's OpenAI-compatible API (exporter/simulator/openai_api.py), over real HTTP on loopback:
in process against start_server, and against the real `python -m exporter.simulator` process.

Timing tests run the `idle` scenario (no background traffic) on an L4, where one decode step of
llama-3.1-8b takes ~56 ms: gaps long enough that a loaded CI machine's scheduling jitter stays small
beside them, and counters that only API requests move."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.simulator import Twin, TwinConfig
from exporter.simulator.openai_api import CHAT_TOKENS_PER_MESSAGE, TICK_S, TOKEN_TEXT, ApiLimits
from exporter.simulator.server import TwinServer, start_server
from tests.conftest import ROOT
from tests.support import background_process, free_port

# Wall-clock slack for a loaded 2-core machine: a token may come out late, never early.
LATE_S = 0.5


def _run(body: Callable[[TwinServer, httpx.AsyncClient], Awaitable[None]], *, scenario: str = "idle",
         gpu: str = "l4", speed: float = 1.0, limits: ApiLimits | None = None, warm_s: float = 0.0) -> None:
    async def main() -> None:
        twin = Twin(TwinConfig(scenario=scenario, gpu=gpu, seed=1))
        if warm_s:
            twin.fast_forward(warm_s)
        server = await start_server(twin, speed=speed, api_limits=limits)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                await body(server, client)
        finally:
            await server.stop()

    asyncio.run(main())


async def _until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll instead of one fixed sleep: a loaded CI machine delivers requests late, never early."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def _metrics(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return _samples((await client.get("/metrics")).text)


def _value(m: dict, name: str, **labels: str) -> float:
    return m[(name, tuple(sorted(labels.items())))]


async def _stream(client: httpx.AsyncClient, path: str, body: dict) -> tuple[list[dict], list[float], float]:
    """The stream's JSON chunks, the client's arrival time of each (from just before sending), and
    what followed the last chunk must be [DONE]."""
    chunks: list[dict] = []
    times: list[float] = []
    t0 = time.monotonic()
    async with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in _timed_lines(r, times)]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    return chunks, [t - t0 for t in times[:len(chunks)]], t0


async def _timed_lines(r: httpx.Response, times: list[float]) -> Any:
    async for line in r.aiter_lines():
        if line.startswith("data: "):
            times.append(time.monotonic())
            yield line[len("data: "):]


def _text_of(chunk: dict) -> str:
    if not chunk.get("choices"):
        return ""
    choice = chunk["choices"][0]
    return choice.get("text") or choice.get("delta", {}).get("content") or ""


def test_streaming_completion_times_tokens_from_the_engine() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        before = await _metrics(client)
        prompt = " ".join(["word"] * 100)
        chunks, times, _ = await _stream(client, "/v1/completions", {
            "model": "anything", "prompt": prompt, "max_tokens": 24, "stream_options": {"include_usage": True},
            "ignore_eos": True})
        tokens = [(c, t) for c, t in zip(chunks, times, strict=True) if _text_of(c)]
        assert len(tokens) == 24 and all(_text_of(c) == TOKEN_TEXT for c, _ in tokens)
        assert all(c["object"] == "text_completion" and c["choices"][0]["finish_reason"] is None for c, _ in tokens)
        final, usage = chunks[-2], chunks[-1]
        assert final["choices"][0]["finish_reason"] == "length" and usage["choices"] == []
        assert usage["usage"] == {"prompt_tokens": 100, "completion_tokens": 24, "total_tokens": 124}
        assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
        truth = final["twin"]
        ttft, decode = tokens[0][1], tokens[-1][1] - tokens[0][1]
        sim_decode = truth["e2e_s"] - truth["ttft_s"]
        sim_itl = sim_decode / 23
        gaps = [b[1] - a[1] for a, b in zip(tokens, tokens[1:], strict=False)]
        print(f"TTFT client {ttft * 1e3:.1f} ms vs twin {truth['ttft_s'] * 1e3:.1f} ms; ITL median client "
              f"{statistics.median(gaps) * 1e3:.1f} ms vs twin {sim_itl * 1e3:.1f} ms; decode client "
              f"{decode * 1e3:.1f} ms vs twin {sim_decode * 1e3:.1f} ms")
        # A token never comes out before the twin made it (the client's clock starts before the
        # request reached the twin), and late by no more than the machine's scheduling slack.
        assert truth["ttft_s"] > 0.02
        assert truth["ttft_s"] - TICK_S <= ttft <= truth["ttft_s"] + LATE_S
        assert sim_decode - 2 * TICK_S <= decode <= sim_decode + LATE_S
        assert abs(statistics.median(gaps) - sim_itl) < 0.3 * sim_itl
        after = await _metrics(client)
        # The idle scenario has no traffic of its own: every count here is the API request's.
        assert _value(after, "vllm:generation_tokens_total") - _value(before, "vllm:generation_tokens_total") == 24
        assert _value(after, "vllm:prompt_tokens_total") - _value(before, "vllm:prompt_tokens_total") == 100
        assert _value(after, "vllm:request_success_total", finished_reason="length") == \
            _value(before, "vllm:request_success_total", finished_reason="length") + 1
        ttft_count = "vllm:time_to_first_token_seconds_count"
        assert _value(after, ttft_count) == _value(before, ttft_count) + 1
        assert _value(after, "vllm:e2e_request_latency_seconds_sum") - \
            _value(before, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(truth["e2e_s"])
        assert _value(after, "vllm:request_generation_tokens_count") == 1

    _run(body)


def test_speed_divides_the_simulated_latency() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        chunks, times, _ = await _stream(client, "/v1/completions", {"prompt": "a b c", "max_tokens": 40})
        truth = chunks[-1]["twin"]
        assert truth["speed"] == 4.0
        decode, sim_decode = times[-2] - times[0], truth["e2e_s"] - truth["ttft_s"]
        print(f"speed 4: decode client {decode * 1e3:.1f} ms vs twin {sim_decode * 1e3:.1f} ms / 4")
        assert sim_decode / 4 - 2 * TICK_S <= decode <= sim_decode / 4 + LATE_S

    _run(body, speed=4.0)


def test_chat_streaming_and_both_endpoints_whole() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        models = (await client.get("/v1/models")).json()
        name = models["data"][0]["id"]
        assert models["object"] == "list" and len(models["data"]) == 1 and name == server.clock.twin.model.name
        messages = [{"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "three words here"}]}]
        chunks, _, _ = await _stream(client, "/v1/chat/completions", {"messages": messages, "max_tokens": 5})
        tokens = [c for c in chunks if _text_of(c)]
        assert len(tokens) == 5 and all(c["object"] == "chat.completion.chunk" and c["model"] == name for c in chunks)
        assert tokens[0]["choices"][0]["delta"] == {"role": "assistant", "content": TOKEN_TEXT}
        assert tokens[1]["choices"][0]["delta"] == {"content": TOKEN_TEXT}
        assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-1]

        r = await client.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 7})
        doc = r.json()
        assert r.status_code == 200 and doc["object"] == "chat.completion" and doc["id"].startswith("chatcmpl-")
        assert doc["choices"][0]["message"] == {"role": "assistant", "content": TOKEN_TEXT * 7}
        assert doc["choices"][0]["finish_reason"] == "length"
        prompt = 2 * CHAT_TOKENS_PER_MESSAGE + 2 + 3
        assert doc["usage"] == {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}

        t0 = time.monotonic()
        r = await client.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 6})
        waited = time.monotonic() - t0
        doc = r.json()
        assert doc["object"] == "text_completion" and doc["choices"][0]["text"] == TOKEN_TEXT * 6
        assert doc["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
        assert doc["twin"]["e2e_s"] - TICK_S <= waited  # answered once the last token was made
        assert (await client.post("/v1/completions")).status_code == 400  # no body at all

    _run(body)


def test_an_api_request_is_batched_with_the_background_load() -> None:
    """Under decode-heavy traffic the request shares every step with a large batch: its ITL is the
    loaded step time, well above that of the same request decoding alone, and it is counted running."""
    alone = Twin(TwinConfig(scenario="idle"))
    req = alone.engine.submit(300, 30)
    alone.fast_forward(5.0)
    itl_alone = (req.finished_at - req.first_token) / 29

    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        engine = server.clock.twin.engine
        running_before = len(engine.running)
        assert running_before > 20
        task = asyncio.ensure_future(_stream(client, "/v1/completions", {"prompt": "hello " * 300, "max_tokens": 30}))
        seen = await _until(lambda: task.done() or any(r.external for r in engine.running.values()))
        assert seen and not task.done(), "the API request never showed in the engine's running batch"
        chunks, _, _ = await task
        truth = chunks[-1]["twin"]
        assert sum(1 for c in chunks if _text_of(c)) == 30
        itl = (truth["e2e_s"] - truth["ttft_s"]) / 29
        print(f"ITL in the batch {itl * 1e3:.1f} ms, alone {itl_alone * 1e3:.1f} ms")
        assert itl > 1.4 * itl_alone

    _run(body, scenario="decode-heavy", gpu="NVIDIA H100 80GB HBM3", warm_s=30.0)


def test_bad_requests_answer_400_with_a_json_error() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        max_len = server.clock.twin.engine.max_model_len
        cases: list[tuple[str, Any]] = [
            ("/v1/completions", b"{not json"),
            ("/v1/completions", b"[1, 2]"),
            ("/v1/completions", b"\xff\xfe"),
            ("/v1/completions", b"[" * 100_000),
            ("/v1/completions", {"max_tokens": 4}),
            ("/v1/completions", {"prompt": 3}),
            ("/v1/completions", {"prompt": ["a", "b"]}),
            ("/v1/completions", {"prompt": [1, True]}),
            ("/v1/completions", {"prompt": "x", "max_tokens": "8"}),
            ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
            ("/v1/completions", {"prompt": "x", "max_tokens": 4097}),
            ("/v1/completions", {"prompt": "x", "max_tokens": True}),
            ("/v1/completions", {"prompt": "x", "stream": "yes"}),
            ("/v1/completions", {"prompt": "x", "stream_options": []}),
            ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": 1}}),
            ("/v1/completions", {"prompt": "x", "n": 2}),
            ("/v1/completions", {"prompt": "x", "model": 5}),
            ("/v1/completions", {"prompt": "w " * max_len, "max_tokens": 1}),
            ("/v1/chat/completions", {"prompt": "x"}),
            ("/v1/chat/completions", {"messages": []}),
            ("/v1/chat/completions", {"messages": "hi"}),
            ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": {"a": 1}}]}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        ]
        before = server.clock.twin.engine.counters.arrived
        for path, payload in cases:
            r = await client.post(path, content=payload) if isinstance(payload, bytes) else \
                await client.post(path, json=payload)
            assert r.status_code == 400, (path, payload)
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and err["message"], (path, payload)
        assert server.clock.twin.engine.counters.arrived == before  # none reached the engine
        assert (await client.get("/v1/completions")).status_code == 405
        assert (await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 1})).status_code == 200

    _run(body)


def test_body_over_the_cap_answers_413() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        huge = json.dumps({"prompt": "x " * (1 << 19) + "tail"}).encode()
        assert len(huge) > 1 << 20
        r = await client.post("/v1/completions", content=huge)
        assert r.status_code == 413 and r.json()["error"]["code"] == 413
        assert server.clock.twin.engine.counters.arrived == 0
        assert (await client.get("/health")).status_code == 200

    _run(body)


def test_concurrency_cap_answers_429_and_frees_slots() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        streams = [asyncio.ensure_future(_stream(client, "/v1/completions", {"prompt": "p", "max_tokens": 12}))
                   for _ in range(3)]
        assert await _until(lambda: server.app.api.inflight == 3)
        r = await client.post("/v1/completions", json={"prompt": "p", "max_tokens": 1})
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        for chunks, _, _ in await asyncio.gather(*streams):
            assert sum(1 for c in chunks if _text_of(c)) == 12
        assert server.app.api.inflight == 0
        assert (await client.post("/v1/completions", json={"prompt": "p", "max_tokens": 1})).status_code == 200

    _run(body, limits=ApiLimits(max_concurrent=3))


def _raw_stream_request(port: int, max_tokens: int) -> socket.socket:
    body = json.dumps({"prompt": "hi there", "max_tokens": max_tokens, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: twin\r\ncontent-type: application/json\r\n"
                 + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def _read_until_token(sock: socket.socket) -> None:
    seen = b""
    while TOKEN_TEXT.encode() not in seen:
        data = sock.recv(65536)
        assert data, "the twin closed the stream before the first token"
        seen += data


def test_client_disconnect_aborts_the_request_and_the_twin_serves_on() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        engine = server.clock.twin.engine
        port = int(server.url.rsplit(":", 1)[1])
        before = await _metrics(client)
        sock = await asyncio.to_thread(_raw_stream_request, port, 4000)
        await asyncio.to_thread(_read_until_token, sock)
        assert len(engine.running) == 1 and engine.kv_blocks_used() > 0
        sock.close()
        assert await _until(lambda: engine.counters.aborted > 0)
        assert engine.counters.aborted == 1 and server.app.api.inflight == 0
        assert not engine.running and not engine.by_id and engine.kv_blocks_used() == 0 and engine.n_decoding == 0
        after = await _metrics(client)
        assert _value(after, "vllm:request_success_total", finished_reason="abort") == \
            _value(before, "vllm:request_success_total", finished_reason="abort") + 1
        assert _value(after, "vllm:num_requests_running") == 0
        chunks, _, _ = await _stream(client, "/v1/completions", {"prompt": "again", "max_tokens": 3})
        assert sum(1 for c in chunks if _text_of(c)) == 3

    _run(body)


def test_wall_clock_timeout_and_engine_restart_end_the_request() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        engine = server.clock.twin.engine
        r = await client.post("/v1/completions", json={"prompt": "slow", "max_tokens": 400})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
        chunks, _, _ = await _stream(client, "/v1/completions", {"prompt": "slow", "max_tokens": 400})
        assert "error" in chunks[-1] and chunks[-1]["error"]["code"] == 504
        assert 0 < sum(1 for c in chunks if _text_of(c)) < 400
        assert engine.counters.aborted == 2 and not engine.by_id and engine.kv_blocks_used() == 0

        task = asyncio.ensure_future(_stream(client, "/v1/completions", {"prompt": "lost", "max_tokens": 400}))
        assert await _until(lambda: bool(engine.by_id))
        assert (await client.post("/sim/restart")).status_code == 200
        chunks, _, _ = await task
        assert chunks[-1]["error"]["code"] == 503

    _run(body, limits=ApiLimits(timeout_s=1.0))


def test_api_handlers_run_on_the_event_loop() -> None:
    from exporter.simulator.clock import RealtimeClock
    from exporter.simulator.server import build_app

    app = build_app(RealtimeClock(Twin(TwinConfig(scenario="idle"))))
    assert {path for _, path in app.api.routes} == {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    assert all(inspect.iscoroutinefunction(fn) for fn in app.api.routes.values())


def _vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _aborted_streams(port: int, count: int, batch: int = 25) -> None:
    for _ in range(count // batch):
        socks = [_raw_stream_request(port, 4000) for _ in range(batch)]
        for sock in socks:
            _read_until_token(sock)
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def _twin_process() -> Iterator[tuple[subprocess.Popen, int]]:
    """The real `python -m exporter.simulator` on a free port, once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "exporter.simulator", "--port", str(port), "--scenario", "idle", "--gpu", "l4"]
    with background_process(cmd, f"http://127.0.0.1:{port}/health", cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        yield proc, port


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_real_twin_process_serves_the_api_and_aborted_streams_do_not_grow_it() -> None:
    with _twin_process() as (proc, port), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        tokens = 0
        with client.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hello"}], "max_tokens": 10, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    tokens += 1
        assert tokens == 10
        _aborted_streams(port, 50)  # warm-up: the allocator's pools and the pump reach their size
        time.sleep(0.5)
        rss_before = _vm_rss_kib(proc.pid)
        _aborted_streams(port, 300)
        deadline = time.monotonic() + 10
        while client.get("/sim/gpu").json()["engine"]["requests_aborted_total"] < 350:
            assert time.monotonic() < deadline, "aborted streams not counted"
            time.sleep(0.05)
        rss_after = _vm_rss_kib(proc.pid)
        print(f"twin VmRSS before {rss_before} KiB, after 300 aborted streams {rss_after} KiB")
        assert rss_after - rss_before < 8 * 1024
        engine = client.get("/sim/gpu").json()["engine"]
        assert engine["running"] == 0 and engine["kv_blocks_used"] == 0
        doc = client.post("/v1/completions", json={"prompt": "still here", "max_tokens": 2}).json()
        assert doc["usage"]["completion_tokens"] == 2


def _partial_body(port: int, declared: int, sent: int, *, now: bool = True) -> tuple[socket.socket, bytes]:
    """A request that declares `declared` body bytes, sends `sent` of them and holds the rest back.
    With now=False only what the kernel takes without waiting goes out; the rest is returned."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: twin\r\ncontent-type: application/json\r\n"
                 + f"content-length: {declared}\r\n\r\n".encode())
    body = b'{"prompt": "' + b"x " * ((sent - 12) // 2)
    if not now:
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            body = body[sock.send(body):]
        sock.setblocking(True)
    with contextlib.suppress(OSError):  # refused half-way: the twin answered and closed
        if now:
            sock.sendall(body)
            body = b""
    return sock, body


def _status(sock: socket.socket) -> int | None:
    """The status line's code if the twin has answered, else None (without waiting)."""
    sock.setblocking(False)
    try:
        head = sock.recv(64)
    except (BlockingIOError, ConnectionResetError):
        return None
    finally:
        sock.setblocking(True)
    parts = head.split()
    return int(parts[1]) if head.startswith(b"HTTP/1.1 ") and len(parts) > 1 else None


def test_bodies_being_read_share_one_budget_and_give_it_back() -> None:
    async def body(server: TwinServer, client: httpx.AsyncClient) -> None:
        api = server.app.api
        port = int(server.url.rsplit(":", 1)[1])
        first, _ = await asyncio.to_thread(_partial_body, port, 60_000, 40_000)
        assert await _until(lambda: api.bodies.held >= 39_000)
        second, _ = await asyncio.to_thread(_partial_body, port, 60_000, 40_000)
        assert await _until(lambda: api.inflight == 1)  # the second was refused, the first still reads
        assert 39_000 <= api.bodies.held <= 40_000
        assert (await asyncio.to_thread(second.recv, 64)).startswith(b"HTTP/1.1 429 ")
        second.close()
        first.close()  # the client leaves half-way: its bytes go back too
        assert await _until(lambda: api.inflight == 0 and api.bodies.held == 0)
        r = await client.post("/v1/completions", json={"prompt": "fits again", "max_tokens": 1})
        assert r.status_code == 200 and api.bodies.held == 0

    _run(body, limits=ApiLimits(max_bodies_bytes=64_000))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
@pytest.mark.parametrize("busy", [False, True], ids=["serving", "stopped-while-sent"])
def test_real_twin_process_holds_at_most_its_body_budget_under_a_flood_of_slow_bodies(busy: bool) -> None:
    """160 clients each send 900 KB of a 1 MB body and stall: 144 MB if every read kept its bytes. The
    twin holds at most MAX_BODIES_BYTES (32 MiB) of bodies and refuses the rest with 429, then serves
    on. RSS also holds the connections' buffers and the allocator's slack (measured +34 to +36 MB).

    busy: the twin is stopped (SIGSTOP) while the clients connect and send, as a loaded machine
    deschedules it, so every socket is readable at once when it resumes. Reads of 256 KiB apiece
    before any request asked for them left +56 MB of RSS that way (two full `make test` runs failed
    on it); httpserver.READ_BYTES bounds them."""
    with _twin_process() as (proc, port):
        rss_before = _vm_rss_kib(proc.pid)
        if busy:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            sent = [_partial_body(port, 1_000_000, 900_000, now=not busy) for _ in range(160)]
        finally:
            if busy:
                os.kill(proc.pid, signal.SIGCONT)
        socks = [sock for sock, _ in sent]
        try:
            for sock, rest in sent:
                with contextlib.suppress(OSError):  # refused half-way
                    sock.sendall(rest)
            # The twin reads what was sent and refuses what is over its budget: wait for the refusals
            # to arrive (a loaded machine takes longer) and then stop changing.
            codes: dict[int, int] = {}
            least = 160 - (32 << 20) // 900_000 - 1
            deadline = time.monotonic() + 60
            settled = 0
            while time.monotonic() < deadline and settled < 5:
                before = len(codes)
                for i, sock in enumerate(socks):
                    if i not in codes and (code := _status(sock)) is not None:
                        codes[i] = code
                settled = settled + 1 if len(codes) == before and len(codes) >= least else 0
                time.sleep(0.1)
            rss_during = _vm_rss_kib(proc.pid)
            refused = list(codes.values())
            print(f"twin VmRSS {rss_before} KiB before, {rss_during} KiB with 160 stalled bodies; "
                  f"{len(refused)} refused")
            assert refused and set(refused) == {429}, refused
            assert len(refused) >= 160 - (32 << 20) // 900_000 - 1
            assert rss_during - rss_before < 48 * 1024
        finally:
            for sock in socks:
                sock.close()
        doc = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "still here", "max_tokens": 2},
                         timeout=30).json()
        assert doc["usage"]["completion_tokens"] == 2


def test_engine_token_times_follow_the_steps_through_preemptions() -> None:
    """What the API reads, driven directly: requests submitted into a KV pool under pressure
    (preempted and recomputed) still get exactly max_tokens tokens, whose times, read a few rounds
    at a time as the pump does, never go backwards and end at the finish; the workload's own
    requests finish and abort as before."""
    twin = Twin(TwinConfig(scenario="kv-pressure", seed=2))
    twin.fast_forward(40.0)
    engine = twin.engine
    reqs = [engine.submit(8000, 600) for _ in range(6)]
    seen = dict.fromkeys(range(len(reqs)), 0)
    times: dict[int, list[float]] = {i: [] for i in range(len(reqs))}
    preempted_before = engine.counters.preemptions
    while any(r.finished_at < 0 for r in reqs) and twin.now < 400:
        twin.fast_forward(0.05)
        for i, r in enumerate(reqs):
            n = engine.generated(r)
            times[i] += [engine.token_time(r, k) for k in range(seen[i] + 1, n + 1)]
            seen[i] = n
            assert all(t <= twin.now for t in times[i][-3:])
    assert engine.counters.preemptions > preempted_before
    assert any(r.preemptions for r in reqs)
    for i, r in enumerate(reqs):
        assert r.finished_at >= 0 and not r.aborted and r.generated == 600 == len(times[i])
        assert times[i] == sorted(times[i]) and times[i][0] == r.first_token and times[i][-1] == r.finished_at
    # An abort takes a request out wherever it is: queued behind a full pool, or decoding.
    queued = engine.submit(8000, 600)
    twin.fast_forward(0.5)
    assert queued in engine.waiting and queued.blocks == 0
    assert engine.abort(queued) and not engine.abort(queued)
    assert queued.aborted and queued not in engine.waiting and queued.rid not in engine.by_id
    idle = Twin(TwinConfig(scenario="idle"))
    decoding = idle.engine.submit(1000, 600)
    idle.fast_forward(0.5)
    assert decoding.decoding and idle.engine.kv_blocks_used() > 0
    assert idle.engine.abort(decoding)
    assert idle.engine.kv_blocks_used() == 0 and idle.engine.n_decoding == 0 and idle.engine.decode_ctx == 0
    idle.fast_forward(5.0)  # its stale finish-heap entry is skipped
    assert idle.engine.counters.finished == 0 and idle.engine.counters.aborted == 1
