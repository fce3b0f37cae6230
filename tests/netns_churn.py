"""Run inside a fresh user, network and mount namespace (`unshare -rnm --fork python
tests/netns_churn.py`) by tests/test_hardening_host_r3.py: mounts that namespace's sysfs on /sys,
makes veth pairs whose names no default exclude covers, and renames every one of them again and
again (pods come and go; each rename is a name gone and a new one), first under the real
`llm-exporter run` (its RSS and its log lines), then under a HostSource in this process reading
the same real sysfs (the Python heap it keeps, by tracemalloc, and its log records). Prints one
JSON line."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import IO

import httpx
import psutil

PAIRS = 30  # 60 interfaces: within MAX_NETWORK_LINKS, so every one is read
PROCESS_CHURN_S = 4.0
ROUND_PAUSE_S = 0.12  # a little over the exporter's 100 ms cycle: it sees each generation
IN_PROCESS_ROUNDS = 60


class Links:
    """veth pairs renamed through one `ip -batch` process (an `ip` per command would be slower
    than the exporter)."""

    def __init__(self, pairs: int) -> None:
        self._ip = subprocess.Popen(["ip", "-force", "-batch", "-"], stdin=subprocess.PIPE, text=True,
                                    stdout=subprocess.DEVNULL)
        self.generation = 0
        self.names = [f"g0p{n}{end}" for n in range(pairs) for end in "ab"]
        self._send([f"link add g0p{n}a type veth peer name g0p{n}b" for n in range(pairs)])
        self.seen = len(self.names)

    def _send(self, commands: list[str]) -> None:
        assert self._ip.stdin is not None
        self._ip.stdin.write("".join(c + "\n" for c in commands))
        self._ip.stdin.flush()

    def rename_all(self) -> None:
        self.generation += 1
        new = [f"g{self.generation}{name[name.index('p'):]}" for name in self.names]
        self._send([f"link set {old} name {name}" for old, name in zip(self.names, new, strict=True)])
        self.names = new
        self.seen += len(new)

    def close(self) -> None:
        assert self._ip.stdin is not None
        self._ip.stdin.close()
        self._ip.wait(timeout=60)


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def lines(log: IO[bytes]) -> int:
    log.seek(0)
    return log.read().count(b"\n")


def real_process(log: IO[bytes]) -> dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    links = Links(PAIRS)  # there at start: found by the first discovery, whatever the interval
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "100ms",
         "--gpu-backend", "none"],
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        time.sleep(1.5)  # the first generation found and read: its lines are not churn's
        watched = psutil.Process(exporter.pid)
        rss0, lines0 = watched.memory_info().rss, lines(log)
        started = time.monotonic()
        while time.monotonic() - started < PROCESS_CHURN_S:
            links.rename_all()
            time.sleep(ROUND_PAUSE_S)
        time.sleep(0.5)
        page = httpx.get(base + "/metrics", timeout=5).text
        return {"names": links.seen, "rss_growth_bytes": watched.memory_info().rss - rss0,
                "log_lines": lines(log) - lines0,
                "network_info_series": sum(line.startswith("llm_host_network_info{") for line in page.splitlines()),
                "alive": exporter.poll() is None}
    finally:
        links.close()
        exporter.terminate()
        try:
            exporter.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.wait()


class Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1


def in_process() -> dict:
    from exporter.sources.host import HostOptions, HostSource

    counted = Count()
    logger = logging.getLogger("exporter.sources.host")
    logger.addHandler(counted)
    logger.setLevel(logging.INFO)
    links = Links(PAIRS)
    source = HostSource(HostOptions(search_interval_s=0.0))  # the links listed again every cycle
    try:
        for _ in range(3):  # warm: the first generation found, the code paths run once
            links.rename_all()
            source.collect_sync()
            source.collect_sync()
        gc.collect()
        tracemalloc.start()
        before, records0 = tracemalloc.get_traced_memory()[0], counted.records
        for _ in range(IN_PROCESS_ROUNDS):
            links.rename_all()
            source.collect_sync()  # sees the links gone
            source.collect_sync()  # finds the new names
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return {"names": links.seen, "heap_growth_bytes": grown, "log_records": counted.records - records0}
    finally:
        source.close_sync()
        links.close()
        logger.removeHandler(counted)


def main() -> int:
    sh("mount", "-t", "sysfs", "sysfs", "/sys")
    sh("ip", "link", "set", "lo", "up")
    with tempfile.TemporaryFile() as log:
        result = {"process": real_process(log)}
        log.seek(0)
        result["exporter_stderr_tail"] = log.read().decode(errors="replace")[-1500:]
    for name in os.listdir("/sys/class/net"):  # the first part's links
        if name != "lo" and name.endswith("a"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    result["in_process"] = in_process()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
