"""/metrics latency of the exporter (8 fake GPUs, 4 engine targets, the host source) next to the
Debian prometheus-node-exporter's own scrape latency, measured in the same run, same client,
requests interleaved so both see the same machine load."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import statistics
import sys
import time

import httpx

from tests.support import background_process

ROOT = pathlib.Path(__file__).resolve().parent.parent
REQUESTS = 400
CPU_WINDOW_S = 20.0
WARMUP = 20
FRESH_SCRAPES = 15


def _process(command: list[str], ready_url: str):
    return background_process(command, ready_url, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


def _node_exporter() -> str | None:
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def _percentiles(durations: list[float]) -> tuple[float, float]:
    ordered = sorted(durations)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def _process_cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cycles(url: str) -> float:
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith("llm_exporter_collections_total "):
            return float(line.split()[1])
    return 0.0


def _cpu_and_rss(pid: int, url: str, window_s: float) -> tuple[float, float, float]:
    """CPU share while only collecting (one scrape at each end, as a 15 s Prometheus would)."""
    cycles_before, cpu_before = _cycles(url), _process_cpu_seconds(pid)
    time.sleep(window_s)
    cpu_after, cycles_after = _process_cpu_seconds(pid), _cycles(url)
    return (cpu_after - cpu_before) / window_s, _rss_mb(pid), cycles_after - cycles_before


def _first_scrapes_of_a_cycle(url: str, count: int) -> list[float]:
    """A cycle's page is rendered by its first scrape; Prometheus, scraping every 15 s against a
    1 s collection interval, only ever makes first scrapes. Each one here waits for a new cycle."""
    durations = []
    with httpx.Client(timeout=5) as client:
        for _ in range(count):
            time.sleep(1.05)
            started = time.perf_counter()
            client.get(url).raise_for_status()
            durations.append(time.perf_counter() - started)
    return durations


def run() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT))
    from bench.bench_soak import engines_process
    from tests.support import free_port

    rows: list[tuple[str, str]] = []
    with contextlib.ExitStack() as stack:
        # Four targets serving the vLLM capture, kept alive, from a process of their own.
        engines_port = free_port()
        stack.enter_context(engines_process(engines_port))
        port = free_port()
        command = [sys.executable, "-m", "bench.exporter_with_fakes", "--listen", f"127.0.0.1:{port}", "--gpus", "8"]
        for index in range(4):
            command += ["--engine", f"http://127.0.0.1:{engines_port}/stable,name=e{index}"]
        exporter = stack.enter_context(_process(command, f"http://127.0.0.1:{port}/readyz"))
        ours_url = f"http://127.0.0.1:{port}/metrics"
        targets = {"llm-exporter": ours_url}
        node_binary = _node_exporter()
        if node_binary:
            node_port = free_port()
            node_url = f"http://127.0.0.1:{node_port}/metrics"
            stack.enter_context(_process([node_binary, f"--web.listen-address=127.0.0.1:{node_port}"], node_url))
            targets["node_exporter"] = node_url
        time.sleep(2.5)  # a few collection cycles so GPU rates and CPU ratios exist
        durations: dict[str, list[float]] = {name: [] for name in targets}
        sizes: dict[str, int] = {}
        failures: dict[str, int] = {name: 0 for name in targets}
        clients = {name: httpx.Client(timeout=2) for name in targets}
        for index in range(REQUESTS + WARMUP):
            for name, url in targets.items():
                started = time.perf_counter()
                try:
                    response = clients[name].get(url)
                except httpx.HTTPError:
                    # Seen with node_exporter on a loaded machine: a keep-alive request that never
                    # answers. Counted, and the connection is replaced.
                    failures[name] += 1
                    clients[name].close()
                    clients[name] = httpx.Client(timeout=2)
                    continue
                elapsed = time.perf_counter() - started
                if index >= WARMUP:
                    durations[name].append(elapsed)
                sizes[name] = len(response.content)
        for client in clients.values():
            client.close()
        lines = httpx.get(ours_url).text.count("\n")
        fresh = _first_scrapes_of_a_cycle(ours_url, FRESH_SCRAPES)
        cpu_share, rss_mb, cycles = _cpu_and_rss(exporter.pid, ours_url, CPU_WINDOW_S)
    ours_p50, ours_p99 = _percentiles(durations["llm-exporter"])
    rows.append(("/metrics payload, 8 GPUs + 4 engines + host (lines / KB)",
                 f"{lines} / {sizes['llm-exporter'] / 1024:.0f}"))
    rows.append(("llm-exporter /metrics p50 / p99 (ms)", f"{ours_p50:.2f} / {ours_p99:.2f}"))
    rows.append((f"llm-exporter first scrape of a cycle (renders the page), p50 / max of {FRESH_SCRAPES} (ms)",
                 f"{statistics.median(fresh) * 1000:.2f} / {max(fresh) * 1000:.2f}"))
    rows.append(("requests that failed (ours / node_exporter)",
                 f"{failures['llm-exporter']} / {failures.get('node_exporter', '-')}"))
    rows.append((f"exporter CPU share of one core at 1 s interval, over {CPU_WINDOW_S:.0f} s, "
                 "scraped at both ends (target < 2%)",
                 f"{cpu_share * 100:.2f}%"))
    rows.append(("exporter CPU per collection cycle (ms)", f"{cpu_share * CPU_WINDOW_S / max(cycles, 1) * 1000:.1f}"))
    rows.append(("exporter RSS after the run (MB, target < 80)", f"{rss_mb:.1f}"))
    if "node_exporter" in durations:
        node_p50, node_p99 = _percentiles(durations["node_exporter"])
        rows.append(("node_exporter /metrics p50 / p99 (ms), same run", f"{node_p50:.2f} / {node_p99:.2f}"))
        rows.append(("ratio ours / node_exporter at p50 (target <= 0.2)", f"{ours_p50 / node_p50:.2f}"))
        rows.append(("ratio ours / node_exporter at p99 (target <= 1)", f"{ours_p99 / node_p99:.2f}"))
        rows.append(("ratio ours (first scrape of a cycle) / node_exporter at p50",
                     f"{statistics.median(fresh) * 1000 / node_p50:.2f}"))
    else:
        rows.append(("node_exporter", "not installed (make bench installs prometheus-node-exporter)"))
    return rows
