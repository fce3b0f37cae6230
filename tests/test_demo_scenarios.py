"""Every scenario's verdict from the live demo: `llm-exporter demo --scenario S --speed 1`, as a user
runs it, reaches the verdict the scenario declares (Scenario.expect, exporter/simulator/scenarios.py)
on its /metrics within VERDICT_BUDGET_S of wall time, keeps it HOLD_S more, and announces it.

The demos run side by side (one process each, distinct ports), started once for the module and
watched by one thread each, so the whole file takes about the slowest scenario's time (~1 min), not
the sum. Times to verdict are printed (`-s`) per scenario and as a table at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from exporter.catalog.derived import RESOURCES
from exporter.cli import DEMO_PROBE_EVERY_S
from exporter.simulator.scenarios import SCENARIOS
from tests.support import free_port, wait_until

pytestmark = pytest.mark.e2e

VERDICT_BUDGET_S = 90.0  # wall seconds from the demo's start to its scenario's verdict
HOLD_S = 10.0  # and it stays the verdict this long after
MIN_HOLD_READINGS = 3  # read as the verdict at least this often within HOLD_S
POLL_S = 0.5


def judged() -> list[str]:
    """Scenarios with a declared verdict; those declaring none are skipped in the tests, not here."""
    return [name for name, sc in SCENARIOS.items() if sc.expect is None or sc.expect.verdict is not None]


@dataclass
class Watch:
    scenario: str
    expected: str | None  # None: a scenario that declares no verdict (faults): only its page is read
    process: subprocess.Popen | None = None
    base: str = ""
    started: float = 0.0
    took_s: float | None = None  # wall seconds from launch to the expected verdict
    left_to: str | None = None  # what replaced it within HOLD_S, if anything
    seen: list[str] = field(default_factory=list)  # verdicts seen, in order, without repeats
    probe_requests: tuple[float, float] = (0.0, 0.0)  # the demo's client probe, as the hold began and ended
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    metrics: str = ""  # the demo's /metrics at the end of the watch


def demo0_lines(base: str, family: str) -> list[str]:
    """The demo's /metrics lines of `family` for target demo-0 ([] while it does not answer)."""
    try:
        response = httpx.get(base + "/metrics", timeout=2)
    except httpx.HTTPError:
        return []
    if response.status_code != 200:
        return []
    prefix = family + "{"  # a line scan: 8 demos polled twice a second on 2 cores
    return [line for line in response.text.splitlines() if line.startswith(prefix) and 'target="demo-0"' in line]


def bottleneck(base: str) -> str | None:
    """The resource llm_bottleneck{target="demo-0"} is 1 for; None while not serving or warming up."""
    for line in demo0_lines(base, "llm_bottleneck"):
        if line.rstrip().endswith(" 1.0"):
            return line.split('resource="', 1)[1].split('"', 1)[0]
    return None


def probe_requests(base: str) -> float:
    """llm_probe_requests_total of the demo's first twin (0 without it)."""
    lines = demo0_lines(base, "llm_probe_requests_total")
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def observe(w: Watch) -> None:
    try:
        _observe(w)
    finally:
        with contextlib.suppress(httpx.HTTPError):
            w.metrics = httpx.get(w.base + "/metrics", timeout=5).text


def _observe(w: Watch) -> None:
    if w.expected is None:  # no verdict to wait for: serve a while, with its events, then read the page
        wait_until(lambda: bool(demo0_lines(w.base, "llm_engine_up")), timeout=VERDICT_BUDGET_S)
        time.sleep(HOLD_S)
        return
    deadline = w.started + VERDICT_BUDGET_S
    while time.monotonic() < deadline and w.process.poll() is None:
        verdict = bottleneck(w.base)
        if verdict and (not w.seen or w.seen[-1] != verdict):
            w.seen.append(verdict)
        if verdict == w.expected:
            w.took_s = time.monotonic() - w.started
            break
        time.sleep(POLL_S)
    if w.took_s is None:
        return
    hold_until = time.monotonic() + HOLD_S
    held_from = probe_requests(w.base)
    held = 0
    while time.monotonic() < hold_until:
        verdict = bottleneck(w.base)
        # No reading (the page or the engine scrape late on a loaded machine: 8 demos on 2 cores) is
        # not another verdict; a full CI run saw one such gap in pd-transfer's hold. Another
        # resource is, and so is a hold with too few readings to say it held.
        if verdict is not None and verdict != w.expected:
            w.left_to = verdict
            w.seen.append(w.left_to)
            return
        held += verdict == w.expected
        time.sleep(POLL_S)
    if held < MIN_HOLD_READINGS:
        w.left_to = f"(no verdict: {held} readings of it in {HOLD_S:.0f} s)"
        w.seen.append(w.left_to)
    w.probe_requests = (held_from, probe_requests(w.base))


def stop(w: Watch) -> None:
    if w.process is None:
        return
    if w.process.poll() is None:
        w.process.send_signal(signal.SIGINT)
    try:
        w.stdout, w.stderr = w.process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        w.process.kill()
        w.stdout, w.stderr = w.process.communicate()
    w.returncode = w.process.returncode


@pytest.fixture(scope="module")
def demos() -> dict[str, Watch]:
    watches = {name: Watch(name, sc.expect.verdict if sc.expect is not None else None)
               for name, sc in SCENARIOS.items()}
    try:
        for w in watches.values():
            port = free_port()
            w.base = f"http://127.0.0.1:{port}"
            w.started = time.monotonic()
            w.process = subprocess.Popen(
                [sys.executable, "-m", "exporter.cli", "demo", "--listen", f"127.0.0.1:{port}",
                 "--scenario", w.scenario, "--speed", "1"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threads = [threading.Thread(target=observe, args=(w,), daemon=True) for w in watches.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(VERDICT_BUDGET_S + HOLD_S + 30)
    finally:
        for w in watches.values():
            stop(w)
    print("\ntime to verdict from the live demo at --speed 1 (wall seconds from launch):")
    for w in watches.values():
        if w.expected is None:
            continue
        took = f"{w.took_s:5.1f} s" if w.took_s is not None else "  none"
        print(f"  {w.scenario:18} {w.expected:18} {took}   declared ~{SCENARIOS[w.scenario].expect.within_s:.0f} s"
              f"   seen {w.seen}")
    return watches


def test_every_declared_verdict_is_a_resource() -> None:
    for name, sc in SCENARIOS.items():
        assert sc.expect is not None, f"scenario {name!r} declares no Expect (exporter/simulator/scenarios.py)"
        assert sc.expect.verdict is None or sc.expect.verdict in RESOURCES, (name, sc.expect.verdict)
        assert sc.expect.within_s <= 60, f"{name}: the demo's signature should show within a minute"
        assert sc.expect.verdict is not None or sc.expect.why_no_verdict, f"{name}: no verdict and no reason"


def _params() -> list[str]:
    """The scenarios with a verdict. One declaring none (faults) says why in its Expect, which
    test_every_declared_verdict_is_a_resource requires; its panels and alerts are checked by
    tests/test_dashboards_live.py::test_fault_panels_and_alerts_show_the_faults_scenario."""
    return [name for name, sc in SCENARIOS.items() if sc.expect is None or sc.expect.verdict is not None]


@pytest.mark.timeout(VERDICT_BUDGET_S + HOLD_S + 90)
@pytest.mark.parametrize("scenario", _params())
def test_live_demo_reaches_and_holds_the_declared_verdict(demos: dict[str, Watch], scenario: str) -> None:
    assert SCENARIOS[scenario].expect is not None, f"scenario {scenario!r} declares no Expect"
    w = demos[scenario]
    assert w.took_s is not None, (f"{scenario}: no {w.expected} verdict within {VERDICT_BUDGET_S:.0f} s; "
                                  f"verdicts seen: {w.seen}; stderr: {w.stderr[-2000:]}")
    print(f"{scenario} at --speed 1: {w.expected} after {w.took_s:.1f} s of wall time (verdicts seen: {w.seen})")
    assert w.left_to is None, f"{scenario}: {w.expected} gave way to {w.left_to} within {HOLD_S:.0f} s; {w.seen}"
    # The client probe ran (in idle too: the verdict leaves its own work out). On the idle twin its
    # requests are quick, so a hold of two probe periods sees one end while idle holds; elsewhere one
    # can wait in the twin's queue (kv-pressure, overload) longer than the hold.
    assert w.probe_requests[1] >= 1, f"{scenario}: probe requests {w.probe_requests}"
    if scenario == "idle":
        assert HOLD_S >= 2 * DEMO_PROBE_EVERY_S
        assert w.probe_requests[1] > w.probe_requests[0], f"idle: probe requests {w.probe_requests}"
    assert w.returncode == 0, w.stderr[-2000:]
    # The demo told the user what to expect, from the same declaration.
    assert f"verdict {w.expected} " in w.stdout, w.stdout


@pytest.mark.timeout(VERDICT_BUDGET_S + HOLD_S + 90)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_promtool_accepts_the_demo_metrics_in_every_scenario(demos: dict[str, Watch], scenario: str) -> None:
    """Users lint exporters in CI: `promtool check metrics` on the demo's own /metrics passes (no label
    that Prometheus reserves for summaries or histograms on a gauge, no other lint) in every scenario."""
    page = demos[scenario].metrics
    assert "llm_engine_up{" in page and "llm_exporter_build_info" in page, page[:500]
    done = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr)[:3000]
