"""Files that block: the files a configuration names (the --config YAML, --web.config.file and the
certificates it names, engine token, password and CA files, the engine pidfile) swapped for a FIFO,
as a mounted secret swapped through a symlink can be. Opening a FIFO waits for a writer that never
comes: before, the exporter hung silently at start, stalled its event loop (so /healthz timed out)
on a token file, and stuck a web config reload for ever (the success metric stayed 1 and SIGTERM
never ended the process). Now only regular files are read, off the event loop, with a size bound
and a timeout (exporter/safefile.py). The real `llm-exporter run` is driven as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import bcrypt
import httpx
import pytest

from exporter import webconfig
from exporter.safefile import Detached, FileReadError, read_regular_file
from tests.support import fake_engine, free_port, wait_until
from tests.test_security import _write_yaml

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"
VLLM = (FIXTURES / "vllm-v0.11__documented.prom").read_bytes()
RELOAD_OK = "llm_exporter_web_config_last_reload_successful"
# Failsafes only: a run that works takes well under a second; one that hangs never ends.
EXIT_FAILSAFE_S = 20.0
TERM_BOUND_S = 10.0


def _fifo_over(path: pathlib.Path) -> None:
    """Swap `path` for a FIFO in one rename, as a symlink swap of a mounted secret does."""
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)
    os.replace(fifo, path)


def _in_thread(fn: Callable[[], object], timeout: float = EXIT_FAILSAFE_S) -> object:
    """fn() in a daemon thread: before the fix it blocks for ever, and must fail the test, not hang it."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(_capture(fn)), daemon=True)
    thread.start()
    thread.join(timeout)
    assert out, f"still blocked after {timeout:g}s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _capture(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except BaseException as error:  # noqa: BLE001 - handed back to the test's thread
        return error


@contextlib.contextmanager
def _exporter(log: pathlib.Path, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`llm-exporter run ARGS` on a free loopback port, its stderr in `log` (a file, not a pipe,
    read through its own handle); yields (process, base URL) once /readyz answers; kills it at
    the end if a test left it running."""
    port = free_port()
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "100ms",
             "--gpu-backend", "none", "--no-host", *args],
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        base = f"http://127.0.0.1:{port}"
        try:
            def ready() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return httpx.get(base + "/readyz", timeout=1).status_code == 200
                return process.poll() is not None

            assert wait_until(ready, timeout=30) and process.poll() is None, log.read_text()
            yield process, base
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _value(text: str, prefix: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return None


def _terminate_and_time(process: subprocess.Popen) -> float:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=EXIT_FAILSAFE_S)
    return time.monotonic() - started


# --- the helper ------------------------------------------------------------------------------------

def test_only_regular_files_are_read_and_never_waited_on(tmp_path):
    regular = tmp_path / "token"
    regular.write_bytes(b"abc\n")
    assert read_regular_file(regular, 4) == b"abc\n"
    with pytest.raises(FileReadError, match="larger than 3 bytes"):
        read_regular_file(regular, 3)
    os.mkfifo(tmp_path / "fifo")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "fifo")  # a symlink swapped onto a FIFO
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "sock"))
    try:
        for path, kind in ((tmp_path / "fifo", "a FIFO"), (link, "a FIFO"), (tmp_path, "a directory"),
                           ("/dev/zero", "a character device")):
            with pytest.raises(FileReadError, match=f"not a regular file \\({kind}\\)"):
                _in_thread(lambda p=path: read_regular_file(p, 1 << 20))
        with pytest.raises(OSError):  # a socket cannot even be opened (ENXIO)
            read_regular_file(tmp_path / "sock", 10)
    finally:
        listening.close()
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "absent", 10)


def test_a_call_that_never_returns_times_out_and_starts_no_second_thread():
    release = threading.Event()
    calls: list[int] = []

    def hung() -> str:
        calls.append(1)
        release.wait(60)
        return "late"

    reader: Detached[str] = Detached("a hung mount", timeout_s=0.2)
    with pytest.raises(FileReadError, match="a hung mount: not read within 0.2s"):
        reader.call(hung)
    assert reader.running
    with pytest.raises(FileReadError):  # its time is spent: fails at once, joins the running call
        reader.call(hung)
    with pytest.raises(FileReadError):
        asyncio.run(reader.acall(hung))
    assert len(calls) == 1  # one thread for the hung mount, not one per ask
    release.set()
    assert wait_until(lambda: not reader.running, timeout=10)
    assert reader.call(lambda: "fresh") == "fresh"
    assert [t for t in threading.enumerate() if t.name == "a hung mount"] == []


def test_the_engine_pidfile_swapped_for_a_fifo_is_no_pid(tmp_path):
    from exporter.sources.host_process import read_pidfile

    pidfile = tmp_path / "engine.pid"
    pidfile.write_text("1234\n")
    assert read_pidfile(str(pidfile)) == 1234
    _fifo_over(pidfile)
    assert _in_thread(lambda: read_pidfile(str(pidfile))) is None


def test_a_model_path_that_is_a_fifo_is_refused(tmp_path):
    """--model, or the model label an engine reports, may be a local config.json path."""
    from exporter.specs.models import load_model

    _fifo_over(tmp_path / "config.json")
    with pytest.raises(FileReadError, match="FIFO"):
        _in_thread(lambda: load_model(str(tmp_path)))


def test_a_certificate_swapped_for_a_fifo_is_refused_at_reload(tmp_path, caplog):
    import trustme

    from tests.test_security import _server_cert

    ca = trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, tmp_path)})
    manager = webconfig.WebConfigManager(str(web))
    _fifo_over(tmp_path / "server.crt")
    caplog.set_level(logging.WARNING)
    assert _in_thread(lambda: manager.check()) is False
    assert manager.last_reload_successful is False and manager.tls_enabled
    assert "tls_server_config.cert_file" in caplog.text and "FIFO" in caplog.text


def test_a_reload_that_cannot_finish_fails_and_recovers(tmp_path, monkeypatch, caplog):
    """A read that never returns (a hung mount): the reload fails after the timeout (metric 0, one
    line), polls meanwhile neither start another read nor log again, auth stays on, and once the
    read returns the next poll reads the files afresh and the metric goes back to 1."""
    caplog.set_level(logging.INFO, logger="llm_exporter.webconfig")
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()}})
    manager = webconfig.WebConfigManager(str(web))
    manager._reader.timeout_s = 0.3
    release = threading.Event()
    real_parse = webconfig.parse_web_config
    parses: list[int] = []

    def hung_parse(path: str) -> webconfig.WebConfig:
        parses.append(1)
        release.wait(60)
        return real_parse(path)

    monkeypatch.setattr(webconfig, "parse_web_config", hung_parse)

    async def scenario() -> list[bool | None]:
        results = [await manager.reload("SIGHUP")]
        for _ in range(3):  # the watcher's polls while the read hangs
            results.append(manager._commit(await manager._evaluate_detached(False), "file changed"))
        release.set()
        await asyncio.to_thread(wait_until, lambda: not manager._reader.running, 10)
        results.append(manager._commit(await manager._evaluate_detached(False), "file changed"))
        return results

    assert asyncio.run(scenario()) == [False, False, False, False, True]
    assert len(parses) == 2  # the hung one and the fresh one after it returned
    refusals = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(refusals) == 1 and "not read within 0.3s" in refusals[0], refusals
    assert manager.last_reload_successful is True and manager.auth_enabled


# --- the real process ------------------------------------------------------------------------------

def _config_fifo(tmp_path: pathlib.Path) -> list[str]:
    _fifo_over(tmp_path / "config.yml")
    return ["--config", str(tmp_path / "config.yml")]


def _web_fifo(tmp_path: pathlib.Path) -> list[str]:
    _fifo_over(tmp_path / "web.yml")
    return ["--web.config.file", str(tmp_path / "web.yml")]


def _token_fifo(tmp_path: pathlib.Path) -> list[str]:
    _fifo_over(tmp_path / "token")
    return ["--engine", f"http://127.0.0.1:1/metrics,bearer_token_file={tmp_path / 'token'}"]


def _ca_fifo(tmp_path: pathlib.Path) -> list[str]:
    _fifo_over(tmp_path / "ca.crt")
    return ["--engine", f"https://127.0.0.1:1/metrics,ca_file={tmp_path / 'ca.crt'}"]


@pytest.mark.parametrize("fifo", [_config_fifo, _web_fifo, _token_fifo, _ca_fifo],
                         ids=["config", "web-config", "bearer-token-file", "ca-file"])
def test_a_fifo_at_start_exits_2_with_one_line_instead_of_hanging(tmp_path, fifo):
    args = fifo(tmp_path)
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "run", "--listen", "127.0.0.1:0",
                                "--gpu-backend", "none", "--no-host", *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=EXIT_FAILSAFE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    elapsed = time.monotonic() - started
    assert process.returncode == 2, f"still running after {elapsed:.1f}s (rc {process.returncode}): {stderr}"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file (a FIFO)" in lines[0] and args[-1].split("=")[-1] in lines[0], \
        stderr


def test_a_bearer_token_file_swapped_for_a_fifo_fails_that_target_and_nothing_else(tmp_path):
    token = "tok-" + secrets.token_hex(16)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    up = 'llm_engine_up{'
    failing = 'llm_exporter_collect_errors_total{reason="credentials",source="engine:secure"}'
    with fake_engine(VLLM, expect_authorization=f"Bearer {token}") as (url, _), \
            _exporter(tmp_path / "log", "--engine", f"{url},kind=vllm,name=secure,bearer_token_file={token_file}") \
            as (process, base):
        assert wait_until(lambda: _value(httpx.get(base + "/metrics", timeout=5).text, up) == 1.0, timeout=20)
        _fifo_over(token_file)
        # Before the fix the event loop sat in open() on the FIFO: every request timed out.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert httpx.get(base + "/healthz", timeout=5).status_code == 200
            assert httpx.get(base + "/metrics", timeout=5).status_code == 200
            time.sleep(0.1)
        assert wait_until(lambda: (_value(httpx.get(base + "/metrics", timeout=5).text, failing) or 0) >= 3,
                          timeout=20)
        text = httpx.get(base + "/metrics", timeout=5).text
        assert _value(text, 'llm_exporter_source_up{source="engine:secure"}') == 0.0
        assert _value(text, "llm_exporter_collections_total") > 0
        token_file.unlink()
        token_file.write_text(token + "\n")  # a regular file again: the target recovers
        assert wait_until(lambda: _value(httpx.get(base + "/metrics", timeout=5).text, up) == 1.0, timeout=20)
        elapsed = _terminate_and_time(process)
        assert process.returncode is not None and elapsed < TERM_BOUND_S, f"SIGTERM took {elapsed:.1f}s"
        logs = (tmp_path / "log").read_text()
    failing_lines = [line for line in logs.splitlines() if "source engine:secure failing" in line]
    assert len(failing_lines) == 1, logs
    assert "credentials" in failing_lines[0] and "not a regular file (a FIFO)" in failing_lines[0]
    assert str(token_file) in failing_lines[0]
    assert sum("source engine:secure recovered" in line for line in logs.splitlines()) == 1, logs
    assert token not in logs


def test_a_web_config_swapped_for_a_fifo_then_sighups_fails_closed_and_sigterm_still_ends_it(tmp_path):
    password = secrets.token_hex(8)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": hashed}})
    auth = ("prometheus", password)
    log = tmp_path / "log"
    with _exporter(log, "--web.config.file", str(web)) as (process, base):
        assert _value(httpx.get(base + "/metrics", timeout=5, auth=auth).text, RELOAD_OK) == 1.0
        _fifo_over(web)
        for _ in range(3):
            process.send_signal(signal.SIGHUP)
            time.sleep(0.2)
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        # Before the fix the reload sat in open() on the FIFO for ever and the metric stayed 1.
        assert wait_until(lambda: _value(httpx.get(base + "/metrics", timeout=5, auth=auth).text, RELOAD_OK) == 0.0,
                          timeout=15)
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401  # auth fails closed
        process.send_signal(signal.SIGHUP)  # more SIGHUPs still answer at once
        assert wait_until(lambda: log.read_text().count("not reloaded (SIGHUP)") == 4, timeout=15), log.read_text()
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        elapsed = _terminate_and_time(process)
        assert process.returncode is not None and elapsed < TERM_BOUND_S, f"SIGTERM took {elapsed:.1f}s"
        logs = (tmp_path / "log").read_text()
    refusals = [line for line in logs.splitlines() if "not reloaded" in line]
    # One per SIGHUP asked for, at most one more from the watcher's poll (it logs a state once).
    assert 4 <= len(refusals) <= 5 and all("not a regular file (a FIFO)" in line for line in refusals), logs
    assert password not in logs and hashed not in logs

