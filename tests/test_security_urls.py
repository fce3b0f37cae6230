"""Issue 27, class 3: a basic-auth password with an unencoded / ? # @ in an engine URL.

urllib ends the authority at the first / ? #, so `http://u:pa/ss@host/` was read as host `u`, port
`pa`: the exporter tried to resolve the user name, and the password reached the log, the pages and
start-up errors. Now the userinfo runs to the last @ (exporter/redact.split_userinfo), the URL is
re-encoded once (targets.normalize_engine_url) and every place a URL is shown uses redact_url."""

from __future__ import annotations

import base64
import os
import pathlib
import secrets
import subprocess
import sys
import urllib.parse

import httpx
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exporter.config import ConfigError, load_config
from exporter.redact import RedactUrlCredentials, redact_url
from exporter.targets import _options_start, _split_spec, normalize_engine_url, reject_command_line_secrets
from tests.support import fake_engine, free_port, wait_until

VLLM = (pathlib.Path(__file__).parent / "fixtures" / "engines" / "vllm-v0.11__documented.prom").read_bytes()
# The alphabet of generated secrets (password managers, openssl rand -base64, pwgen -y).
SECRET_ALPHABET = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                   "/+=_-.~!$&'()*,;:%@#?")
USERS = st.text("abcdefghijklmnopqrstuvwxyz0123456789._~-", min_size=1, max_size=8)
PASSWORDS = st.text(SECRET_ALPHABET, min_size=1, max_size=40)
HOSTS = st.sampled_from(["127.0.0.1", "engine.example", "[::1]", "vllm-0.vllm.svc"])


def _secret_password() -> tuple[str, list[str]]:
    """A password with every separator urllib misreads, and the pieces between them (each must
    appear nowhere)."""
    pieces = [secrets.token_hex(6) for _ in range(5)]
    return "{}/{}#{}?{}@{}".format(*pieces), pieces


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --- the parser, over the generated-secret alphabet ---------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(user=USERS, password=PASSWORDS, host=HOSTS, port=st.integers(1, 65535),
       path=st.sampled_from(["", "/", "/metrics", "/a/b?x=1"]))
def test_userinfo_is_split_where_the_user_means_it(user, password, host, port, path):
    # % is the escape character of a URL: written %25 it is always itself (an unencoded % not
    # followed by two hex digits is itself too; the next test).
    url = f"http://{user}:{password.replace('%', '%25')}@{host}:{port}{path}"
    parts = urllib.parse.urlsplit(normalize_engine_url(url))
    assert (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password)) == (user, password)
    assert (parts.hostname, parts.port) == (host.strip("[]"), port)
    assert redact_url(url) == f"http://{host}:{port}{path}"
    # The log filter takes the same path, whatever text surrounds the URL.
    assert _filtered(f"scrape of {url} failed") == f"scrape of http://{host}:{port}{path} failed"


@settings(max_examples=300, deadline=None)
@given(user=USERS, password=PASSWORDS)
def test_a_raw_password_without_percent_escapes_needs_no_encoding(user, password):
    assume(not _has_escape(password))
    url = f"http://{user}:{password}@127.0.0.1:8000/metrics"
    parts = urllib.parse.urlsplit(normalize_engine_url(url))
    assert urllib.parse.unquote(parts.password) == password and parts.hostname == "127.0.0.1"


@settings(max_examples=300, deadline=None)
@given(user=USERS, password=PASSWORDS, options=st.sampled_from(["", ",kind=vllm", ",name=a,kind=vllm,timeout=2s"]))
def test_a_spec_keeps_commas_in_the_password_and_the_command_line_refuses_it_silently(user, password, options):
    assume(not _options_start().search("," + password.replace("%", "%25")))  # a password cannot hold ",kind="
    encoded = password.replace("%", "%25")
    spec = f"http://{user}:{encoded}@127.0.0.1:8000/metrics{options}"
    url, parsed = _split_spec(spec, "engine")
    assert url == f"http://{user}:{encoded}@127.0.0.1:8000/metrics"
    assert set(parsed) == {item.partition("=")[0] for item in options.split(",")[1:]}
    try:
        reject_command_line_secrets([spec])
    except ConfigError as error:
        message = str(error)
    else:
        raise AssertionError("a URL with a password on the command line was accepted")
    # The refusal is the same text whatever the password (a word of the advice can be a password).
    assert message == _refusal_without_password(options), message


def _refusal_without_password(options: str) -> str:
    try:
        reject_command_line_secrets([f"http://u:x@127.0.0.1:8000/metrics{options}"])
    except ConfigError as error:
        return str(error)
    raise AssertionError("refusal expected")


def _has_escape(text: str) -> bool:
    return urllib.parse.unquote(text) != text


def _filtered(message: str) -> str:
    import logging

    record = logging.LogRecord("t", logging.INFO, __file__, 1, "%s", (message,), None)
    RedactUrlCredentials().filter(record)
    return record.getMessage()


def test_unclear_userinfo_is_refused_without_echoing_it():
    for url in ("http://u:QQ1/ZZ2@", "http://u:QQ1#ZZ2@/metrics", "http://u:QQ1@ZZ2@ bad host/"):
        try:
            normalize_engine_url(url)
        except ConfigError as error:
            assert "QQ1" not in str(error) and "ZZ2" not in str(error), str(error)
        else:
            raise AssertionError(url)
    assert redact_url("http://u:pa/ss@") == "http://<redacted>"
    try:  # a comma-cut password used to sit where the port is: a bad port is never echoed
        normalize_engine_url("http://u:s3kr1t")
    except ConfigError as error:
        assert "s3kr1t" not in str(error)


# --- the real process ------------------------------------------------------------------------------


def test_cli_engine_with_separators_in_the_password_is_refused_without_echoing_it():
    password, pieces = _secret_password()
    for url in (f"http://u:{password}@127.0.0.1:9/metrics", f"http://u:{password}@127.0.0.1:9/metrics,kind=vllm"):
        result = subprocess.run([sys.executable, "-m", "exporter.cli", "run", "--engine", url, "--gpu-backend",
                                 "none", "--no-host"], capture_output=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert b"command line" in result.stderr
        for secret in (password, *pieces):
            assert secret.encode() not in result.stdout + result.stderr


def test_run_scrapes_with_such_a_password_and_shows_it_nowhere(tmp_path):
    """LLM_EXPORTER_ENGINES with user:PASSWORD@ where PASSWORD holds / # ? @: the engine gets the
    right Authorization (so the URL was split as meant), and no byte of stderr (debug logs), stdout,
    /metrics, /api/v1/snapshot, /api/v1/diagnosis or the status page holds the password or a piece."""
    password, pieces = _secret_password()
    with fake_engine(VLLM, expect_authorization=_basic("u", password)) as (url, behaviour):
        engine = url.replace("http://", f"http://u:{password}@") + ",name=guarded,kind=vllm"
        port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLM_EXPORTER_ENGINES": engine}
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", "run", "--listen", f"127.0.0.1:{port}", "--interval", "100ms",
             "--gpu-backend", "none", "--no-host", "--log-level", "debug"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        base = f"http://127.0.0.1:{port}"
        served = b""
        try:
            def up() -> bool:
                try:
                    return any(line.startswith("llm_engine_up{") and 'target="guarded"' in line
                               and float(line.split()[-1]) == 1
                               for line in httpx.get(base + "/metrics", timeout=2).text.splitlines())
                except httpx.HTTPError:
                    return process.poll() is not None  # exited: fail below with its stderr

            assert wait_until(up, timeout=30)
            assert process.poll() is None
            for path in ("/metrics", "/api/v1/snapshot", "/api/v1/diagnosis", "/", "/healthz", "/readyz"):
                served += httpx.get(base + path, timeout=5).content
        finally:
            process.terminate()
            stdout, stderr = process.communicate(timeout=15)
        seen = behaviour.authorizations_seen
    assert b"level=DEBUG" in stderr
    assert _basic("u", password) in seen and all(a == _basic("u", password) for a in seen)
    assert b"127.0.0.1" in served  # the URL is shown, redacted
    for secret in (password, *pieces, base64.b64encode(f"u:{password}".encode()).decode()):
        assert secret.encode() not in stdout + stderr + served, secret


def test_yaml_and_env_urls_load_with_such_a_password(tmp_path):
    password, _ = _secret_password()
    config = load_config({}, {"LLM_EXPORTER_ENGINES": f"http://u:{password}@h:1/metrics,name=x"})
    parts = urllib.parse.urlsplit(config.engines[0].url)
    assert (parts.hostname, parts.port, urllib.parse.unquote(parts.password)) == ("h", 1, password)
    assert password not in repr(config)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(option=st.sampled_from(["name", "kind", "timeout", "bearer_token_env", "username"]),
       before=st.text("0123456789/#?", min_size=6, max_size=10),
       after=st.text("0123456789/#?@", min_size=6, max_size=12))
def test_a_password_holding_an_option_key_is_refused_without_echoing_any_of_it(option, before, after):
    """`,name=` in a password cuts the spec there (the options' keys are the only place to cut); the
    rest of the password then sits in an option's value. Refused, and no piece of it is shown."""
    password = f"{before},{option}={after}"
    spec = f"http://u:{password}@127.0.0.1:9/metrics"
    try:
        load_config({}, {"LLM_EXPORTER_ENGINES": spec})
    except ConfigError as error:
        message = str(error)
    else:
        raise AssertionError("accepted a spec that hides part of a password in an option")
    for piece in (before, after, password):
        assert piece not in message, (piece, message)


def test_doctor_url_and_loadtest_urls_refuse_userinfo_without_echoing_it():
    """`doctor --url`, `loadtest URL` and `--exporter` are command lines too: a password there is
    visible to every local user. urllib read `u:pa/ss@` as host u, port pa and printed the port."""
    password, pieces = _secret_password()
    url = f"http://u:{password}@127.0.0.1:{free_port()}"
    for args in (["doctor", "--url", url], ["loadtest", url, "--concurrency", "1"],
                 ["loadtest", "http://127.0.0.1:9", "--exporter", url, "--concurrency", "1"]):
        done = subprocess.run([sys.executable, "-m", "exporter.cli", *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        output = done.stdout + done.stderr
        assert done.returncode == 2, (args, output)
        assert "user[:password]@ in the URL" in output
        for piece in pieces:
            assert piece not in output, (args, output)
