"""Run inside a fresh user, network and mount namespace (`unshare -rnm --fork python
tests/netns_veth.py`) by tests/test_host_net_live.py: mounts that namespace's sysfs on /sys,
makes a veth pair eth0 <-> eth1 (a pod's eth0 is a veth too), starts the real `llm-exporter run`
with the host source on /sys, listening on the namespace's loopback only, sends raw Ethernet
frames from eth0 to eth1 (AF_PACKET) while it polls /metrics from inside the namespace, and
prints one JSON line: what was sent, and what the exporter said about the pair."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

import httpx
from prometheus_client.parser import text_string_to_metric_families

FRAME_BYTES = 1000
ETHERTYPE = b"\x88\xb5"  # IEEE 802 local experimental
DEADLINE_S = 60.0  # generous: the machine may be loaded; the exporter's own cycles decide


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def metrics(base: str) -> dict[tuple[str, tuple], float]:
    response = httpx.get(base + "/metrics", timeout=5)
    if response.status_code != 200:  # 503 until the first collection is published
        return {}
    text = response.text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("llm_host_network_") or s.name == "llm_exporter_collections_total":
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def in_process_check() -> dict:
    """HostSource in this process: the sysfs here is this namespace's, so the NICs' counters come
    from /proc/self/net/dev, and they agree with the statistics files."""
    from exporter.sources.host import HostOptions, HostSource

    source = HostSource(HostOptions())
    data = source.collect_sync()
    rx = {dict(s.labels)["device"]: s.value for s in data.samples
          if s.name == "llm_host_network_receive_bytes_total"}
    files = {d: int(pathlib.Path(f"/sys/class/net/{d}/statistics/rx_bytes").read_text()) for d in ("eth0", "eth1")}
    checked = {"own_namespace": source.network._own_namespace,  # noqa: SLF001 - what is checked
               "proc_net_dev_held": "/proc/self/net/dev" in source.held_files,
               "counters_agree": all(rx.get(d) is not None and rx[d] <= files[d] for d in files)}
    source.close_sync()
    return checked


def main() -> int:
    with tempfile.TemporaryFile() as log:
        return run(log)


def run(log: IO[bytes]) -> int:
    sh("mount", "-t", "sysfs", "sysfs", "/sys")
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
    sh("ip", "link", "set", "eth0", "up")
    sh("ip", "link", "set", "eth1", "up")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    # stderr to a file, not a pipe nobody reads while it runs (a pipe blocks the writer at 64 KiB).
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "500ms",
         "--gpu-backend", "none", "--profile", "full"],  # the raw link counters are full's
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    sent = [0]
    stop = threading.Event()

    def send() -> None:
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
            raw.bind(("eth0", 0))
            src = bytes.fromhex(pathlib.Path("/sys/class/net/eth0/address").read_text().strip().replace(":", ""))
            frame = b"\xff" * 6 + src + ETHERTYPE + b"x" * (FRAME_BYTES - 14)
            while not stop.is_set():
                for _ in range(50):
                    raw.send(frame)
                    sent[0] += FRAME_BYTES
                time.sleep(0.02)

    sender = threading.Thread(target=send, daemon=True)
    result: dict = {"ok": False}
    try:
        sender.start()
        deadline = time.monotonic() + DEADLINE_S
        # Counted in the exporter's own cycles, not in seconds (the machine may be loaded): the
        # bytes sent before a page showing cycle N must be on the page of cycle N + 2 at the latest
        # (cycle N + 1 may have read the counters before they were sent).
        mark: tuple[int, float] | None = None  # (bytes sent, cycles completed) when marked
        while time.monotonic() < deadline:
            time.sleep(0.05)
            sent_now = sent[0]
            try:
                seen = metrics(base)
            except httpx.HTTPError:
                continue
            cycles = seen.get(("llm_exporter_collections_total", ()), 0.0)
            if mark is None:
                if cycles >= 1 and sent_now > 0:
                    mark = (sent_now, cycles)
                continue
            tx = seen.get(("llm_host_network_transmit_bytes_total", (("device", "eth0"),)), 0.0)
            rx = seen.get(("llm_host_network_receive_bytes_total", (("device", "eth1"),)), 0.0)
            util = seen.get(("llm_host_network_utilization_ratio", (("device", "eth0"), ("direction", "transmit"))),
                            0.0)
            result = {"ok": tx >= mark[0] and rx >= mark[0] and util > 0, "sent_before": mark[0],
                      "cycles_after_mark": cycles - mark[1], "eth0_transmit_bytes": tx, "eth1_receive_bytes": rx,
                      "eth0_transmit_utilization": util,
                      "series": sorted(f"{n}{dict(lbl)}" for n, lbl in seen if n.startswith("llm_host_network_"))}
            if result["ok"] or cycles - mark[1] > 2:
                break
    finally:
        stop.set()
        sender.join()
        exporter.terminate()
        try:
            exporter.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exporter.kill()
            exporter.wait()
    log.seek(0)
    result["exporter_stderr_tail"] = log.read().decode(errors="replace")[-1500:]
    result["in_process"] = in_process_check()
    # The exporter listened inside this namespace only: nothing outside can reach its port.
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
