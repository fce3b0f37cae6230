"""Run inside a fresh user, network and mount namespace (`unshare -rnm --fork python
tests/netns_veth.py`) by tests/test_host_net_live.py: mounts that namespace's sysfs on /sys,
makes a veth pair eth0 <-> eth1 (a pod's eth0 is a veth too), starts the real `llm-exporter run`
with the host source on /sys, listening on the namespace's loopback only, sends raw Ethernet
frames from eth0 to eth1 (AF_PACKET) while it polls /metrics from inside the namespace, and
prints one JSON line: what was sent, and what the exporter said about the pair."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

FRAME_BYTES = 1000
ETHERTYPE = b"\x88\xb5"  # IEEE 802 local experimental
DEADLINE_S = 60.0  # generous: the machine may be loaded; the exporter's own cycles decide


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def metrics(base: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(base + "/metrics", timeout=5).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("llm_host_network_"):
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
    sh("mount", "-t", "sysfs", "sysfs", "/sys")
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
    sh("ip", "link", "set", "eth0", "up")
    sh("ip", "link", "set", "eth1", "up")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    exporter = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "500ms",
         "--gpu-backend", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
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
        while time.monotonic() < deadline:
            time.sleep(0.2)
            sent_before = sent[0]
            with contextlib.suppress(httpx.HTTPError):
                seen = metrics(base)
                tx = seen.get(("llm_host_network_transmit_bytes_total", (("device", "eth0"),)), 0.0)
                rx = seen.get(("llm_host_network_receive_bytes_total", (("device", "eth1"),)), 0.0)
                util = seen.get(("llm_host_network_utilization_ratio", (("device", "eth0"), ("direction", "transmit"))),
                                0.0)
                result = {"ok": tx >= sent_before > 0 and rx >= sent_before and util > 0, "sent_before": sent_before,
                          "eth0_transmit_bytes": tx, "eth1_receive_bytes": rx, "eth0_transmit_utilization": util,
                          "series": sorted(f"{n}{dict(lbl)}" for n, lbl in seen)}
                if result["ok"]:
                    break
    finally:
        stop.set()
        sender.join()
        exporter.terminate()
        try:
            _, err = exporter.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            exporter.kill()
            _, err = exporter.communicate()
    result["exporter_stderr_tail"] = err.decode(errors="replace")[-1500:]
    result["in_process"] = in_process_check()
    # The exporter listened inside this namespace only: nothing outside can reach its port.
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
