"""Issue 46 item 4: a running `llm-exporter run` (its own process, TLS and basic auth from
--web.config.file) reloads its web config, checked from outside only: an HTTPS client for the
certificate served and the credentials accepted, /metrics for the reload self-metrics, its stderr
for the one line each reload logs.

The sequence, once through SIGHUP and once through the file watcher (a 3 s poll in the process):
a changed password, a rotated certificate (a Kubernetes-style secret volume: the certificate folder
is a symlink swapped atomically, so no poll sees a new certificate beside the old key), a broken
file (the last good config stays), two weaker files (basic auth dropped, TLS dropped: both
refused), then a good file again. docs/security.md, "Reload", is what is checked."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import trustme

from tests.support import free_port, stop_process, wait_until
from tests.test_security import _hash, _write_yaml

USER = "prometheus"
# The file watcher polls every 3 s (webconfig.RELOAD_POLL_S) in a process the test cannot patch:
# a generous deadline for a loaded machine, never a timing assertion.
STEP_TIMEOUT_S = 45.0
SUCCESS_TS = "llm_exporter_web_config_last_reload_success_timestamp_seconds"
SUCCESSFUL = "llm_exporter_web_config_last_reload_successful"


@dataclass
class Certs:
    """The certificate folder behind the symlink `tls` next to the web config file."""

    folder: pathlib.Path
    generation: int = 0

    def rotate(self, ca: trustme.CA) -> bytes:
        """Write a new key and certificate in a fresh folder and swap the symlink onto it in one
        rename, as the kubelet updates a mounted secret; returns the new certificate's DER."""
        self.generation += 1
        data = self.folder / f"..data_{self.generation}"
        data.mkdir()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert.cert_chain_pems[0].write_to_path(str(data / "tls.crt"))
        cert.private_key_pem.write_to_path(str(data / "tls.key"))
        link = self.folder / "tls.new"
        link.symlink_to(data.name)
        os.replace(link, self.folder / "tls")
        return ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())


def _client(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def _served_fingerprint(port: int) -> str:
    """SHA-256 of the certificate a fresh TLS handshake gets (not verified: only looked at)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest()


def _status(base: str, ca: trustme.CA, auth: tuple[str, str] | None, path: str = "/metrics") -> int | None:
    try:
        return httpx.get(base + path, auth=auth, verify=_client(ca), timeout=10).status_code
    except httpx.HTTPError:
        return None


def _self_metrics(base: str, ca: trustme.CA, password: str) -> dict[str, float]:
    response = httpx.get(base + "/metrics", auth=(USER, password), verify=_client(ca), timeout=10)
    assert response.status_code == 200, response.status_code
    return {line.split()[0]: float(line.split()[1]) for line in response.text.splitlines()
            if line.startswith("llm_exporter_web_config_")}


def _settled(base: str, ca: trustme.CA, password: str, accept: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    """The reload self-metrics once `accept` holds: they are taken with each collection cycle, so
    /metrics shows a reload up to one --interval after it."""
    seen: list[dict[str, float]] = []

    def check() -> bool:
        seen.append(_self_metrics(base, ca, password))
        return accept(seen[-1])

    assert wait_until(check, timeout=STEP_TIMEOUT_S, interval=0.1), seen[-1]
    return seen[-1]


class Exporter:
    """`llm-exporter run` with its stderr in a file; each step reads only what it logged since."""

    def __init__(self, folder: pathlib.Path, web: pathlib.Path) -> None:
        self.port = free_port()
        self.base = f"https://127.0.0.1:{self.port}"
        self.log_path = folder / "exporter.log"
        self.web = web
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{self.port}",
                 "--interval", "500ms", "--gpu-backend", "none", "--no-host", "--web.config.file", str(web)],
                stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.seen = 0

    def log(self) -> str:
        return self.log_path.read_text()

    def new_lines(self) -> list[str]:
        return self.log()[self.seen:].splitlines()

    def mark(self) -> None:
        self.seen = len(self.log())


def _outcome_lines(lines: list[str], reason: str) -> tuple[list[str], list[str]]:
    """The reload lines naming `reason` ("SIGHUP" or "file changed"): (loaded, refused)."""
    loaded = [line for line in lines if f"reloaded ({reason}; " in line and "not reloaded" not in line]
    refused = [line for line in lines if f"not reloaded ({reason})" in line]
    return loaded, refused


@pytest.fixture(params=["SIGHUP", "file changed"], ids=["sighup", "watcher"])
def reason(request) -> str:
    return request.param


@pytest.fixture
def setting(tmp_path) -> Iterator[tuple[Exporter, Certs, trustme.CA]]:
    ca = trustme.CA()
    certs = Certs(tmp_path)
    certs.rotate(ca)
    web = tmp_path / "web.yml"
    _write_yaml(web, _good(_hash("one")))
    exporter = Exporter(tmp_path, web)
    try:
        assert wait_until(lambda: _status(exporter.base, ca, None, "/readyz") == 200, timeout=30), exporter.log()
        yield exporter, certs, ca
    finally:
        stop_process(exporter.process)
    assert exporter.process.returncode == 0, exporter.log()


def _good(hashed: str) -> dict:
    return {"tls_server_config": {"cert_file": "tls/tls.crt", "key_file": "tls/tls.key"},
            "basic_auth_users": {USER: hashed}}


def test_a_running_exporter_reloads_rotates_keeps_the_last_good_config_and_refuses_weaker_auth(setting, reason):
    exporter, certs, ca = setting
    base = exporter.base

    def step(change: Callable[[], object], loaded: bool, why: str) -> str:
        """Make the change, trigger the reload the way under test and wait for its one line."""
        exporter.mark()
        change()
        if reason == "SIGHUP":
            exporter.process.send_signal(signal.SIGHUP)
        wanted = 0 if loaded else 1

        def done() -> bool:
            return len(_outcome_lines(exporter.new_lines(), reason)[wanted]) >= 1

        assert wait_until(done, timeout=STEP_TIMEOUT_S, interval=0.1), f"{why}: no reload line\n{exporter.log()}"
        ok, refused = _outcome_lines(exporter.new_lines(), reason)
        # One line per reload, and only the outcome expected (a refusal must not also say "reloaded").
        assert (len(ok), len(refused)) == ((1, 0) if loaded else (0, 1)), (why, exporter.new_lines())
        return (ok or refused)[0]

    first = _self_metrics(base, ca, "one")
    assert first[SUCCESSFUL] == 1.0
    assert _status(base, ca, (USER, "one")) == 200 and _status(base, ca, None) == 401

    # 1. A changed password: the new one works at once, the old one (cached as good) no longer does.
    line = step(lambda: _write_yaml(exporter.web, _good(_hash("two"))), True, "new password")
    assert f"web config {exporter.web} reloaded ({reason}; tls=on, basic_auth_users=1)" in line
    assert _status(base, ca, (USER, "two")) == 200
    assert _status(base, ca, (USER, "one")) == 401
    after_password = _settled(base, ca, "two", lambda m: m[SUCCESSFUL] == 1.0 and m[SUCCESS_TS] > first[SUCCESS_TS])

    # 2. A rotated certificate (same paths, a new key): new handshakes get it, trusted by the new CA only.
    old_fingerprint = _served_fingerprint(exporter.port)
    new_ca = trustme.CA()
    new_der: list[bytes] = []
    step(lambda: new_der.append(certs.rotate(new_ca)), True, "rotated certificate")
    assert _served_fingerprint(exporter.port) == hashlib.sha256(new_der[0]).hexdigest() != old_fingerprint
    assert _status(base, new_ca, (USER, "two")) == 200
    assert _status(base, ca, (USER, "two")) is None  # the old CA no longer verifies what is served
    after_rotation = _settled(base, new_ca, "two",
                              lambda m: m[SUCCESSFUL] == 1.0 and m[SUCCESS_TS] > after_password[SUCCESS_TS])

    # 3. A broken file: refused in one line naming the file and the problem; the last good config
    # (password, certificate) stays, and the self-metrics say the reload failed.
    line = step(lambda: _write_yaml(exporter.web, "basic_auth_users: [not closed\n"), False, "broken file")
    assert f"web config {exporter.web} not reloaded ({reason}), keeping the last good one" in line
    assert _served_fingerprint(exporter.port) == hashlib.sha256(new_der[0]).hexdigest()
    assert _status(base, new_ca, (USER, "two")) == 200 and _status(base, new_ca, (USER, "one")) == 401
    _settled(base, new_ca, "two", lambda m: m == {SUCCESSFUL: 0.0, SUCCESS_TS: after_rotation[SUCCESS_TS]})

    # 4. Weaker auth, refused: a file without basic_auth_users (what a truncated rewrite leaves)...
    line = step(lambda: _write_yaml(exporter.web, {"tls_server_config": _good("")["tls_server_config"]}), False,
                "basic auth dropped")
    assert "would turn basic auth off" in line and "needs a restart" in line
    assert _status(base, new_ca, None) == 401 and _status(base, new_ca, (USER, "two")) == 200
    # ... and one without tls_server_config: still HTTPS with the rotated certificate, plain HTTP refused.
    line = step(lambda: _write_yaml(exporter.web, {"basic_auth_users": {USER: _hash("two")}}), False, "TLS dropped")
    assert "would turn TLS off" in line and "needs a restart" in line
    assert _served_fingerprint(exporter.port) == hashlib.sha256(new_der[0]).hexdigest()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{exporter.port}/metrics", auth=(USER, "two"), timeout=10)
    assert _status(base, new_ca, (USER, "two")) == 200
    # Still failed, and no success since the rotation: the refusals changed nothing.
    assert _self_metrics(base, new_ca, "two") == {SUCCESSFUL: 0.0, SUCCESS_TS: after_rotation[SUCCESS_TS]}

    # 5. A good file again: loaded, and the self-metrics say so.
    step(lambda: _write_yaml(exporter.web, _good(_hash("three"))), True, "good file")
    assert _status(base, new_ca, (USER, "three")) == 200 and _status(base, new_ca, (USER, "two")) == 401
    _settled(base, new_ca, "three", lambda m: m[SUCCESSFUL] == 1.0 and m[SUCCESS_TS] > after_rotation[SUCCESS_TS])
    # Each refused state was logged once by the path under test, never by a traceback.
    text = exporter.log()
    assert "Traceback" not in text, text
    assert len(re.findall(rf"not reloaded \({re.escape(reason)}\)", text)) == 3, text
