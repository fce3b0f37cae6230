"""The kubelet's pod-resources client in the exporter (issue 43): the DaemonSet mode, which asks the
kubelet every 5 s and labels every GPU with the pod holding it, against the same exporter without
it, side by side in one window. The twin serves a node of 8 GPUs; a real gRPC pod-resources server
(tests/podresources_server.py) on a unix socket holds them in pods of 1, 2 and 0 GPUs. Both
exporters collect every 1 s; the rows are their CPU share of one core and their RSS, against the
exporter's bars (bench_metrics: CPU < 2%, RSS < 80 MB). Without a socket grpc is never imported
(tests/test_podresources.py), so the plain sidecar pays nothing."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
WINDOW_S = 20.0


def run() -> list[tuple[str, str]]:
    sys.path.insert(0, str(ROOT))
    from bench.bench_metrics import _cpu_and_rss
    from tests.podresources_server import node_of_eight
    from tests.support import background_process, free_port, stop_process, wait_until

    twin_port = free_port()
    twin = f"http://127.0.0.1:{twin_port}"
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        stack.enter_context(background_process(
            [sys.executable, "-m", "exporter.simulator", "--port", str(twin_port), "--gpus", "8"], twin + "/health"))
        uuids = [g["uuid"] for g in sorted(httpx.get(twin + "/sim/gpu", timeout=5).json()["gpus"],
                                           key=lambda g: g["index"])]
        sock, node = os.path.join(d, "kubelet.sock"), os.path.join(d, "node.json")
        pathlib.Path(node).write_text(json.dumps(node_of_eight(uuids)))
        kubelet = subprocess.Popen([sys.executable, "-m", "tests.podresources_server", sock, node],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        stack.callback(stop_process, kubelet)
        assert wait_until(lambda: os.path.exists(sock), timeout=20), "the pod-resources server did not start"
        exporters = {}
        for name, extra in (("plain", ()), ("mapping", ("--kubernetes-gpu-mapping", "--pod-resources-socket", sock))):
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            process = stack.enter_context(background_process(
                [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "1s",
                 "--gpu-backend", "sim", "--sim-url", twin, "--no-host", *extra], base + "/readyz"))
            exporters[name] = (process.pid, base + "/metrics")
        mapped = exporters["mapping"][1]
        assert wait_until(lambda: 'pod="' in httpx.get(mapped, timeout=5).text, timeout=30), \
            "no GPU labelled with its pod"
        time.sleep(3)  # a few cycles, and one kubelet refresh, before the window
        # Both measured over the same seconds: whatever else the machine does loads both alike.
        results: dict[str, tuple[float, float, float]] = {}

        def measure(name: str, pid: int, url: str) -> None:
            results[name] = _cpu_and_rss(pid, url, WINDOW_S)

        threads = [threading.Thread(target=measure, args=(n, p, u)) for n, (p, u) in exporters.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    plain, mapping = results["plain"], results["mapping"]

    def per_cycle(r: tuple[float, float, float]) -> float:
        return r[0] * WINDOW_S / max(r[2], 1) * 1000

    return [
        (f"pod-resources: exporter CPU share, 8 sim GPUs at 1 s over {WINDOW_S:.0f} s, plain / DaemonSet mapping "
         "(target < 2%)", f"{plain[0] * 100:.2f}% / {mapping[0] * 100:.2f}%"),
        ("pod-resources: exporter CPU per cycle, plain / DaemonSet mapping (ms)",
         f"{per_cycle(plain):.1f} / {per_cycle(mapping):.1f}"),
        ("pod-resources: exporter RSS, plain / with the gRPC client (MB, target < 80)",
         f"{plain[1]:.1f} / {mapping[1]:.1f}"),
    ]


def main() -> None:
    for label, value in run():
        print(f"{label:<100}{value}")


if __name__ == "__main__":
    main()
