"""`llm-exporter doctor` against a live kv-pressure twin, through a running exporter and directly."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from exporter.cli import run
from exporter.config import Config
from exporter.doctor import EXIT_DEGRADED, EXIT_UNKNOWN, exit_code, render_report
from exporter.simulator import Twin, TwinConfig
from exporter.simulator.server import start_server
from exporter.sources.engines.scrape import EngineSource
from exporter.sources.gpu.sim import SimGpuSource
from exporter.targets import EngineTarget
from tests.exporter_process import running_exporter
from tests.support import free_port, wait_until

KV_FULL_AFTER_S = 150.0  # twin seconds until the kv-pressure pool is full and preempting


@dataclass(frozen=True)
class LiveTwin:
    url: str  # twin base URL; engine metrics at url + "/metrics"
    exporter: str  # exporter base URL


@contextlib.contextmanager
def serving_twin(scenario: str, warm_s: float) -> Iterator[str]:
    """A twin fast-forwarded `warm_s` seconds, then served in real time from its own loop thread."""
    twin = Twin(TwinConfig(scenario=scenario))
    twin.fast_forward(warm_s)
    loop = asyncio.new_event_loop()
    started: list = []
    ready = threading.Event()

    def runner() -> None:
        asyncio.set_event_loop(loop)
        started.append(loop.run_until_complete(start_server(twin)))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    assert ready.wait(15), "twin server did not start"
    try:
        yield started[0].url
    finally:
        asyncio.run_coroutine_threadsafe(started[0].stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@contextlib.contextmanager
def live_kv_pressure() -> Iterator[LiveTwin]:
    """The kv-pressure twin scraped by an in-process exporter (engine over HTTP, GPUs through the
    twin's /sim/gpu), until the exporter has a verdict."""
    with serving_twin("kv-pressure", KV_FULL_AFTER_S) as url:
        target = EngineTarget(url=url + "/metrics", name="kv", timeout_s=2.0)
        config = Config(listen_host="127.0.0.1", listen_port=0, interval_s=0.5, engines=(target,),
                        gpu_backend="none", host_enabled=False)
        sources = [EngineSource(target, max_payload_bytes=config.max_payload_bytes, max_series=10_000),
                   SimGpuSource(url)]
        with running_exporter(config, sources) as base:
            assert wait_until(lambda: _verdict(base) is not None, timeout=20), "no verdict from the exporter"
            yield LiveTwin(url, base)


def _verdict(base: str) -> str | None:
    doc = httpx.get(base + "/api/v1/diagnosis", timeout=2).json()
    return (doc.get("targets", {}).get("kv") or {}).get("verdict")


@pytest.fixture(scope="module")
def live() -> Iterator[LiveTwin]:
    with live_kv_pressure() as twin:
        yield twin


def test_doctor_url_names_kv_capacity_and_says_why(live, capsys):
    code = run(["doctor", "--url", live.exporter], {})
    out = capsys.readouterr().out
    assert code == EXIT_DEGRADED, out
    assert "bottleneck: KV cache capacity" in out
    assert "status: DEGRADED" in out
    why = out.split("why:")[1].split("first things to try:")[0]
    assert "KV cache" in why and "preemptions/s" in why
    assert "KV limits" in out and "more replicas" in out.lower()


def test_doctor_url_json(live, capsys):
    code = run(["doctor", "--url", live.exporter, "--json"], {})
    doc = json.loads(capsys.readouterr().out)
    assert code == doc["exit_code"] == EXIT_DEGRADED
    target = doc["diagnosis"]["targets"]["kv"]
    assert target["verdict"] == "kv_capacity"
    assert max(target["scores"], key=target["scores"].get) == "kv_capacity"
    assert target["gpus"] and target["gpus"][0]["gpm_ratio"] is not None


def test_doctor_engine_samples_the_engine_itself(live, capsys):
    code = run(["doctor", "--engine", live.url + "/metrics,name=kv", "--duration", "2s", "--interval", "250ms",
                "--gpu-backend", "none", "--no-host", "--json"], {})
    doc = json.loads(capsys.readouterr().out)
    assert code == EXIT_DEGRADED
    assert doc["diagnosis"]["targets"]["kv"]["verdict"] == "kv_capacity"


def test_doctor_cannot_tell_when_nothing_answers(capsys):
    code = run(["doctor", "--url", "http://127.0.0.1:9"], {})
    assert code == EXIT_UNKNOWN
    assert "cannot tell" in capsys.readouterr().out


def test_exit_codes_and_report_for_healthy_and_unreachable():
    healthy = {"ready": True, "status": "healthy", "targets": {"a": {
        "verdict": "memory_bandwidth", "status": "healthy", "evidence": ["HBM at 80% of peak by GPM"],
        "remedies": ["quantize"], "scores": {"memory_bandwidth": 0.9, "idle": 0.0}}}, "unreachable": []}
    assert exit_code(healthy) == 0
    assert exit_code({"ready": True, "status": "unknown"}) == EXIT_UNKNOWN
    assert exit_code({"ready": False}) == EXIT_UNKNOWN
    out = io.StringIO()
    render_report({**healthy, "status": "degraded", "unreachable": [{"target": "b", "reason": "timeout"}]}, "x", out)
    text = out.getvalue()
    assert "bottleneck: HBM bandwidth" in text and "UNREACHABLE (timeout)" in text and "1. quantize" in text


def _restarted_diagnosis() -> dict:
    """A real Deriver's diagnosis of a target that missed its TTFT SLO, restarted and has served
    nothing since (tests/test_derive_verdict.py has the pages)."""
    from exporter.derive import build_deriver
    from tests.test_derive_verdict import restarting_snapshot

    deriver = build_deriver(Config(interval_s=5.0))
    for i in range(12):
        deriver(restarting_snapshot(5.0 * i, 10.0 * i), None)
    for i in range(12, 16 + 62):  # restarted, and nothing served for longer than the 5 minute window
        deriver(restarting_snapshot(5.0 * i, 0.0), None)
    return deriver.diagnosis()


def test_no_recent_traffic_is_said_and_does_not_degrade_the_exit_code():
    diagnosis = _restarted_diagnosis()
    assert exit_code(diagnosis) == 0
    out = io.StringIO()
    render_report(diagnosis, "x", out)
    text = out.getvalue()
    assert "  TTFT SLO: no recent traffic (no requests finished in the last 5 minutes)\n" in text
    assert "degraded:" not in text and "[healthy]" in text


def test_headroom_is_healthy_for_the_exit_code_and_worded():
    from tests.test_derive_formulas import _diagnosis_with

    target = _diagnosis_with(deferred=0)  # llama.cpp serving on 4 slots, nothing waiting
    assert target["verdict"] == "headroom"
    diagnosis = {"ready": True, "status": "healthy", "targets": {"a": target}, "unreachable": []}
    assert exit_code(diagnosis) == 0
    out = io.StringIO()
    render_report(diagnosis, "x", out)
    text = out.getvalue()
    assert "bottleneck: headroom (serving, no resource near its limit)   [healthy]" in text
    assert "llm_kv_cache_headroom_sequences" in text


def test_doctor_engine_on_an_unreachable_engine_cannot_tell_as_with_url():
    """The real `llm-exporter doctor --engine` process, pointed at a port where nothing listens: no
    target ever answered, so there is nothing to diagnose: "cannot tell" (3), as `doctor --url` says
    of an exporter that cannot be reached (docs/cli.md). An engine that answered once and then
    stopped is a finding instead: tests/test_cli_outcomes.py."""
    port = free_port()  # bound and released: nothing listens there
    done = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--engine",
                           f"http://127.0.0.1:{port}/metrics,name=gone", "--duration", "1s", "--interval", "250ms",
                           "--gpu-backend", "none", "--no-host"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    assert done.stdout == f"llm-exporter doctor: cannot tell: cannot reach http://127.0.0.1:{port}/metrics: " \
                          "connection refused\n"
    assert done.stderr == ""
