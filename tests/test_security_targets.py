"""Engine targets behind authentication: bearer tokens and basic auth from files or environment
variables, token rotation, custom CAs, and the secrets showing up nowhere: no log line, metric,
JSON document or page (grepped), and never accepted on the command line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import pathlib
import secrets
import ssl
import subprocess
import sys

import httpx
import pytest
import trustme
import yaml

from exporter.app import build_sources
from exporter.config import ConfigError, build_config, load_config
from exporter.sources.base import SourceError
from exporter.sources.engines.scrape import EngineSource
from tests.exporter_process import running_exporter
from tests.support import fake_engine, free_port, wait_until

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "engines"
VLLM = (FIXTURES / "vllm-v0.11__documented.prom").read_bytes()


def guarded_engine(expect: str | None, tls: ssl.SSLContext | None = None):
    """A fake engine that answers 401 unless Authorization equals `expect` (None: anything)."""
    return fake_engine(VLLM, tls=tls, expect_authorization=expect)


def _write_secret(path: pathlib.Path, value: str) -> None:
    # Rotate the way Kubernetes and most tools do: a new file renamed over the old one.
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _flags(*engines: str, **extra: object) -> dict[str, object]:
    return {"engines": list(engines), "listen": "127.0.0.1:0", "interval": "100ms", "gpu_backend": "none",
            "host_enabled": False, **extra}


def _everything_served(base: str) -> dict[str, str]:
    """Every page, document and exposition the exporter serves."""
    out = {}
    for path in ("/metrics", "/api/v1/snapshot", "/api/v1/diagnosis", "/", "/healthz", "/readyz"):
        out[path] = httpx.get(base + path, timeout=5).text
    out["/metrics (openmetrics)"] = httpx.get(base + "/metrics", timeout=5, headers={
        "Accept": "application/openmetrics-text; version=1.0.0"}).text
    return out


def _up(base: str, target: str) -> float | None:
    for line in httpx.get(base + "/metrics", timeout=5).text.splitlines():
        if line.startswith("llm_engine_up{") and f'target="{target}"' in line:
            return float(line.split()[-1])
    return None


def _assert_nowhere(secret_values: list[str], served: dict[str, str], logs: str) -> None:
    for value in secret_values:
        for where, text in served.items():
            assert value not in text, f"secret found in {where}"
        assert value not in logs, "secret found in a log line"


def test_bearer_token_from_a_file_is_sent_rotated_and_shown_nowhere(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, every level, httpx and httpcore included
    first, second = "tok-" + secrets.token_hex(16), "tok-" + secrets.token_hex(16)
    token_file = tmp_path / "token"
    _write_secret(token_file, first)
    with guarded_engine(f"Bearer {first}") as (url, engine):
        config = load_config(_flags(f"{url},kind=vllm,name=secure,bearer_token_file={token_file}"), {})
        with running_exporter(config, build_sources(config)) as base:
            assert wait_until(lambda: _up(base, "secure") == 1.0, timeout=10)
            assert engine.authorizations_seen[-1] == f"Bearer {first}"
            served = _everything_served(base)
            assert '"auth": "bearer"' in httpx.get(base + "/api/v1/snapshot", timeout=5).text.replace('":"', '": "')

            engine.expect_authorization = f"Bearer {second}"  # the engine rotates first: scrapes fail with 401 ...
            assert wait_until(lambda: _up(base, "secure") == 0.0, timeout=10)
            failing = _everything_served(base)
            assert "http_status" in failing["/metrics"]
            _write_secret(token_file, second)  # ... until the new token lands in the file
            assert wait_until(lambda: _up(base, "secure") == 1.0, timeout=10)
            assert engine.authorizations_seen[-1] == f"Bearer {second}"
            recovered = _everything_served(base)

            token_file.unlink()  # a missing file fails the scrape, naming the file only
            assert wait_until(lambda: 'reason="credentials"' in httpx.get(base + "/metrics", timeout=5).text,
                              timeout=10)
            gone = _everything_served(base)
    logs = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert "credentials" in logs and str(token_file) in logs
    for snapshot in (served, failing, recovered, gone):
        _assert_nowhere([first, second], snapshot, logs)


def test_basic_auth_from_env_and_url_userinfo_and_yaml_blocks(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    env_password, url_password, file_password = (secrets.token_hex(12) for _ in range(3))
    (tmp_path / "pw").write_text(file_password + "\n")
    with contextlib.ExitStack() as stack:
        url_a, engine_a = stack.enter_context(guarded_engine(_basic("scraper", env_password)))
        url_b, engine_b = stack.enter_context(guarded_engine(_basic("alice", url_password)))
        url_c, engine_c = stack.enter_context(guarded_engine(_basic("bob", file_password)))
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump({"engines": [
            {"url": url_a, "name": "env", "kind": "vllm",
             "basic_auth": {"username": "scraper", "password_env": "ENGINE_PASSWORD"}},
            {"url": url_b.replace("http://", f"http://alice:{url_password}@"), "name": "userinfo", "kind": "vllm"},
            {"url": url_c, "name": "file", "kind": "vllm", "username": "bob", "password_file": str(tmp_path / "pw")},
        ]}))
        config = load_config({"config": str(config_file), "listen": "127.0.0.1:0", "interval": "100ms",
                              "gpu_backend": "none", "host_enabled": False}, {"ENGINE_PASSWORD": env_password})
        assert env_password not in repr(config) and file_password not in repr(config)
        with running_exporter(config, build_sources(config)) as base:
            for name in ("env", "userinfo", "file"):
                assert wait_until(lambda name=name: _up(base, name) == 1.0, timeout=10), name
            served = _everything_served(base)
    assert engine_a.authorizations_seen[-1] == _basic("scraper", env_password)
    assert engine_b.authorizations_seen[-1] == _basic("alice", url_password)
    assert engine_c.authorizations_seen[-1] == _basic("bob", file_password)
    logs = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    _assert_nowhere([env_password, url_password, file_password,
                     _basic("scraper", env_password).split()[1], _basic("alice", url_password).split()[1]],
                    served, logs)
    assert url_b in served["/api/v1/snapshot"]  # the URL is shown, redacted


def test_cli_run_with_secrets_logs_none_of_them(tmp_path):
    """The real command at --log-level debug: nothing on stderr, /metrics, /api/* or / carries a secret."""
    token, password = "tok-" + secrets.token_hex(16), secrets.token_hex(12)
    token_file = tmp_path / "token"
    _write_secret(token_file, token)
    with guarded_engine(f"Bearer {token}") as (url_a, _), guarded_engine(_basic("u", password)) as (url_b, _):
        config_file = tmp_path / "config.yaml"
        config_file.write_text(yaml.safe_dump({"engines": [
            {"url": url_a, "name": "bearer", "kind": "vllm", "bearer_token_file": str(token_file)},
            {"url": url_b.replace("http://", f"http://u:{password}@"), "name": "userinfo", "kind": "vllm"},
        ]}))
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "run", "--config", str(config_file), "--listen",
             f"127.0.0.1:{port}", "--interval", "100ms", "--gpu-backend", "none", "--no-host", "--log-level", "debug"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        base = f"http://127.0.0.1:{port}"
        try:
            def both_up() -> bool:
                try:
                    return _up(base, "bearer") == 1.0 and _up(base, "userinfo") == 1.0
                except httpx.HTTPError:
                    return False

            assert wait_until(both_up, timeout=20)
            served = _everything_served(base)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=15)
    assert "level=DEBUG" in stderr  # debug logging really was on
    _assert_nowhere([token, password, base64.b64encode(f"u:{password}".encode()).decode()], served, stderr)


@pytest.mark.parametrize("spec_suffix, secret", [
    (",bearer_token=SEKRIT-VALUE-1", "SEKRIT-VALUE-1"),
    (",username=u,password=SEKRIT-VALUE-2", "SEKRIT-VALUE-2"),
])
def test_a_secret_on_the_command_line_is_refused_with_exit_2(spec_suffix, secret):
    for argv in (["--engine", f"http://127.0.0.1:9/metrics{spec_suffix}"],
                 ["--engine", "http://user:SEKRIT-URL@127.0.0.1:9/metrics"]):
        result = subprocess.run([sys.executable, "-m", "exporter.cli", "run", *argv, "--gpu-backend", "none",
                                 "--no-host"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "command line" in lines[0] and "_file" in lines[0], lines[0]
        assert secret not in result.stderr and "SEKRIT-URL" not in result.stderr


def test_config_validation_of_credentials(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("abc\n")
    good = load_config({"engines": [f"http://h:1/metrics,bearer_token_file={token_file}"]}, {})
    assert good.engines[0].bearer_token_file == str(token_file) and good.engines[0].auth_kind == "bearer"
    # user:password@ is fine from the environment or a file, refused on the command line
    assert load_config({}, {"LLM_EXPORTER_ENGINES": "http://u:pw@h:1/metrics"}).engines[0].auth_kind == "basic_url"
    cases = [
        ({"engines": [{"url": "http://h:1", "bearer_token": "x"}]}, "engine", "must not be given inline"),
        ({"engines": [{"url": "http://h:1", "basic_auth": {"username": "u", "password": "x"}}]}, "engine", "inline"),
        ({"engines": [f"http://h:1,bearer_token_file={tmp_path / 'absent'}"]}, "engine.bearer_token_file",
         "No such file"),
        ({"engines": [f"http://h:1,bearer_token_file={tmp_path}"]}, "engine.bearer_token_file", ""),
        ({"engines": ["http://h:1,bearer_token_env=NOT_SET_ANYWHERE"]}, "engine.bearer_token_env", "not set"),
        ({"engines": [f"http://h:1,bearer_token_file={token_file},bearer_token_env=X"]}, "engine", "not both"),
        ({"engines": [f"http://h:1,bearer_token_file={token_file},username=u,password_env=X"]}, "engine", "either"),
        ({"engines": ["http://h:1,username=u"]}, "engine", "password_file"),
        ({"engines": [f"http://h:1,password_file={token_file}"]}, "engine", "username"),
        ({"engines": [f"http://u:p@h:1,username=u,password_file={token_file}"]}, "engine", "user:password@"),
        ({"engines": [f"https://h:1,ca_file={token_file}"]}, "engine.ca_file", "PEM"),
        ({"engines": [f"https://h:1,ca_file={tmp_path / 'absent'}"]}, "engine.ca_file", "No such file"),
        ({"engines": ["https://h:1,insecure_skip_verify=maybe"]}, "engine.insecure_skip_verify", "true or false"),
        ({"engines": [{"url": "http://h:1", "tls_config": {"ca": "x"}}]}, "engine.tls_config", "unknown"),
    ]
    for settings, field_name, needle in cases:
        with pytest.raises(ConfigError) as caught:
            build_config(settings, {})
        assert caught.value.field == field_name and needle in str(caught.value), (settings, str(caught.value))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        load_config({"engines": [f"http://h:1,bearer_token_file={tmp_path / 'empty'}"]}, {})
    (tmp_path / "two-lines").write_text("abc\ndef\n")
    with pytest.raises(ConfigError, match="line break"):
        load_config({"engines": [f"http://h:1,bearer_token_file={tmp_path / 'two-lines'}"]}, {})
    env_config = load_config({"engines": ["http://h:1,bearer_token_env=TOKEN"]}, {"TOKEN": "hidden-value"})
    assert "hidden-value" not in repr(env_config) and "hidden-value" not in str(env_config.engines[0])


def test_https_engine_with_custom_ca_and_insecure_skip_verify(tmp_path):
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    with guarded_engine(None, tls=server_context) as (url, engine):
        def collect(spec: str):
            config = load_config({"engines": [spec]}, {})
            source = EngineSource(config.engines[0], max_payload_bytes=1 << 20, max_series=10_000)

            async def once():
                try:
                    return await source.collect()
                finally:
                    await source.close()
            return asyncio.run(once())

        assert collect(f"{url},kind=vllm,ca_file={tmp_path / 'ca.pem'}").samples
        with pytest.raises(SourceError) as caught:
            collect(f"{url},kind=vllm")  # the default trust store does not know the private CA
        assert caught.value.reason == "tls" and "ca_file" in caught.value.message
        assert collect(f"{url},kind=vllm,insecure_skip_verify=true").samples
        assert len(engine.authorizations_seen) == 2  # the refused handshake never got as far as a request
