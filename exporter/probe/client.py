"""One streaming completion against an OpenAI-compatible server, timed from the client's side.

`stream_completion` sends `POST /v1/completions` (or `/v1/chat/completions`) with `stream: true`
and `stream_options.include_usage`, reads the Server-Sent Events answer and records the monotonic
time of the request sent, of the response head and of each chunk that carries text. The result,
a `CompletionTiming`, has TTFT, the gaps between text chunks (ITL), end-to-end latency and the
token counts (the usage the server reports, else the text chunks counted). It never raises for
anything the server does: a failure is `ok=False` with one of REASONS and a short message.

The engine's answer is untrusted (docs/security.md); the HTTP side is exporter/httpclient.py (h11
framing, the head and chunk-line bounds, resolving in a Resolver's own thread, no redirects, no
proxies, no environment). What this module adds:

- time: a connect deadline, a first-byte deadline (request sent -> response head) and one
  deadline over the whole exchange (asyncio.timeout);
- bytes: the response head (StreamLimits.max_head_bytes), each SSE line (or one event's data lines
  together), the whole body and the number of events are capped; past a cap the answer is
  `too_large`. A line is scanned once as it arrives, so a server dripping one byte at a time
  costs linear time;
- one request per connection (`Connection: close`), closed (aborted) when the call returns: no
  idle connection or pool to keep safe between probes; a 3xx is `http_status`, never followed;
  messages never carry a header value.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from exporter import jsonsafe
from exporter.catalog.probe import ERROR_REASONS
from exporter.httpclient import (
    ClosedEarly,
    Connection,
    HeadTooLarge,
    ProtocolError,
    ResolveError,
    Resolver,
    connect,
    error_hint,
    header_list,
    parse_url,
    printable,
    request,
    resolve,
)
from exporter.jsonsafe import JsonTooDeep
from exporter.redact import redact_url

__all__ = ["APIS", "REASONS", "CompletionTiming", "Resolver", "StreamLimits", "endpoint_url", "make_prompt",
           "stream_completion"]

APIS: Mapping[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Why a call failed: a bounded set (they become label values). credentials and exception are the
# caller's (exporter/probe/source.py); the rest are decided here.
REASONS = ERROR_REASONS
MAX_MESSAGE = 200  # characters of a server-provided text (an error object) in a message
# Usage counts past what the request can cost are ignored (the server's numbers are remote input:
# the verdict subtracts the probe's tokens from the engine's work, so an inflated count would hide
# real traffic, and an unbounded int would not even convert to a float). A token covers at least
# one byte of the prompt; a chat template adds its own tokens.
TEMPLATE_TOKENS = 1024
_ERROR_BODY = 4096  # read of a non-200 answer, for its hint


class StreamLimits(NamedTuple):
    """Bounds of one call. Timeouts of None fall back to the call's total `timeout_s`."""

    connect_timeout_s: float | None = None
    first_byte_timeout_s: float | None = None  # request sent -> response head complete
    max_head_bytes: int = 64 * 1024  # status line + headers; also a chunk-size line and the trailers
    max_line_bytes: int = 64 * 1024  # one SSE line, and the data of one event (a chunk is ~0.3 KB)
    max_body_bytes: int = 4 * 1024 * 1024  # the whole stream (4096 chunks of ~1 KB)
    max_events: int = 8192  # SSE events (chunks) in one answer

    @classmethod
    def for_tokens(cls, max_tokens: int, **overrides: Any) -> StreamLimits:
        """Caps sized to an answer of `max_tokens`: a few events per token (role, usage and [DONE]
        events besides one per token), and about 1 KB per event."""
        events = 4 * max_tokens + 64
        return cls(**{"max_events": events, "max_body_bytes": max(64 * 1024, events * 1024), **overrides})


class CompletionTiming(NamedTuple):
    """One call's outcome. Times are seconds; `*_at` are time.monotonic() readings.

    ttft_s: request sent -> first text chunk; itl_s: gaps between consecutive text chunks;
    e2e_s: request sent -> end of the stream ([DONE] or the body's end). Chunks that arrive in one
    read share its arrival time (the client cannot tell them apart)."""

    ok: bool
    reason: str  # "" when ok, else one of REASONS
    message: str
    status: int | None  # the HTTP status, once a response head was read
    started_at: float
    connect_s: float | None  # call start -> connection open (TLS included)
    sent_at: float | None
    response_at: float | None  # response head read
    token_times: tuple[float, ...]  # arrival of each text-bearing chunk
    ttft_s: float | None
    itl_s: tuple[float, ...]
    e2e_s: float | None
    prompt_tokens: int | None  # from the usage chunk
    completion_tokens: int  # from the usage chunk, else the text chunks counted
    usage_reported: bool


def endpoint_url(base_url: str, api: str) -> str:
    """The API path appended to a base URL (`http://host:8000`, or one ending in /v1)."""
    if api not in APIS:
        raise ValueError(f"api must be one of {', '.join(APIS)}")
    base = base_url.rstrip("/")
    return base.removesuffix("/v1") + APIS[api]


_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "old",
          "ships", "sail", "past", "green", "hills")


def make_prompt(words: int) -> str:
    """A deterministic prompt of `words` common words (about one token each in every tokenizer)."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(max(1, words)))


def request_body(api: str, *, model: str | None, prompt: str, max_tokens: int, ignore_eos: bool = True,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON request. `ignore_eos`: engines that know it (vLLM, SGLang, LMDeploy, NIM) generate
    exactly max_tokens, so every probe costs the same; the others ignore the field."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                            "temperature": 0}
    if model is not None:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(extra or {})
    return body


@dataclass(slots=True)
class _Marks:
    """What one call has seen so far, for its CompletionTiming."""

    status: int | None = None
    connect_s: float | None = None
    sent_at: float | None = None
    response_at: float | None = None


class _Fail(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _count(value: object, most: int) -> bool:
    """A usage count: an int (not a bool) from 0 to `most`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


class _Stream:
    """SSE parsing and the timing record of one answer."""

    def __init__(self, api: str, limits: StreamLimits, max_prompt_tokens: int, max_completion_tokens: int) -> None:
        self.api = api
        self.limits = limits
        self.max_prompt_tokens, self.max_completion_tokens = max_prompt_tokens, max_completion_tokens
        self.buffer = bytearray()
        self.scanned = 0  # bytes of `buffer` known to hold no line break
        self.data: list[bytes] = []  # data lines of the event being read
        self.data_bytes = 0
        self.events = 0
        self.finished = False  # [DONE] seen
        self.token_times: list[float] = []
        # The first chunk with a choice, text or not: the first visible output of a stream whose
        # tokens all decoded to nothing (llama.cpp holds back bytes that never complete a UTF-8
        # character; seen on a live llama.cpp in 25 of 1,290 requests, 16 tokens counted, no text).
        self.first_choice_at: float | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def feed(self, piece: bytes, now: float) -> None:
        self.buffer += piece
        start, scan = 0, self.scanned  # only the new bytes are searched for a line break
        while not self.finished:
            end = self.buffer.find(b"\n", scan)
            if end < 0:
                break
            line = bytes(self.buffer[start:end]).removesuffix(b"\r")
            start = scan = end + 1
            self._line(line, now)
        if self.finished:
            self.buffer.clear()
            self.scanned = 0
            return
        del self.buffer[:start]
        self.scanned = len(self.buffer)
        if len(self.buffer) > self.limits.max_line_bytes:
            raise _Fail("too_large", f"an SSE line over {self.limits.max_line_bytes} bytes")

    def end(self, now: float) -> None:
        """The body ended: a last line without its line break, a last event without its blank line."""
        if self.buffer and not self.finished:
            self._line(bytes(self.buffer).removesuffix(b"\r"), now)
        self.buffer.clear()
        if self.data and not self.finished:
            self._dispatch(now)

    def _line(self, line: bytes, now: float) -> None:
        if not line:
            if self.data:
                self._dispatch(now)
            return
        if line.startswith(b":"):  # a comment (keep-alive pings)
            return
        name, _, value = line.partition(b":")
        if name != b"data":  # event:, id:, retry: say nothing a completion needs
            return
        value = value.removeprefix(b" ")
        self.data_bytes += len(value) + 1
        if self.data_bytes > self.limits.max_line_bytes:
            raise _Fail("too_large", f"an SSE event over {self.limits.max_line_bytes} bytes")
        self.data.append(value)

    def _dispatch(self, now: float) -> None:
        payload = b"\n".join(self.data)
        self.data.clear()
        self.data_bytes = 0
        self.events += 1
        if self.events > self.limits.max_events:
            raise _Fail("too_large", f"more than {self.limits.max_events} events in one answer")
        if payload.strip() == b"[DONE]":
            self.finished = True
            return
        try:
            doc = jsonsafe.loads(payload)
        except JsonTooDeep as error:
            raise _Fail("too_deep", f"an SSE event: {error}") from None
        except ValueError:  # UnicodeDecodeError included
            raise _Fail("protocol", "an SSE event that is not JSON") from None
        if not isinstance(doc, dict):
            raise _Fail("protocol", "an SSE event that is not a JSON object")
        failure = doc.get("error")
        if failure:  # vLLM and others report a failure mid-stream as {"error": {...}}
            text = failure.get("message", "") if isinstance(failure, dict) else failure
            raise _Fail("stream_error", "the server sent an error: " + printable(
                text if isinstance(text, str) else "no message", MAX_MESSAGE))
        choices = doc.get("choices")
        if self._has_text(choices):
            self.token_times.append(now)
        elif self.first_choice_at is None and isinstance(choices, list) and choices:
            self.first_choice_at = now
        usage = doc.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if _count(prompt, self.max_prompt_tokens):
                self.prompt_tokens = prompt
            if _count(completion, self.max_completion_tokens):
                self.completion_tokens = completion

    def _has_text(self, choices: object) -> bool:
        if not isinstance(choices, list):
            return False
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if self.api == "chat":
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    continue
                # Reasoning models stream their thinking first, in a field of its own: tokens all the same.
                texts: tuple[object, ...] = (delta.get("content"), delta.get("reasoning_content"),
                                             delta.get("reasoning"))
            else:
                texts = (choice.get("text"),)
            if any(isinstance(t, str) and t for t in texts):
                return True
        return False


async def stream_completion(url: str, *, api: str = "completions", model: str | None, prompt: str,
                            max_tokens: int, timeout_s: float, headers: Mapping[str, str] | None = None,
                            limits: StreamLimits | None = None, ssl_context: ssl.SSLContext | None = None,
                            resolver: Resolver | None = None, ignore_eos: bool = True,
                            extra_body: Mapping[str, Any] | None = None) -> CompletionTiming:
    """One streaming completion at `url` (the server's base URL) timed from here; see the module
    docstring. `model` None leaves the field out (servers of one model take that). `headers` are
    sent as given (Authorization) and never appear in a message."""
    limits = limits or StreamLimits.for_tokens(max_tokens)
    started = time.monotonic()
    record = _Marks()
    stream = _Stream(api, limits, len(prompt.encode()) + TEMPLATE_TOKENS, max_tokens)
    stage = "no connection"
    conn: Connection | None = None
    try:
        full = endpoint_url(url, api)
        try:
            origin = parse_url(full)
        except ValueError:
            raise _Fail("connection", "not an http(s) URL") from None
        payload = json.dumps(request_body(api, model=model, prompt=prompt, max_tokens=max_tokens,
                                          ignore_eos=ignore_eos, extra=extra_body), separators=(",", ":")).encode()
        try:
            head = request(b"POST", origin.target.encode("ascii"), header_list({
                "Host": origin.host_header, "User-Agent": "llm-exporter-probe", "Accept": "text/event-stream",
                "Accept-Encoding": "identity", "Content-Type": "application/json",
                "Content-Length": str(len(payload)), "Connection": "close", **(headers or {})}))
        except ValueError as error:  # names the header, never its value
            raise _Fail("credentials", f"request {error}") from None
        async with asyncio.timeout(timeout_s):
            try:
                async with asyncio.timeout(limits.connect_timeout_s):
                    conn = await connect(origin, await resolve(origin.host, origin.port, resolver), ssl_context,
                                         limits.max_head_bytes)
            except TimeoutError:  # the connect deadline's own (the whole call's surfaces outside)
                raise _Fail("timeout", f"no connection within {limits.connect_timeout_s:g}s") from None
            except ResolveError as error:
                raise _Fail("dns", str(error)) from None
            except ssl.SSLError:
                raise
            except OSError as failure:
                # The errno's words ("connection refused"), not asyncio's "Connect call failed (...)".
                why = os.strerror(failure.errno).lower() if failure.errno else (failure.strerror or str(failure))
                raise _Fail("connection", f"cannot connect to {redact_url(full)}: {why}") from None
            record.connect_s = time.monotonic() - started
            stage = "request not sent"
            conn.send(head, payload)
            await conn.writer.drain()
            record.sent_at = time.monotonic()
            stage = "no answer"
            try:
                async with asyncio.timeout(limits.first_byte_timeout_s):
                    answer = await conn.read_head()
            except TimeoutError:  # the first-byte deadline's own
                raise _Fail("timeout", f"no answer within {limits.first_byte_timeout_s:g}s of the request") from None
            status = answer.status
            record.response_at, record.status = time.monotonic(), status
            if answer.coding not in (b"identity", b""):  # asked for identity: a compressed stream is refused
                raise _Fail("protocol", "compressed answer (Content-Encoding) to a request for identity")
            if status != 200:
                raise _Fail("http_status", f"HTTP {status}{_redirect_note(status)}{await _hint(conn)}")
            stage = "stream not complete"
            total = 0
            while not stream.finished:
                piece = await conn.read()
                now = time.monotonic()  # the piece's arrival: what TTFT and the token gaps are made of
                if not piece:
                    stream.end(now)
                    break
                total += len(piece)
                if total > limits.max_body_bytes:
                    raise _Fail("too_large", f"answer over {limits.max_body_bytes} bytes")
                stream.feed(piece, now)
        ended = time.monotonic()
        if not stream.token_times:
            if not stream.completion_tokens or stream.first_choice_at is None:
                raise _Fail("empty", "the stream carried no text")
            # Tokens generated (usage says so) but none visible: the first output is the first chunk.
            stream.token_times.append(stream.first_choice_at)
        return _timing(True, "", "", started, record, stream, ended)
    except _Fail as failure:
        return _timing(False, failure.reason, failure.message, started, record, stream, None)
    except TimeoutError:
        return _timing(False, "timeout", f"{stage} within {timeout_s:g}s", started, record, stream, None)
    except ssl.SSLCertVerificationError as error:
        return _timing(False, "tls", f"certificate not trusted ({error.verify_message})", started, record,
                       stream, None)
    except HeadTooLarge:
        what = "response head" if record.response_at is None else "chunk-size line"
        reason = "too_large" if record.response_at is None else "protocol"
        return _timing(False, reason, f"{what} over {limits.max_head_bytes} bytes", started, record, stream, None)
    except ProtocolError as error:
        return _timing(False, "protocol", str(error), started, record, stream, None)
    except ClosedEarly:
        return _timing(False, "connection", f"connection closed: {stage}", started, record, stream, None)
    except ssl.SSLError as error:
        return _timing(False, "tls", f"TLS: {error.reason or type(error).__name__}", started, record, stream, None)
    except OSError as error:
        return _timing(False, "connection", f"{type(error).__name__}: {stage}", started, record, stream, None)
    finally:
        if conn is not None:
            conn.abort()  # one request per connection; nothing is kept


def _redirect_note(status: int) -> str:
    return " (a redirect: not followed)" if 300 <= status < 400 else ""


async def _hint(conn: Connection) -> str:
    """What an error answer says (OpenAI style {"error": {"message": ...}}, else its text), short and
    printable; the first _ERROR_BODY bytes within half a second."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(0.5):
            while size < _ERROR_BODY and (piece := await conn.read()):
                chunks.append(piece)
                size += len(piece)
    except (TimeoutError, ProtocolError, ClosedEarly, OSError):
        return ""
    return error_hint(b"".join(chunks)[:_ERROR_BODY], raw_text=True)


def _timing(ok: bool, reason: str, message: str, started: float, record: _Marks, stream: _Stream,
            ended: float | None) -> CompletionTiming:
    sent = record.sent_at
    times = tuple(stream.token_times)
    ttft = times[0] - sent if ok and times and sent is not None else None
    itl = tuple(b - a for a, b in zip(times, times[1:], strict=False)) if ok else ()
    completion = stream.completion_tokens
    return CompletionTiming(
        ok=ok, reason=reason, message=message, status=record.status, started_at=started,
        connect_s=record.connect_s, sent_at=sent, response_at=record.response_at, token_times=times,
        ttft_s=ttft, itl_s=itl, e2e_s=ended - sent if ok and ended is not None and sent is not None else None,
        prompt_tokens=stream.prompt_tokens,
        completion_tokens=completion if completion is not None else len(times),
        usage_reported=completion is not None)
