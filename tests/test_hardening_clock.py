"""Hardening round 3, the wall clock stepping: rates and windows run on the monotonic clock, a step
is detected, logged once and counted, and never freezes or inflates a rate.

The real process: `llm-exporter run` under libfaketime (LD_PRELOAD, Debian's libfaketime, which
`make debs` installs), whose wall-clock offset the test moves by rewriting a file while the process
runs; the monotonic clock stays real (FAKETIME_DONT_FAKE_MONOTONIC). The engine counts 1000 tokens
a second by the real monotonic clock. Before, a -3600 s step froze every derived rate for an hour
(the windows dropped every snapshot older than their newest one) and a +20 s step read the rate
inflated until the window moved past it."""

from __future__ import annotations

import http.server
import pathlib
import re
import time

import httpx
import pytest

from exporter.clock import CLOCK_STEP_TOLERANCE_S, Clocks
from tests.support import exporter_run, send_body, serve_in_background, wait_until

LIBFAKETIME = next(iter(sorted(pathlib.Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)


class _Tokens:
    """A generation counter growing at `rate` tokens a second by the monotonic clock."""

    def __init__(self, rate: float) -> None:
        self.rate, self.base, self.since = rate, 0.0, time.monotonic()

    def now(self) -> float:
        return self.base + (time.monotonic() - self.since) * self.rate

    def set_rate(self, rate: float) -> None:
        self.base, self.since, self.rate = self.now(), time.monotonic(), rate


TOKENS = _Tokens(1000.0)


class _CountingEngine(http.server.BaseHTTPRequestHandler):
    """A vLLM page whose generation counter grows at TOKENS.rate by the monotonic clock."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        tokens = TOKENS.now()
        body = (f'# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{model_name="m"}} '
                f'{tokens:.1f}\n# TYPE vllm:prompt_tokens_total counter\n'
                f'vllm:prompt_tokens_total{{model_name="m"}} {tokens / 10:.1f}\n'
                f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m"}} 4\n'
                f'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name="m"}} 0\n')
        send_body(self, body.encode())

    def log_message(self, *args: object) -> None:
        pass


def _value(base: str, name: str) -> float | None:
    text = httpx.get(base + "/metrics", timeout=5).text
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_clocks_count_a_step_not_a_slew() -> None:
    wall, mono = [1000.0], [5.0]
    clocks = Clocks(lambda: wall[0], lambda: mono[0])
    for _ in range(50):  # NTP slewing: the wall clock runs 0.05% fast
        wall[0] += 1.0005
        mono[0] += 1.0
        assert clocks.read().steady == pytest.approx(wall[0] - clocks.offset_s)
    assert clocks.steps == 0
    wall[0] -= 3600
    reading = clocks.read()
    assert clocks.steps == 1 and reading.wall == wall[0] and clocks.offset_s == pytest.approx(-3600 + 0.025)
    assert reading.steady == pytest.approx(1000.0 + 50)  # the steady clock went on
    wall[0] += CLOCK_STEP_TOLERANCE_S / 2  # a late cycle: both clocks move
    mono[0] += CLOCK_STEP_TOLERANCE_S / 2
    clocks.read()
    assert clocks.steps == 1


def test_a_wall_clock_step_neither_freezes_nor_inflates_the_rates(tmp_path: pathlib.Path) -> None:
    assert LIBFAKETIME is not None, "libfaketime is missing: `make debs` installs it"
    server, url = serve_in_background(_CountingEngine)
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset), "FAKETIME_NO_CACHE": "1",
           "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    rate = "llm_decode_tokens_per_second"
    try:
        env["LLM_EXPORTER_RATE_WINDOW"] = "2s"
        # Ready within 60 s, not the usual 20: under libfaketime with FAKETIME_NO_CACHE every clock read
        # stats the offset file, and a clean-clone make test beside the live tier's vLLM took longer
        # than 20 s to start (a rerun on the same loaded machine passed).
        with exporter_run("--engine", f"{url},kind=vllm,name=m", env=env, ready_timeout_s=60.0) as (base, _, log):
            assert wait_until(lambda: 800 < (_value(base, rate) or 0) < 1200, timeout=20), _value(base, rate)
            # With each step the engine changes pace: a frozen window would keep showing the old
            # rate, an inflated one many times the new (20 s forward in a 2 s window: 10x).
            for step, tokens_per_s in (("-3600", 3000.0), ("-3580", 1000.0)):
                offset.write_text(f"{step}\n")
                TOKENS.set_rate(tokens_per_s)
                assert wait_until(lambda want=tokens_per_s: abs((_value(base, rate) or 0) - want) < 0.2 * want,
                                  timeout=10), (step, _value(base, rate))
                seen = []
                for _ in range(8):  # and it stays there, step or not
                    seen.append(_value(base, rate))
                    time.sleep(0.25)
                assert all(v is not None and abs(v - tokens_per_s) < 0.25 * tokens_per_s for v in seen), (step, seen)
            assert _value(base, "llm_exporter_clock_steps_total") == 2
            assert _value(base, "llm_exporter_clock_offset_seconds") == pytest.approx(-3580, abs=2)
            log.seek(0)
            lines = [line for line in log.read().decode().splitlines() if "wall clock stepped" in line]
            # Two steps within a minute: the first logged, the second counted for the next line.
            assert len(lines) == 1 and "back by 3600" in lines[0], lines
    finally:
        server.shutdown()
