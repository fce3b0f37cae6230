"""The twin's OpenAI-compatible API: `POST /v1/completions`, `POST /v1/chat/completions` (streaming
or not) and `GET /v1/models`, so a load-test client or a probe can measure TTFT and inter-token
latency against the twin with no real engine.

Each request joins the twin's simulated engine as a real request (Engine.submit): it arrives at the
twin's current time, is tokenized by the simulated API server, queues, is batched, holds KV blocks
and is counted in the engine's /metrics like the workload's own. Its tokens are released to the
client when the simulated engine generates them: a token made at twin time t goes out at the
wall-clock moment the twin's clock reaches t (RealtimeClock.wall_at), so a streaming client sees the
simulated TTFT and inter-token gaps divided by `speed`, later by at most a tick (TICK_S) plus the
event loop's own delay. While API requests are in flight a pump advances the twin every tick (or
when the wall clock catches up with the engine, whichever is later) and reads their progress.

Tokenization (no tokenizer, nothing to download): one token per whitespace-separated word of the
prompt; a chat request counts the words of every message's content plus CHAT_TOKENS_PER_MESSAGE
for each message (the chat template's role markers); a `prompt` given as a list of token ids counts
one token per id. At least 1. Output: exactly `max_tokens` tokens (default DEFAULT_MAX_TOKENS),
each the text TOKEN_TEXT: the twin never stops early (`ignore_eos` is accepted and changes
nothing), finish_reason is always "length".

Bounds (ApiLimits): a request body of at most MAX_BODY_BYTES (413), at most MAX_BODIES_BYTES of
bodies being read at once across all requests (429), max_tokens at most MAX_TOKENS_CAP and prompt +
max_tokens within the engine's max_model_len (400), at most MAX_CONCURRENT requests at once, bodies
being read included (429), each one at most
REQUEST_TIMEOUT_S of wall-clock time (a stream ends with an error event, a plain request answers
504). A client that disconnects has its request aborted in the engine at once (KV blocks freed;
vLLM counts it under finished_reason="abort", SGLang in num_aborted_requests). Errors are JSON:
{"error": {"message": ..., "type": ..., "code": status}}.

Non-standard, for tests and probes that want the truth to compare with: the final chunk of a
stream and a plain response carry "twin": {"arrival_s", "ttft_s", "e2e_s", "speed"} (twin seconds
of the simulated request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import exporter.jsonsafe as jsonsafe
from exporter.simulator.clock import RealtimeClock
from exporter.simulator.engine import Engine, Request

MAX_BODY_BYTES = 1 << 20
MAX_BODIES_BYTES = 32 << 20
"""All request bodies being read at once: MAX_CONCURRENT clients each sending MAX_BODY_BYTES slowly
would otherwise hold 512 MiB in the twin. Real prompts are kilobytes, so the cap only meets floods."""
MAX_TOKENS_CAP = 4096
MAX_CONCURRENT = 512
REQUEST_TIMEOUT_S = 300.0
# How often the pump reads progress while requests are in flight: the release granularity.
TICK_S = 0.005
DEFAULT_MAX_TOKENS = 16
CHAT_TOKENS_PER_MESSAGE = 4
TOKEN_TEXT = " tok"

Asgi = Callable[[dict, Any, Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ApiLimits:
    max_body_bytes: int = MAX_BODY_BYTES
    max_bodies_bytes: int = MAX_BODIES_BYTES
    max_tokens: int = MAX_TOKENS_CAP
    max_concurrent: int = MAX_CONCURRENT
    timeout_s: float = REQUEST_TIMEOUT_S
    tick_s: float = TICK_S


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.kind, "code": self.status}}).encode()


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated request: what the engine and the response need."""

    chat: bool
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


def _words(text: str) -> int:
    return len(text.split())


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _words(content)
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "..."}]
        total = 0
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, "only text content parts are supported: {\"type\": \"text\", \"text\": \"...\"}")
            total += _words(part["text"])
        return total
    raise ApiError(400, "message content must be a string or a list of text parts")


def prompt_tokens(body: dict, chat: bool) -> int:
    """The tokenization rule of the module docstring."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list of {role, content}")
        total = 0
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, "each message must be an object with a string 'role'")
            total += CHAT_TOKENS_PER_MESSAGE + _content_tokens(m.get("content"))
        return max(1, total)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return max(1, _words(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)")


def _optional(body: dict, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ApiError(400, f"'{key}' must be {what}")
    return value


def parse_request(raw: bytes, chat: bool, limits: ApiLimits) -> Parsed:
    try:
        body = jsonsafe.loads(raw)
    except ValueError:  # JsonTooDeep included
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    _optional(body, "model", str, "a string")
    n = _optional(body, "n", int, "an integer")
    if n not in (None, 1):
        raise ApiError(400, "only n=1 is supported")
    _optional(body, "ignore_eos", bool, "a boolean")
    max_tokens = _optional(body, "max_tokens", int, "an integer")
    if max_tokens is None and chat:
        max_tokens = _optional(body, "max_completion_tokens", int, "an integer")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= limits.max_tokens:
        raise ApiError(400, f"max_tokens must be between 1 and {limits.max_tokens}")
    stream = bool(_optional(body, "stream", bool, "a boolean"))
    options = _optional(body, "stream_options", dict, "an object")
    include_usage = False
    if options is not None:
        include_usage = bool(_optional(options, "include_usage", bool, "a boolean"))
    return Parsed(chat, prompt_tokens(body, chat), max_tokens, stream, include_usage)


@dataclass(slots=True)
class BodyBudget:
    """Bytes of request bodies held by reads in progress, shared by every request."""

    limit: int
    held: int = 0


async def read_body(receive: Any, cap: int, budget: BodyBudget) -> bytes:
    """The request body; ApiError 413 past `cap` bytes, 429 when it would take the bodies being read
    past `budget`, 400 if the client left half-way. What it held goes back to `budget` either way."""
    # Chunks joined once at the end: a growing bytearray reallocates, and a flood of them leaves the
    # heap fragmented well past the budget (80 stalled 900 KB bodies: +52 MB of RSS, +35 MB this way).
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ApiError(400, "the request body ended early")
            chunk = message.get("body", b"")
            if size + len(chunk) > cap:
                raise ApiError(413, f"the request body is over {cap} bytes")
            if budget.held + len(chunk) > budget.limit:
                raise ApiError(429, f"the twin is already reading {budget.limit} bytes of request bodies",
                               "rate_limit_error")
            budget.held += len(chunk)
            size += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)
    finally:
        budget.held -= size


@dataclass(slots=True, eq=False)
class _Call:
    """One API request in the engine, as the pump last saw it."""

    req: Request
    engine: Engine
    seen: int = 0
    times: deque[float] = field(default_factory=deque)  # twin times of tokens not yet released
    finished: bool = False
    lost: bool = False  # the twin's engine restarted under it
    wake: asyncio.Event = field(default_factory=asyncio.Event)


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class OpenAIApi:
    """The endpoints as ASGI callables (`routes`), on the twin's event loop like every other
    handler: the pump and the handlers advance the twin one at a time."""

    def __init__(self, clock: RealtimeClock, limits: ApiLimits | None = None) -> None:
        self.clock = clock
        self.limits = limits or ApiLimits()
        self.inflight = 0
        self.bodies = BodyBudget(self.limits.max_bodies_bytes)
        self.calls: dict[int, _Call] = {}
        self._pump_task: asyncio.Task[None] | None = None
        self.routes: dict[tuple[str, str], Asgi] = {
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("GET", "/v1/models"): self.models,
        }

    # --- endpoints ------------------------------------------------------------------------

    async def models(self, scope: dict, receive: Any, send: Any) -> None:
        twin = self.clock.twin
        doc = {"object": "list", "data": [{
            "id": twin.model.name, "object": "model", "created": int(twin.epoch), "owned_by": "llm-exporter-twin",
            "max_model_len": twin.engine.max_model_len}]}
        await _send_json(send, 200, json.dumps(doc).encode())

    async def completions(self, scope: dict, receive: Any, send: Any) -> None:
        await self._serve(receive, send, chat=False)

    async def chat_completions(self, scope: dict, receive: Any, send: Any) -> None:
        await self._serve(receive, send, chat=True)

    async def close(self) -> None:
        """Stop the pump (the server has closed every connection, so no request is left)."""
        task, self._pump_task = self._pump_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- one request ----------------------------------------------------------------------

    async def _serve(self, receive: Any, send: Any, *, chat: bool) -> None:
        if self.inflight >= self.limits.max_concurrent:
            err = ApiError(429, f"the twin serves at most {self.limits.max_concurrent} API requests at once",
                           "rate_limit_error")
            await _send_json(send, err.status, err.body())
            return
        self.inflight += 1
        try:
            try:
                parsed = parse_request(await read_body(receive, self.limits.max_body_bytes, self.bodies), chat,
                                       self.limits)
                self.clock.sync()
                engine = self.clock.twin.route()
                if parsed.prompt_tokens + parsed.max_tokens > engine.max_model_len:
                    raise ApiError(400, f"this model's maximum context length is {engine.max_model_len} tokens; "
                                        f"the prompt has {parsed.prompt_tokens} and max_tokens is {parsed.max_tokens}")
            except ApiError as err:
                await _send_json(send, err.status, err.body())
                return
            call = _Call(engine.submit(parsed.prompt_tokens, parsed.max_tokens), engine)
            self.calls[id(call)] = call
            try:
                await self._run(call, parsed, receive, send)
            finally:
                del self.calls[id(call)]
                if call.engine in self.clock.twin.engines:  # not replaced by a restart
                    call.engine.abort(call.req)  # no-op once finished
        finally:
            self.inflight -= 1

    async def _run(self, call: _Call, parsed: Parsed, receive: Any, send: Any) -> None:
        self._ensure_pump()
        response = _Response(parsed, self.clock.twin.model.name, call.req, self.clock.speed)
        producer = asyncio.ensure_future(
            self._stream(call, response, send) if parsed.stream else self._whole(call, response, send))
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        try:
            done, _ = await asyncio.wait({producer, watcher}, timeout=self.limits.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if producer in done:
                producer.result()
                return
            if watcher in done:
                return  # the client is gone: the finally of _serve aborts the request
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
            err = ApiError(504, f"the simulated request did not finish within {self.limits.timeout_s:g} s",
                           "timeout_error")
            if response.started:
                await send({"type": "http.response.body", "body": _sse(json.loads(err.body())) + b"data: [DONE]\n\n"})
            else:
                await _send_json(send, err.status, err.body())
        finally:
            for task in (producer, watcher):
                task.cancel()
            await asyncio.gather(producer, watcher, return_exceptions=True)

    async def _tokens(self, call: _Call) -> AsyncIterator[float]:
        """Twin times of the request's tokens, each yielded once the wall clock has reached it."""
        clock = self.clock
        while True:
            while call.times:
                t = call.times.popleft()
                delay = clock.wall_at(t) - time.monotonic()
                if delay > 0:  # the engine computes a step ahead of the wall clock; the token waits for it
                    await asyncio.sleep(min(delay, self.limits.timeout_s))
                yield t
            if call.finished:
                return
            if call.lost:
                raise ApiError(503, "the engine restarted; the request was lost", "server_error")
            call.wake.clear()
            await call.wake.wait()

    async def _stream(self, call: _Call, response: _Response, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        response.started = True
        await send({"type": "http.response.body", "body": b"", "more_body": True})  # the head goes now
        try:
            async for _ in self._tokens(call):
                await send({"type": "http.response.body", "body": _sse(response.token_chunk()), "more_body": True})
        except ApiError as err:
            await send({"type": "http.response.body", "body": _sse(json.loads(err.body())) + b"data: [DONE]\n\n"})
            return
        tail = _sse(response.final_chunk())
        if response.parsed.include_usage:
            tail += _sse(response.usage_chunk())
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n"})

    async def _whole(self, call: _Call, response: _Response, send: Any) -> None:
        try:
            async for _ in self._tokens(call):
                response.emitted += 1
        except ApiError as err:
            await _send_json(send, err.status, err.body())
            return
        await _send_json(send, 200, json.dumps(response.whole()).encode())

    # --- the pump -------------------------------------------------------------------------

    def _ensure_pump(self) -> None:
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        clock = self.clock
        while self.calls:
            clock.sync()
            for call in list(self.calls.values()):
                self._observe(call)
            # A step computed ahead of the wall clock (its tokens are already timed): nothing new
            # can come out before the clock reaches the engine's time.
            ahead = clock.wall_at(clock.twin.now) - time.monotonic()
            await asyncio.sleep(min(max(self.limits.tick_s, ahead), 0.25))

    def _observe(self, call: _Call) -> None:
        engine = call.engine
        if engine not in self.clock.twin.engines:  # the engine restarted: its requests are lost
            call.lost = True
            call.wake.set()
            return
        req = call.req
        n = engine.generated(req)
        for k in range(call.seen + 1, n + 1):
            call.times.append(engine.token_time(req, k))
        if n > call.seen or req.finished_at >= 0:
            call.seen = n
            call.finished = req.finished_at >= 0
            call.wake.set()


@dataclass(slots=True)
class _Response:
    """The OpenAI shapes of one request's chunks and answer."""

    parsed: Parsed
    model: str
    req: Request
    speed: float
    started: bool = False
    emitted: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    ident: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def _id(self) -> str:
        return ("chatcmpl-" if self.parsed.chat else "cmpl-") + self.ident

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.parsed.chat else "text_completion"
        return {"id": self._id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str, finish: str | None, first: bool) -> dict[str, Any]:
        if not self.parsed.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def token_chunk(self) -> dict[str, Any]:
        self.emitted += 1
        return {**self._head(True), "choices": [self._choice(TOKEN_TEXT, None, self.emitted == 1)]}

    def final_chunk(self) -> dict[str, Any]:
        return {**self._head(True), "choices": [self._choice("", "length", False)], "twin": self.truth()}

    def usage(self) -> dict[str, int]:
        p, c = self.parsed.prompt_tokens, self.emitted
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def usage_chunk(self) -> dict[str, Any]:
        return {**self._head(True), "choices": [], "usage": self.usage()}

    def truth(self) -> dict[str, float]:
        r = self.req
        return {"arrival_s": r.arrival, "ttft_s": r.first_token - r.arrival, "e2e_s": r.finished_at - r.arrival,
                "speed": self.speed}

    def whole(self) -> dict[str, Any]:
        text = TOKEN_TEXT * self.emitted
        if self.parsed.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return {**self._head(False), "choices": [choice], "usage": self.usage(), "twin": self.truth()}


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def _send_json(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
