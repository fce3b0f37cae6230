"""Issue 40, class 2 and the planner's part of class 7: `llm-exporter plan` with hostile inputs.

Class 2: one absurd level in a load-test JSON, `--candidate rate=1e6`, or an engine reporting a billion
running requests through a real exporter each grew the planner to 1.5 GiB (MemoryError after 17-44 s):
the twin's replay created a request per arrival without bound. Now every input is checked against
exporter/planner/limits.py before any replay, and each replay is bounded in arrivals, steps and CPU
inside the twin's engine. Class 7: a load-test JSON or an exporter answer of the wrong shape at any
depth gave a traceback; now one line naming the path, exit 2.

The class-2 tests drive the real `llm-exporter plan` process (and a real `llm-exporter run`) and read
the child's peak RSS from wait4; a guard on its address space keeps the machine safe on a regressed
build (it then dies of MemoryError, which the test reports as the failure it is).
"""

from __future__ import annotations

import copy
import http.server
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from exporter.cli import build_parser
from exporter.cli import run as cli_run
from exporter.planner.cmd import command_plan
from exporter.planner.limits import MAX_CONCURRENCY, MAX_RATE_RPS, MAX_REPLAY_ARRIVALS
from tests.support import exporter_run, serve_in_background, wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "planner"
LOADTEST = json.loads((FIXTURES / "loadtest-demo.json").read_text())
# The guard on a planner's address space: a fixed build peaks near 100 MiB of it (35 MiB resident); a
# regressed one reaches it in seconds and dies there instead of taking the machine's memory.
ADDRESS_SPACE_GUARD = 1 << 30
# Peak RSS of a planner that refused its input or stopped its replay: 35-90 MiB measured; today's code
# grew past 1.5 GiB on each of these inputs.
MAX_PEAK_RSS_MIB = 300


class Outcome(NamedTuple):
    code: int
    out: str
    err: str
    peak_rss_mib: float
    wall_s: float


# Forks the plan from a small fresh Python and reports the plan's own wait4 peak RSS: a child forked
# (or vforked) from pytest itself counts the copy of pytest it was before exec in its ru_maxrss (559
# MiB late in `make test`, for a plan of 35). The address-space guard keeps a regressed run from
# taking the machine; a kill of the wrapper at the timeout takes the plan with it (its process group).
_MEASURE = """import os, resource, sys
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
    os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[2], "w") as report:
    report.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
"""


def plan_process(*args: str, timeout: float = 90.0) -> Outcome:
    """`llm-exporter plan ARGS` as a real process, with its own peak RSS (see _MEASURE)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss:
        start = time.monotonic()
        process = subprocess.Popen([sys.executable, "-c", _MEASURE, str(ADDRESS_SPACE_GUARD), rss.name,
                                    "-m", "exporter.cli", "plan", *args], stdout=out, stderr=err,
                                   start_new_session=True)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        peak_kib = float(rss.read() or "inf")
        return Outcome(code, out.read().decode(), err.read().decode(), peak_kib / 1024, wall)


def one_line(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("llm-exporter plan: "), err[-2000:]
    return err


def write(tmp_path: Path, doc: Any, name: str = "lt.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def with_step(field: str, value: Any, step: int = 1, **more: Any) -> dict:
    """The real load test with one value of one step replaced (`field` a dotted path)."""
    doc = copy.deepcopy(LOADTEST)
    for path, v in ((field, value), *more.items()):
        *parents, last = path.split(".")
        node = doc["steps"][step]
        for key in parents:
            node = node[key]
        node[last] = v
    return doc


# --- class 2: absurd levels, multipliers and observed counts, on real processes ---------------------

def test_an_absurd_load_test_level_is_refused_in_one_line_before_any_replay(tmp_path):
    """Concurrency 1e9 (closed loop) and rate 1e12 (open loop), each in a JSON of one changed number:
    before, 2.9 GB and MemoryError after 42 s, or still growing at 60 s; now exit 2 in under a second."""
    concurrency = write(tmp_path, with_step("level", 1e9, **{"in_flight.mean": 1e9}), "c.json")
    rate = with_step("level", 1e12, mode="rate", **{"throughput.requests_per_s": 1e12})
    rate_words = f"steps[1].level: 1e+12 is out of range: 0..{MAX_RATE_RPS:g}"
    for path, words in ((concurrency, f"steps[1].level: 1e+09 is out of range: 1..{MAX_CONCURRENCY}"),
                        (write(tmp_path, rate, "r.json"), rate_words)):
        result = plan_process("--from", path, "--no-rate-search")
        assert result.code == 2 and words in one_line(result.err), result.err[-2000:]
        assert result.peak_rss_mib < MAX_PEAK_RSS_MIB, result


def test_a_candidate_multiplier_out_of_range_is_refused_and_one_in_range_stops_at_its_budget(tmp_path):
    """`rate=1e6` is refused by name; `rate=1000,output=100` is in range but outruns the device: its
    replay stops at MAX_REPLAY_ARRIVALS and the plan says so (before: it grew until MemoryError)."""
    report = write(tmp_path, LOADTEST)
    refused = plan_process("--from", report, "--candidate", "rate=1e6", "--no-rate-search")
    assert refused.code == 2 and "rate=1e6: must be positive and at most 1000" in one_line(refused.err)
    assert refused.peak_rss_mib < MAX_PEAK_RSS_MIB, refused
    # An open-loop source, so that rate= scales Poisson arrivals (issue 41: a plan replays in its
    # source's one mode, and 1000 times a closed loop's clients is a closed loop, which cannot flood).
    open_loop = write(tmp_path, with_step("mode", "rate", level=22.667), "open.json")
    stopped = plan_process("--from", open_loop, "--candidate", "name=flood,rate=1000,output=100", "--no-rate-search",
                           "--json", str(tmp_path / "plan.json"))
    assert stopped.code == 0, stopped.err[-2000:]
    assert f"Note: flood: the replay stopped at {MAX_REPLAY_ARRIVALS:,} arrivals" in stopped.out
    assert stopped.peak_rss_mib < MAX_PEAK_RSS_MIB, stopped
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert "outruns the device" in doc["candidates"][0]["predicted"]["replay_stopped"]
    assert all(c["predicted"]["replay_stopped"] is None for c in doc["current"])


class _Engine(http.server.BaseHTTPRequestHandler):
    """A vLLM page whose counters grow with time (10 requests of 100 tokens every 0.1 s) and whose
    running gauge says a billion."""

    started = time.monotonic()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        n = int((time.monotonic() - self.started) * 10) + 1
        body = (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} 1e9\n"
                f"# TYPE vllm:request_success_total counter\n"
                f"vllm:request_success_total{{finished_reason=\"stop\",model_name=\"m\"}} {10 * n}\n"
                f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{model_name=\"m\"}} {1000 * n}\n"
                f"# TYPE vllm:generation_tokens_total counter\n"
                f"vllm:generation_tokens_total{{model_name=\"m\"}} {1000 * n}\n"
                f"# TYPE vllm:time_to_first_token_seconds histogram\n"
                f"vllm:time_to_first_token_seconds_bucket{{le=\"0.1\",model_name=\"m\"}} {10 * n}\n"
                f"vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\",model_name=\"m\"}} {10 * n}\n"
                f"vllm:time_to_first_token_seconds_sum{{model_name=\"m\"}} {0.5 * n}\n"
                f"vllm:time_to_first_token_seconds_count{{model_name=\"m\"}} {10 * n}\n"
                f"# TYPE vllm:inter_token_latency_seconds histogram\n"
                f"vllm:inter_token_latency_seconds_bucket{{le=\"0.1\",model_name=\"m\"}} {990 * n}\n"
                f"vllm:inter_token_latency_seconds_bucket{{le=\"+Inf\",model_name=\"m\"}} {990 * n}\n"
                f"vllm:inter_token_latency_seconds_sum{{model_name=\"m\"}} {19.8 * n}\n"
                f"vllm:inter_token_latency_seconds_count{{model_name=\"m\"}} {990 * n}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_engine_reporting_a_billion_running_through_a_real_exporter_is_refused():
    """Engine -> `llm-exporter run` -> `llm-exporter plan --from http://exporter`: the window's mean
    running requests (1e9) sized the closed loop; before, MemoryError at 2.9 GB after 44 s."""
    server, engine = serve_in_background(_Engine)
    try:
        with exporter_run("--engine", f"{engine}/metrics,kind=vllm,name=bad") as (base, _process, _stderr):
            assert wait_until(lambda: '"bad"' in _get(base + "/api/v1/diagnosis"), timeout=15)
            result = plan_process("--from", base, "--window", "2s", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                  "--no-rate-search")
    finally:
        server.shutdown()
        server.server_close()
    assert result.code == 2, result.err[-2000:]
    line = one_line(result.err)
    assert "1e+09 requests in flight over the window (llm_requests_running sampled 1e+09" in line, line
    assert f"out of range: 0..{MAX_CONCURRENCY}" in line
    assert result.peak_rss_mib < MAX_PEAK_RSS_MIB, result


def _get(url: str) -> str:
    import httpx

    try:
        return httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return ""


# --- class 7: wrong shapes at every path ------------------------------------------------------------

WRONG: dict[str, Any] = {"list": [1], "object": {"a": 1}, "string": "x", "null": None, "negative": -1,
                         "huge": 1e308, "nan": math.nan, "infinity": math.inf, "huge_int": 10**400}
# What the planner reads of a load test (docs/planner.md), by kind: any other shape there is refused by path.
STEP_NUMBERS = ("level", "requests.ok", "elapsed_s", "in_flight.mean", "client.cpu_cores",
                "throughput.requests_per_s", "throughput.input_tokens", "throughput.output_tokens",
                "throughput.output_tokens_per_s", "server.ttft_mean_s", "server.itl_mean_s",
                *(f"latency_s.{k}.{q}" for k in ("ttft", "tpot") for q in ("p50", "p95", "p99", "count")))
STEP_OBJECTS = ("requests", "latency_s", "latency_s.ttft", "latency_s.tpot", "throughput", "server", "in_flight",
                "client")
READ = {**{f"steps[{i}].{p}": "number" for i in (0, 1) for p in STEP_NUMBERS},
        **{f"steps[{i}].{p}": "object" for i in (0, 1) for p in STEP_OBJECTS},
        **{f"steps[{i}]": "object" for i in (0, 1)}, **{f"steps[{i}].mode": "string" for i in (0, 1)},
        "config": "object", "config.client": "object", "config.model": "string", "config.gpu": "string",
        "config.client.cpus": "number", "config.client.loopback_target": "boolean"}
# Wrong for each kind: a number's null is absent (a step with no TTFT is skipped), -1 and 1e308 are out of
# range; an object's {"a": 1} is an object; a string's "x" is a string (a mode of "x" is refused).
REFUSED = {"number": ("list", "object", "string", "negative", "huge", "nan", "infinity", "huge_int"),
           "object": ("list", "string", "negative", "huge", "nan", "infinity", "huge_int"),
           "string": ("list", "object", "negative", "huge", "nan", "infinity", "huge_int"),
           "boolean": ("list", "object", "string", "negative", "huge", "nan", "infinity", "huge_int")}
# The lines a document may end on without naming a path: the whole document, or the sentinel below that
# a plan which read its source reaches (a model that does not exist: no calibration, no replay).
DOCUMENT_WORDS = ("not a load-test report", "the report has no steps", "no step recorded a request")
SENTINEL = ("--model", "no-such-model")
SENTINEL_WORDS = "model 'no-such-model' is not a built-in shape"


def paths(value: Any, path: str = "") -> Iterator[tuple[str, tuple]]:
    """Every path of a JSON document, as the planner writes it (steps[1].latency_s.ttft.p50) and as keys."""
    def walk(v: Any, text: str, keys: tuple) -> Iterator[tuple[str, tuple]]:
        yield text, keys
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, child in items:
            yield from walk(child, f"{text}[{k}]" if isinstance(k, int) else f"{text}.{k}" if text else k, (*keys, k))
    yield from walk(value, path, ())


def mutated(doc: Any, keys: tuple, value: Any) -> Any:
    if not keys:
        return value
    out = copy.deepcopy(doc)
    node = out
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    return out


def plan_in_process(args, source: str) -> tuple[int, str, str]:
    args.source = source
    out, err = io.StringIO(), io.StringIO()
    code = command_plan(args, {}, out, err)
    return code, out.getvalue(), err.getvalue()


def test_a_load_test_of_the_wrong_shape_at_any_path_is_one_line_and_exit_2(tmp_path):
    """Every path of a real load-test JSON replaced by a list, an object, a string, null, -1, 1e308, NaN
    and Infinity (the `plan` command in-process, as main() runs it): exit 2, one line, no traceback;
    where the planner reads the value, the line names its path. Before, 15 of 17 such inputs exited 1
    with a traceback (a list for `requests`: AttributeError)."""
    args = build_parser().parse_args(["plan", "--from", "-", *SENTINEL])
    source = tmp_path / "lt.json"
    seen: dict[str, set[str]] = {}
    count = 0
    for text, keys in paths(LOADTEST):
        for kind, value in WRONG.items():
            source.write_text(json.dumps(mutated(LOADTEST, keys, value)))  # NaN and Infinity as JavaScript writes them
            code, out, err = plan_in_process(args, str(source))
            count += 1
            assert code == 2 and out == "", (text, kind, err)
            line = one_line(err)
            named = f": {text}: " in line
            # or a path inside the value put there (a list for `steps` is "steps[0]: expected an object")
            assert named or f": {text}[" in line or f": {text}." in line or SENTINEL_WORDS in line \
                or any(w in line for w in DOCUMENT_WORDS), (text, kind, line)
            if named:
                seen.setdefault(text, set()).add(kind)
    assert count > 1000
    for text, kind in READ.items():
        missing = set(REFUSED[kind]) - seen.get(text, set())
        assert not missing, f"{text}: {sorted(missing)} not refused by path"


def test_wrong_shapes_through_the_real_process_are_one_line_too(tmp_path):
    """A few of the table's cases on the real `llm-exporter plan` process."""
    cases = {"steps[0].requests": mutated(LOADTEST, ("steps", 0, "requests"), [1]),
             "steps[1].latency_s.ttft.p50": mutated(LOADTEST, ("steps", 1, "latency_s", "ttft", "p50"), math.nan),
             "steps[0]": mutated(LOADTEST, ("steps", 0), "x"),
             "config.client": mutated(LOADTEST, ("config", "client"), [])}
    for text, doc in cases.items():
        result = plan_process("--from", write(tmp_path, doc))
        assert result.code == 2 and f": {text}: " in one_line(result.err), (text, result.err[-2000:])


DIAGNOSIS = json.loads((FIXTURES / "diagnosis.json").read_text())


class _Diagnosis(http.server.BaseHTTPRequestHandler):
    """An exporter whose /api/v1/diagnosis is the class's `body` and whose /metrics answers 404: a
    plan that accepts the diagnosis ends on that 404, in one line, without waiting out a window."""

    body = b"{}"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        status, body = (200, type(self).body) if self.path == "/api/v1/diagnosis" else (404, b"no\n")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_exporter_diagnosis_of_the_wrong_shape_at_any_path_is_one_line_and_exit_2():
    """`plan --from http://...` against answers of the wrong shape at every path of a real diagnosis
    (before: a list for a target's entry or numbers was AttributeError, a dict for gpus KeyError)."""
    handler = type("Handler", (_Diagnosis,), {})
    server, base = serve_in_background(handler)
    args = build_parser().parse_args(["plan", "--from", base, "--window", "1s", *SENTINEL])
    read = {"targets": "object", "targets.bad": "object", "targets.bad.numbers": "object",
            "targets.bad.numbers.running": "number", "targets.bad.gpus": "list", "targets.bad.gpus[0]": "object",
            "targets.bad.gpus[0].name": "string", "targets.bad.engine": "string", "targets.bad.model": "string"}
    seen: dict[str, set[str]] = {}
    try:
        for text, keys in paths(DIAGNOSIS):
            for kind, value in WRONG.items():
                handler.body = json.dumps(mutated(DIAGNOSIS, keys, value)).encode()
                code, _, err = plan_in_process(args, base)
                line = one_line(err)
                assert code == 2, (text, kind, line)
                at = "diagnosis: " + (text.replace("targets.bad", 'targets["bad"]') if keys else "the document")
                if f"{at}: " in line:
                    seen.setdefault(text, set()).add(kind)
                else:  # a path inside the value put there, or the ends of a diagnosis the planner took
                    assert f"{at}[" in line or f"{at}." in line or "answered HTTP 404" in line \
                        or "no engine target" in line, (text, kind, line)
        for body in (b"<html>not an exporter</html>", b"[1, 2", b"\xff\xfe"):
            handler.body = body
            code, _, err = plan_in_process(args, base)
            assert code == 2 and "is not JSON" in one_line(err), err
    finally:
        server.shutdown()
        server.server_close()
    wrong_for = {"object": ("list", "string", "negative", "huge", "nan", "infinity"),
                 "list": ("object", "string", "negative", "huge", "nan", "infinity"),
                 "number": ("list", "object", "string", "negative", "huge", "nan", "infinity", "huge_int"),
                 "string": ("list", "object", "negative", "huge", "nan", "infinity")}
    for text, kind in read.items():
        missing = set(wrong_for[kind]) - seen.get(text, set())
        assert not missing, f"{text}: {sorted(missing)} not refused by path"


class _NotMetrics(_Diagnosis):
    """A diagnosis that names a target, and a /metrics that is not an exposition."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = json.dumps(DIAGNOSIS).encode() if self.path == "/api/v1/diagnosis" else b"<html><body>hi</body></html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_exporter_metrics_page_that_is_not_an_exposition_is_one_line():
    server, base = serve_in_background(_NotMetrics)
    try:
        code, _, err = plan_in_process(build_parser().parse_args(["plan", "--from", base]), base)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and "/metrics is not a Prometheus exposition" in one_line(err), err


# --- the flags and candidates: each bound by name --------------------------------------------------

@pytest.mark.parametrize(("args", "words"), [
    (["--tp", "100000"], "--tp 100000 is out of range: 1..1024"),
    (["--tp", "1" + "0" * 400], "--tp 100000000000... is out of range: 1..1024"),
    (["--max-num-seqs", "1000000000"], "--max-num-seqs 1e+09 is out of range"),
    (["--max-batched-tokens", "0"], "--max-batched-tokens 0 is out of range"),
    (["--output-tokens", "nan"], "--output-tokens nan is out of range"),
    (["--gpu-price-per-hour", "-1"], "--gpu-price-per-hour -1 is out of range"),
    (["--cpu-cores", "inf"], "--cpu-cores inf is out of range"),
    (["--cpu-threads", "100000"], "--cpu-threads 100000 is out of range"),
    (["--candidate", "concurrency=100000"], f"must be positive and at most {MAX_CONCURRENCY}"),
    (["--candidate", "tp=5000"], "tp=5000: must be positive and at most 1024"),
    (["--candidate", "prompt=1e6"], "prompt=1e6: must be positive and at most 1000"),
    (["--candidate", "output=nan"], "output=nan: must be positive"),
    (["--candidate", "max_num_seqs=1000000000"], "max_num_seqs=1000000000: must be positive and at most 65536"),
    (["--candidate", "price=1e9"], "price=1e9: must be positive"),
])
def test_flags_and_candidate_keys_out_of_range_are_refused_by_name(tmp_path, capsys, args, words):
    code = cli_run(["plan", "--from", write(tmp_path, LOADTEST), *args], {})
    err = capsys.readouterr().err
    assert code == 2 and words in one_line(err), err


def test_a_multiplier_in_range_that_takes_the_observed_traffic_past_a_bound_is_refused(tmp_path, capsys):
    """rate=1000 on 5,000 requests/s observed is 5M requests/s: refused before calibration replays."""
    doc = with_step("level", 5000.0, mode="rate", **{"throughput.requests_per_s": 5000.0})
    started = time.monotonic()
    code = cli_run(["plan", "--from", write(tmp_path, doc), "--candidate", "rate=1000"], {})
    err = capsys.readouterr().err
    assert code == 2 and "candidate 'rate=1000': rate=1000 times the observed 5000 is 5e+06 requests/s: at most " \
                         f"{MAX_RATE_RPS:g}" in one_line(err), err
    assert time.monotonic() - started < 5.0  # no calibration ran (it takes 2-10 s)


def test_a_plan_past_its_cpu_budget_stops_in_one_line():
    """Every replay checks the plan's CPU deadline (limits.MAX_PLAN_CPU_S): a 32-step sweep at the
    bounds' highest levels would otherwise calibrate for minutes. Here a budget of 0.2 s, under the
    2 s this calibration takes."""
    from exporter.planner.model import PlanError, Setup, gpu_device
    from exporter.planner.observe import from_loadtest
    from exporter.planner.plan import plan
    from exporter.specs.models import load_model

    observed = from_loadtest(LOADTEST, "lt.json")
    base = Setup(gpu_device("h100-sxm"), load_model("llama-3.1-8b"))
    started = time.process_time()
    with pytest.raises(PlanError, match=r"the plan ran past its budget of 0.2 s of CPU \(limits.MAX_PLAN_CPU_S\)"):
        plan(observed, base, [], ttft_slo=2.5, tpot_slo=0.1, cpu_budget_s=0.2)
    assert time.process_time() - started < 1.5
