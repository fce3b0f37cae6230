"""Hostile and broken input aimed at the exporter's own auth and config files, through a real
exporter on loopback: web config reloads that would open the exporter are refused (fail closed),
basic auth costs the same for unknown and known users and stays bounded under a flood of bad
passwords, and YAML alias bombs are refused in one short line without growing memory, off the
event loop."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import bcrypt
import httpx
import psutil
import pytest
import trustme

from exporter import webconfig
from tests.exporter_process import running_exporter
from tests.support import wait_until
from tests.test_collect import ScriptedSource
from tests.test_security import _client, _config, _metric, _server_cert, _write_yaml

RELOAD_OK = "llm_exporter_web_config_last_reload_successful"


@pytest.fixture
def fast_reload(monkeypatch):
    monkeypatch.setattr(webconfig, "RELOAD_POLL_S", 0.1)


def _hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def _failures(base: str, reason: str, **kwargs) -> float | None:
    return _metric(base, f'llm_exporter_http_auth_failures_total{{reason="{reason}"}}', **kwargs)


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]


# --- fail closed at reload -------------------------------------------------------------------------

def _truncate(web: pathlib.Path) -> None:
    with open(web, "w"):  # what a non-atomic rewrite leaves for a moment
        pass


def _partial(web: pathlib.Path) -> None:
    full = web.read_text()
    with open(web, "w") as handle:  # the rewrite stopped halfway through the first user's hash
        handle.write(full[:full.index("$2b$") + 12])


def _cut_before_users(web: pathlib.Path) -> None:
    with open(web, "w") as handle:
        handle.write("basic_auth_users:\n")


def _no_users_key(web: pathlib.Path) -> None:
    _write_yaml(web, {"http_server_config": {"http2": True}})  # a well-formed file with no users at all


def _users_to_none(web: pathlib.Path) -> None:
    _write_yaml(web, {"basic_auth_users": {}})


@pytest.mark.parametrize("damage", [_truncate, _partial, _cut_before_users, _no_users_key, _users_to_none],
                         ids=["truncated", "partial-yaml", "cut-before-users", "no-users-key", "users-to-none"])
def test_a_reload_that_would_turn_basic_auth_off_is_refused_and_auth_stays_on(tmp_path, fast_reload, caplog, damage):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    auth = {"auth": ("prometheus", "s3cret")}
    with running_exporter(_config(web), [ScriptedSource("a")]) as base:
        assert _metric(base, RELOAD_OK, **auth) == 1.0
        damage(web)
        assert wait_until(lambda: _metric(base, RELOAD_OK, **auth) == 0.0, timeout=10)
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401
        assert httpx.get(base + "/api/v1/snapshot", timeout=5).status_code == 401
        assert httpx.get(base + "/metrics", timeout=5, **auth).status_code == 200
        time.sleep(0.5)  # several more watch ticks: still one line for the one bad state
        refusals = _refusals(caplog)
        assert len(refusals) == 1, refusals
        assert [r.levelno for r in caplog.records if "not reloaded" in r.getMessage()] == [logging.WARNING]
        assert str(web) in refusals[0]
        # It says why and what to do; a partial file may fail as bad YAML or a bad hash before that.
        assert "restart" in refusals[0] or "bcrypt" in refusals[0] or "YAML" in refusals[0], refusals[0]

        # The writer finishes: the good file is loaded again.
        _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("n3w")}})
        new = {"auth": ("prometheus", "n3w")}
        assert wait_until(lambda: httpx.get(base + "/metrics", timeout=5, **new).status_code == 200, timeout=10)
        assert wait_until(lambda: _metric(base, RELOAD_OK, **new) == 1.0, timeout=10)


def test_a_reload_that_stops_verifying_client_certificates_is_refused(tmp_path, fast_reload, caplog):
    server_ca, client_ca = trustme.CA(), trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.crt"))
    web = tmp_path / "web.yml"
    cert = _server_cert(server_ca, tmp_path)
    _write_yaml(web, {"tls_server_config": {**cert, "client_ca_file": "clients.crt",
                                            "client_auth_type": "RequireAndVerifyClientCert"}})
    good = _client(server_ca, client_ca.issue_cert("prometheus@example"))
    with running_exporter(_config(web), [ScriptedSource("a")], tls=good) as base:
        for weaker in ({**cert},
                       {**cert, "client_ca_file": "clients.crt", "client_auth_type": "VerifyClientCertIfGiven"}):
            _write_yaml(web, {"tls_server_config": weaker})
            assert wait_until(lambda: _metric(base, RELOAD_OK, verify=good) == 0.0, timeout=10), weaker
            with pytest.raises(httpx.TransportError):  # a client without a certificate is still turned away
                httpx.get(base + "/metrics", timeout=5, verify=_client(server_ca))
            # back to the good file, so that the next weaker one is a change again
            _write_yaml(web, {"tls_server_config": {**cert, "client_ca_file": "clients.crt",
                                                    "client_auth_type": "RequireAndVerifyClientCert"}})
            assert wait_until(lambda: _metric(base, RELOAD_OK, verify=good) == 1.0, timeout=10)
    assert sum("verify client certificates less" in m for m in _refusals(caplog)) == 2


# --- basic auth cost -------------------------------------------------------------------------------

def _cpu_per_request(base: str, auth: tuple[str, str], count: int) -> float:
    """Mean process CPU time (every thread: client, server and bcrypt workers) per request."""
    with httpx.Client(base_url=base, timeout=30) as http:
        http.get("/healthz")  # connection set up outside the measurement
        start = time.process_time()
        for _ in range(count):
            assert http.get("/metrics", auth=auth).status_code == 401
        return (time.process_time() - start) / count


@pytest.mark.parametrize(("cost", "count"), [(8, 20), (12, 3)])
def test_an_unknown_user_costs_as_much_as_a_known_user_with_a_wrong_password(tmp_path, cost, count):
    # Before: the unknown-user hash had a fixed cost 10, so with users at cost 8 an unknown user took
    # 4x longer, and at cost 12 a quarter of the time: either way, timing told which users exist.
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret", cost), "grafana": _hash("other", cost)}})
    with running_exporter(_config(web, interval_s=60), [ScriptedSource("a")]) as base:
        ratios = []
        for _ in range(2):  # best of two: the machine is shared
            known = _cpu_per_request(base, ("prometheus", "wrong"), count)
            unknown = _cpu_per_request(base, ("nobody", "wrong"), count)
            ratios.append(unknown / known)
        assert any(0.5 < ratio < 2.0 for ratio in ratios), ratios


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_a_bad_password_flood_neither_starves_a_cached_credential_nor_floods_the_log(tmp_path, caplog):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret", 10)}})  # ~60 ms a check
    with running_exporter(_config(web, interval_s=0.2), [ScriptedSource("a")]) as base:
        good = _basic("prometheus", "s3cret")
        assert httpx.get(base + "/metrics", headers=good, timeout=5).status_code == 200  # cached from now on
        statuses: list[int] = []

        def attacker(index: int) -> None:
            with httpx.Client(base_url=base, timeout=30) as http:
                for _ in range(25):  # 8 x 25 = 200 requests
                    statuses.append(http.get("/metrics", headers=_basic("prometheus", f"guess{index}")).status_code)

        threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(8)]
        for thread in threads:
            thread.start()
        good_statuses = []
        with httpx.Client(base_url=base, timeout=30) as http:
            for _ in range(20):
                good_statuses.append(http.get("/metrics", headers=good).status_code)
        good_finished_first = any(thread.is_alive() for thread in threads)
        for thread in threads:
            thread.join(timeout=60)
        assert good_statuses == [200] * 20
        assert good_finished_first, "the cached credential waited for the whole flood"
        assert len(statuses) == 200 and set(statuses) <= {401, 503}, set(statuses)
        refused = statuses.count(401)
        assert wait_until(lambda: _failures(base, "bad_password", headers=good) == refused, timeout=10)
        assert _failures(base, "overloaded", headers=good) == statuses.count(503)
    lines = [r.getMessage() for r in caplog.records if "basic auth refused" in r.getMessage()]
    assert 1 <= len(lines) <= 4, lines  # the flood takes seconds: a line per 10 s, not one per request
    assert "bad_password=" in lines[0] and not any("guess" in line for line in lines)


def test_checks_beyond_the_bcrypt_queue_get_503_at_once_and_are_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(webconfig, "BCRYPT_WORKERS", 1)
    monkeypatch.setattr(webconfig, "BCRYPT_MAX_WAITING", 1)
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret", 12)}})  # ~250 ms a check
    with running_exporter(_config(web, interval_s=0.2), [ScriptedSource("a")]) as base:
        good = _basic("prometheus", "s3cret")
        assert httpx.get(base + "/metrics", headers=good, timeout=10).status_code == 200
        barrier = threading.Barrier(8)
        responses: list[httpx.Response] = []

        def attacker(index: int) -> None:
            with httpx.Client(base_url=base, timeout=30) as http:
                http.get("/healthz")
                barrier.wait(timeout=10)
                responses.append(http.get("/metrics", headers=_basic("prometheus", f"guess{index}")))

        threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        statuses = sorted(r.status_code for r in responses)
        assert 401 in statuses and 503 in statuses, statuses
        assert statuses.count(401) <= 3, statuses  # one running and one waiting (give a late arrival slack)
        assert all(r.headers.get("retry-after") == "1" for r in responses if r.status_code == 503)
        assert httpx.get(base + "/metrics", headers=good, timeout=10).status_code == 200
        assert wait_until(lambda: _failures(base, "overloaded", headers=good) == statuses.count(503), timeout=10)


def test_auth_failures_are_counted_by_reason(tmp_path):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    with running_exporter(_config(web, interval_s=0.2), [ScriptedSource("a")]) as base:
        good = _basic("prometheus", "s3cret")
        httpx.get(base + "/metrics", timeout=5)
        httpx.get(base + "/metrics", headers={"Authorization": "Basic !!!"}, timeout=5)
        httpx.get(base + "/metrics", headers=_basic("nobody", "x"), timeout=5)
        httpx.get(base + "/metrics", headers=_basic("prometheus", "x"), timeout=5)
        expected = {"missing": 1, "malformed": 1, "unknown_user": 1, "bad_password": 1, "overloaded": 0}
        assert wait_until(lambda: {r: _failures(base, r, headers=good) for r in expected} == expected, timeout=10)
        text = httpx.get(base + "/metrics", headers=good, timeout=5).text
        assert "nobody" not in text  # no user names in labels


# --- YAML alias bombs ------------------------------------------------------------------------------

def _laughs(levels: int = 9, width: int = 9) -> list[str]:
    """Anchors a0..a{levels-1}, each a list of `width` aliases of the one before: a few hundred
    bytes that stand for width**levels strings."""
    lines = ["&a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return lines


def config_bomb(levels: int = 9) -> str:
    anchors = _laughs(levels)
    # Under a key that is validated even with the flags below (--listen would override listen:).
    return "".join(f"x{i}: {line}\n" for i, line in enumerate(anchors[:-1])) + f"interval: {anchors[-1]}\n"


def web_bomb(levels: int = 9) -> str:
    # Inside basic_auth_users, where validation turns the value into text.
    return "basic_auth_users:\n  prometheus: [" + ", ".join(_laughs(levels)) + "]\n"


RSS_LIMIT = 200 * 1024 * 1024
# In-process tests use a bomb that is over the loader's bound (9**6 strings) but that the code
# before the fix could expand without taking the test process down with it.
SMALL_BOMB_LEVELS = 6


@pytest.mark.parametrize(("flag", "bomb"), [("--config", config_bomb), ("--web.config.file", web_bomb)])
def test_a_billion_laughs_file_exits_2_with_one_short_line_and_small_memory(tmp_path, flag, bomb):
    path = tmp_path / "bomb.yml"
    path.write_text(bomb())
    assert path.stat().st_size < 2000
    peak, killed = 0, False
    # stderr into a file, not a pipe: before the fix it was a 2 GB line.
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen([sys.executable, "-m", "exporter.cli", "run", flag, str(path), "--listen",
                                    "127.0.0.1:0", "--gpu-backend", "none", "--no-host"],
                                   stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            watched = psutil.Process(process.pid)
            deadline = time.monotonic() + 60
            while process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, watched.memory_info().rss)
                if peak > RSS_LIMIT:
                    killed = True
                    break
                time.sleep(0.01)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        size = stderr.tell()
        stderr.seek(0)
        head = stderr.read(4000).decode(errors="replace")
    assert not killed, f"RSS passed {RSS_LIMIT >> 20} MiB loading {path.stat().st_size} bytes"
    assert process.returncode == 2, head
    assert size < 600 and head.count("\n") == 1, head[:600]
    assert "alias" in head, head


def test_a_bomb_written_over_the_web_config_is_refused_while_metrics_keep_answering(tmp_path, fast_reload,
                                                                                   monkeypatch):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    auth = {"auth": ("prometheus", "s3cret")}
    # Hold the reload in the middle of its parse until /metrics has answered: if the reload ran on
    # the event loop, /metrics could not answer until it was released (10 s later, below).
    parsing, release = threading.Event(), threading.Event()
    real_parse = webconfig.parse_web_config

    def held_parse(path: str) -> webconfig.WebConfig:
        parsing.set()
        release.wait(timeout=10)
        return real_parse(path)

    with running_exporter(_config(web), [ScriptedSource("a")]) as base:
        monkeypatch.setattr(webconfig, "parse_web_config", held_parse)
        _write_yaml(web, web_bomb(SMALL_BOMB_LEVELS))
        assert parsing.wait(timeout=10)
        try:
            during = httpx.get(base + "/metrics", timeout=3, **auth)
            healthz = httpx.get(base + "/healthz", timeout=3)
        finally:
            release.set()
        assert during.status_code == 200 and healthz.status_code == 200
        assert wait_until(lambda: _metric(base, RELOAD_OK, **auth) == 0.0, timeout=10)
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401
        assert httpx.get(base + "/metrics", timeout=5, **auth).status_code == 200


def test_reload_parses_in_a_worker_thread_and_names_its_reason(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="llm_exporter.webconfig")
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("one")}})
    manager = webconfig.WebConfigManager(str(web))
    threads: list[str] = []
    gate = threading.Event()
    real_parse = webconfig.parse_web_config

    def recording_parse(path: str) -> webconfig.WebConfig:
        threads.append(threading.current_thread().name)
        gate.wait(timeout=10)
        return real_parse(path)

    monkeypatch.setattr(webconfig, "parse_web_config", recording_parse)

    async def scenario() -> list[bool | None]:
        _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("two")}})
        first = asyncio.create_task(manager.reload("SIGHUP"))
        await asyncio.sleep(0.2)  # first is parsing (held by the gate); the loop still runs
        second = asyncio.create_task(manager.reload("SIGHUP"))  # waits for first
        third = asyncio.create_task(manager.reload("SIGHUP"))  # joins second
        await asyncio.sleep(0.1)
        gate.set()
        results = list(await asyncio.gather(first, second, third))
        _write_yaml(web, web_bomb(SMALL_BOMB_LEVELS))
        results.append(await manager.reload("SIGUSR1"))
        return results

    assert asyncio.run(scenario()) == [True, True, None, False]
    assert threads and threading.main_thread().name not in threads
    messages = [r.getMessage() for r in caplog.records]
    assert sum("reloaded (SIGHUP" in m for m in messages) == 2
    assert any("not reloaded (SIGUSR1)" in m and "alias" in m and len(m) < 600 for m in messages), messages
    assert manager.current.users["prometheus"].startswith(b"$2b$04$")
    assert manager.last_reload_successful is False


def test_a_bcrypt_cost_too_high_to_check_is_refused(tmp_path):
    web = tmp_path / "web.yml"
    too_slow = "$2b$20$" + "a" * 53  # each check would take about a minute
    _write_yaml(web, {"basic_auth_users": {"prometheus": too_slow}})
    with pytest.raises(webconfig.WebConfigError, match="bcrypt cost 20"):
        webconfig.parse_web_config(str(web))



def test_one_bad_state_seen_twice_logs_one_line(tmp_path, caplog):
    """CI once saw two refusal lines for one truncated file: the watcher's fingerprint took the file's
    stat before the truncation and its bytes after, so the next poll saw a "change" to the same bad
    content. One bad state is one line; a different bad state, or a reload someone asked for, is
    another; a good file in between starts over."""
    from exporter.webconfig import WebConfigManager

    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    manager = WebConfigManager(str(web))
    caplog.set_level(logging.WARNING)
    _truncate(web)
    assert manager.check() is False
    os.utime(web, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # the same bytes, a new stat
    assert manager.check() is False  # seen as a change, refused again ...
    assert len(_refusals(caplog)) == 1  # ... without a second line
    web.write_text("basic_auth_users: {prometheus: [unclosed\n")  # another bad state, another reason
    assert manager.check() is False and len(_refusals(caplog)) == 2
    asyncio.run(manager.reload("SIGHUP"))  # asked for: always answered
    assert len(_refusals(caplog)) == 3
