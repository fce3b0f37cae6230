"""`llm-exporter demo` as a user runs it: twins, exporter, engine + GPU + host series on /metrics."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import free_port, wait_until


def test_demo_serves_engine_gpu_and_host_series_and_stops_on_ctrl_c():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}", "--interval", "300ms",
         "--gpus", "2", "--engines", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"

    def names() -> set[str]:
        try:
            response = httpx.get(base + "/metrics", timeout=2)
        except httpx.HTTPError:
            return set()
        if response.status_code != 200:
            return set()
        text = response.text
        return {s.name for f in text_string_to_metric_families(text) for s in f.samples}

    try:
        assert wait_until(lambda: {"llm_engine_up", "llm_gpu_power_watts", "llm_host_cpu_busy_ratio",
                                   "llm_decode_tokens_per_second", "llm_probe_up"} <= names(), timeout=30), names()
        text = httpx.get(base + "/metrics", timeout=2).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        up = {s.labels["target"]: s.value for s in samples if s.name == "llm_engine_up"}
        assert up == {"demo-0": 1.0, "demo-1": 1.0}
        gpus = {s.labels["gpu"] for s in samples if s.name == "llm_gpu_power_watts"}
        assert gpus == {"0", "1", "2", "3"}  # 2 engines x 2 GPUs, distinct indices
        assert any(s.name == "llm_time_to_first_token_seconds_count" and s.value > 0 for s in samples)
        # The demo probes each twin's OpenAI API as `run --probe` would (issue 18): client-side series
        # per engine target, with the target's engine label.
        def probed() -> dict[str, str]:
            text = httpx.get(base + "/metrics", timeout=2).text
            return {s.labels["target"]: s.labels["engine"] for f in text_string_to_metric_families(text)
                    for s in f.samples if s.name == "llm_probe_requests_total" and s.value >= 1}

        assert wait_until(lambda: len(probed()) == 2, timeout=20), probed()
        assert probed() == {"demo-0": "vllm", "demo-1": "vllm"}
        assert httpx.get(base + "/", timeout=2).status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
    stdout = process.stdout.read()
    assert process.returncode == 0, process.stderr.read()
    assert f"http://127.0.0.1:{port}/metrics" in stdout
    assert "probe         every 5s" in stdout


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--gpu", "NVIDIA X9000", "unknown GPU 'NVIDIA X9000': the twin knows"),
    ("--model", "llama-9000", "unknown model 'llama-9000'; built-in:"),
])
def test_demo_refuses_an_unknown_gpu_or_model_in_one_line(flag: str, value: str, said: str) -> None:
    """`llm-exporter demo` with a GPU or model the twin does not know: one line and the usage exit
    status (2), as loadtest --demo says it, not a traceback."""
    done = subprocess.run([sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{free_port()}",
                           flag, value], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("llm-exporter demo: " + said), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_second_demo_on_the_port_of_a_running_one_says_what_to_do_and_the_readme_agrees() -> None:
    """The README's quick start runs `make demo` (port 9480) and then suggests another scenario: it
    must not tell the user to start a second demo on the same port. The real second process fails
    in one line that says to stop the first or switch it with the printed curl line."""
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Running it next to a real engine")]
    assert "/sim/scenario?name=" in quick and "one demo at a time" in quick
    port = free_port()
    first = subprocess.Popen([sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}",
                              "--no-probe"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: _ready(port), timeout=30)
        second = subprocess.run([sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}",
                                 "--scenario", "kv-pressure"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr
        assert "Address already in use" in second.stderr and "curl line it printed" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=30)


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(240)
def test_a_throttled_gpu_under_full_kv_is_named_beside_kv_with_both_remedies() -> None:
    """The real demo in kv-pressure, switched to thermal-throttle with the curl line it prints and
    `backlog=keep`: the queue the heavy traffic built stays (as it would on a real engine whose GPU
    starts throttling), so KV stays full, and now the GPU throttles too. Both score alike: doctor names both, with both
    remedies, and the status page shows both."""
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}",
                             "--scenario", "kv-pressure", "--no-probe", "--speed", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _ready(port), timeout=30)
        switch = ""
        while "switch: curl" not in switch:
            switch = demo.stdout.readline()
        twin = switch.split("'")[1].split("/sim/")[0]

        def target() -> dict:
            return next(iter(httpx.get(base + "/api/v1/diagnosis", timeout=5).json()["targets"].values()), {})
        assert wait_until(lambda: target().get("verdict") == "kv_capacity", timeout=90, interval=1.0), target()
        httpx.post(twin + "/sim/scenario?name=thermal-throttle&backlog=keep", timeout=5).raise_for_status()
        assert wait_until(lambda: "power_thermal" in (target().get("also_limiting") or []), timeout=90,
                          interval=1.0), target()
        t = target()
        assert t["verdict"] == "kv_capacity" and t["status"] == "degraded"
        report = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", base], capture_output=True,
                                text=True, timeout=60).stdout
        assert "bottleneck: KV cache capacity, and as much power / thermal throttling" in report, report
        assert "limited by power_thermal as much" in report
        from exporter.derive.bottleneck import REMEDIES
        assert REMEDIES["power_thermal"][0] in report and REMEDIES["kv_capacity"][0] in report
        page = httpx.get(base + "/", timeout=5).text
        assert 'data-verdict="power_thermal"' in page and 'data-verdict="kv_capacity"' in page
    finally:
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=30)


@pytest.mark.timeout(120)
def test_demo_of_a_prefill_decode_scenario_serves_both_instances() -> None:
    """`llm-exporter demo --scenario pd-transfer`: the demo knows the scenario is a pair and starts
    both instances, each its own target and port (decode first), both pages carrying the KV-transfer
    families; the exporter scrapes both. The verdict is tests/test_demo_scenarios.py's."""
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}",
                             "--scenario", "pd-transfer", "--engine-format", "sglang", "--speed", "5",
                             "--interval", "300ms", "--no-probe"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _ready(port), timeout=30)
        twins: list[tuple[str, str]] = []
        while len(twins) < 2:
            line = demo.stdout.readline()
            assert line, demo.stderr.read()[-2000:]
            if line.startswith("  twin "):
                twins.append((line.split()[2], line.split("(")[1].split()[0]))
        assert [role for _, role in twins] == ["decode", "prefill"]

        def page(url: str) -> str:
            return httpx.get(url, timeout=5).text

        assert wait_until(lambda: "sglang:kv_transfer_latency_ms_bucket" in page(twins[1][0]), timeout=30)
        decode, prefill = page(twins[0][0]), page(twins[1][0])
        assert 'engine_type="decode"' in decode and "sglang:num_decode_transfer_queue_reqs{" in decode
        assert 'engine_type="prefill"' in prefill and "sglang:num_prefill_inflight_queue_reqs{" in prefill
        host = httpx.get(twins[0][0].replace("/metrics", "/sim/host"), timeout=5).json()
        assert [n["device"] for n in host["network"]] == ["eth0", "mlx5_0:1"]

        def up() -> dict[str, float]:
            return {s.labels["target"]: s.value for f in text_string_to_metric_families(page(base + "/metrics"))
                    for s in f.samples if s.name == "llm_engine_up"}
        assert wait_until(lambda: up() == {"demo-0": 1.0, "demo-1": 1.0}, timeout=20), up()
    finally:
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=30)
    assert demo.returncode == 0
