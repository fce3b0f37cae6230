"""Configuration: one frozen dataclass, validated once at start.

Precedence: command-line flag > LLM_EXPORTER_* environment variable > YAML file > default
(dcgm-exporter's env twins, declared in one place). A bad value raises ConfigError naming the
field and the value; the CLI turns it into one line on stderr and exit status 2."""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.yamlsafe import MAX_ECHO_CHARS, YamlLoadError, load_yaml_file, shorten

GPU_BACKENDS = ("auto", "nvml", "sim", "none")
DEFAULT_LISTEN = "0.0.0.0:9480"
DEFAULT_INTERVAL_S = 1.0
DEFAULT_ENGINE_TIMEOUT_S = 0.8
MIN_INTERVAL_S = 0.1  # below this the collector would spin (a cycle itself takes a few ms of CPU)
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
ENV_PREFIX = "LLM_EXPORTER_"
_TARGET_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


class ConfigError(ValueError):
    """A bad configuration value; `field` and `value` name it."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        # Values come from files and flags: quote only the start of one (a YAML value can stand
        # for millions of nodes), and keep the message on one line.
        super().__init__(f"invalid {field_name}={shorten(repr(value))}: {shorten(reason, 4 * MAX_ECHO_CHARS)}")
        self.field = field_name
        self.value = value


class Secret:
    """A credential read from an environment variable. Its repr and str never show the value, so a
    Config or EngineTarget that ends up in a log line or a traceback does not leak it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('<redacted>')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, len(self._value)))


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """One engine to scrape. Credentials are only ever named here (a file path, an environment
    variable's name); a value read from the environment is wrapped in Secret. Files are read by
    exporter/sources/engines/auth.py at scrape time, so rotated tokens are picked up."""

    url: str
    name: str
    kind: str | None = None  # None: auto-detect from the exposition
    timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    bearer_token_file: str | None = None
    bearer_token_env: str | None = None  # the variable's name; its value is in `env_secret`
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    basic_auth_password_env: str | None = None  # the variable's name; its value is in `env_secret`
    env_secret: Secret | None = None
    ca_file: str | None = None  # CA bundle for an https:// engine (default: the system store)
    insecure_skip_verify: bool = False

    def __repr__(self) -> str:
        # The URL may carry user:password@ (YAML, LLM_EXPORTER_ENGINES): shown redacted, as in logs.
        shown = (f"{f.name}={redact_url(self.url) if f.name == 'url' else getattr(self, f.name)!r}"
                 for f in dataclasses.fields(self))
        return f"EngineTarget({', '.join(shown)})"

    @property
    def auth_kind(self) -> str:
        if self.bearer_token_file or self.bearer_token_env:
            return "bearer"
        if self.basic_auth_username is not None:
            return "basic"
        if urllib.parse.urlsplit(self.url).username is not None:
            return "basic_url"
        return "none"


@dataclass(frozen=True, slots=True)
class Config:
    listen_host: str = "0.0.0.0"
    listen_port: int = 9480
    interval_s: float = DEFAULT_INTERVAL_S
    engines: tuple[EngineTarget, ...] = ()
    engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_series_per_target: int = 10_000
    gpu_backend: str = "auto"
    sim_url: str | None = None  # twin URL for --gpu-backend sim when the twin is another process
    host_enabled: bool = True
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    engine_port: int | None = None
    engine_pidfile: str | None = None
    engine_process_name: str | None = None
    max_concurrent_scrapes: int = 4
    log_level: str = "info"
    # Derivation settings (exporter/derive/): the model shape turns token rates into bytes and FLOPs.
    model: str | None = None  # a built-in shape name or a path to a Hugging Face config.json
    tensor_parallel: int | None = None  # GPUs one engine replica spans; default: all GPUs seen
    gpu_price_per_hour: float | None = None  # for llm_cost_per_million_tokens; omitted when unset
    slo_ttft_s: float = 2.5
    slo_tbt_s: float = 0.1
    quantile_window_s: float = 300.0
    web_config_file: str | None = None  # --web.config.file: TLS and basic auth (exporter/webconfig.py)
    extra: Mapping[str, Any] = field(default_factory=dict)  # settings of later stages (derive)

    @property
    def listen(self) -> str:
        return f"{_bracket(self.listen_host)}:{self.listen_port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def redact_url(url: str) -> str:
    """Drop user:password@ from a URL before it is logged, labelled or shown. Never raises: a URL
    urllib cannot split (a bad port, an unclosed IPv6 bracket) loses its userinfo by pattern."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        _, _, hostport = parts.netloc.rpartition("@")
    except ValueError:
        return _URL_USERINFO.sub(r"\1", url)
    return urllib.parse.urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))


# user:password@ after a scheme; quotes may be part of a password, so only / and spaces end it.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")


class RedactUrlCredentials(logging.Filter):
    """Last line of defence for logs: drop user:password@ from any URL in a record, whoever
    wrote it (httpx logs full request URLs). On the root handlers (cli.setup_logging) and on the
    httpx logger (EngineSource), so it holds however logging is configured."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _URL_USERINFO.sub(r"\1", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def install_log_redaction(logger: logging.Logger) -> None:
    if not any(isinstance(f, RedactUrlCredentials) for f in logger.filters):
        logger.addFilter(RedactUrlCredentials())


def parse_listen(value: str, field_name: str = "listen") -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(field_name, value, "expected HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(field_name, value, "port out of range")
    return (host.strip("[]") or "0.0.0.0"), port


def parse_duration(value: object, field_name: str) -> float:
    """Seconds from 1.5, "1.5", "500ms", "2s", "1m"."""
    if isinstance(value, bool):
        raise ConfigError(field_name, value, "expected a duration like 1s or 500ms")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", str(value))
        if not match:
            raise ConfigError(field_name, value, "expected a duration like 1s or 500ms")
        seconds = float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[match.group(2)]
    if not 0 < seconds <= 3600:
        raise ConfigError(field_name, value, "must be > 0 and at most 1h")
    return seconds


def _default_target_name(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    name = parts.hostname or "engine"
    if parts.port:
        name = f"{name}:{parts.port}"
    return name


def normalize_engine_url(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as error:  # an unclosed IPv6 bracket, ...
        raise ConfigError("engine", redact_url(url), f"not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("engine", redact_url(url), "expected an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError("engine", redact_url(url), "bad port") from None
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


# Options of an engine target that carry a secret inline: refused everywhere, because a file or an
# environment variable is the only place a secret may come from (never the command line or a YAML
# file that is usually world-readable and checked in).
INLINE_SECRET_KEYS = frozenset({"bearer_token", "token", "password", "credentials", "authorization"})
_SECRET_ADVICE = ("put the secret in a file (bearer_token_file=PATH, password_file=PATH) or an environment "
                  "variable (bearer_token_env=VAR, password_env=VAR)")
_TARGET_OPTIONS = frozenset({"kind", "name", "timeout", "bearer_token_file", "bearer_token_env", "username",
                             "password_file", "password_env", "ca_file", "insecure_skip_verify"})


def _flatten_target_mapping(spec: Mapping[str, Any]) -> dict[str, Any]:
    """YAML targets may group options the Prometheus way: basic_auth: {username, password_file,
    password_env} and tls_config: {ca_file, insecure_skip_verify}."""
    options = {str(k): v for k, v in spec.items()}
    for block, allowed in (("basic_auth", ("username", "password_file", "password_env", "password")),
                           ("tls_config", ("ca_file", "insecure_skip_verify"))):
        inner = options.pop(block, None)
        if inner is None:
            continue
        if not isinstance(inner, Mapping):
            raise ConfigError(f"engine.{block}", "<mapping expected>", "expected a mapping")
        unknown = set(map(str, inner)) - set(allowed)
        if unknown:
            raise ConfigError(f"engine.{block}", sorted(unknown), f"unknown option(s); expected {', '.join(allowed)}")
        options.update({str(k): v for k, v in inner.items()})
    return options


def parse_engine_spec(spec: str | Mapping[str, Any], default_timeout: float,
                      env: Mapping[str, str] | None = None) -> EngineTarget:
    """`URL[,kind=K][,name=N][,timeout=T][,bearer_token_file=PATH]...` or a YAML mapping with the same
    keys (plus basic_auth/tls_config blocks). Secrets come from files or environment variables."""
    if isinstance(spec, Mapping):
        options = _flatten_target_mapping(spec)
        url = str(options.pop("url", ""))
    else:
        url, *rest = str(spec).strip().split(",")
        options = {}
        for item in rest:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError("engine", redact_url(url), "expected key=value after the URL")
            options[key.strip()] = value.strip()
    inline = set(options) & INLINE_SECRET_KEYS
    if inline:
        raise ConfigError("engine", redact_url(url), f"{sorted(inline)[0]} must not be given inline: {_SECRET_ADVICE}")
    unknown = set(options) - _TARGET_OPTIONS
    if unknown:
        raise ConfigError("engine", redact_url(url), f"unknown option(s) {sorted(unknown)}")
    url = normalize_engine_url(url)
    kind = options.get("kind")
    if kind is not None:
        kind = str(kind)
        known = _engine_kinds()
        if kind not in known and kind != "auto":
            raise ConfigError("engine.kind", kind, f"expected one of {', '.join(('auto',) + known)}")
        kind = None if kind == "auto" else kind
    name = str(options.get("name") or _default_target_name(url))
    if not _TARGET_NAME_RE.match(name):
        raise ConfigError("engine.name", name, "letters, digits and _.:- only, 1-64 characters")
    timeout = parse_duration(options["timeout"], "engine.timeout") if "timeout" in options else default_timeout
    credentials = _target_credentials(url, options, os.environ if env is None else env)
    return EngineTarget(url=url, name=name, kind=kind, timeout_s=timeout, **credentials)


def _opt(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    return None if value in (None, "") else str(value)


def _target_credentials(url: str, options: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Validate the credential and TLS options of one target: at most one way to authenticate,
    files readable now (they are re-read at scrape time), variables set, CA bundle loadable."""
    token_file, token_env = _opt(options, "bearer_token_file"), _opt(options, "bearer_token_env")
    username = _opt(options, "username")
    password_file, password_env = _opt(options, "password_file"), _opt(options, "password_env")
    where = redact_url(url)
    if token_file and token_env:
        raise ConfigError("engine", where, "set bearer_token_file or bearer_token_env, not both")
    if password_file and password_env:
        raise ConfigError("engine", where, "set password_file or password_env, not both")
    if (password_file or password_env) and username is None:
        raise ConfigError("engine", where, "basic auth needs username= with password_file= or password_env=")
    if username is not None and not (password_file or password_env):
        raise ConfigError("engine", where, "basic auth needs password_file= or password_env= with username=")
    if username is not None and ":" in username:
        raise ConfigError("engine.username", username, "a basic-auth username cannot contain ':'")
    bearer, basic = bool(token_file or token_env), username is not None
    if bearer and basic:
        raise ConfigError("engine", where, "set either a bearer token or basic auth, not both")
    if (bearer or basic) and urllib.parse.urlsplit(url).username is not None:
        raise ConfigError("engine", where, "the URL already carries user:password@; remove it or the other credentials")
    values: dict[str, Any] = {"bearer_token_file": token_file, "bearer_token_env": token_env,
                              "basic_auth_username": username, "basic_auth_password_file": password_file,
                              "basic_auth_password_env": password_env}
    for key, path in (("bearer_token_file", token_file), ("password_file", password_file)):
        if path:
            _check_secret_file(path, f"engine.{key}")
    variable = token_env or password_env
    if variable:
        value = env.get(variable, "")
        if not value.strip():
            raise ConfigError(f"engine.{'bearer_token_env' if token_env else 'password_env'}", variable,
                              "environment variable is not set or empty")
        if any(c in value.strip() for c in "\r\n\0"):
            raise ConfigError(f"engine.{'bearer_token_env' if token_env else 'password_env'}", variable,
                              "the value contains a line break or NUL")
        values["env_secret"] = Secret(value.strip())
    ca_file = _opt(options, "ca_file")
    insecure = _as_bool(options.get("insecure_skip_verify", False), "engine.insecure_skip_verify")
    if ca_file and insecure:
        raise ConfigError("engine", where, "ca_file and insecure_skip_verify exclude each other")
    if ca_file:
        try:
            ssl.create_default_context(cafile=ca_file)
        except ssl.SSLError as error:  # before OSError, its base class
            raise ConfigError("engine.ca_file", ca_file, f"not a PEM CA bundle ({error.reason or error})") from None
        except OSError as error:
            raise ConfigError("engine.ca_file", ca_file, error.strerror or str(error)) from None
    values["ca_file"], values["insecure_skip_verify"] = ca_file, insecure
    return values


def _check_secret_file(path: str, field_name: str) -> None:
    from exporter.sources.engines.auth import CredentialError, read_secret_file

    try:
        read_secret_file(path)
    except CredentialError as error:
        raise ConfigError(field_name, path, str(error)) from None


def reject_command_line_secrets(specs: object) -> None:
    """`--engine` values are visible to every local user (ps, /proc/PID/cmdline): refuse a secret
    there, inline or as user:password@ in the URL, with advice on where to put it."""
    if not specs:
        return
    for spec in [specs] if isinstance(specs, str) else specs:
        if not isinstance(spec, str):
            continue
        url, *rest = spec.strip().split(",")
        keys = {item.partition("=")[0].strip() for item in rest}
        secret_keys = sorted(keys & INLINE_SECRET_KEYS)
        # Any userinfo: a token is often passed as the user name alone (http://TOKEN@host/).
        _, _, authority = url.partition("://")
        if secret_keys or "@" in authority.split("/", 1)[0]:
            what = secret_keys[0] if secret_keys else "user[:password]@ in the URL"
            raise ConfigError("engine", redact_url(url),
                              f"{what}: a secret on the command line is visible to every local user; {_SECRET_ADVICE}")


def _engine_kinds() -> tuple[str, ...]:
    from exporter.sources.engines.normalize import KINDS

    return tuple(KINDS)


def _load_yaml(path: str) -> dict[str, Any]:
    try:
        data = load_yaml_file(path) or {}
    except YamlLoadError as error:
        raise ConfigError("config", path, str(error)) from None
    if not isinstance(data, dict):
        raise ConfigError("config", path, "top level must be a mapping")
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """LLM_EXPORTER_LISTEN=..., LLM_EXPORTER_ENGINES="URL,kind=vllm URL2" (space separated)."""
    settings: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "CONFIG":
            continue
        name = key[len(ENV_PREFIX):].lower()
        settings["engines" if name in ("engine", "engines") else name] = (
            value.split() if name in ("engine", "engines") else value
        )
    return settings


_FIELDS = {f.name for f in dataclasses.fields(Config)} | {
    "listen", "interval", "engine_timeout", "slo_ttft", "slo_tbt", "quantile_window"}


def _as_number(value: object, field_name: str, low: float, high: float, kind: type) -> Any:
    try:
        number = kind(str(value))
    except ValueError:
        raise ConfigError(field_name, value, "expected an integer" if kind is int else "expected a number") from None
    if not low <= number <= high:
        raise ConfigError(field_name, value, f"must be between {low:g} and {high:g}")
    return number


def _as_int(value: object, field_name: str, low: int, high: int) -> int:
    return _as_number(value, field_name, low, high, int)


def _as_bool(value: object, field_name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(field_name, value, "expected true or false")


def build_config(settings: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Validate merged settings (already in precedence order) into a Config. `env` is where
    `bearer_token_env`/`password_env` variables are looked up (default: os.environ)."""
    flat = dict(settings)
    host_block = flat.pop("host", None)
    if isinstance(host_block, Mapping):
        for key, value in host_block.items():
            flat.setdefault("host_enabled" if key == "enabled" else str(key), value)
    elif host_block is not None:  # `host: false` is read as `host: {enabled: false}`
        flat.setdefault("host_enabled", _as_bool(host_block, "host"))
    unknown = set(flat) - _FIELDS - {"extra"}
    extra = dict(flat.pop("extra", {}) or {})
    for key in unknown:
        extra[key] = flat.pop(key)
    values: dict[str, Any] = {"extra": extra}
    if "listen" in flat:
        values["listen_host"], values["listen_port"] = parse_listen(str(flat["listen"]))
    interval = parse_duration(flat.get("interval", flat.get("interval_s", DEFAULT_INTERVAL_S)), "interval")
    if interval < MIN_INTERVAL_S:
        raise ConfigError("interval", flat.get("interval", flat.get("interval_s")),
                          f"at least {MIN_INTERVAL_S * 1000:g}ms: a collection cycle costs a few ms of CPU")
    values["interval_s"] = interval
    engine_timeout = parse_duration(
        flat.get("engine_timeout", flat.get("engine_timeout_s", min(DEFAULT_ENGINE_TIMEOUT_S, interval))),
        "engine_timeout",
    )
    values["engine_timeout_s"] = engine_timeout
    raw_engines = flat.get("engines") or ()
    if isinstance(raw_engines, str | Mapping):
        raw_engines = [raw_engines]
    if not isinstance(raw_engines, list | tuple):
        raise ConfigError("engines", raw_engines, "expected a list of targets (URL strings or mappings)")
    engines = tuple(parse_engine_spec(spec, engine_timeout, env) for spec in raw_engines)
    names = [e.name for e in engines]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError("engine.name", duplicates[0], "two targets share this name; set name= on one")
    values["engines"] = engines
    backend = str(flat.get("gpu_backend", "auto"))
    if backend not in GPU_BACKENDS:
        raise ConfigError("gpu_backend", backend, f"expected one of {', '.join(GPU_BACKENDS)}")
    values["gpu_backend"] = backend
    for key, low, high in (("max_payload_bytes", 1024, 1 << 30), ("max_series_per_target", 10, 1_000_000),
                           ("max_concurrent_scrapes", 1, 256)):
        if key in flat:
            values[key] = _as_int(flat[key], key, low, high)
    for key in ("engine_port",):
        if flat.get(key) not in (None, ""):
            values[key] = _as_int(flat[key], key, 1, 65535)
    for key in ("proc_root", "sys_root", "engine_pidfile", "engine_process_name", "sim_url", "web_config_file"):
        if flat.get(key) not in (None, ""):
            values[key] = str(flat[key])
    if "host_enabled" in flat:
        values["host_enabled"] = _as_bool(flat["host_enabled"], "host_enabled")
    values.update(_derive_settings(flat))
    level = str(flat.get("log_level", "info")).lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError("log_level", level, "expected debug, info, warning or error")
    values["log_level"] = level
    return Config(**values)


def _as_float(value: object, field_name: str, low: float, high: float) -> float:
    return _as_number(value, field_name, low, high, float)


def _derive_settings(flat: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if flat.get("model") not in (None, ""):
        values["model"] = str(flat["model"])
    if flat.get("tensor_parallel") not in (None, ""):
        values["tensor_parallel"] = _as_int(flat["tensor_parallel"], "tensor_parallel", 1, 64)
    if flat.get("gpu_price_per_hour") not in (None, ""):
        values["gpu_price_per_hour"] = _as_float(flat["gpu_price_per_hour"], "gpu_price_per_hour", 0.0, 1e4)
    for key in ("slo_ttft", "slo_tbt", "quantile_window"):
        raw = flat.get(key, flat.get(key + "_s"))
        if raw not in (None, ""):
            values[key + "_s"] = parse_duration(raw, key)
    return values


def load_config(flags: Mapping[str, Any], env: Mapping[str, str], config_path: str | None = None) -> Config:
    """Merge default < file < env < flags and validate."""
    path = flags.get("config") or env.get(ENV_PREFIX + "CONFIG") or config_path
    merged: dict[str, Any] = {}
    if path:
        merged.update(_load_yaml(str(path)))
    merged.update(_from_env(env))
    reject_command_line_secrets(flags.get("engines"))
    merged.update({k: v for k, v in flags.items() if v is not None and k != "config"})
    return build_config(merged, env)
