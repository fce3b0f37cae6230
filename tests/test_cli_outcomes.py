"""Every command's outcome on a bad command line and on a target that is not there, through the real
process: one clean line and the exit code docs/cli.md's table gives (issue 39, items 6 and 7).

- an unknown option is named, with the closest valid one, before any other check, in every
  subcommand; abbreviations are off in every parser;
- a target that takes no connection is `cannot reach URL: connection refused` whichever flag named
  it: doctor --url and --engine (exit 3, and --engine does not wait its window out), plan --from
  (2), loadtest URL and --exporter (2, after a few tries spaced out);
- an exporter's base URL given with /metrics is taken as the base;
- a server's error page never reaches an error line: its status code and phrase do.

Each case is a short subprocess against loopback servers started here; a dead port is one bound
and released (support.free_port)."""

from __future__ import annotations

import contextlib
import http.server
import json
import pathlib
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import jsonschema
import pytest

from exporter.cli import build_parser
from exporter.cliargs import Parser, parsers
from exporter.probe.report import REPORT_SCHEMA
from tests.support import exporter_run, fake_engine, free_port, send_body, serve_in_background, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[1]
VLLM = (ROOT / "tests" / "fixtures" / "engines" / "vllm-v0.11__documented.prom").read_bytes()
# What a plain web server's error page may hold: markup, and controls that would redraw a terminal.
ERROR_PAGE = b"<html><body><h1>Not Found</h1>\x1b[2J\x1b[1AREMOTE-PAGE-MARKER</body></html>"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens there


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


class _Page(http.server.BaseHTTPRequestHandler):
    """A plain web server: 404 with an HTML page for everything, as `python -m http.server` would
    for these paths, and 501 for a POST."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        send_body(self, ERROR_PAGE, 404, "text/html")

    def do_POST(self) -> None:  # noqa: N802
        send_body(self, ERROR_PAGE, 501, "text/html")

    def log_message(self, *args: object) -> None:
        return


class _AnswersOnce(http.server.BaseHTTPRequestHandler):
    """An engine that answers its first scrape and then only 503."""

    def do_GET(self) -> None:  # noqa: N802
        self.server.hits += 1  # type: ignore[attr-defined]
        if self.server.hits == 1:  # type: ignore[attr-defined]
            send_body(self, VLLM)
        else:
            send_body(self, b"gone", 503, "text/plain")

    def log_message(self, *args: object) -> None:
        return


@contextlib.contextmanager
def serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[tuple[str, http.server.HTTPServer]]:
    """support.serve_in_background, with what the handlers here count, and stopped on exit."""
    server, url = serve_in_background(handler)
    server.paths, server.hits = [], 0  # type: ignore[attr-defined]
    try:
        yield url, server
    finally:
        server.shutdown()
        server.server_close()


# --- the command line --------------------------------------------------------------------------

def test_every_parser_refuses_abbreviations():
    every = parsers(build_parser())
    names = {p.prog for p in every}
    commands = ("run", "demo", "doctor", "loadtest", "plan", "mixin")
    assert {"llm-exporter", *(f"llm-exporter {c}" for c in commands)} <= names
    for parser in every:
        assert isinstance(parser, Parser) and parser.allow_abbrev is False, parser.prog


@pytest.mark.parametrize(("args", "line"), [
    (("loadtest", "--demo", "--concurency", "1,8"),
     "llm-exporter loadtest: unknown option --concurency (did you mean --concurrency?)"),
    (("plan", "--from", "x.json", "--candidat", "gpu=h200"),
     "llm-exporter plan: unknown option --candidat (did you mean --candidate?)"),
    (("doctor", "--engine", "http://127.0.0.1:1", "--duraton=2s"),
     "llm-exporter doctor: unknown option --duraton (did you mean --duration?)"),
    (("run", "--engine", "http://127.0.0.1:1", "--listn", "127.0.0.1:1"),
     "llm-exporter run: unknown option --listn (did you mean --listen?)"),
    (("demo", "--scenaro", "idle"), "llm-exporter demo: unknown option --scenaro (did you mean --scenario?)"),
    (("--verison",), "llm-exporter: unknown option --verison (did you mean --version?)"),
    (("plan", "--from", "x.json", "--zzzzzz"),
     "llm-exporter plan: unknown option --zzzzzz (llm-exporter plan --help lists them)"),
])
def test_an_unknown_option_is_named_with_the_closest_one_before_any_other_check(args, line):
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) == line and done.stdout == ""


def test_option_values_are_not_taken_for_options():
    """A negative number and a value after `=` are values, not unknown options."""
    parser = build_parser()
    args = parser.parse_args(["loadtest", "http://127.0.0.1:1", "--seed", "-3", "--concurrency=1"])
    assert (args.seed, args.concurrency) == (-3, "1")


# --- a target that is not there ------------------------------------------------------------------

def test_doctor_says_the_same_of_a_dead_target_whichever_flag_named_it():
    url = dead_url()
    by_url = cli("doctor", "--url", url)
    started = time.monotonic()
    by_engine = cli("doctor", "--engine", url, "--duration", "60s", "--gpu-backend", "none", "--no-host")
    took = time.monotonic() - started
    assert by_url.returncode == by_engine.returncode == 3, by_url.stdout + by_engine.stdout
    assert one_line(by_url.stdout) == f"llm-exporter doctor: cannot tell: cannot reach {url}: connection refused"
    assert one_line(by_engine.stdout) == (f"llm-exporter doctor: cannot tell: cannot reach {url}/metrics: "
                                          "connection refused")
    assert by_url.stderr == by_engine.stderr == ""
    assert took < 45  # a refused connection ends the sampling: it does not wait the 60 s window out
    as_json = json.loads(cli("doctor", "--url", url, "--json").stdout)
    assert as_json == {"status": "unknown", "exit_code": 3, "error": f"cannot reach {url}: connection refused"}


def test_doctor_engine_that_answered_once_and_then_failed_is_a_finding():
    with serve(_AnswersOnce) as (base, _):
        done = cli("doctor", "--engine", f"{base}/metrics,name=flaky", "--duration", "2s", "--interval", "250ms",
                   "--gpu-backend", "none", "--no-host")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "status: DEGRADED" in done.stdout and "target flaky: UNREACHABLE (http_status)" in done.stdout


def test_an_exporter_whose_only_target_never_answered_cannot_tell_either():
    """The same dead engine named by `run --engine`: doctor --url on that exporter says cannot tell
    (exit 3) as doctor --engine on it does, and lists the target as unreachable; a target that
    answered once and then failed is a finding there too (exit 1)."""
    url = dead_url()
    with exporter_run("--engine", f"{url}/metrics,name=dead") as (base, _, _):
        done = cli("doctor", "--url", base)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "status: UNKNOWN" in done.stdout and "target dead: UNREACHABLE (connection)" in done.stdout
    assert "no engine target has answered a scrape yet" in done.stdout
    with serve(_AnswersOnce) as (engine, _), exporter_run("--engine", f"{engine}/metrics,name=flaky") as (base, _, _):
        # The first scrape answered (the exporter was ready after it); wait for a later one's 503.
        assert wait_until(lambda: bool(json.loads(urllib.request.urlopen(base + "/api/v1/diagnosis", timeout=5)
                                                  .read()).get("unreachable")), timeout=60)
        done = cli("doctor", "--url", base)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "status: DEGRADED" in done.stdout and "target flaky: UNREACHABLE" in done.stdout


def test_plan_and_loadtest_on_a_dead_target_say_why_in_one_line():
    url = dead_url()
    plan = cli("plan", "--from", url + "/metrics")
    assert plan.returncode == 2 and plan.stdout == ""
    assert one_line(plan.stderr) == f"llm-exporter plan: cannot reach {url}: connection refused"
    with serve(_Page) as (page, _):
        exporter = cli("loadtest", page, "--exporter", url, "--concurrency", "1", "--duration", "1s")
    assert exporter.returncode == 2 and exporter.stdout == ""
    assert one_line(exporter.stderr) == f"llm-exporter loadtest: cannot reach the exporter {url}: connection refused"


@pytest.mark.parametrize("sweep", [("--concurrency", "1"), ("--rate", "20")])
def test_loadtest_backs_off_then_stops_on_a_server_that_takes_no_connection(tmp_path, sweep):
    url = dead_url()
    done = cli("loadtest", url, *sweep, "--duration", "30s", "--warmup", "0", "--json", str(tmp_path / "r.json"),
               "--html", str(tmp_path / "r.html"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_line(done.stderr) == f"llm-exporter loadtest: cannot reach {url}: connection refused"
    assert done.stdout == ""  # no table of zeros, no knee, no recommendation
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    (step,) = report["steps"]
    # Five tries, spaced out (0.1 + 0.2 + 0.4 + 0.8 s), not thousands in a tight loop.
    assert step["requests"]["ok"] == 0 and step["requests"]["failed"] <= 5
    assert report["stopped"]["text"] == f"cannot reach {url}: connection refused"
    assert report["knee"] is None and report["recommendation"]["max_concurrency"] is None
    assert report["recommendation"]["text"] == "no successful request: no knee"
    page = (tmp_path / "r.html").read_text()
    assert "No successful request: no knee." in page and "Recommendation." not in page and "<b>Knee." not in page


def test_loadtest_where_every_request_fails_gives_no_knee_and_no_recommendation():
    with serve(_Page) as (page, _):
        done = cli("loadtest", page, "--concurrency", "1", "--duration", "0.5s", "--warmup", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no successful request: no knee" in done.stdout
    assert "knee:" not in done.stdout and "recommendation" not in done.stdout
    last = done.stderr.splitlines()[-1]
    assert re.fullmatch(r"llm-exporter loadtest: no request succeeded: \d+ failed: http_status \d+; "
                        r"the last answered HTTP 501 \(Not Implemented\)", last), last
    assert "REMOTE-PAGE-MARKER" not in done.stdout + done.stderr


# --- base URLs and remote pages ----------------------------------------------------------------

def test_an_exporter_base_url_given_with_metrics_is_taken_as_the_base():
    with fake_engine(VLLM) as (engine, _), exporter_run("--engine", engine) as (base, _, _):
        doctor = cli("doctor", "--url", base + "/metrics/")
        plan = cli("plan", "--from", base + "/metrics", "--window", "1s")
    assert doctor.returncode in (0, 1), doctor.stdout + doctor.stderr
    assert f"llm-exporter doctor: {base}/metrics/ (exporter)" in doctor.stdout and "HTTP 404" not in doctor.stdout
    # A static engine finishes no request: the planner got past the diagnosis and two scrapes to say so.
    assert plan.returncode == 2
    assert one_line(plan.stderr) == ("llm-exporter plan: no request finished in the window: nothing to calibrate "
                                     "on (send traffic or widen --window)")


def test_a_servers_error_page_never_reaches_an_error_line():
    with serve(_Page) as (page, server):
        plan = cli("plan", "--from", page)
        doctor = cli("doctor", "--url", page + "/metrics")
        paths = list(server.paths)
    assert plan.returncode == 2 and doctor.returncode == 3
    assert one_line(plan.stderr) == (f"llm-exporter plan: {page}/api/v1/diagnosis answered HTTP 404 (Not Found) "
                                     "(is it an llm-exporter?)")
    assert one_line(doctor.stdout) == (f"llm-exporter doctor: cannot tell: {page}/api/v1/diagnosis answered "
                                       "HTTP 404 (Not Found) (is it an llm-exporter?)")
    for text in (plan.stdout, plan.stderr, doctor.stdout, doctor.stderr):
        assert "REMOTE-PAGE-MARKER" not in text and "<html>" not in text and "\x1b" not in text
    assert paths == ["/api/v1/diagnosis", "/api/v1/diagnosis"]  # /metrics taken off, never /metrics/api/...


def test_the_exit_code_table_covers_every_command():
    doc = (ROOT / "docs" / "cli.md").read_text()
    table = doc[doc.index("| command |"):]
    for command in ("run", "demo", "doctor", "loadtest", "plan", "mixin"):
        assert f"| `{command}` |" in table, command
    assert "docs/cli.md" in (ROOT / "README.md").read_text()


def test_a_server_that_goes_away_mid_sweep_stops_it_and_the_completed_steps_still_judge():
    """In-process, with a send that succeeds and then never connects: the sweep stops in the step the
    server went away in, says why, and that step is left out of the knee and the recommendation."""
    import asyncio
    import dataclasses

    import exporter.probe.loadtest as lt

    @dataclasses.dataclass
    class Refused:
        reason: str = "connection"
        ok: bool = False
        status: int | None = None
        ttft_s: float | None = None
        itl_s: tuple = ()
        e2e_s: float | None = None
        prompt_tokens: int | None = None
        completion_tokens: int | None = None
        sent_at: float | None = None  # never sent: no connection
        message: str = "cannot connect to http://gone/v1/completions: connection refused"

    calls = 0

    async def send(spec: lt.RequestSpec) -> object:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if calls <= 30:
            return lt.Failed("", ok=True, ttft_s=0.005, itl_s=(0.002,) * 3, e2e_s=0.011, prompt_tokens=5,
                             completion_tokens=4)
        return Refused()

    config = lt.SweepConfig(mode="concurrency", levels=(1, 2, 4), warmup_s=0, duration_s=1.0)
    report = asyncio.run(lt.run_sweep(send, lt.Workload(prompt_words=5, max_tokens=4), config,
                                      meta={"url": "http://gone"}))
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["stopped"]["text"] == "cannot reach http://gone: connection refused"
    assert report["steps"][-1]["notes"][-1] == f"stopped: {report['stopped']['text']}"
    assert calls < 30 + 12  # spaced out, then stopped: no tight loop against a dead port
    assert report["recommendation"]["text"] != lt.NO_SUCCESS  # the steps before still had successes
