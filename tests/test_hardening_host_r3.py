"""Hardening round 3, the host source (issue 40, classes 1 and 8).

Class 1: `--engine-process-name` was searched with `re` over each process's whole command line.
A pattern of the kind users write (`vllm.*serve`) backtracks quadratically over a long command
line that repeats the first word and never says the second (256 KiB: 5.6 s, 1 MiB: ~90 s), and
`re` holds the GIL all along, so any local user's process stalled /healthz and SIGTERM. Now the
first MAX_CMDLINE_BYTES of a command line are read, matched by a lazily built DFA in linear time
(exporter/sources/host_match.py), and a search is spread over sweeps with a time budget.

Class 8: the network part remembered every interface name and sysfs path it ever saw, and logged
each one going away (about 9 lines per interface). Now what it keeps follows the links it reads,
and link changes are one rate-limited summary line.

Every test drives real processes: the real `llm-exporter run`, hostile processes with long
command lines, and real interfaces in a fresh network namespace (unshare, as
test_host_net_live.py does)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support import free_port

HERE = pathlib.Path(__file__).resolve().parent
pytestmark = pytest.mark.process

# A command line of about 1 MiB (Linux allows 2 MiB of argv and environment together, 128 KiB per
# argument): today's code took about 90 s on one such process.
HOSTILE_ARG_BYTES = 120_000
HOSTILE_ARGS = 8
HOSTILE_PROCESSES = 2
# Generous bounds (a shared 2-core machine): before the fix nothing answered for minutes.
FIRST_ANSWER_BOUND_S = 15.0
HEALTHZ_BOUND_S = 2.5
TERM_BOUND_S = 5.0
ADOPT_BOUND_S = 15.0
WATCH_S = 3.0


def _sleeper(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def _processes(*commands: tuple[str, ...]) -> Iterator[list[subprocess.Popen]]:
    started = [_sleeper(*c) for c in commands]
    try:
        yield started
    finally:
        for p in started:
            p.kill()
            p.wait()


@contextlib.contextmanager
def _exporter(log: pathlib.Path, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """The real `llm-exporter run` with the host source on this machine's /proc; not waited on."""
    port = free_port()
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "500ms",
             "--gpu-backend", "none", *args],
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            yield process, f"http://127.0.0.1:{port}"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _first_answer(base: str, process: subprocess.Popen, bound: float) -> float | None:
    """Seconds until /healthz first answers 200, None past `bound`."""
    started = time.monotonic()
    while time.monotonic() - started < bound and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.05)
    return None


def _slowest_healthz(base: str, seconds: float) -> float:
    slowest = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            httpx.get(base + "/healthz", timeout=HEALTHZ_BOUND_S * 4)
            slowest = max(slowest, time.monotonic() - started)
        except httpx.HTTPError:
            slowest = max(slowest, HEALTHZ_BOUND_S * 4)
        time.sleep(0.1)
    return slowest


def _engine_found(base: str) -> float | None:
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(base + "/metrics", timeout=2).text.splitlines():
            if line.startswith("llm_engine_process_found"):
                return float(line.split()[-1])
    return None


def _terminate(process: subprocess.Popen) -> float:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=TERM_BOUND_S * 4)
    return time.monotonic() - started


def test_long_command_lines_cannot_stall_the_exporter_and_the_engine_is_still_found(tmp_path):
    marker = uuid.uuid4().hex[:12]  # this test's own engine: other tests' processes never match
    hostile = ("vllm " * (HOSTILE_ARG_BYTES // 5),) * HOSTILE_ARGS
    engine = ("vllm", "serve", marker, "--port", "8000")
    with _processes(*[hostile] * HOSTILE_PROCESSES, engine) as started:
        legit = started[-1]
        # A: no engine to find, so it keeps searching past the hostile processes; B: finds ours.
        with _exporter(tmp_path / "a.log", "--engine-process-name", f"vllm.*serve {marker}-absent") as (a, base_a), \
                _exporter(tmp_path / "b.log", "--engine-process-name", f"vllm.*serve {marker}") as (b, base_b):
            first_a = _first_answer(base_a, a, FIRST_ANSWER_BOUND_S)
            silent = f"/healthz silent for {FIRST_ANSWER_BOUND_S}s"
            assert first_a is not None, f"{silent}: {(tmp_path / 'a.log').read_text()[-2000:]}"
            slowest = _slowest_healthz(base_a, WATCH_S)
            term_s = _terminate(a)
            deadline = time.monotonic() + ADOPT_BOUND_S
            while time.monotonic() < deadline and _engine_found(base_b) != 1.0:
                time.sleep(0.2)
            found = _engine_found(base_b)
            assert legit.poll() is None
    print(f"first /healthz {first_a:.2f}s, slowest {slowest:.3f}s, SIGTERM {term_s:.2f}s, found {found}")
    assert slowest < HEALTHZ_BOUND_S, slowest
    assert term_s < TERM_BOUND_S, term_s
    assert a.returncode == 0
    assert found == 1.0, (tmp_path / "b.log").read_text()[-2000:]


# --- the matcher and the search, each on real processes or against re itself ----------------------

PATTERNS = (r"vllm.*serve", r"(?i)VLLM", r"^python", r"serve$", r"\bvllm\b", r"\Bll", r"a|b|", r"", r"^$", r"(?m)^b",
            r"(?m)a$", r"x{2,4}y", r"(ab)*c", r"(a*)*b", r"[^a-c\d]+z", r"(?s)a.b", r"a.b", r"\w+\s\W", r"(?a:\w)é",
            r"é\b", r"(?i)straße", r"[\]\-^]", r"a{0}", r"(?:a|bc){2,}d", r"\Aa", r"a\Z", r"$", r"\b", r"\B",
            r"(?x) v l l m", r"a*?b", r"(?i)k", r"(|a)+$", r"\n$", r"(?m)$\n", r"sglang\.launch_server|llama-server")
ALPHABET = "ab \nvlmsercxyzé_.-]^1Kk\u212aßS"


def test_the_linear_matcher_says_what_re_says():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from exporter.sources.host_match import LinearPattern

    compiled = [(LinearPattern(p), re.compile(p)) for p in PATTERNS]

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(st.text(alphabet=ALPHABET, max_size=16))
    def agrees(text: str) -> None:
        for linear, reference in compiled:
            assert linear.search(text) == (reference.search(text) is not None), (linear.pattern, text)

    agrees()


def test_the_matcher_is_linear_on_the_hostile_command_line():
    from exporter.sources.host_match import LinearPattern

    def cpu(pattern: str, text: str) -> float:
        linear = LinearPattern(pattern)
        started = time.process_time()
        assert linear.search(text) is False
        return time.process_time() - started

    small, large = ("vllm " * (n // 5) for n in (128 << 10, 1 << 20))
    for pattern in ("vllm.*serve", "python.*vllm.*serve.*--model"):
        t_small, t_large = cpu(pattern, small), cpu(pattern, large)
        # re: 256 KiB 5.6 s, quadratic. Here 1 MiB takes ~40 ms; 8x the text, 8x the time.
        assert t_large < 2.0, (pattern, t_large)
        assert t_large < 40 * max(t_small, 0.005), (pattern, t_small, t_large)


def test_a_search_reads_a_bounded_prefix_and_is_spread_over_sweeps():
    from exporter.sources.host_process import MAX_CMDLINE_BYTES, NameTest, ProcessSearch, read_cmdline

    marker = uuid.uuid4().hex[:12]
    with _processes(("vllm " * 20_000,) * 4, ("vllm", "serve", marker)) as (hostile, legit):
        assert len(read_cmdline("/proc", hostile.pid)) <= MAX_CMDLINE_BYTES
        now = [0.0]

        def clock() -> float:  # every look at the clock takes 0.15 s: at most two processes a sweep
            now[0] += 0.15
            return now[0]

        test = NameTest("/proc", re.compile(f"vllm.*serve {marker}"), clock=clock)
        search = ProcessSearch("/proc", lambda: test, clock, budget_s=0.2)
        deadline = time.monotonic() + 10  # a pass over /proc before the sleepers end
        while time.monotonic() < deadline:
            done, found = search.sweep()
            if done:
                break
        assert done and found is not None and found.pid == legit.pid
        processes = sum(name.isdigit() for name in os.listdir("/proc"))
        assert search.sweeps >= processes // 3, (search.sweeps, processes)  # spread: not one sweep for all


@pytest.mark.parametrize(("pattern", "why"), [("vllm(", "not a valid regex"), (r"(vllm) \1", "backreferences"),
                                              ("(?<!x)serve", "lookarounds")])
def test_a_pattern_that_needs_backtracking_is_one_line_and_exit_2(pattern, why):
    done = subprocess.run([sys.executable, "-m", "exporter.cli", "run", "--listen", "127.0.0.1:0", "--gpu-backend",
                           "none", "--engine-process-name", pattern], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and why in done.stderr and "Traceback" not in done.stderr


# --- class 8: network interfaces that come and go --------------------------------------------------

# Before: 4-6 s of renames cost the real exporter 480 log lines; 60 rounds in process kept 2.5 MB
# (9 paths per name it ever saw) and logged 15,280 records; with the host fixed but not the
# derive stage's per-link windows, the real exporter grew 6.5 MB in 6 s (1.1 MB/s, for the 10
# minutes it kept a name). Now: 1 line, 0 records, ~0.2 MB of heap, ~1 MB of RSS (caches filling to
# their bounds). Bounds well above what is measured now, below what was measured before.
CHURN_LOG_LINES_BOUND = 30
CHURN_HEAP_BOUND_BYTES = 1 << 20
CHURN_RSS_BOUND_BYTES = 4 << 20


def test_interface_churn_keeps_the_host_source_bounded_and_its_log_quiet():
    unshare = shutil.which("unshare")
    assert unshare, "unshare(1) (util-linux) is needed to make a network namespace"
    assert shutil.which("ip"), "ip(8) (iproute2) is needed to make veth pairs"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run([unshare, "-rnm", "--fork", sys.executable, str(HERE / "netns_churn.py")],
                          capture_output=True, text=True, timeout=180, cwd=HERE.parent, env=env)
    assert done.returncode == 0, f"could not run in a new network namespace: {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    process, local = result["process"], result["in_process"]
    print(json.dumps({"process": process, "in_process": local}))
    assert process["alive"] and process["names"] > 600, result
    assert process["log_lines"] <= CHURN_LOG_LINES_BOUND, result
    assert process["rss_growth_bytes"] < CHURN_RSS_BOUND_BYTES, result
    assert 0 < process["network_info_series"] <= 64, result  # what is read now, not every name seen
    assert local["names"] > 3000, result
    assert local["log_records"] <= CHURN_LOG_LINES_BOUND, result
    assert local["heap_growth_bytes"] < CHURN_HEAP_BOUND_BYTES, result


def test_state_change_lines_are_bounded_and_the_default_excludes_cover_the_cnis():
    from exporter.settings import SETTINGS
    from exporter.sources.host_common import (
        DEFAULT_NETWORK_EXCLUDE,
        MAX_PRESENCE_KEYS,
        MAX_PRESENCE_LINES,
        PresenceLog,
    )
    from exporter.sources.host_net import matches

    now = [0.0]
    presence = PresenceLog(clock=lambda: now[0])
    for i in range(MAX_PRESENCE_KEYS * 4):  # names that come once and go
        presence.note(f"/sys/class/net/pod{i}/operstate", False)
    assert len(presence) == MAX_PRESENCE_KEYS
    assert presence.budget.suppressed == MAX_PRESENCE_KEYS * 4 - MAX_PRESENCE_LINES
    setting = next(s for s in SETTINGS if s.name == "network_exclude")
    assert setting.default_text == ", ".join(DEFAULT_NETWORK_EXCLUDE)  # the docs say what the code does
    for name in ("cali1a2b3c4d5e6", "flannel.1", "cni0", "vxlan.calico", "lxc1234", "gke5f6a7b8c9d0", "eni1a2b3c4d5e6",
                 "azv1a2b3c4d5e6", "tunl0", "weave", "vethwe-datapath", "cilium_host", "genev_sys_6081",
                 "ovn-k8s-mp0", "3f2a1b0c9d8e7f6", "kube-ipvs0", "nodelocaldns"):
        assert matches(name, DEFAULT_NETWORK_EXCLUDE), name
    for name in ("eth0", "ens2f0np0", "enp65s0f1", "bond0", "ib0", "mlx5_0:1", "eno1"):
        assert not matches(name, DEFAULT_NETWORK_EXCLUDE), name
