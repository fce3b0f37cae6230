"""The settings table: every setting of `llm-exporter run`, declared once.

Each `Setting` names its Config field, value type (which validates it),
default, command-line flag, LLM_EXPORTER_* variable, YAML key and meaning. deploy/config_class.py
writes the fields of exporter/config.py's Config from it (`make generate`; the suite fails on a
drift), exporter/config.py validates from it, exporter/cli.py and exporter/doctor.py add their
flags from it, and deploy/configuration_docs.py writes docs/configuration.md from it.
Adding a setting is one entry here, `make generate`, and reading the new Config field where it is used.
The collectors' switches (`--collector.NAME`) are settings too, one derived from each entry of COLLECTORS.

Imports nothing from exporter/ but data: the spec tables and the SLO thresholds (exporter/slo.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.slo import TBT, TTFT  # the thresholds alerts/ and dashboards/ use too
from exporter.yamlsafe import MAX_ECHO_CHARS, shorten

ENV_PREFIX = "LLM_EXPORTER_"
GPU_BACKENDS = ("auto", "nvml", "sim", "none")
HOST_BACKENDS = ("procfs", "sim")
PROFILES = ("minimal", "default", "full")  # smallest first: exporter/catalog/profiles.py, families.csv
DEFAULT_PROFILE = "default"
LOG_LEVELS = ("debug", "info", "warning", "error")
HISTOGRAM_BUCKETS = ("auto", "engine", "coarse", "slo")  # exporter/buckets.py
DEFAULT_INTERVAL_S = 1.0
DEFAULT_ENGINE_TIMEOUT_S = 0.8
MIN_INTERVAL_S = 0.1  # below this the collector would spin (a cycle itself takes a few ms of CPU)
MAX_DURATION_S = 3600.0
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
DEFAULT_PROBE_EVERY_S = 15.0
DEFAULT_PROBE_TIMEOUT_S = 10.0
MIN_PROBE_EVERY_S = 1.0
DEFAULT_GPU_RETRY_S = 10.0
MIN_GPU_RETRY_S = 1.0  # a re-initialisation opens every GPU again: tens of NVML calls per GPU
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's, on every node
MAX_TARGET_GPUS = 1024  # GPU indices one target may list in target_gpus (a node has at most a few dozen)
TARGET_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
MAX_MODEL_NAME = 256
# A model name as engines print it (org/name, paths, versions), bounded, printable, and free of what
# would need escaping in a label value or a terminal: no quotes, backslashes or control characters.
MODEL_NAME_RE = re.compile(rf"[^\x00-\x1f\x7f-\x9f\"\\]{{1,{MAX_MODEL_NAME}}}\Z")


class ConfigError(ValueError):
    """A bad configuration value; `field` and `value` name it."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        # Values come from files and flags: quote only the start of one (a YAML value can stand
        # for millions of nodes), and keep the message on one line.
        shown, why = shorten(repr(value)), shorten(reason, 4 * MAX_ECHO_CHARS)
        super().__init__(f"invalid {field_name}={shown}: {why}")
        self.field = field_name
        self.value = value


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """ " (did you mean 'interval'?)" for the closest known name, or ""."""
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownKeyError(ConfigError):
    """A key no setting knows: `intervall: 5s` would otherwise run with the default interval."""

    def __init__(self, key: str, known: Sequence[str], where: str = "", hint: str = "") -> None:
        inside = f" in {where}" if where else ""
        hint = f" ({hint})" if hint else did_you_mean(key, known)
        ValueError.__init__(self, f"unknown key {shorten(repr(key))}{inside}{hint}")
        self.field = f"{where}.{key}" if where else key
        self.value = key


# --- value types: each parses one raw value (text from a flag or variable, or a YAML node) -----

def is_unset(value: object) -> bool:
    """None or blank text: the setting keeps its default."""
    return value is None or (isinstance(value, str) and not value.strip())


class _ValueType:
    """Base of the value types: `parse(value, name)` validates a raw value; `text(value)` writes a
    default as the docs show it (plain str() unless a type overrides it)."""

    __slots__ = ()

    def text(self, value: object) -> str:
        return str(value)


@dataclass(frozen=True, slots=True)
class Duration(_ValueType):
    """Seconds from 1.5, "1.5", "500ms", "2s", "1m", "1h" (always > 0)."""

    minimum_s: float | None = None
    minimum_reason: str = ""

    def parse(self, value: object, name: str) -> float:
        seconds = parse_duration(value, name)
        if self.minimum_s is not None and seconds < self.minimum_s:
            raise ConfigError(name, value, f"at least {self.minimum_s * 1000:g}ms: {self.minimum_reason}")
        return seconds

    def text(self, value: object) -> str:
        return f"{value:g}s" if isinstance(value, int | float) else str(value)


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


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
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not 0 < seconds <= MAX_DURATION_S:
        raise ConfigError(field_name, value, "must be > 0 and at most 1h")
    return seconds


def _number(value: object, name: str, low: float, high: float, kind: type) -> Any:
    expected = "expected an integer" if kind is int else "expected a number"
    if isinstance(value, bool):  # YAML `yes` is a bool, not the number 1
        raise ConfigError(name, value, expected)
    try:
        number = kind(str(value))
    except ValueError:
        raise ConfigError(name, value, expected) from None
    if not low <= number <= high:
        raise ConfigError(name, value, f"must be between {low:g} and {high:g}")
    return number


@dataclass(frozen=True, slots=True)
class Integer(_ValueType):
    low: int
    high: int

    def parse(self, value: object, name: str) -> int:
        return _number(value, name, self.low, self.high, int)


@dataclass(frozen=True, slots=True)
class Number(_ValueType):
    low: float
    high: float

    def parse(self, value: object, name: str) -> float:
        return _number(value, name, self.low, self.high, float)

    def text(self, value: object) -> str:
        return f"{value:g}" if isinstance(value, int | float) else str(value)


_BYTE_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20,
               "gib": 1 << 30}


@dataclass(frozen=True, slots=True)
class ByteSize(_ValueType):
    """A byte count: 8388608, "8MiB", "512KiB", "1GB"."""

    low: int
    high: int

    def parse(self, value: object, name: str) -> int:
        match = None if isinstance(value, bool) else re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = _BYTE_UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None or len(match.group(1)) > 18:
            raise ConfigError(name, value, "expected an integer (bytes), or a size like 8MiB or 512KiB")
        return _number(int(match.group(1)) * unit, name, self.low, self.high, int)

    def text(self, value: object) -> str:
        if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
            return f"{value >> 20}MiB"
        return str(value)


@dataclass(frozen=True, slots=True)
class Boolean(_ValueType):
    def parse(self, value: object, name: str) -> bool:
        return as_bool(value, name)

    def text(self, value: object) -> str:
        return "true" if value else "false"


def as_bool(value: object, field_name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(field_name, value, "expected true or false")


@dataclass(frozen=True, slots=True)
class Choice(_ValueType):
    choices: tuple[str, ...]

    def parse(self, value: object, name: str) -> str:
        text = str(value).lower() if isinstance(value, str) else str(value)
        if text not in self.choices:
            raise ConfigError(name, text, f"expected one of {', '.join(self.choices)}")
        return text


MAX_TEXT_CHARS = 4096  # a path (PATH_MAX), a URL or a pattern; a longer value is a mistake or an attack
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Text(_ValueType):
    """A string (a path, a URL, a regex, a name) of at most MAX_TEXT_CHARS characters, with no
    control characters (a NUL made open() raise); empty means unset. A YAML number or boolean is
    taken as its text (`model: 7b` is a name); a list or mapping is refused."""

    def parse(self, value: object, name: str) -> str:
        if isinstance(value, Mapping | list | tuple | set | bytes):
            raise ConfigError(name, value, "expected text")
        text = str(value)
        if len(text) > MAX_TEXT_CHARS:
            raise ConfigError(name, value, f"longer than {MAX_TEXT_CHARS} characters")
        if _CONTROL.search(text):
            raise ConfigError(name, value, "contains a control character (a NUL, a line break, ...)")
        return text


MAX_NAME_LIST = 64  # globs in one list setting
MAX_NAME_GLOB = 64  # characters in one glob (interface and RDMA device names are shorter)


@dataclass(frozen=True, slots=True)
class NameList(_ValueType):
    """Names or shell globs: a YAML list, or comma-separated text ("eth0,mlx5_*")."""

    def parse(self, value: object, name: str) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or len(items) > MAX_NAME_LIST:
            raise ConfigError(name, value, f"expected a list of at most {MAX_NAME_LIST} names or globs")
        out = []
        for item in items:
            text = item.strip() if isinstance(item, str) else None
            if not text or len(text) > MAX_NAME_GLOB or not text.isprintable() or " " in text:
                raise ConfigError(name, item, f"expected a name or glob of 1-{MAX_NAME_GLOB} characters, no spaces")
            out.append(text)
        return tuple(out)

    def text(self, value: object) -> str:
        return ", ".join(value) if isinstance(value, tuple) else str(value)


MAX_GPU_IDS = 1024  # entries of --gpus (a node has at most a few dozen GPUs and MIG instances)
# A GPU UUID as NVML prints it (GPU-<uuid>), a MIG instance's (MIG-<uuid>, or the older
# MIG-GPU-<uuid>/<gi>/<ci>), or an NVML index.
GPU_ID_RE = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]{1,80}|[0-9]{1,4}")


@dataclass(frozen=True, slots=True)
class GpuIds(_ValueType):
    """GPUs by UUID (GPU-..., MIG-...) or NVML index: a YAML list or comma-separated text."""

    def parse(self, value: object, name: str) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(items, int) and not isinstance(items, bool):
            items = [str(items)]
        if not isinstance(items, list | tuple) or not items or len(items) > MAX_GPU_IDS:
            raise ConfigError(name, value, f"expected 1 to {MAX_GPU_IDS} GPU UUIDs (GPU-..., MIG-...) or indices")
        out: list[str] = []
        for item in items:
            text = str(item).strip() if isinstance(item, str | int) and not isinstance(item, bool) else ""
            if not GPU_ID_RE.fullmatch(text):
                raise ConfigError(name, item, "expected a GPU UUID (GPU-..., MIG-...) or an NVML index")
            if text not in out:
                out.append(text)
        return tuple(out)

    def text(self, value: object) -> str:
        return ",".join(value) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True, slots=True)
class KvCacheDtype(_ValueType):
    """An engine's KV-cache dtype name (vLLM --kv-cache-dtype): fp8, bfloat16, auto..."""

    def parse(self, value: object, name: str) -> str:
        from exporter.specs.models import kv_cache_dtype_bytes

        try:
            kv_cache_dtype_bytes(str(value))
        except ValueError as error:
            raise ConfigError(name, value, str(error)) from None
        return str(value)


def _structured(value: object, name: str) -> object:
    """A mapping from YAML, or JSON text from a flag or variable."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        raise ConfigError(name, value, "expected a mapping (in a variable: a JSON object)") from None


@dataclass(frozen=True, slots=True)
class GpuSpecOverrides(_ValueType):
    """{field: number} replacing fields of the detected GPU's spec (exporter/specs/gpus.py)."""

    def parse(self, value: object, name: str) -> Mapping[str, float | int]:
        from exporter.specs.gpus import SPEC_FIELDS

        value = _structured(value, name)
        if not isinstance(value, Mapping):
            raise ConfigError(name, value, "expected a mapping of GPU spec fields to numbers")
        out: dict[str, float | int] = {}
        for key, number in value.items():
            if str(key) not in SPEC_FIELDS:
                raise UnknownKeyError(str(key), SPEC_FIELDS, name)
            parsed = _number(number, f"{name}.{key}", 0.0, 1e18, float)
            out[str(key)] = int(parsed) if isinstance(number, int) else parsed
        return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class TargetGpus(_ValueType):
    """{target name: [GPU index, ...]}: which GPUs serve which engine target."""

    def parse(self, value: object, name: str) -> Mapping[str, tuple[int, ...]]:
        value = _structured(value, name)
        if not isinstance(value, Mapping):
            raise ConfigError(name, value, "expected a mapping of target names to lists of GPU indices")
        out: dict[str, tuple[int, ...]] = {}
        for target, indices in value.items():
            if not TARGET_NAME_RE.match(str(target)):
                raise ConfigError(f"{name}.target", target, "letters, digits and _.:- only, 1-64 characters")
            if isinstance(indices, int | str):
                indices = [indices]
            if not isinstance(indices, list | tuple) or len(indices) > MAX_TARGET_GPUS:
                raise ConfigError(f"{name}.{target}", indices,
                                  f"expected a list of at most {MAX_TARGET_GPUS} GPU indices")
            where = f"{name}.{target}"
            out[str(target)] = tuple(_number(i, where, 0, MAX_TARGET_GPUS - 1, int) for i in indices)
        return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class Listen(_ValueType):
    """HOST:PORT; the Config keeps it as two fields, listen_host and listen_port."""

    def parse(self, value: object, name: str) -> tuple[str, int]:
        if isinstance(value, Mapping | list | tuple | set | bool | bytes):
            raise ConfigError(name, value, "expected HOST:PORT")
        return parse_listen(str(value), name)


MAX_HOST_CHARS = 253  # the longest DNS name
# A host name, an IPv4 address or a bracketed IPv6 one (with a %zone): what bind() can take.
_LISTEN_HOST_RE = re.compile(r"[A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]|[0-9A-Fa-f:.]+")


def parse_listen(value: str, field_name: str = "listen") -> tuple[str, int]:
    if not isinstance(value, str):
        raise ConfigError(field_name, value, "expected HOST:PORT")
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5:
        raise ConfigError(field_name, value, "expected HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(field_name, value, "port out of range")
    if len(host) > MAX_HOST_CHARS + 2 or not _LISTEN_HOST_RE.fullmatch(host):
        raise ConfigError(field_name, value, "expected HOST:PORT with a host name, an IPv4 address or "
                          "[an IPv6 address]")
    return (host.strip("[]") or "0.0.0.0"), port


@dataclass(frozen=True, slots=True)
class EngineTargets(_ValueType):
    """`URL[,OPTION=VALUE]...` strings or YAML mappings; parsed by exporter.targets.parse_engine_spec
    once the engine timeout is known (its options are exporter.targets.TARGET_OPTIONS)."""

    def text(self, value: object) -> str:
        return "unset" if not value else str(value)


@dataclass(frozen=True, slots=True)
class ProbeTargets(_ValueType):
    """`URL[,OPTION=VALUE]...` strings or YAML mappings; parsed by exporter.targets.parse_probe_spec once
    the engine targets are known (its options are exporter.targets.PROBE_OPTIONS)."""

    def text(self, value: object) -> str:
        return "unset" if not value else str(value)


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting. `name` is the Config field; `key` the YAML key and LLM_EXPORTER_<KEY> suffix."""

    name: str
    type: Any  # one of the value types above (a _ValueType)
    annotation: str  # the Config field's type, as written in a signature
    default: Any
    help: str
    key: str = ""  # default: the name without a trailing _s
    flag: str | None = None  # None: YAML and environment only
    aliases: tuple[str, ...] = ()  # other accepted YAML keys / variable suffixes
    metavar: str | None = None
    flag_action: str = "store"  # "append" (repeatable), "store_false" (a --no-... switch), "switch" (both)
    flag_choices: bool = False  # let argparse refuse a bad choice (shows the choices in --help)
    default_text: str | None = None  # the default as the docs show it, when not the plain value
    field: bool = True  # False: read before Config is built (--config)

    @property
    def yaml_key(self) -> str:
        return self.key or (self.name[:-2] if self.name.endswith("_s") else self.name)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.yaml_key.upper()

    @property
    def dest(self) -> str:
        return self.yaml_key

    @property
    def flags(self) -> tuple[str, ...]:
        """The flag, and for a "switch" its --no- twin (`--collector.host`, `--no-collector.host`)."""
        if not self.flag:
            return ()
        return (self.flag, "--no-" + self.flag[2:]) if self.flag_action == "switch" else (self.flag,)

    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None or self.default == ():
            return "unset"
        return self.type.text(self.default)


_ENGINE_HELP = ("engine /metrics URL to scrape; repeat for several targets (env LLM_EXPORTER_ENGINES); "
                "credentials: bearer_token_file=PATH | bearer_token_env=VAR | username=U,password_file=PATH"
                " | username=U,password_env=VAR; TLS: ca_file=PATH, insecure_skip_verify=true. "
                "Secrets themselves are refused on the command line")

_ROUTER_HELP = ("router /metrics URL to scrape (vllm-router, sglang-router, Dynamo's frontend, the inference "
                "extension's endpoint picker; kind auto-detected); repeat for several (env LLM_EXPORTER_ROUTERS); "
                "the same options as --engine. Backends it names that are also --engine targets (same host and "
                "port) are joined to them for the routing verdict; docs/routers.md")

_PROBE_HELP = ("opt-in client-side probe: a small streaming request to the engine's OpenAI-compatible API at "
               "this base URL every few seconds, timing TTFT and inter-token gaps from here (llm_probe_*); "
               "repeat for several (env LLM_EXPORTER_PROBES); it sends the credentials of the engine target "
               "it belongs to when the URL has that target's scheme, host and port")

@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """One collector's declaration (node_exporter's registerCollector): its name, whether it runs by
    default, a one-line help, and the settings that configure it. Its switch is a setting derived from
    this (`--collector.NAME` / `--no-collector.NAME`, `collectors: {NAME: false}`,
    LLM_EXPORTER_COLLECTOR_NAME); the factory that builds its sources is in exporter/collectors.py,
    which checks at import that every collector declared here has one and no other."""

    name: str
    default: bool
    help: str
    settings: tuple[str, ...] = ()  # names in SETTINGS it reads (docs list them beside the collector)

    @property
    def setting_name(self) -> str:
        """The Config field of its switch."""
        return f"collector_{self.name}"


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec("engine", True, "scrape each engine target's /metrics (llm_* engine series, llm_engine_up)",
                  ("engines", "engine_timeout_s", "max_payload_bytes", "max_series_per_target")),
    CollectorSpec("router", True, "scrape each router target's /metrics (llm_router_*, llm_router_up); nothing "
                  "to do without --router",
                  ("routers", "engine_timeout_s", "max_payload_bytes", "max_series_per_target")),
    CollectorSpec("probe", True, "client-side probes of the engines' OpenAI API (llm_probe_*); nothing to do "
                  "without --probe", ("probes",)),
    CollectorSpec("host", True, "the host's CPUs, memory, PCIe and network links and the engine process "
                  "(llm_host_*): this machine's procfs and sysfs, or the twin's", (
                      "host_backend", "proc_root", "sys_root", "engine_port", "engine_pidfile",
                      "engine_process_name", "engine_network_devices", "network_exclude", "sim_url")),
    CollectorSpec("gpu", True, "GPU telemetry (llm_gpu_*) from NVML, or the twin's",
                  ("gpu_backend", "gpu_retry_interval_s", "sim_url", "gpus", "gpu_dra_claim", "gpu_dra_metadata_dir",
                   "pod_name",
                   "pod_namespace", "engine_containers", "exporter_container", "pod_resources_socket",
                   "kubernetes_gpu_mapping")),
)
"""Every collector, in the order its sources are built (the probe reads the engine targets' sources,
the GPU source the host source's engine pids)."""
COLLECTOR: Mapping[str, CollectorSpec] = MappingProxyType({c.name: c for c in COLLECTORS})
COLLECTORS_KEY = "collectors"
"""The YAML block of the switches, `collectors: {host: false}`; unknown names in it are errors."""


def _switch(collector: CollectorSpec) -> Setting:
    state = "on" if collector.default else "off"
    return Setting(collector.setting_name, Boolean(), "bool", collector.default,
                   f"collector {collector.name} (default {state}): {collector.help}",
                   flag=f"--collector.{collector.name}", flag_action="switch")


SETTINGS: tuple[Setting, ...] = (
    Setting("config", Text(), "str | None", None, "YAML config file (env LLM_EXPORTER_CONFIG)",
            flag="--config", field=False),
    Setting("engines", EngineTargets(), "tuple[EngineTarget, ...]", (), _ENGINE_HELP, flag="--engine",
            aliases=("engine",), metavar="URL[,kind=K][,name=N][,timeout=T]", flag_action="append"),
    Setting("routers", EngineTargets(), "tuple[EngineTarget, ...]", (), _ROUTER_HELP, flag="--router",
            aliases=("router",), metavar="URL[,kind=K][,name=N][,timeout=T]", flag_action="append"),
    Setting("probes", ProbeTargets(), "tuple[ProbeTarget, ...]", (), _PROBE_HELP, flag="--probe",
            aliases=("probe",), metavar="URL[,model=M][,every=15s][,api=completions|chat][,target=NAME]",
            flag_action="append"),
    Setting("web_config_file", Text(), "str | None", None,
            "TLS and basic auth config in the exporter-toolkit format, reloaded when it changes "
            "(env LLM_EXPORTER_WEB_CONFIG_FILE; see docs/security.md)", flag="--web.config.file",
            metavar="PATH"),
    Setting("listen", Listen(), "str", "0.0.0.0:9480",
            "HOST:PORT to serve on (default 0.0.0.0:9480; env LLM_EXPORTER_LISTEN)", flag="--listen"),
    Setting("interval_s", Duration(minimum_s=MIN_INTERVAL_S,
                                   minimum_reason="a collection cycle costs a few ms of CPU"),
            "float", DEFAULT_INTERVAL_S, "collection interval, e.g. 1s or 500ms (default 1s)",
            flag="--interval", aliases=("interval_s",)),
    Setting("engine_timeout_s", Duration(), "float", DEFAULT_ENGINE_TIMEOUT_S,
            "per-target scrape timeout (default 0.8s, at most the interval)", flag="--engine-timeout",
            aliases=("engine_timeout_s",)),
    Setting("max_payload_bytes", ByteSize(1024, 1 << 30), "int", DEFAULT_MAX_PAYLOAD_BYTES,
            "engine payload cap (default 8 MiB)", flag="--max-payload-bytes"),
    Setting("gpu_backend", Choice(GPU_BACKENDS), "str", "auto",
            "GPU source (default auto); none: the older spelling of --no-collector.gpu (either one off: off)",
            flag="--gpu-backend", flag_choices=True),
    Setting("sim_url", Text(), "str | None", None, "twin URL for --gpu-backend sim and --host-backend sim",
            flag="--sim-url"),
    Setting("gpu_retry_interval_s", Duration(minimum_s=MIN_GPU_RETRY_S,
                                             minimum_reason="a re-initialisation opens every GPU again"),
            "float", DEFAULT_GPU_RETRY_S, "first wait before the GPU source initialises NVML again after a lost "
            "GPU or a failed start; doubles while it stays lost, up to 5m (default 10s)",
            flag="--gpu-retry-interval", aliases=("gpu_retry_interval_s",)),
    Setting("host_enabled", Boolean(), "bool", True,
            "disable the host source: the older spelling of --no-collector.host (either one off: off)",
            flag="--no-host", flag_action="store_false"),
    Setting("host_backend", Choice(HOST_BACKENDS), "str", "procfs",
            "host source: procfs (this machine's /proc and /sys) or sim (the twin at --sim-url; default procfs)",
            flag="--host-backend", flag_choices=True),
    Setting("proc_root", Text(), "str", "/proc", "procfs mount point (default /proc)", flag="--proc-root"),
    Setting("sys_root", Text(), "str", "/sys", "sysfs mount point (default /sys)", flag="--sys-root"),
    Setting("engine_port", Integer(1, 65535), "int | None", None,
            "find the engine process by its listening port", flag="--engine-port"),
    Setting("engine_pidfile", Text(), "str | None", None, "find the engine process by pid file",
            flag="--engine-pidfile"),
    Setting("engine_process_name", Text(), "str | None", None,
            "find the engine process by name: a regex searched in its comm and the first 4 KiB of its command "
            "line, in linear time (backreferences and lookarounds refused)", flag="--engine-process-name"),
    Setting("engine_network_devices", NameList(), "tuple[str, ...] | None", None,
            "network links that belong to the engine (llm_host_network_info engine=\"true\"): names or globs "
            "of the device label, e.g. [eth0, \"mlx5_*\"] (an RDMA port is <ibdev>:<port>); default: the links "
            "on the NUMA node or PCI host bridge of the engine's GPUs (docs/host.md)"),
    Setting("network_exclude", NameList(), "tuple[str, ...] | None", None,
            "network links not read at all, names or globs; replaces the default list",
            # host_common.DEFAULT_NETWORK_EXCLUDE (tests/test_hardening_host_r3.py checks they agree)
            default_text="lo, veth*, docker*, br-*, virbr*, cali*, cni*, flannel*, cilium_*, lxc*, vxlan*, "
                         "tunl*, kube-ipvs*, gke*, eni*, azv*, weave, datapath, genev_sys_*, ovn-k8s-*, antrea-*, "
                         "kube-bridge, kube-dummy-if, nodelocaldns, podman*, lxdbr*, " + "[0-9a-f]" * 15),
    Setting("model", Text(), "str | None", None,
            "model shape: a built-in name (e.g. llama-3.1-70b) or a config.json path", flag="--model"),
    Setting("tensor_parallel", Integer(1, 64), "int | None", None,
            "GPUs per engine replica (default: all GPUs seen)", flag="--tensor-parallel"),
    Setting("gpu_price_per_hour", Number(0.0, 1e4), "float | None", None,
            "price of one GPU-hour, for llm_cost_per_million_tokens (omitted when unset)",
            flag="--gpu-price-per-hour"),
    Setting("slo_ttft_s", Duration(), "float", TTFT.threshold_seconds,
            f"TTFT SLO threshold (default {TTFT.threshold_seconds:g}s)",
            flag="--slo-ttft", aliases=("slo_ttft_s",)),
    Setting("slo_tbt_s", Duration(), "float", TBT.threshold_seconds,
            f"time-between-tokens SLO threshold (default {TBT.threshold_seconds * 1000:g}ms)",
            flag="--slo-tbt", aliases=("slo_tbt_s",)),
    Setting("quantile_window_s", Duration(), "float", 300.0, "sliding window for tails (default 5m)",
            flag="--quantile-window", aliases=("quantile_window_s",)),
    Setting("log_level", Choice(LOG_LEVELS), "str", "info", "debug, info, warning or error (default info)",
            flag="--log-level"),
    Setting("max_series_per_target", Integer(10, 1_000_000), "int", 10_000,
            "normalized series kept per engine target per collection; whole series past it are dropped and "
            "counted (a guard against label explosions)"),
    Setting("max_concurrent_scrapes", Integer(1, 256), "int", 4,
            "/metrics requests served at once; more get 503 and are counted"),
    # Read by the derivations (exporter/derive/).
    Setting("kv_cache_dtype", KvCacheDtype(), "str | None", None,
            "KV-cache dtype the engine runs with (its --kv-cache-dtype: fp8, bfloat16, auto...) when it is "
            "not the model's own"),
    Setting("verdict_hold_cycles", Integer(1, 1000), "int | None", None,
            "cycles in a row the standing verdict must lose before the winner replaces it (default 3)"),
    Setting("rate_window_s", Duration(), "float | None", None,
            "window of the rates behind the bottleneck scores (default 15s or 5 intervals, the longer)",
            aliases=("rate_window_s",)),
    Setting("gpu_spec", GpuSpecOverrides(), "Mapping[str, float] | None", None,
            "GPU spec fields replacing the detected card's (exporter/specs/gpus.py), e.g. "
            "{mem_bandwidth_bytes_per_s: 3.35e12}; in a variable, a JSON object"),
    Setting("target_gpus", TargetGpus(), "Mapping[str, tuple[int, ...]] | None", None,
            "which GPUs serve which target, {target: [GPU indices]}; default: slices of --tensor-parallel "
            "GPUs in target-name order; in a variable, a JSON object"),
    # Which GPUs the GPU source watches (exporter/sources/gpu/attribution.py, docs/gpu.md "Which GPUs").
    Setting("gpus", GpuIds(), "tuple[str, ...] | None", None,
            "watch only these GPUs: UUIDs (GPU-..., MIG-...) or NVML indices, comma-separated; default: the "
            "engine's GPUs from a DRA claim or the kubelet's pod-resources API, else every GPU NVML shows",
            flag="--gpus", metavar="UUID|INDEX,..."),
    Setting("gpu_dra_claim", Text(), "str | None", None,
            "the DRA ResourceClaim (resource.k8s.io) the engine and this exporter share: the DRA driver injects "
            "only the claimed GPUs into both containers, so every GPU NVML shows is the engine's",
            flag="--gpu-dra-claim", metavar="NAME"),
    Setting("gpu_dra_metadata_dir", Text(), "str", "/var/run/dra-device-attributes",
            "where DRA device metadata (KEP-5304) appears in this container: with gpu_dra_claim, the UUIDs in "
            "<dir>/<claim>/<request>/<driver>-metadata.json are the GPUs watched (default "
            "/var/run/dra-device-attributes)"),
    Setting("pod_name", Text(), "str | None", None,
            "this pod's name (downward API metadata.name), to ask the kubelet's pod-resources API for the "
            "engine's GPUs", flag="--pod-name"),
    Setting("pod_namespace", Text(), "str | None", None,
            "this pod's namespace (downward API metadata.namespace)", flag="--pod-namespace"),
    Setting("engine_containers", NameList(), "tuple[str, ...] | None", None,
            "the pod's containers whose GPUs are the engine's (names or globs); default: every container "
            "but the exporter's own (exporter_container)"),
    Setting("exporter_container", Text(), "str", "llm-exporter",
            "this exporter's container name in its pod, left out of the engine's containers (default "
            "llm-exporter)"),
    Setting("pod_resources_socket", Text(), "str", POD_RESOURCES_SOCKET,
            f"the kubelet's pod-resources socket (default {POD_RESOURCES_SOCKET})",
            flag="--pod-resources-socket", metavar="PATH"),
    Setting("kubernetes_gpu_mapping", Boolean(), "bool", False,
            "DaemonSet mode: label every GPU with the pod, namespace and container that hold it, from the "
            "kubelet's pod-resources List (default off)", flag="--kubernetes-gpu-mapping",
            flag_action="switch"),
    Setting("profile", Choice(PROFILES), "str", DEFAULT_PROFILE,
            "which families /metrics writes: minimal (the verdict, SLO burn, hardware faults, the fleet view), "
            "default or full; exporter/catalog/families.csv lists each family's profile (default default)",
            flag="--profile", flag_choices=True),
    Setting("families_file", Text(), "str | None", None,
            "write exactly the families this file lists (the format of exporter/catalog/families.csv, "
            "copied and trimmed); replaces --profile", flag="--families", metavar="FILE"),
    # The engine histograms' buckets on /metrics (exporter/buckets.py; docs/alerts.md, "Histogram buckets and
    # SLO thresholds").
    Setting("histogram_buckets", Choice(HISTOGRAM_BUCKETS), "str", "auto",
            "the engine histograms' buckets on /metrics: engine (the engine's own edges), coarse (at most "
            "histogram_buckets_max of them, the SLO thresholds among them), slo (only the SLO thresholds' "
            "buckets of the TTFT and TBT histograms, no other engine histogram: for when Prometheus also "
            "scrapes the engine's own) or auto (coarse under --profile minimal, engine otherwise; default "
            "auto)", flag="--histogram-buckets", flag_choices=True),
    Setting("histogram_buckets_max", Integer(2, 64), "int", 8,
            "coarse buckets: the finite edges kept per histogram, chosen from the engine's own (default 8)",
            flag="--histogram-buckets-max", metavar="N"),
    *(_switch(c) for c in COLLECTORS),
)

BY_NAME: Mapping[str, Setting] = MappingProxyType({s.name: s for s in SETTINGS})
# YAML keys and variable suffixes (aliases included) -> setting.
BY_KEY: Mapping[str, Setting] = MappingProxyType(
    {k: s for s in SETTINGS for k in (s.yaml_key, *s.aliases)})
_undeclared = sorted({n for c in COLLECTORS for n in c.settings} - set(BY_NAME))
if _undeclared:  # a collector's settings are listed in the docs beside it: each must be a setting
    raise ValueError(f"COLLECTORS name settings that SETTINGS does not declare: {_undeclared}")
# `host:` in YAML may be a block (or `host: false`): {inner key: setting name}.
HOST_BLOCK: Mapping[str, str] = MappingProxyType(
    {"enabled": "host_enabled", "backend": "host_backend", "proc_root": "proc_root", "sys_root": "sys_root"})
# Top-level YAML keys that are never settings: a place for anchors (`x-defaults: &d {...}`), as in
# docker compose files.
EXTENSION_PREFIX = "x-"


def add_flags(parser: Any, names: Sequence[str] | None = None, *, helps: Mapping[str, str] | None = None,
              defaults: Mapping[str, Any] | None = None, metavars: Mapping[str, str] | None = None) -> None:
    """Add the flags of the settings `names` (default: every setting with a flag) to an argparse
    parser or group. Values stay text (dest: the YAML key): exporter.config validates them like the
    same value from a file, so a flag and its variable fail with the same message."""
    wanted = [s for s in SETTINGS if s.flag] if names is None else [BY_NAME[n] for n in names]
    for setting in wanted:
        shown = (helps or {}).get(setting.name, setting.help)
        options: dict[str, Any] = {"dest": setting.dest, "help": shown}
        if setting.flag_action == "switch":  # --X on, --no-X off, neither: unset (env, file or default)
            on, off = setting.flags
            parser.add_argument(on, dest=setting.dest, action="store_const", const=True, help=shown,
                                default=(defaults or {}).get(setting.name))
            parser.add_argument(off, dest=setting.dest, action="store_const", const=False,
                                help=f"turn {on} off", default=(defaults or {}).get(setting.name))
            continue
        if setting.flag_action == "store_false":
            options.update(action="store_const", const=False)
        else:
            if setting.flag_action == "append":
                options["action"] = "append"
            metavar = (metavars or {}).get(setting.name, setting.metavar)
            if metavar:
                options["metavar"] = metavar
            if setting.flag_choices:
                options["choices"] = setting.type.choices
        if defaults and setting.name in defaults:
            options["default"] = defaults[setting.name]
        parser.add_argument(setting.flag, **options)
