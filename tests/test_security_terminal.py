"""Issue 27, class 4: terminal escapes in remote text. An engine's model name holding
ESC [2J ESC [1A "status: HEALTHY" BEL was printed raw by `doctor` (and remote text by the
`loadtest` table): it could clear the screen and forge a verdict over a DEGRADED report. Now
exporter/termsafe.py shows every control escaped at the boundary where they print."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from exporter.termsafe import terminal_safe, terminal_safe_tree
from tests.support import fake_engine

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "engines" / "vllm-v0.11__documented.prom"
FORGED = "\x1b[2J\x1b[1A status: HEALTHY\x07"
RAW = (b"\x1b", b"\x07", b"\x9b", "\u202e".encode())


def test_the_sanitizer_escapes_every_control_and_keeps_the_text():
    assert terminal_safe(FORGED) == "\\x1b[2J\\x1b[1A status: HEALTHY\\x07"
    assert terminal_safe("a\tb\nc\rd\x7fe\x9bf\u202eg\u2066h") == "a\tb\\x0ac\\x0dd\\x7fe\\x9bf\\u202eg\\u2066h"
    assert terminal_safe("line 1\nline 2", newlines=True) == "line 1\nline 2"
    assert terminal_safe("llama-3.1-8b é 模型") == "llama-3.1-8b é 模型"
    assert terminal_safe_tree({"m\x1b": [FORGED, 1, None]}) == {"m\\x1b": [terminal_safe(FORGED), 1, None]}


def test_doctor_prints_a_forged_model_name_escaped():
    """The real `doctor` against a fake vLLM whose model_name label holds the escapes: no raw ESC,
    BEL, CSI or bidi byte on stdout or stderr, and the name is still there, readable."""
    page = FIXTURE.read_bytes().replace(b"meta-llama/Llama-3.1-8B-Instruct", FORGED.encode())
    assert FORGED.encode() in page
    with fake_engine(page) as (url, behaviour):
        result = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--engine", url + ",kind=vllm",
                                 "--duration", "1s", "--gpu-backend", "none", "--no-host"],
                                capture_output=True, timeout=120)
        assert behaviour.requests > 0
    output = result.stdout + result.stderr
    assert b"status:" in result.stdout, output
    for raw in RAW:
        assert raw not in output, output
    assert b"\\x1b[2J\\x1b[1A status: HEALTHY\\x07" in result.stdout, output
    assert result.stdout.count(b"\nstatus: ") == 1  # the forged one is not at the start of a line


def test_loadtest_prints_a_forged_verdict_escaped(tmp_path):
    """The real `loadtest` against a streaming server that is also its exporter, whose diagnosis
    names a verdict and evidence holding the escapes (the table prints the verdict per step)."""
    import asyncio
    import contextlib
    import json
    import threading

    from tests.test_loadtest import StreamServer

    class Forging(StreamServer):
        async def exporter(self, path: bytes, writer: asyncio.StreamWriter) -> None:
            if path != b"/api/v1/diagnosis":
                return await super().exporter(path, writer)
            doc = {"ready": True, "targets": {FORGED: {"verdict": FORGED + "\u202e", "evidence": [FORGED],
                                                       "numbers": {"running": self.in_flight}}}}
            payload = json.dumps(doc).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(payload)).encode() + b"\r\nConnection: close\r\n\r\n" + payload)
            await writer.drain()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = Forging()
    asyncio.run_coroutine_threadsafe(server.__aenter__(), loop).result(10)
    try:
        result = subprocess.run([sys.executable, "-m", "exporter.cli", "loadtest", server.url, "--exporter", server.url,
                                 "--concurrency", "1", "--warmup", "0s", "--duration", "1s",
                                 "--json", str(tmp_path / "r.json")], capture_output=True, timeout=120)
    finally:
        asyncio.run_coroutine_threadsafe(server.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        with contextlib.suppress(Exception):
            loop.close()
    output = result.stdout + result.stderr
    assert server.ok > 0, output
    assert b"status: HEALTHY" in output, output  # the forged text is shown, readable, escaped
    for raw in RAW:
        assert raw not in output, output
    json.loads((tmp_path / "r.json").read_text())  # the JSON report stays valid (escaped by json)
