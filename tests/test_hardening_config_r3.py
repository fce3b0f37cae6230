"""Hardening round 3, classes 3 and 7 (issue 40): what a file, a flag or a remote JSON of the wrong
shape can do.

Class 3, duplicate YAML keys: PyYAML keeps the last of two equal keys silently. A web config with
`basic_auth_users: {...}` and later `basic_auth_users: {}` started with no authentication and said
nothing; a second `engines: []` ran with no sources; a user written twice took the second hash, so
an edit that appended one line swapped the password. Every YAML file we read now refuses a key
written twice, at any depth, naming the file, the line and the key; the web config fails closed
(exit 2 at start, the last good config kept on reload).

Class 7, wrong shapes: a list where an object is expected, a dict where a string is, out-of-range
settings; and a load test that lost its whole sweep when the --exporter answered a wrong-shaped
diagnosis. Each is one line and the documented exit code (docs/cli.md), never a traceback, and a
sweep that stops keeps the steps it finished."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pathlib
import resource
import secrets
import signal
import subprocess
import sys
import time

import bcrypt
import httpx
import pytest

from exporter import cli
from exporter.yamlsafe import YamlLoadError, load_yaml_file
from tests.support import free_port, stop_process, wait_until
from tests.test_hardening_files import RELOAD_OK, _exporter, _value
from tests.test_security import _write_yaml

# Failsafes, far above a run that works (under a second): before a fix a run may never end.
EXIT_FAILSAFE_S = 30.0
# A refused start takes about 0.5 s (the interpreter and imports): 10x that on a busy CI machine.
REFUSED_START_BOUND_S = 5.0


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def _run_cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """`llm-exporter ARGV` as a real process: (exit status, stderr, seconds to exit)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "exporter.cli", *argv], capture_output=True, text=True,
                          timeout=EXIT_FAILSAFE_S, env={**os.environ, **(env or {})}, check=False)
    return done.returncode, done.stderr, time.monotonic() - started


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


# --- class 3: duplicate keys ---------------------------------------------------------------------

# (YAML text, the key named, the line of the second one): each a file we read refuses.
DUPLICATES = [
    ("engines: ['http://127.0.0.1:1']\ninterval: 1s\nengines: []\n", "'engines'", 3),
    ("engines:\n  - url: http://127.0.0.1:1\n    name: a\n    url: http://127.0.0.1:2\n", "'url'", 4),
    ("host:\n  enabled: false\n  backend: procfs\n  enabled: true\n", "'enabled'", 4),
    ("gpu_spec: {mem_bandwidth_bytes_per_s: 1e12, mem_bandwidth_bytes_per_s: 2e12}\n",
     "'mem_bandwidth_bytes_per_s'", 1),
    ("target_gpus:\n  a: [0]\n  b: [1]\n  a: [2]\n", "'a'", 4),
    # a key is what it constructs to, as the dict that receives it compares them
    ("x-a:\n  1: one\n  true: two\n", "'true'", 3),
    ("x-a:\n  null: one\n  ~: two\n", "'~'", 3),
    ("x-a:\n  a: 1\n  \"a\": 2\n", "'a'", 3),
    # `<<` written twice: PyYAML merged both, silently; one `<<: [*a, *b]` says it
    ("x-a: &a {kind: vllm}\nx-b: &b {timeout: 1s}\nengines:\n  - url: http://127.0.0.1:1\n    <<: *a\n    <<: *b\n",
     "'<<'", 6),
    ("x-deep: [[{a: [{b: {c: 1, c: 2}}]}]]\n", "'c'", 1),
]


@pytest.mark.parametrize(("text", "key", "line"), DUPLICATES)
def test_a_key_written_twice_is_refused_at_any_depth_naming_file_line_and_key(tmp_path, text, key, line):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(YamlLoadError) as caught:
        load_yaml_file(path)
    assert f"duplicate key {key} at line {line}," in str(caught.value)
    rc, stderr = _in_process("run", "--config", str(path))
    assert rc == 2
    assert str(path) in stderr and f"duplicate key {key} at line {line}," in stderr


def test_merge_keys_and_keys_that_only_look_alike_are_no_duplicates(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("x-defaults: &d {kind: vllm, timeout: 300ms}\n"
                    "x-other: &o {name: b}\n"
                    "x-types: {1: int, '1': str}\n"  # an int and a string: two keys
                    "engines:\n"
                    "  - {<<: *d, url: 'http://127.0.0.1:1', name: a, timeout: 200ms}\n"  # explicit over merged
                    "  - {<<: [*d, *o], url: 'http://127.0.0.1:2'}\n")
    data = load_yaml_file(path)
    assert data["engines"][0] == {"kind": "vllm", "timeout": "200ms", "url": "http://127.0.0.1:1", "name": "a"}
    assert data["engines"][1]["name"] == "b"


def _refused_start(tmp_path: pathlib.Path, *args: str) -> tuple[str, float]:
    """`llm-exporter run ARGS` on a free port, which must exit 2 at once: (its one stderr line, the
    seconds it took). One that starts instead fails the test saying what it serves without
    credentials."""
    port = free_port()
    started = time.monotonic()
    with open(tmp_path / "stderr", "w+b") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}",
                                    "--gpu-backend", "none", "--no-host", *args],
                                   stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            process.wait(timeout=2 * REFUSED_START_BOUND_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(httpx.HTTPError):
                status = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code
                pytest.fail(f"it started: /metrics without credentials answered {status}")
            pytest.fail("it neither exited nor answered")
        finally:
            stop_process(process)
        took = time.monotonic() - started
        stderr.seek(0)
        text = stderr.read().decode(errors="replace")
    assert process.returncode == 2, text
    return _one_line(text), took


def test_a_web_config_with_a_second_empty_user_block_does_not_start(tmp_path):
    """Before: it started with no authentication, and logged nothing (`/metrics` answered 200
    without credentials). Now: exit 2, one line naming the file, the line and the key."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: {_hash('s3cret')}\nbasic_auth_users: {{}}\n")
    line, took = _refused_start(tmp_path, "--web.config.file", str(web))
    assert str(web) in line and "duplicate key 'basic_auth_users' at line 3" in line, line
    assert took < REFUSED_START_BOUND_S, f"refusing took {took:.1f}s"


def test_a_config_with_a_second_engines_key_does_not_start(tmp_path):
    """Before: it ran with no engine target at all."""
    config = tmp_path / "c.yaml"
    config.write_text("engines:\n  - http://127.0.0.1:9/metrics\nlog_level: info\nengines: []\n")
    line, took = _refused_start(tmp_path, "--config", str(config))
    assert str(config) in line and "duplicate key 'engines' at line 4" in line, line
    assert took < REFUSED_START_BOUND_S, f"refusing took {took:.1f}s"


def test_a_reload_with_a_user_written_twice_keeps_the_last_good_config(tmp_path):
    """An appended line that repeats a user (or the whole block) replaced that user's hash before,
    and the reload succeeded: the second password was the one that worked. Now the reload is
    refused, the metric says so, the old credentials still work and the new ones do not; a request
    without credentials still gets 401."""
    good, other = secrets.token_hex(8), secrets.token_hex(8)
    web = tmp_path / "web.yml"
    _write_yaml(web, f"basic_auth_users:\n  prometheus: {_hash(good)}\n")
    log = tmp_path / "log"
    with _exporter(log, "--web.config.file", str(web)) as (process, base):
        assert _value(httpx.get(base + "/metrics", timeout=5, auth=("prometheus", good)).text, RELOAD_OK) == 1.0
        _write_yaml(web, f"basic_auth_users:\n  prometheus: {_hash(good)}\n  prometheus: {_hash(other)}\n")
        process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "not reloaded (SIGHUP)" in log.read_text(), timeout=15), log.read_text()
        # The metric is on the page of the next collection cycle (100 ms here, later on a busy machine).
        assert wait_until(lambda: _value(httpx.get(base + "/metrics", timeout=5, auth=("prometheus", good)).text,
                                         RELOAD_OK) == 0.0, timeout=15)
        assert httpx.get(base + "/metrics", timeout=5, auth=("prometheus", other)).status_code == 401
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401
        # The block written twice, the second empty: refused the same way (not as "auth off").
        _write_yaml(web, f"basic_auth_users:\n  prometheus: {_hash(good)}\nbasic_auth_users: {{}}\n")
        process.send_signal(signal.SIGHUP)
        assert wait_until(lambda: log.read_text().count("not reloaded (SIGHUP)") == 2, timeout=15)
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401
    refusals = [line for line in log.read_text().splitlines() if "not reloaded" in line]
    assert "duplicate key 'prometheus' at line 3" in refusals[0] and "in basic_auth_users" in refusals[0], refusals
    assert any("duplicate key 'basic_auth_users' at line 3" in line for line in refusals), refusals
    assert good not in log.read_text() and other not in log.read_text()


def test_finding_duplicates_costs_linear_time(tmp_path):
    """A 1 MiB file of 40,000 keys in one mapping, the duplicate last: found in one pass (a dict of
    the keys seen), not by comparing pairs (800 million comparisons)."""
    path = tmp_path / "c.yaml"
    keys = 40_000
    path.write_text("x-big:\n" + "".join(f"  key{i:07d}: {i}\n" for i in range(keys)) + "  key0000000: again\n")
    assert path.stat().st_size < 1 << 20
    started = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    with pytest.raises(YamlLoadError, match=f"duplicate key 'key0000000' at line {keys + 2}, .* in x-big"):
        load_yaml_file(path)
    spent = resource.getrusage(resource.RUSAGE_SELF).ru_utime - started
    assert spent < 10.0, f"{spent:.1f}s of CPU"  # about 0.5 s on a laptop


# --- helpers -------------------------------------------------------------------------------------

def _in_process(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The real CLI entry (cli.run) in this process, stderr captured; a start that passes every
    check returns 0 at once instead of serving (see _no_serving)."""
    err = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # run's setup_logging replaces them
    with contextlib.redirect_stderr(err), _no_serving():
        try:
            rc = cli.run(list(argv), env if env is not None else {})
        except SystemExit as exit_:  # argparse
            rc = int(exit_.code or 0)
        except Exception as error:  # noqa: BLE001 - what a real process would die of, with a traceback
            rc, _ = 1, err.write(f"Traceback (in-process): {type(error).__name__}: {error}\n")
        finally:
            root.handlers[:], root.level = handlers, level
    return rc, err.getvalue()


@contextlib.contextmanager
def _no_serving():
    """Everything `run` does before it serves (config, web config, sources, the derive stages and
    the collector built from them), then return instead of listening."""
    import exporter.app as app

    async def built_then_stop(config, sources, sock, *args, web=None, **kwargs) -> None:
        collector = app.make_collector(config, sources)
        await collector.close()

    saved = app.serve, app.bind_listener
    app.serve, app.bind_listener = built_then_stop, lambda config: None
    try:
        yield
    finally:
        app.serve, app.bind_listener = saved


# --- class 7: every value of a valid config replaced by a wrong shape -----------------------------

def _valid_config(tmp_path: pathlib.Path) -> dict:
    """A config that sets nearly every setting, each nested shape included; `run` accepts it."""
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    return {
        "engines": [
            {"url": "http://127.0.0.1:9/metrics", "name": "a", "kind": "vllm", "timeout": "500ms", "role": "decode",
             "model": "m", "basic_auth": {"username": "u", "password_env": "PW"},
             "tls_config": {"insecure_skip_verify": False}},
            {"url": "http://127.0.0.1:10/metrics", "name": "b", "bearer_token_file": str(token)},
            "http://127.0.0.1:11,name=c,kind=sglang",
        ],
        "probes": [{"url": "http://127.0.0.1:9", "target": "a", "every": "15s", "prompt_tokens": 8, "max_tokens": 4,
                    "api": "chat", "timeout": "5s", "model": "m"}],
        "listen": "127.0.0.1:0", "interval": "1s", "engine_timeout": "500ms", "max_payload_bytes": "8MiB",
        "gpu_backend": "none",
        "host": {"enabled": False, "backend": "procfs", "proc_root": "/proc", "sys_root": "/sys"},
        "engine_port": 8000, "engine_process_name": "vllm", "engine_network_devices": ["eth0", "mlx5_*"],
        "network_exclude": ["lo"], "model": "llama-3.1-8b", "tensor_parallel": 1, "gpu_price_per_hour": 2.5,
        "slo_ttft": "1s", "slo_tbt": "100ms", "quantile_window": "5m", "log_level": "error",
        "max_series_per_target": 1000, "max_concurrent_scrapes": 4, "kv_cache_dtype": "fp8",
        "verdict_hold_cycles": 3, "rate_window": "15s", "gpu_spec": {"mem_bandwidth_bytes_per_s": 3.35e12},
        "target_gpus": {"a": [0], "b": [1]},
    }


# What each value is replaced with: the shapes a hand-written or generated file gets wrong.
WRONG_VALUES = {
    "list": [1, "two"], "dict": {"k": "v"}, "string": "zzz", "null": None, "negative": -1, "huge": 1e308,
    "nan": float("nan"), "bool": True, "nul": "a\0b", "long": "x" * 10_000, "deep": [[[[{"k": [[{}]]}]]]],
}


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, (*prefix, index))
    return out


def _replaced(doc: dict, path: tuple, value: object) -> dict:
    import copy

    doc = copy.deepcopy(doc)
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


def test_every_value_of_a_config_replaced_by_a_wrong_shape_is_one_line_and_exit_2(tmp_path):
    import yaml

    base = _valid_config(tmp_path)
    path = tmp_path / "c.yaml"
    env = {"PW": "pa55"}
    path.write_text(yaml.safe_dump(base))
    assert _in_process("run", "--config", str(path), env=env) == (0, "")
    failures, refused, started = [], 0, 0
    for where in _paths(base):
        for name, value in WRONG_VALUES.items():
            path.write_text(yaml.safe_dump(_replaced(base, where, value), width=1 << 20))
            rc, stderr = _in_process("run", "--config", str(path), env=env)
            lines = stderr.splitlines()
            if "Traceback" in stderr or rc not in (0, 2) or (rc == 2 and len(lines) != 1) or (rc == 0 and stderr):
                failures.append(f"{'.'.join(map(str, where))} = {name}: exit {rc}: {stderr[-300:]!r}")
            elif rc == 2:
                refused += 1
                assert lines[0].startswith("llm-exporter: ") and len(lines[0]) < 1200, lines[0]
            else:
                started += 1
    assert not failures, f"{len(failures)} of {refused + started + len(failures)}:\n" + "\n".join(failures[:40])
    assert refused > started  # most wrong shapes are refused; the rest are values of another valid kind


# Text a flag or an environment variable can carry: every setting gets each.
WRONG_TEXTS = ("[1, 2]", '{"k": "v"}', "zzz", "-1", "0", "1e308", "nan", "inf", "9" * 5000, "x" * 10_000, "a\x01b",
               "[" * 10_000, '{"a": {"b": [1]}}', "true")


def _settings_with(attribute: str) -> list:
    from exporter.settings import SETTINGS

    return [s for s in SETTINGS if s.field and getattr(s, attribute)]


def test_every_setting_as_an_environment_variable_with_wrong_text_is_one_line_and_exit_2():
    failures = []
    for setting in _settings_with("env"):
        for text in WRONG_TEXTS:
            rc, stderr = _in_process("run", "--gpu-backend", "none", "--no-host", "--listen", "127.0.0.1:0",
                                     env={setting.env: text, "LLM_EXPORTER_LOG_LEVEL": "error"}
                                     if setting.name != "log_level" else {setting.env: text})
            if "Traceback" in stderr or rc not in (0, 2) or len(stderr.splitlines()) != (rc == 2):
                failures.append(f"{setting.env}={text[:20]!r}: exit {rc}: {stderr[-300:]!r}")
    assert not failures, "\n".join(failures[:40])


def test_every_flag_with_wrong_text_is_one_line_and_exit_2():
    failures = []
    for setting in _settings_with("flag"):
        if setting.flag_action == "store_false":
            continue
        for text in WRONG_TEXTS:
            argv = ["run", "--gpu-backend", "none", "--no-host", "--listen", "127.0.0.1:0", "--log-level", "error"]
            rc, stderr = _in_process(*argv, setting.flag, text)
            if "Traceback" in stderr or rc not in (0, 2) or len(stderr.splitlines()) != (rc == 2):
                failures.append(f"{setting.flag} {text[:20]!r}: exit {rc}: {stderr[-300:]!r}")
    assert not failures, "\n".join(failures[:40])


# --- class 7: a load test that goes bad mid-sweep ---------------------------------------------------

LOADTEST_FAILSAFE_S = 90.0  # a sweep of three 1 s steps takes about 5 s; before a fix one could hang
LOADTEST_WALL_BOUND_S = 30.0  # about 9x the 3.5 s the sweep takes, for a busy CI machine
LOADTEST_RSS_BOUND = 256 << 20  # the load generator peaks at 35 MiB here (7x)


class _Server:
    """One loopback server that is both an OpenAI-style streaming engine (/v1/completions: 20 ms to
    the first token, 5 ms between tokens, exactly max_tokens) and an exporter (/api/v1/diagnosis,
    /metrics), each of which can go bad once `bad_at` requests were in flight at once (so in the
    step of that concurrency, never before): the diagnosis (twice a wrong shape, then numbers no
    exporter sends) with `diagnosis_goes_bad`, else the engine (it stops listening and resets the
    requests in flight: a server that died)."""

    def __init__(self, *, bad_at: int | None = None, diagnosis_goes_bad: bool = False) -> None:
        import http.server
        import threading

        self.bad_at, self.diagnosis_goes_bad = bad_at, diagnosis_goes_bad
        self.bad_polls = self.in_flight = 0
        self.gone_bad = False
        self.lock = threading.Lock()
        self.dead = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                outer.complete(self)

            def do_GET(self) -> None:  # noqa: N802
                outer.exporter(self)

            def log_message(self, *args: object) -> None:
                return

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.dead.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def complete(self, handler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        with self.lock:
            self.in_flight += 1
            self.gone_bad = self.gone_bad or (self.bad_at is not None and self.in_flight >= self.bad_at)
            if self.gone_bad and not self.diagnosis_goes_bad and not self.dead.is_set():
                self.dead.set()
                self.httpd.socket.close()  # no more connections: refused from now on
        counted = False
        try:
            if self.dead.is_set():
                handler.connection.shutdown(2)  # the requests in flight are reset too
                return
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.end_headers()
            time.sleep(0.02)
            for i in range(body["max_tokens"]):
                if self.dead.is_set():
                    handler.connection.shutdown(2)
                    return
                time.sleep(0.005 if i else 0)
                handler.wfile.write(b'data: {"choices":[{"index":0,"text":" tok"}]}\n\n')
            usage = {"prompt_tokens": 8, "completion_tokens": body["max_tokens"]}
            # Counted out before the client can see the end: it sends its next request only after
            # [DONE], so the count here never runs ahead of the client's concurrency.
            counted = self._leave()
            handler.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                                + b"\n\ndata: [DONE]\n\n")
        except OSError:
            pass
        finally:
            if not counted:
                self._leave()

    def _leave(self) -> bool:
        with self.lock:
            self.in_flight -= 1
        return True

    def exporter(self, handler) -> None:
        if handler.path.startswith("/api/v1/diagnosis"):
            with self.lock:
                bad = self.bad_polls = self.bad_polls + (self.gone_bad and self.diagnosis_goes_bad)
            good = {"ready": True, "targets": {"twin": {"verdict": "memory_bandwidth", "evidence": ["all fine"],
                                                        "numbers": {"running": 1, "waiting": 0}}}}
            if not bad:
                payload = json.dumps(good)
            elif bad <= 2:  # a list where an object belongs: the sweep died of it
                payload = json.dumps({"ready": True, "targets": [good["targets"]["twin"]]})
            else:  # a shape that passes, numbers no exporter sends (NaN broke the JSON report at the end)
                payload = ('{"ready": true, "targets": {"twin": {"verdict": "' + "v" * 5000 + '", "evidence": ["'
                           + "e" * 20_000 + '"], "numbers": {"running": NaN, "waiting": 1e999, '
                           '"kv_usage_ratio": -3}}}}')
            body, kind = payload.encode(), "application/json"
        else:
            body, kind = (b'llm_requests_running{target="twin"} 1e308\nllm_kv_cache_usage_ratio{target="twin"} 7\n'
                          b'llm_requests_waiting{target="twin"} -5\n'), "text/plain"
        handler.send_response(200)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def _loadtest(tmp_path: pathlib.Path, *args: str, interrupt_after_step: int | None = None) -> tuple[int, str, str,
                                                                                                      float, int]:
    """`llm-exporter loadtest ARGS --json --html` as a real process: (exit status, stdout, stderr,
    seconds, peak RSS). With `interrupt_after_step`, SIGINT once that step's progress line is out."""
    import psutil

    out, err = tmp_path / "out", tmp_path / "err"
    started, peak = time.monotonic(), 0
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        # SIGINT as a terminal gives it: a runner started in the background (a shell's `cmd &`) hands
        # its children SIGINT ignored, and Python then keeps it ignored (the sweep ran to its end).
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "loadtest", *args, "--json",
                                    str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")],
                                   stdout=stdout, stderr=stderr,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        watched = psutil.Process(process.pid)
        try:
            while process.poll() is None and time.monotonic() - started < LOADTEST_FAILSAFE_S:
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, watched.memory_info().rss)
                if interrupt_after_step is not None and f"step {interrupt_after_step}/" in err.read_text():
                    process.send_signal(signal.SIGINT)
                    interrupt_after_step = None
                time.sleep(0.05)
        finally:
            stop_process(process)
    return process.returncode, out.read_text(), err.read_text(), time.monotonic() - started, peak


def _report(tmp_path: pathlib.Path) -> dict:
    import jsonschema

    from exporter.probe.report import REPORT_SCHEMA

    path = tmp_path / "r.json"
    assert path.exists(), "no JSON report: the steps measured were lost"
    report = json.loads(path.read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    return report


SWEEP = ("--concurrency", "1,2,3", "--warmup", "0s", "--duration", "1s", "--max-tokens", "8", "--prompt-tokens", "8")


def test_a_loadtest_whose_exporter_answers_garbage_mid_sweep_keeps_every_step(tmp_path):
    """Before: the first wrong-shaped diagnosis (a list where an object belongs) killed the sweep
    with a traceback (exit 1, no table, no JSON); numbers like NaN broke the JSON report at the very
    end. Now each such poll fails in one line (in the step's notes), the sweep runs to its end and
    every step is written; the server side keeps only what made sense."""
    with _Server(bad_at=2, diagnosis_goes_bad=True) as server:
        rc, out, err, took, rss = _loadtest(tmp_path, server.url, "--exporter", server.url, *SWEEP)
    assert "Traceback" not in err, err[-2000:]
    assert rc == 0, err[-2000:]
    report = _report(tmp_path)
    assert [s["level"] for s in report["steps"]] == [1, 2, 3] and all(s["requests"]["ok"] for s in report["steps"])
    first, second, third = (s["server"] for s in report["steps"])
    assert first["verdict"] == "memory_bandwidth" and first["poll_errors"] == 0
    notes = " ".join(report["steps"][1]["notes"] + report["steps"][2]["notes"])
    assert second["poll_errors"] and "targets is an array, not an object" in notes, notes
    # The garbage numbers are dropped, never kept as NaN, infinite, negative or above a ratio's 1.
    assert (third["running_max"], third["waiting_max"], third["kv_usage_max"], third["verdict"]) == (None,) * 4
    assert all(len(line) < 500 for line in third["evidence"])
    assert "polls failed" in out  # the table's notes say where the exporter's side went
    assert took < LOADTEST_WALL_BOUND_S and rss < LOADTEST_RSS_BOUND, (took, rss >> 20)


def test_a_loadtest_whose_engine_dies_at_level_3_keeps_the_steps_it_finished(tmp_path):
    with _Server(bad_at=3) as server:
        rc, out, err, took, rss = _loadtest(tmp_path, server.url, *SWEEP)
    assert "Traceback" not in err, err[-2000:]
    assert rc == 2, err
    assert err.strip().splitlines()[-1] == f"llm-exporter loadtest: cannot reach {server.url}: connection refused"
    report = _report(tmp_path)
    assert [s["level"] for s in report["steps"]] == [1, 2, 3]
    assert report["stopped"]["reason"] == "connection" and "stopped:" in report["steps"][2]["notes"][-1]
    assert all(s["requests"]["ok"] and not s["requests"]["failed"] for s in report["steps"][:2])
    assert report["recommendation"]["slo"]["max_concurrency"] == 2  # judged on the two steps completed
    assert took < LOADTEST_WALL_BOUND_S and rss < LOADTEST_RSS_BOUND, (took, rss >> 20)


def test_an_interrupted_loadtest_writes_the_steps_it_finished(tmp_path):
    """Before: Ctrl-C exited 130 and wrote nothing, whatever the steps had measured."""
    with _Server() as server:
        # Steps of 4 s: the SIGINT lands in step 2 however late this process reads step 1's line on a
        # loaded machine (with 1 s steps a busy machine let the sweep finish first).
        sweep = tuple("4s" if a == "1s" else a for a in SWEEP)
        rc, out, err, took, _ = _loadtest(tmp_path, server.url, *sweep, interrupt_after_step=1)
    assert "Traceback" not in err, err[-2000:]
    assert rc == 130, err
    report = _report(tmp_path)
    assert [s["level"] for s in report["steps"]] == [1] and report["steps"][0]["requests"]["ok"]
    assert report["stopped"]["reason"] == "interrupted" and report["stopped"]["after"] == 1
    assert err.strip().splitlines()[-1] == ("llm-exporter loadtest: interrupted in step 2 of 3 (concurrency 2); "
                                            "1 step finished and kept")
    assert took < LOADTEST_WALL_BOUND_S


def test_a_step_that_raises_stops_the_sweep_and_keeps_the_steps_before_it():
    """Whatever raises inside a step (here the progress callback, at step 3) stops the sweep with
    one line naming the step and the error; the two steps before it are the report, judged alone."""
    import asyncio
    import dataclasses

    from exporter.probe import loadtest as lt

    @dataclasses.dataclass
    class Ok:
        ok: bool = True
        reason: str = ""
        status: int | None = 200
        ttft_s: float | None = 0.01
        itl_s: tuple = (0.001,)
        e2e_s: float | None = 0.02
        prompt_tokens: int | None = 4
        completion_tokens: int | None = 2

    async def send(spec: lt.RequestSpec) -> Ok:
        await asyncio.sleep(0.01)
        return Ok()

    def progress(index: int, steps: int, level: float, stats: object, done: float) -> None:
        if index == 2:
            raise KeyError("a figure no check foresaw")

    config = lt.SweepConfig(mode="concurrency", levels=(1, 2, 4), warmup_s=0.0, duration_s=0.3)
    report = asyncio.run(lt.run_sweep(send, lt.Workload(prompt_words=4, max_tokens=2), config, progress=progress))
    assert [s["level"] for s in report["steps"]] == [1, 2]
    assert report["stopped"] == {
        "reason": "error", "cause": "KeyError: 'a figure no check foresaw'", "after": 2,
        "text": "an error in step 3 of 3 (concurrency 4), KeyError: 'a figure no check foresaw'; 2 steps finished "
                "and kept"}
    assert report["recommendation"]["slo"]["max_concurrency"] == 2


# (arguments, what the one line says): each was a traceback (exit 1), a sweep of requests that could
# never connect (:99999 ran 105 s of failures), or a report lost after the sweep (--json into a
# folder that does not exist).
BAD_ARGUMENTS = [
    (("loadtest", "http://127.0.0.1:9", "--concurrency", "inf"), "invalid concurrency="),
    (("loadtest", "http://127.0.0.1:9", "--concurrency", "nan"), "invalid concurrency="),
    (("loadtest", "http://127.0.0.1:9", "--concurrency", "9" * 400), "invalid concurrency="),
    (("loadtest", "http://127.0.0.1:99999"), "invalid url='http://127.0.0.1:99999': not a URL"),
    (("loadtest", "http://[::1"), "invalid url='http://[::1': not a URL"),
    (("loadtest", "http://127.0.0.1:9", "--exporter", "http://[::1"), "invalid exporter="),
    (("loadtest", "http://127.0.0.1:9", "--exporter", "ftp://x"), "invalid exporter="),
    (("loadtest", "http://127.0.0.1:9", "--json", "/nonexistent/folder/r.json"), "no such directory"),
    (("loadtest", "http://127.0.0.1:9", "--html", "/"), "is a directory"),
    (("loadtest", "http://127.0.0.1:9", "--dataset", "a\0b"), "an argument contains a NUL byte"),
    (("loadtest", "http://127.0.0.1:9", "--prompt-tokens", "1e308"), "invalid int value"),
    (("doctor", "--url", "http://[::1"), "invalid url="),
    (("doctor", "--url", "http://127.0.0.1:99999"), "invalid url="),
    (("run", "--config", "a\0b"), "an argument contains a NUL byte"),
]


@pytest.mark.parametrize(("argv", "words"), BAD_ARGUMENTS, ids=lambda value: str(value)[:40])
def test_bad_arguments_are_one_line_and_exit_2_before_anything_is_sent(argv, words):
    started = time.monotonic()
    rc, stderr = _in_process(*argv)
    line = _one_line(stderr)
    assert rc == 2 and words in line, stderr
    assert time.monotonic() - started < 5.0  # refused before a request, not after a sweep of failures


def test_a_dataset_that_is_a_fifo_is_refused_instead_of_waiting_for_ever(tmp_path):
    fifo = tmp_path / "d.jsonl"
    os.mkfifo(fifo)
    rc, stderr, took = _run_cli("loadtest", "http://127.0.0.1:9", "--dataset", str(fifo))
    assert rc == 2 and "not a regular file (a FIFO)" in _one_line(stderr), stderr
    assert took < REFUSED_START_BOUND_S


def test_a_web_config_naming_a_file_with_a_nul_is_one_line_at_start_and_a_refused_reload(tmp_path, caplog):
    """A NUL in a certificate path (YAML's "\\0") made open() raise ValueError: a traceback at start,
    and at reload a traceback in the log at every poll. Now: one line, and a refused reload."""
    import trustme

    from exporter import webconfig
    from tests.test_security import _server_cert

    web = tmp_path / "web.yml"
    web.write_text('tls_server_config: {cert_file: "a\\0b", key_file: k}\n')
    rc, stderr = _in_process("run", "--web.config.file", str(web), "--gpu-backend", "none", "--no-host")
    assert rc == 2 and "not a file name" in _one_line(stderr), stderr
    cert = _server_cert(trustme.CA(), tmp_path)
    _write_yaml(web, {"tls_server_config": cert})
    manager = webconfig.WebConfigManager(str(web))
    _write_yaml(web, {"tls_server_config": {**cert, "cert_file": "s\0.crt"}})
    assert manager.check() is False and manager.check() is None  # refused once, then nothing changed
    assert manager.tls_enabled and not manager.last_reload_successful
    assert [r for r in caplog.records if r.exc_info] == []


# Diagnoses of another shape: `doctor --url` died on each with a traceback (exit 1) while rendering.
WRONG_DIAGNOSES = [
    ({"targets": [1]}, "targets is an array, not an object"),
    ({"targets": {"a": [1]}}, "targets.a is an array, not an object"),
    ({"targets": {"a": None}}, "targets.a is null, not an object"),
    ({"targets": {"a": {"evidence": 5}}}, "targets.a.evidence is a number, not an array"),
    ({"targets": {"a": {"evidence": [{"x": 1}]}}}, "targets.a.evidence[0] is an object, not a string"),
    ({"targets": {"a": {"slo": [1]}}}, "targets.a.slo is an array, not an object"),
    ({"targets": {"a": {"slo": {"ttft": [1]}}}}, "targets.a.slo.ttft is an array, not an object"),
    ({"targets": {"a": {"probe": "x"}}}, "targets.a.probe is a string, not an object"),
    ({"targets": {"a": {"probe": {"failing": True}}}}, "targets.a.probe.words is missing"),
    ({"targets": {"a": {"scores": {"x": "y"}}}}, "targets.a.scores.x is a string, not a number"),
    ({"targets": {"a": {"also_limiting": [[1]]}}}, "targets.a.also_limiting[0] is an array, not a string"),
    ({"targets": {"a": {"verdict": [1]}}}, "targets.a.verdict is an array, not a string"),
    ({"targets": {"a": {"engine": {"a": 1}}}}, "targets.a.engine is an object, not a string"),
    ({"targets": {"a": {"unaccounted_families": [1, 2]}}}, "targets.a.unaccounted_families[0] is a number"),
    ({"unreachable": [1]}, "unreachable[0] is a number, not an object"),
    ({"unreachable": {"a": 1}}, "unreachable is an object, not an array"),
    ({"gpu_faults_unassigned": [1]}, "gpu_faults_unassigned[0] is a number, not an object"),
    ({"notes": 5}, "notes is a number, not an array"),
    ({"ready": True, "status": [1]}, "status is an array, not a string"),
]


@contextlib.contextmanager
def _diagnosis_server(documents: list):
    """An "exporter" whose /api/v1/diagnosis answers documents[0] (tests change it)."""
    import http.server

    from tests.support import send_body, serve_in_background

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            send_body(self, json.dumps(documents[0]).encode(), content_type="application/json")

        def log_message(self, *args: object) -> None:
            return

    server, url = serve_in_background(Handler)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def test_doctor_on_a_diagnosis_of_another_shape_cannot_tell_in_one_line():
    documents: list = [None]
    failures = []
    with _diagnosis_server(documents) as url:
        for document, words in WRONG_DIAGNOSES:
            documents[0] = document
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc, stderr = _in_process("doctor", "--url", url)
            lines = out.getvalue().splitlines()
            if rc != 3 or stderr or len(lines) != 1 or words not in lines[0] or "Traceback" in out.getvalue():
                failures.append(f"{json.dumps(document)}: exit {rc}: {(stderr + out.getvalue())[-300:]!r}")
        documents[0] = {"ready": True, "status": "healthy", "targets": {"a": {"verdict": "headroom",
                                                                              "scores": {"compute": None}}}}
        done = subprocess.run([sys.executable, "-m", "exporter.cli", "doctor", "--url", url], capture_output=True,
                              text=True, timeout=EXIT_FAILSAFE_S, check=False)
    assert not failures, "\n".join(failures)
    # A null score (diagnosis.finite makes a non-finite one null) is left out, not a TypeError.
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
