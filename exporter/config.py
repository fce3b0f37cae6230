"""Configuration: one frozen dataclass, validated once at start.

Precedence: command-line flag > LLM_EXPORTER_* environment variable > YAML file > default
(dcgm-exporter's env twins, declared in one place). A bad value raises ConfigError naming the
field and the value; the CLI turns it into one line on stderr and exit status 2."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

GPU_BACKENDS = ("auto", "nvml", "sim", "none")
DEFAULT_LISTEN = "0.0.0.0:9480"
DEFAULT_INTERVAL_S = 1.0
DEFAULT_ENGINE_TIMEOUT_S = 0.8
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
ENV_PREFIX = "LLM_EXPORTER_"
_TARGET_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


class ConfigError(ValueError):
    """A bad configuration value; `field` and `value` name it."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        super().__init__(f"invalid {field_name}={value!r}: {reason}")
        self.field = field_name
        self.value = value


@dataclass(frozen=True, slots=True)
class EngineTarget:
    url: str
    name: str
    kind: str | None = None  # None: auto-detect from the exposition
    timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S


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
    extra: Mapping[str, Any] = field(default_factory=dict)  # settings of later stages (derive)

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"


def redact_url(url: str) -> str:
    """Drop user:password@ from a URL before it is logged, labelled or shown."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


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
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*", str(value))
        if not match:
            raise ConfigError(field_name, value, "expected a duration like 1s or 500ms")
        seconds = float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[match.group(2)]
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
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("engine", redact_url(url), "expected an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError("engine", redact_url(url), "bad port") from None
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def parse_engine_spec(spec: str | Mapping[str, Any], default_timeout: float) -> EngineTarget:
    """`URL[,kind=K][,name=N][,timeout=T]` or a YAML mapping with url/kind/name/timeout."""
    if isinstance(spec, Mapping):
        options = {str(k): v for k, v in spec.items()}
        url = str(options.pop("url", ""))
    else:
        url, *rest = str(spec).strip().split(",")
        options = {}
        for item in rest:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError("engine", redact_url(str(spec)), f"expected key=value after the URL, got {item!r}")
            options[key.strip()] = value.strip()
    unknown = set(options) - {"kind", "name", "timeout"}
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
    return EngineTarget(url=url, name=name, kind=kind, timeout_s=timeout)


def _engine_kinds() -> tuple[str, ...]:
    from exporter.sources.engines.normalize import KINDS

    return tuple(KINDS)


def _load_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except OSError as error:
        raise ConfigError("config", path, error.strerror or str(error)) from None
    except yaml.YAMLError as error:
        raise ConfigError("config", path, f"not valid YAML ({str(error).splitlines()[0]})") from None
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


def _as_int(value: object, field_name: str, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(field_name, value, "expected an integer") from None
    if not low <= number <= high:
        raise ConfigError(field_name, value, f"must be between {low} and {high}")
    return number


def _as_bool(value: object, field_name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(field_name, value, "expected true or false")


def build_config(settings: Mapping[str, Any]) -> Config:
    """Validate merged settings (already in precedence order) into a Config."""
    flat = dict(settings)
    host_block = flat.pop("host", None)
    if isinstance(host_block, Mapping):
        for key, value in host_block.items():
            flat.setdefault("host_enabled" if key == "enabled" else str(key), value)
    unknown = set(flat) - _FIELDS - {"extra"}
    extra = dict(flat.pop("extra", {}) or {})
    for key in unknown:
        extra[key] = flat.pop(key)
    values: dict[str, Any] = {"extra": extra}
    if "listen" in flat:
        values["listen_host"], values["listen_port"] = parse_listen(str(flat["listen"]))
    interval = parse_duration(flat.get("interval", flat.get("interval_s", DEFAULT_INTERVAL_S)), "interval")
    values["interval_s"] = interval
    engine_timeout = parse_duration(
        flat.get("engine_timeout", flat.get("engine_timeout_s", min(DEFAULT_ENGINE_TIMEOUT_S, interval))),
        "engine_timeout",
    )
    values["engine_timeout_s"] = engine_timeout
    raw_engines = flat.get("engines") or ()
    if isinstance(raw_engines, str | Mapping):
        raw_engines = [raw_engines]
    engines = tuple(parse_engine_spec(spec, engine_timeout) for spec in raw_engines)
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
    for key in ("proc_root", "sys_root", "engine_pidfile", "engine_process_name", "sim_url"):
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
    try:
        number = float(str(value))
    except ValueError:
        raise ConfigError(field_name, value, "expected a number") from None
    if not low <= number <= high:
        raise ConfigError(field_name, value, f"must be between {low:g} and {high:g}")
    return number


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
    merged.update({k: v for k, v in flags.items() if v is not None and k != "config"})
    return build_config(merged)
