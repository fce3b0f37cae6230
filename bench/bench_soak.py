"""Soak: the exporter (its own process: 8 fake GPUs, the host source, 4 engine targets) scraped
continuously while its targets churn and fail, for LLM_EXPORTER_SOAK_S seconds (default 600).

The four targets, served on loopback by a process of their own (as engines are: their server
threads must not share a GIL with the client that times the scrapes):
- stable: the vLLM v0.11 capture, always up;
- flapping: up 5 s, then 5 s of dropped connections, again and again;
- faulty: every 3 s the next of HTTP 500, garbage bytes, a hang past the timeout, an HTML page,
  a truncated body and a good page;
- churning: up, but its model name changes every 5 s among 4 names, so a whole page of series
  disappears and another appears (models swapped back and forth behind one endpoint). With a new
  name every time instead (an unbounded label), RSS grows until the bounded label caches are full
  (the renderer's 50,000 label sets, the normalizer's 2 x 20,000): +28 MB over 10 minutes here,
  then flat; that is the cost of those bounds, not a leak (tracemalloc shows the heap flat).

Measured on the exporter process after a warm-up (a fifth of the run, 20 to 60 s) and at the
end: RSS, open file descriptors, threads; and the latency of every scrape (a client asking every
100 ms, as several Prometheus replicas with short intervals would). tests/test_soak.py runs the
same soak for 60 s with generous bounds so a leak fails CI.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import pathlib
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from tests.support import PROMETHEUS_TEXT, QuietServer, background_process, free_port, send_body

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENGINE_BODY = (ROOT / "tests" / "fixtures" / "engines" / "vllm-v0.11__documented.prom").read_bytes()
MODEL = b"meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_SOAK_S = 600.0
SCRAPE_EVERY_S = 0.1
MODELS = 4  # the churning target cycles through this many model names
FAULTS = ("http500", "garbage", "hang", "html", "truncated", "good")


@dataclass
class Probe:
    rss_mb: float
    fds: int
    threads: int


@dataclass
class SoakResult:
    duration_s: float
    warm: Probe
    end: Probe
    latencies_s: list[float] = field(default_factory=list)
    failed_scrapes: int = 0
    cycles: float = 0.0
    engine_requests: dict[str, int] = field(default_factory=dict)

    @property
    def rss_growth_mb(self) -> float:
        return self.end.rss_mb - self.warm.rss_mb

    @property
    def max_latency_ms(self) -> float:
        return max(self.latencies_s) * 1000

    @property
    def p99_latency_ms(self) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000

    @property
    def p50_latency_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000


def probe(pid: int) -> Probe:
    status = pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].split() for line in status if ":" in line}
    return Probe(int(fields["VmRSS"][0]) / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"][0]))


def settled_probe(pid: int, samples: int = 5, gap_s: float = 0.2) -> Probe:
    """The process over about a second: the fewest fds and threads seen, the last RSS. A socket in
    flight (a flapping engine reconnecting, a scrape) comes and goes between two probes; a leaked
    one stays in every probe. (A single probe once read 31 then 34 fds with nothing leaking.)"""
    probes = [probe(pid)]
    for _ in range(samples - 1):
        time.sleep(gap_s)
        probes.append(probe(pid))
    return Probe(probes[-1].rss_mb, min(p.fds for p in probes), min(p.threads for p in probes))


class ChurningEngines:
    """The four targets on one loopback server, each a path; behaviour follows the wall clock."""

    def __init__(self, port: int = 0) -> None:
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.requests: dict[str, int] = {"stable": 0, "flapping": 0, "faulty": 0, "churning": 0}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.strip("/")
                if path == "counts":
                    self.send(json.dumps(owner.requests).encode(), ctype="application/json")
                    return
                if path not in owner.requests:
                    self.send_error(404)
                    return
                owner.requests[path] += 1
                elapsed = time.monotonic() - owner.started
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    if path == "stable":
                        self.send(ENGINE_BODY)
                    elif path == "flapping":
                        if int(elapsed // 5) % 2 == 0:
                            self.send(ENGINE_BODY)
                        else:
                            self.close_connection = True
                            self.connection.shutdown(2)
                    elif path == "churning":
                        self.send(ENGINE_BODY.replace(MODEL, f"model-{int(elapsed // 5) % MODELS}".encode()))
                    else:
                        self.fault(FAULTS[int(elapsed // 3) % len(FAULTS)], owner.requests[path])

            def fault(self, kind: str, n: int) -> None:
                if kind == "http500":
                    self.send(b"upstream exploded", 500)
                elif kind == "garbage":
                    self.send(random.Random(n).randbytes(8192))
                elif kind == "hang":
                    owner.stop.wait(2.0)
                    self.close_connection = True
                elif kind == "html":
                    self.send(b"<html><body>502 Bad Gateway</body></html>", 200, "text/html")
                elif kind == "truncated":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(ENGINE_BODY)))
                    self.end_headers()
                    self.wfile.write(ENGINE_BODY[:4000])
                    self.close_connection = True
                else:
                    self.send(ENGINE_BODY)

            def send(self, body: bytes, status: int = 200, ctype: str = PROMETHEUS_TEXT) -> None:
                send_body(self, body, status, ctype)

            def log_message(self, *args: object) -> None:
                return

        self.server = QuietServer(("127.0.0.1", port), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def exporter_process(engine_base: str, port: int):
    command = [sys.executable, "-m", "bench.exporter_with_fakes", "--listen", f"127.0.0.1:{port}", "--gpus", "8"]
    for name in ("stable", "flapping", "faulty", "churning"):
        command += ["--engine", f"{engine_base}/{name},name={name}"]
    return background_process(command, f"http://127.0.0.1:{port}/readyz", cwd=str(ROOT),
                              env={**os.environ, "PYTHONPATH": str(ROOT)})


def engines_process(port: int):
    """ChurningEngines in a child process; `/counts` answers its request counts."""
    return background_process([sys.executable, "-m", "bench.bench_soak", "--serve-engines", str(port)],
                              f"http://127.0.0.1:{port}/counts", cwd=str(ROOT),
                              env={**os.environ, "PYTHONPATH": str(ROOT)})


def soak(duration_s: float, *, scrape_timeout_s: float = 5.0) -> SoakResult:
    sys.path.insert(0, str(ROOT))
    port, engines_port = free_port(), free_port()
    engines_base = f"http://127.0.0.1:{engines_port}"
    url = f"http://127.0.0.1:{port}/metrics"
    with engines_process(engines_port), exporter_process(engines_base, port) as process:
        warm_at = time.monotonic() + min(60.0, max(20.0, duration_s / 5))
        end_at = time.monotonic() + duration_s
        latencies: list[float] = []
        failed = 0
        warm: Probe | None = None
        cycles_start = 0.0
        with httpx.Client(timeout=scrape_timeout_s) as client:
            while time.monotonic() < end_at:
                started = time.perf_counter()
                try:
                    response = client.get(url)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.perf_counter() - started
                if not ok:
                    failed += 1
                if warm is None and time.monotonic() >= warm_at:
                    warm, cycles_start = settled_probe(process.pid), _cycles(response.text if ok else "")
                if warm is not None and ok:
                    latencies.append(elapsed)
                time.sleep(max(0.0, SCRAPE_EVERY_S - elapsed))
            end = settled_probe(process.pid)
            cycles = _cycles(client.get(url).text) - cycles_start
            engine_requests = client.get(f"{engines_base}/counts").json()
        assert warm is not None
        return SoakResult(duration_s, warm, end, latencies, failed, cycles, engine_requests)


def _cycles(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("llm_exporter_collections_total "):
            return float(line.split()[1])
    return 0.0


def run() -> list[tuple[str, str]]:
    duration = float(os.environ.get("LLM_EXPORTER_SOAK_S", DEFAULT_SOAK_S))
    r = soak(duration)
    return [
        (f"soak: {duration:.0f} s, 8 GPUs + host + 4 churning/failing targets, scraped every "
         f"{SCRAPE_EVERY_S * 1000:.0f} ms (LLM_EXPORTER_SOAK_S)",
         f"{len(r.latencies_s)} scrapes, {r.cycles:.0f} cycles"),
        ("soak: RSS after warm-up -> end (MB; growth target < 5)",
         f"{r.warm.rss_mb:.1f} -> {r.end.rss_mb:.1f} ({r.rss_growth_mb:+.1f})"),
        ("soak: open fds / threads, warm-up -> end (target: no growth)",
         f"{r.warm.fds} -> {r.end.fds} / {r.warm.threads} -> {r.end.threads}"),
        ("soak: scrape latency p50 / p99 / max (ms; max target < 50)",
         f"{r.p50_latency_ms:.2f} / {r.p99_latency_ms:.2f} / {r.max_latency_ms:.2f}"),
        ("soak: scrapes failed", str(r.failed_scrapes)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-engines", type=int, metavar="PORT", help="only serve the four targets")
    args = parser.parse_args()
    if args.serve_engines is None:
        for label, value in run():
            print(f"{label:<100}{value}")
        return
    engines = ChurningEngines(args.serve_engines)
    try:
        threading.Event().wait()  # until terminated
    finally:
        engines.close()


if __name__ == "__main__":
    main()
