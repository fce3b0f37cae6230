"""--web.config.file over real TLS on loopback: a throwaway CA (trustme) per test, server and client
certificates, basic auth with bcrypt, reload (good and bad), start errors, request limits, and no
request-controlled fetches (no `?target=`)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import ssl
import subprocess
import sys
import time

import bcrypt
import httpx
import pytest
import trustme
import yaml

from exporter import webconfig
from exporter.app import load_web_config
from exporter.config import Config, ConfigError
from exporter.webconfig import BasicAuth
from tests.exporter_process import running_exporter
from tests.support import fake_engine, wait_until
from tests.test_collect import ScriptedSource


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests


def _config(web_file: pathlib.Path | None, interval_s: float = 0.2) -> Config:
    return Config(listen_host="127.0.0.1", listen_port=0, interval_s=interval_s, gpu_backend="none",
                  host_enabled=False, web_config_file=str(web_file) if web_file else None)


def _write_yaml(path: pathlib.Path, data: object) -> None:
    # Write then rename, as editors and config management do, so a poll never sees half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    os.replace(tmp, path)


def _server_cert(ca: trustme.CA, folder: pathlib.Path, prefix: str = "server") -> dict[str, str]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = folder / f"{prefix}.crt", folder / f"{prefix}.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    return {"cert_file": cert_path.name, "key_file": key_path.name}  # relative to the web config file


def _client(ca: trustme.CA, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if cert is not None:
        cert.configure_cert(context)
    return context


@pytest.fixture
def fast_reload(monkeypatch):
    monkeypatch.setattr(webconfig, "RELOAD_POLL_S", 0.1)


def _metric(base: str, name: str, **kwargs) -> float | None:
    text = httpx.get(base + "/metrics", timeout=5, **kwargs).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


# --- TLS -------------------------------------------------------------------------------------------

def test_tls_client_without_the_ca_fails_and_with_it_succeeds(tmp_path):
    ca = trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, tmp_path)})
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(ca)) as base:
        assert base.startswith("https://")
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(base + "/metrics", timeout=5)  # the default trust store does not know this CA
        with pytest.raises(httpx.ConnectError):
            httpx.get(base + "/metrics", timeout=5, verify=_client(trustme.CA()))  # another CA
        ok = httpx.get(base + "/metrics", timeout=5, verify=_client(ca))
        assert ok.status_code == 200 and "llm_exporter_source_up" in ok.text
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets nothing
            httpx.get(base.replace("https://", "http://") + "/metrics", timeout=5)


def test_min_version_tls13_refuses_a_tls12_client(tmp_path):
    ca = trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": {**_server_cert(ca, tmp_path), "min_version": "TLS13"}})
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(ca)) as base:
        tls12 = _client(ca)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(httpx.ConnectError):
            httpx.get(base + "/metrics", timeout=5, verify=tls12)


def test_mtls_rejects_a_client_without_a_certificate(tmp_path):
    server_ca, client_ca = trustme.CA(), trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.crt"))
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": {**_server_cert(server_ca, tmp_path), "client_ca_file": "clients.crt",
                                            "client_auth_type": "RequireAndVerifyClientCert"}})
    good = client_ca.issue_cert("prometheus@example")
    rogue = trustme.CA().issue_cert("prometheus@example")
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(server_ca, good)) as base:
        assert httpx.get(base + "/metrics", timeout=5, verify=_client(server_ca, good)).status_code == 200
        for context in (_client(server_ca), _client(server_ca, rogue)):
            with pytest.raises(httpx.TransportError):
                httpx.get(base + "/metrics", timeout=5, verify=context)
        with pytest.raises(httpx.TransportError):  # the probes are open to auth, not to TLS
            httpx.get(base + "/healthz", timeout=5, verify=_client(server_ca))


def test_tls_certificate_rotation_is_picked_up_without_restart(tmp_path, fast_reload):
    old_ca, new_ca = trustme.CA(), trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(old_ca, tmp_path)})
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(old_ca)) as base:
        stamp = _metric(base, "llm_exporter_web_config_last_reload_success_timestamp_seconds", verify=_client(old_ca))
        _server_cert(new_ca, tmp_path)  # same paths, new key and certificate (cert-manager style)

        def new_cert_served() -> bool:
            try:
                return httpx.get(base + "/healthz", timeout=2, verify=_client(new_ca)).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(new_cert_served, timeout=10)
        with pytest.raises(httpx.ConnectError):
            httpx.get(base + "/healthz", timeout=5, verify=_client(old_ca))
        assert wait_until(lambda: _metric(base, "llm_exporter_web_config_last_reload_success_timestamp_seconds",
                                          verify=_client(new_ca)) > stamp, timeout=10)
        assert _metric(base, "llm_exporter_web_config_last_reload_successful", verify=_client(new_ca)) == 1.0


# --- basic auth ------------------------------------------------------------------------------------

def test_basic_auth_wrong_and_missing_get_401_right_gets_200_and_probes_stay_open(tmp_path):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("s3cret"), "grafana": _hash("other")}})
    with running_exporter(_config(web), [ScriptedSource("a")]) as base, httpx.Client(base_url=base, timeout=5) as http:
        for path in ("/metrics", "/api/v1/snapshot", "/api/v1/diagnosis", "/", "/nonexistent"):
            missing = http.get(path)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"].startswith('Basic realm="llm-exporter"')
            for auth in (("prometheus", "wrong"), ("nobody", "s3cret"), ("prometheus", ""), ("", "")):
                assert http.get(path, auth=auth).status_code == 401, (path, auth)
            assert http.get(path, headers={"Authorization": "Basic !!!"}).status_code == 401
            assert http.get(path, headers={"Authorization": "Bearer x"}).status_code == 401
        for path in ("/metrics", "/api/v1/snapshot", "/api/v1/diagnosis", "/"):
            assert http.get(path, auth=("prometheus", "s3cret")).status_code == 200, path
        assert http.get("/metrics", auth=("grafana", "other")).status_code == 200
        assert http.head("/metrics").status_code == 401
        for path in ("/healthz", "/readyz"):
            assert http.get(path).status_code == 200


def test_tls_and_basic_auth_together(tmp_path):
    ca = trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, tmp_path),
                      "basic_auth_users": {"prometheus": _hash("s3cret")}})
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(ca)) as base:
        assert httpx.get(base + "/metrics", timeout=5, verify=_client(ca)).status_code == 401
        assert httpx.get(base + "/metrics", timeout=5, verify=_client(ca),
                         auth=("prometheus", "s3cret")).status_code == 200


def test_basic_auth_caches_successes_only_and_stays_bounded(monkeypatch):
    calls = []
    real = webconfig._checkpw
    monkeypatch.setattr(webconfig, "_checkpw", lambda pw, hashed: calls.append(pw) or real(pw, hashed))
    users = {f"u{i}": _hash("pw").encode() for i in range(5)}
    auth = BasicAuth(max_entries=3)

    def header(user: str, password: str) -> bytes:
        import base64
        return b"Basic " + base64.b64encode(f"{user}:{password}".encode())

    async def scenario() -> None:
        assert await auth.check(users, header("u0", "pw"))
        assert await auth.check(users, header("u0", "pw"))
        assert len(calls) == 1  # the second check was served from the cache
        assert not await auth.check(users, header("u0", "bad"))
        assert not await auth.check(users, header("u0", "bad"))
        assert len(calls) == 3  # failures are never cached
        assert not await auth.check(users, header("ghost", "pw"))  # unknown user: a bcrypt check all the same
        assert len(calls) == 4
        assert not await auth.check(users, header("u0", "x" * 100))  # over bcrypt's 72 bytes: refused, no crash
        for i in range(5):
            assert await auth.check(users, header(f"u{i}", "pw"))
        assert len(auth._cache) == 3
        changed = {**users, "u4": _hash("new").encode()}  # a reload with a new hash: the cache does not apply
        assert not await auth.check(changed, header("u4", "pw"))

    asyncio.run(scenario())


# --- reload ----------------------------------------------------------------------------------------

def test_bad_web_config_at_reload_keeps_the_last_good_one(tmp_path, fast_reload, caplog):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("one")}})
    one = {"auth": ("prometheus", "one")}
    with running_exporter(_config(web), [ScriptedSource("a")]) as base:
        assert _metric(base, "llm_exporter_web_config_last_reload_successful", **one) == 1.0
        first_stamp = _metric(base, "llm_exporter_web_config_last_reload_success_timestamp_seconds", **one)
        def refusals() -> list:
            return [r for r in caplog.records if "not reloaded" in r.getMessage()]

        for edits, bad in enumerate(("basic_auth_users: [unclosed\n", {"basic_auth_users": {"prometheus": "plaintext"}},
                                     {"tls_server_config": {"cert_file": "missing.crt",
                                                            "key_file": "missing.key"}}), 1):
            _write_yaml(web, bad)
            # Each edit is seen before the next is written (the metric alone is already 0 after the first).
            assert wait_until(lambda n=edits: len(refusals()) >= n, timeout=10), bad
            assert wait_until(lambda: _metric(base, "llm_exporter_web_config_last_reload_successful", **one) == 0.0,
                              timeout=10), bad
            assert httpx.get(base + "/metrics", timeout=5, **one).status_code == 200  # the old users still hold
            assert httpx.get(base + "/metrics", timeout=5).status_code == 401  # and auth is still on
        assert _metric(base, "llm_exporter_web_config_last_reload_success_timestamp_seconds", **one) == first_stamp
        time.sleep(0.5)  # a few more polls of the last bad file
        failures = refusals()
        assert len(failures) == 3 and str(web) in failures[0].getMessage()  # one line per bad edit, not per poll

        _write_yaml(web, {"basic_auth_users": {"prometheus": _hash("two")}})
        two = {"auth": ("prometheus", "two")}
        assert wait_until(lambda: httpx.get(base + "/metrics", timeout=5, **two).status_code == 200, timeout=10)
        assert httpx.get(base + "/metrics", timeout=5, **one).status_code == 401
        # The metric is rendered with the next collection cycle, a moment after the reload.
        assert wait_until(lambda: _metric(base, "llm_exporter_web_config_last_reload_successful", **two) == 1.0,
                          timeout=10)
        assert _metric(base, "llm_exporter_web_config_last_reload_success_timestamp_seconds", **two) > first_stamp

        _write_yaml(web, {})  # auth removed by a well-formed file: refused all the same (fail closed)
        assert wait_until(lambda: _metric(base, "llm_exporter_web_config_last_reload_successful", **two) == 0.0,
                          timeout=10)
        assert httpx.get(base + "/metrics", timeout=5).status_code == 401


def test_a_reload_that_names_files_not_there_yet_succeeds_once_they_appear(tmp_path, caplog):
    ca = trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, tmp_path, "old")})
    manager = webconfig.WebConfigManager(str(web))
    assert manager.check() is None
    # cert-manager style: the config is edited to name the new pair before the pair is written.
    new_cert = ca.issue_cert("127.0.0.1")
    _write_yaml(web, {"tls_server_config": {"cert_file": "new.crt", "key_file": "new.key"}})
    assert manager.check() is False and manager.check() is None  # one failure, logged once
    new_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "new.crt"))
    new_cert.private_key_pem.write_to_path(str(tmp_path / "new.key"))
    assert manager.check() is True  # the files appearing is enough; web.yml was not touched again
    assert manager.current.tls.cert_file == str(tmp_path / "new.crt") and manager.last_reload_successful


def test_turning_tls_off_at_reload_is_refused(tmp_path, fast_reload):
    ca = trustme.CA()
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, tmp_path)})
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(ca)) as base:
        _write_yaml(web, {})
        assert wait_until(lambda: _metric(base, "llm_exporter_web_config_last_reload_successful",
                                          verify=_client(ca)) == 0.0, timeout=10)
        assert httpx.get(base + "/healthz", timeout=5, verify=_client(ca)).status_code == 200


def test_no_web_config_no_web_config_metrics(tmp_path):
    with running_exporter(_config(None), [ScriptedSource("a")]) as base:
        assert _metric(base, "llm_exporter_web_config_last_reload_successful") is None


# --- bad file at start -----------------------------------------------------------------------------

def _bad_files(folder: pathlib.Path) -> list[tuple[str, object, str]]:
    ca = trustme.CA()
    cert = _server_cert(ca, folder)
    other = _server_cert(trustme.CA(), folder, prefix="other")
    return [
        ("yaml", "tls_server_config: [unclosed\n", "not valid YAML"),
        ("unknown-key", {"basic_auth_user": {"a": "b"}}, "unsupported key(s) ['basic_auth_user']"),
        ("no-key-file", {"tls_server_config": {"cert_file": cert["cert_file"]}}, "key_file is required"),
        ("missing-cert", {"tls_server_config": {**cert, "cert_file": "nope.crt"}}, "No such file or directory"),
        ("mismatch", {"tls_server_config": {**cert, "key_file": other["key_file"]}}, "cannot load cert_file"),
        ("not-bcrypt", {"basic_auth_users": {"prometheus": "hunter2"}}, "not a bcrypt hash"),
        ("any-cert", {"tls_server_config": {**cert, "client_auth_type": "RequireAnyClientCert"}}, "not supported"),
        ("verify-no-ca", {"tls_server_config": {**cert, "client_auth_type": "RequireAndVerifyClientCert"}},
         "needs client_ca_file"),
        ("old-tls", {"tls_server_config": {**cert, "min_version": "TLS10"}}, "expected TLS12 or TLS13"),
        ("auth-type", {"tls_server_config": {**cert, "client_auth_type": "Sometimes"}}, "client_auth_type"),
    ]


def test_bad_web_config_at_start_names_the_file_and_the_problem(tmp_path):
    for name, content, needle in _bad_files(tmp_path):
        web = tmp_path / f"{name}.yml"
        _write_yaml(web, content)
        with pytest.raises(ConfigError) as caught:
            load_web_config(_config(web))
        message = str(caught.value)
        assert caught.value.field == "web_config_file" and str(web) in message and needle in message, (name, message)
        assert "\n" not in message
        assert "hunter2" not in message
    with pytest.raises(ConfigError, match="No such file"):
        load_web_config(_config(tmp_path / "absent.yml"))


def test_cli_exits_2_with_one_line_on_a_bad_web_config(tmp_path):
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": {"cert_file": "nope.crt", "key_file": "nope.key"}})
    result = subprocess.run([sys.executable, "-m", "exporter.cli", "run", "--listen", "127.0.0.1:0",
                             "--web.config.file", str(web), "--gpu-backend", "none", "--no-host"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"web_config_file='{web}'" in lines[0] and "tls_server_config.cert_file" in lines[0]
    env_result = subprocess.run([sys.executable, "-m", "exporter.cli", "run", "--listen", "127.0.0.1:0",
                                 "--gpu-backend", "none", "--no-host"], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "LLM_EXPORTER_WEB_CONFIG_FILE": str(web)})
    assert env_result.returncode == 2 and "web_config_file" in env_result.stderr


# --- hardening -------------------------------------------------------------------------------------

def test_request_body_and_header_limits(tmp_path):
    with running_exporter(_config(None), [ScriptedSource("a")]) as base:
        assert httpx.post(base + "/metrics", content=b"x" * 20_000, timeout=5).status_code == 413
        assert httpx.post(base + "/api/v1/snapshot", content=b"x" * 20_000, timeout=5).status_code == 413

        def chunks():
            for _ in range(40):
                yield b"y" * 1024

        assert httpx.post(base + "/metrics", content=chunks(), timeout=5).status_code == 413
        assert httpx.post(base + "/metrics", content=b"small", timeout=5).status_code == 405  # under the cap
        try:
            status = httpx.get(base + "/metrics", headers={"X-Big": "a" * 40_000}, timeout=5).status_code
        except httpx.HTTPError:
            status = 0  # the connection was dropped: refused all the same
        assert status in (0, 400, 431)
        assert httpx.get(base + "/metrics", params={"q": "z" * 20_000}, timeout=5).status_code in (400, 414, 431)
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200  # the server is fine after all that


def test_a_target_parameter_changes_nothing_and_fetches_nothing():
    with fake_engine(b"llm_should_never_be_read 1\n") as (url, behaviour):
        with running_exporter(_config(None, interval_s=60), [ScriptedSource("a")]) as base:
            plain = httpx.get(base + "/metrics", timeout=5)
            for path in ("/metrics", "/probe", "/api/v1/snapshot", "/api/v1/diagnosis", "/"):
                for query in ({"target": url}, {"target": url, "module": "vllm"}, {"url": url}):
                    response = httpx.get(base + path, params=query, timeout=5)
                    assert response.status_code in (200, 404), (path, query)
                    assert url not in response.text
            with_target = httpx.get(base + "/metrics", params={"target": url}, timeout=5)
            assert with_target.content == plain.content
            snapshot = httpx.get(base + "/api/v1/snapshot", params={"target": url}, timeout=5).json()
            assert set(snapshot["sources"]) == {"a"}
        assert behaviour.requests == 0


# --- doctor against an exporter served with TLS and basic auth -------------------------------------

def _doctor(argv: list[str], env: dict[str, str], capsys) -> tuple[int, str, str]:
    from exporter.cli import run

    code = run(["doctor", *argv], env)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_doctor_reaches_a_tls_and_basic_auth_exporter_with_ca_file_and_password_file(tmp_path, capsys):
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": _server_cert(ca, tmp_path),
                      "basic_auth_users": {"doctor": _hash("s3cret-pw")}})
    secret = tmp_path / "password"
    secret.write_text("s3cret-pw\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it\n")
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(ca)) as base:
        assert base.startswith("https://")
        # The system's trust store does not know the throwaway CA.
        code, out, _ = _doctor(["--url", base, "--json"], {}, capsys)
        assert code == 3 and "CERTIFICATE_VERIFY_FAILED" in json.loads(out)["error"], out
        code, out, _ = _doctor(["--url", base, "--ca-file", str(ca_file)], {}, capsys)
        assert code == 3 and "HTTP 401 (it wants basic auth" in out, out
        code, out, _ = _doctor(["--url", base, "--ca-file", str(ca_file), "--username", "doctor",
                                "--password-file", str(wrong)], {}, capsys)
        assert code == 3 and "HTTP 401 (wrong --username or password)" in out, out
        for credentials, env in ((["--password-file", str(secret)], {}),
                                 (["--password-env", "DOCTOR_PW"], {"DOCTOR_PW": "s3cret-pw"})):
            code, out, err = _doctor(["--url", base, "--ca-file", str(ca_file), "--username", "doctor",
                                      *credentials, "--json"], env, capsys)
            doc = json.loads(out)
            assert "error" not in doc and "diagnosis" in doc and doc["exit_code"] == code, doc
            assert "s3cret-pw" not in out + err


def test_doctor_presents_a_client_certificate_to_a_mutual_tls_exporter(tmp_path, capsys):
    server_ca, client_ca = trustme.CA(), trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "clients.crt"))
    server_ca.cert_pem.write_to_path(str(tmp_path / "server-ca.pem"))
    web = tmp_path / "web.yml"
    _write_yaml(web, {"tls_server_config": {**_server_cert(server_ca, tmp_path), "client_ca_file": "clients.crt",
                                            "client_auth_type": "RequireAndVerifyClientCert"}})
    good = client_ca.issue_cert("doctor@example")
    good.cert_chain_pems[0].write_to_path(str(tmp_path / "doctor.crt"))
    good.private_key_pem.write_to_path(str(tmp_path / "doctor.key"))
    trust = ["--ca-file", str(tmp_path / "server-ca.pem")]
    with running_exporter(_config(web), [ScriptedSource("a")], tls=_client(server_ca, good)) as base:
        code, out, _ = _doctor(["--url", base, *trust, "--json"], {}, capsys)
        assert code == 3 and "cannot reach" in json.loads(out)["error"], out
        code, out, _ = _doctor(["--url", base, *trust, "--cert-file", str(tmp_path / "doctor.crt"),
                                "--key-file", str(tmp_path / "doctor.key"), "--json"], {}, capsys)
        doc = json.loads(out)
        assert "error" not in doc and "diagnosis" in doc, doc


NOT_PEM = __file__  # a file that exists everywhere and is no certificate


@pytest.mark.parametrize(("argv", "env", "named"), [
    (["--url", "https://127.0.0.1:9", "--username", "u"], {}, "--username"),
    (["--url", "https://127.0.0.1:9", "--password-file", "/nonexistent/pw"], {}, "--username"),
    (["--url", "https://127.0.0.1:9", "--username", "u", "--password-file", "/nonexistent/pw"], {},
     "--password-file='/nonexistent/pw': No such file"),
    (["--url", "https://127.0.0.1:9", "--username", "u", "--password-env", "UNSET_PW"], {},
     "--password-env='UNSET_PW'"),
    (["--url", "https://127.0.0.1:9", "--ca-file", "/nonexistent/ca.pem"], {}, "--ca-file='/nonexistent/ca.pem'"),
    (["--url", "https://127.0.0.1:9", "--cert-file", NOT_PEM], {}, "needs both --cert-file and --key-file"),
    (["--url", "https://127.0.0.1:9", "--cert-file", NOT_PEM, "--key-file", NOT_PEM], {},
     f"--cert-file={NOT_PEM!r}: cannot load it"),
    (["--engine", "http://127.0.0.1:9/metrics", "--ca-file", NOT_PEM], {}, "applies to --url only"),
])
def test_doctor_access_options_are_checked_before_anything_is_fetched(argv, env, named, capsys):
    code, out, err = _doctor(argv, env, capsys)
    assert code == 2, (out, err)
    assert named in err and err.count("\n") == 1, err
