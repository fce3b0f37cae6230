"""CPU per fetch of an engine's /metrics page: the httpx client EngineSource used to have against
exporter/httpclient.py, side by side in one run, over keep-alive.

The page is served by a separate process (its CPU is not counted), HTTP/1.1 with Content-Length,
so each client reuses one connection. Both clients run the same read loop EngineSource runs:
headers, status check, cap check, body. CPU is this process's (time.process_time), per fetch.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time

import httpx

from exporter.httpclient import HttpClient
from exporter.sources.engines.scrape import ACCEPT

PAGE_BYTES = 69 * 1024
FETCHES = 300
ROUNDS = 5
CAP = 8 << 20

_SERVER = r"""
import http.server, sys
body = sys.stdin.buffer.read()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def page() -> bytes:
    line = b'vllm:request_prompt_tokens_bucket{engine="0",le="%d.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} %d\n'
    out, i = [], 0
    size = 0
    while size < PAGE_BYTES:
        out.append(line % (i, i * 7))
        size += len(out[-1])
        i += 1
    return b"".join(out)[:PAGE_BYTES].rsplit(b"\n", 1)[0] + b"\n"


async def _httpx_loop(url: str, n: int) -> float:
    client = httpx.AsyncClient(timeout=httpx.Timeout(5.0), follow_redirects=False,
                               headers={"Accept": ACCEPT, "User-Agent": "llm-exporter"},
                               limits=httpx.Limits(max_connections=2, max_keepalive_connections=1),
                               trust_env=False)

    async def one() -> bytes:
        async with client.stream("GET", url, headers={}) as response:
            assert response.status_code == 200
            declared = response.headers.get("content-length")
            assert not (declared and declared.isdigit() and int(declared) > CAP)
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                assert size <= CAP
                chunks.append(chunk)
        return b"".join(chunks)
    try:
        return await _timed(one, n)
    finally:
        await client.aclose()


async def _ours_loop(url: str, n: int) -> float:
    client = HttpClient(url, timeout_s=5.0, headers={"Accept": ACCEPT, "User-Agent": "llm-exporter"})

    async def one() -> bytes:
        return await client.get(headers={}, max_body=CAP)
    try:
        return await _timed(one, n)
    finally:
        await client.aclose()


async def _timed(one, n: int) -> float:
    for _ in range(20):  # connect and warm up
        await one()
    started = time.process_time()
    for _ in range(n):
        body = await one()
    elapsed = time.process_time() - started
    assert len(body) > PAGE_BYTES - 200
    return elapsed / n * 1000


def run() -> list[tuple[str, str]]:
    body = page()
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        server.stdin.write(body)
        server.stdin.close()
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}/metrics"
        httpx_ms, ours_ms = [], []
        for _ in range(ROUNDS):  # interleaved, so drift on a shared machine hits both alike
            httpx_ms.append(asyncio.run(_httpx_loop(url, FETCHES)))
            ours_ms.append(asyncio.run(_ours_loop(url, FETCHES)))
    finally:
        server.terminate()
        server.wait(timeout=10)
    theirs, ours = statistics.median(httpx_ms), statistics.median(ours_ms)
    return [
        ("fetch payload, keep-alive", f"{len(body) / 1024:.0f} KB, Content-Length"),
        ("httpx.AsyncClient CPU per fetch", f"{theirs:.2f} ms"),
        ("ours (httpclient.py) CPU per fetch", f"{ours:.2f} ms"),
        ("ratio httpx / ours", f"{theirs / ours:.1f}x"),
    ]


if __name__ == "__main__":
    for label, value in run():
        print(f"{label:40} {value}")
