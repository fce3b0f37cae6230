"""Small OpenAI-compatible clients for the live engines, on the standard library only (the project venv's
tests must not need an HTTP client package). Every call is bounded by a timeout."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import time
import urllib.parse

from tests.live.engines import SERVED_MODEL_NAME

REQUEST_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Completion:
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    chunks: int  # streamed events with text (1 for a non-streaming answer)
    seconds: float
    aborted: bool = False


def _connection(base_url: str, timeout: float) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(base_url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def get_json(base_url: str, path: str, timeout: float = 10.0) -> tuple[int, object]:
    conn = _connection(base_url, timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, body.decode(errors="replace")
    finally:
        conn.close()


def complete(
    base_url: str,
    prompt: str | None = None,
    *,
    messages: list[dict] | None = None,
    max_tokens: int = 16,
    stream: bool = False,
    abort_after_chunks: int | None = None,
    timeout: float = REQUEST_TIMEOUT_S,
) -> Completion:
    """One /v1/completions (prompt) or /v1/chat/completions (messages) request. `abort_after_chunks` closes
    the socket mid-stream, the way a client that gives up does."""
    path = "/v1/chat/completions" if messages is not None else "/v1/completions"
    body: dict = {"model": SERVED_MODEL_NAME, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream,
                  # Random weights may hit the end token at once: ignoring it keeps token counts predictable.
                  "ignore_eos": True}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.monotonic()
    conn = _connection(base_url, timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if not stream or r.status != 200:
            data = json.loads(r.read() or b"{}")
            usage = data.get("usage") or {}
            return Completion(r.status, usage.get("prompt_tokens"), usage.get("completion_tokens"), 1,
                              time.monotonic() - t0)
        chunks, usage = 0, {}
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if event.get("usage"):
                usage = event["usage"]
            if event.get("choices"):
                chunks += 1
                if abort_after_chunks is not None and chunks >= abort_after_chunks:
                    return Completion(r.status, None, None, chunks, time.monotonic() - t0, aborted=True)
        return Completion(r.status, usage.get("prompt_tokens"), usage.get("completion_tokens"), chunks,
                          time.monotonic() - t0)
    finally:
        conn.close()


def burst(base_url: str, prompts: list[str], *, max_tokens: int = 32, stream: bool = False,
          timeout: float = REQUEST_TIMEOUT_S) -> list[Completion]:
    """All prompts at once, one thread each: more than the engine's seq/slot cap makes requests wait."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(complete, base_url, p, max_tokens=max_tokens, stream=stream, timeout=timeout)
                   for p in prompts]
        return [f.result(timeout=timeout + 10) for f in futures]
