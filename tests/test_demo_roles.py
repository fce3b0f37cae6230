"""Figures per role and one snapshot everywhere (issue 39 item 2), on the real process: `llm-exporter
demo --scenario pd-transfer` (demo-0 the decode instance, demo-1 the prefill one) and `--scenario
cross-node-tp`, read through doctor, the status page, /api/v1/diagnosis and /metrics. Both demos
run at once, each on its own port, so the file costs about one demo's warm-up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.support import free_port, stop_process, wait_until


class Demo:
    def __init__(self, scenario: str, log_path, speed: str = "2") -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "demo", "--scenario", scenario, "--speed", speed, "--no-probe",
             "--listen", f"127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def diagnosis(self) -> dict:
        return httpx.get(self.base + "/api/v1/diagnosis", timeout=5).json()

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
        self.log.close()


def _tails_ready(demo: Demo, targets: tuple[str, ...]) -> bool:
    try:
        d = demo.diagnosis()
    except (httpx.HTTPError, ValueError):
        return False
    ts = d.get("targets", {})
    return all(t in ts and ts[t].get("verdict") and ts[t]["numbers"].get("ttft") for t in targets)


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Iterator[dict[str, Demo]]:
    tmp = tmp_path_factory.mktemp("demos")
    running = {s: Demo(s, tmp / f"{s}.log") for s in ("pd-transfer", "cross-node-tp")}
    # At --speed 1: faster, token rates (and the bandwidth modelled from them) read SPEED times high.
    running["decode-heavy"] = Demo("decode-heavy", tmp / "decode-heavy.log", speed="1")
    try:
        assert wait_until(lambda: _tails_ready(running["pd-transfer"], ("demo-0", "demo-1")), timeout=90)
        assert wait_until(lambda: _tails_ready(running["cross-node-tp"], ("demo-0",)), timeout=90)
        assert wait_until(lambda: _tails_ready(running["decode-heavy"], ("demo-0",)), timeout=90)
        yield running
    finally:
        for demo in running.values():
            demo.stop()


def test_the_decode_instance_shows_no_prefill_figures(demos):
    demo = demos["pd-transfer"]
    decode = demo.diagnosis()["targets"]["demo-0"]
    assert decode["numbers"]["role"] == "decode"
    assert decode["numbers"]["prefill_tokens_per_second"] is None
    assert decode["numbers"].get("prefill_mfu") is None
    assert not [e for e in decode["evidence"] if "prefill MFU" in e or re.search(r"prefill \d+ tok/s", e)]
    metrics = httpx.get(demo.base + "/metrics", timeout=5).text
    for family in ("llm_prefill_tokens_per_second", "llm_prefill_mfu_ratio"):
        assert not re.search(family + r'\{[^}]*target="demo-0"', metrics), family
        assert re.search(family + r'\{[^}]*target="demo-1"', metrics), family  # the prefill instance has them
    page = httpx.get(demo.base + "/", timeout=5).text
    section = page[page.index('id="target-demo-0"'):page.index('id="target-demo-1"')]
    assert "none: decode role" in section
    doctor = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", demo.base],
                            capture_output=True, text=True, timeout=60).stdout
    decode_part = doctor[doctor.index("target demo-0"):doctor.index("target demo-1")]
    assert "prefill MFU" not in decode_part and not re.search(r"prefill \d+ tok/s", decode_part)


def test_the_prefill_instance_has_no_tbt_judgement_and_pd_wording(demos):
    demo = demos["pd-transfer"]
    prefill = demo.diagnosis()["targets"]["demo-1"]
    assert prefill["numbers"]["role"] == "prefill"
    tbt = prefill["slo"]["tbt"]
    assert tbt["state"] == "not_applicable" and "not applicable: prefill role" in tbt["words"]
    assert not [r for r in prefill["degraded_because"] if "TBT" in r or "token gaps" in r]
    assert not [e for e in prefill["evidence"] if "all-reduce" in e or "TBT p99" in e]
    assert any("prefill instance" in e for e in prefill["evidence"])
    # Its engine time is prefill: a KV producer's request ends at its first token in vLLM's stats.
    assert prefill["numbers"]["prefill_time_share"] > 0.5, prefill["numbers"]
    metrics = httpx.get(demo.base + "/metrics", timeout=5).text
    assert not re.search(r'llm_tbt_slo_attainment_ratio\{[^}]*target="demo-1"', metrics)
    doctor = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", demo.base],
                            capture_output=True, text=True, timeout=60).stdout
    prefill_part = doctor[doctor.index("target demo-1"):]
    assert "TBT SLO: not applicable: prefill role" in prefill_part
    assert not re.search(r"TBT SLO: [\d.]+%", prefill_part)


def test_the_banner_metrics_and_diagnosis_count_the_same_gpus(demos):
    for scenario, demo in demos.items():
        banner = demo.log_path.read_text(errors="replace").splitlines()[0]
        m = re.search(r" on (\d+)x ", banner)
        assert m, banner
        metrics = httpx.get(demo.base + "/metrics", timeout=5).text
        up = len(re.findall(r"^llm_gpu_up\{", metrics, re.M))
        shown = sum(len(t["gpus"]) for t in demo.diagnosis()["targets"].values())
        assert int(m.group(1)) == up == shown, (scenario, banner, up, shown)


def test_decode_heavy_hbm_figures_agree_or_say_which(demos):
    """The evidence's HBM line and the per-GPU figures of the same diagnosis are the same numbers, and
    either they agree within 10% or the line says which one the verdict read and why."""
    demo = demos["decode-heavy"]
    assert wait_until(lambda: demo.diagnosis()["targets"]["demo-0"]["verdict"] == "memory_bandwidth", timeout=90)
    target = demo.diagnosis()["targets"]["demo-0"]
    (line,) = [e for e in target["evidence"] if e.startswith("HBM at")]
    (gpu,) = target["gpus"]
    m = re.match(r"HBM at ([\d.]+)% of peak by GPM; modelled ([\d.]+)%", line)
    assert m, line
    assert abs(float(m.group(1)) - gpu["gpm_ratio"] * 100) <= 0.5
    assert abs(float(m.group(2)) - gpu["model_ratio"] * 100) <= 0.5
    gpm, model = gpu["gpm_ratio"], gpu["model_ratio"]
    if abs(gpm - model) > 0.10 * max(gpm, model):
        assert "the verdict reads GPM" in line, line
    else:
        assert "agree" in line, line
