"""Engine targets and client-side probes: what the exporter scrapes and probes, each parsed from a
URL with options (`URL,name=...,kind=...` on the command line, a mapping in YAML) and validated once at
start. A structured setting with its own options, declared here (the scalar settings are in
exporter/settings.py); exporter/config.py merges them into the Config. Credentials are read from
files or the environment, never from a command line, and stay with the origin they were set for."""

from __future__ import annotations

import dataclasses
import os
import re
import ssl
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.catalog.engine import ROLES
from exporter.redact import (
    CredentialError,
    Secret,
    decode_userinfo,
    encode_userinfo,
    read_secret_file,
    redact_url,
    split_userinfo,
)
from exporter.safefile import read_pem_file
from exporter.settings import (
    DEFAULT_ENGINE_TIMEOUT_S,
    DEFAULT_PROBE_EVERY_S,
    DEFAULT_PROBE_TIMEOUT_S,
    MAX_MODEL_NAME,
    MIN_PROBE_EVERY_S,
    MODEL_NAME_RE,
    TARGET_NAME_RE,
    Choice,
    ConfigError,
    Duration,
    Integer,
    Text,
    as_bool,
    did_you_mean,
    parse_duration,
)


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """One engine to scrape. Credentials are only ever named here (a file path, an environment
    variable's name); a value read from the environment is wrapped in Secret. Files are read by
    exporter/sources/engines/auth.py at scrape time, so rotated tokens are picked up."""

    url: str
    name: str
    kind: str | None = None  # None: auto-detect from the exposition
    timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S
    role: str | None = None  # PD role (catalog ROLES) where the page does not name it; None: not declared
    model: str | None = None  # the `model` label where the page names none (llama.cpp); None: not declared
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
class ProbeTarget:
    """One client-side probe (`--probe`, exporter/probe/). `url` is the engine's base URL (the API
    paths are appended); `target` the `target` label, usually an engine target's name, whose
    credentials and TLS settings `engine` carries (None: a probe of an engine not scraped)."""

    url: str
    target: str
    model: str | None = None  # None: the first model of GET /v1/models
    every_s: float = DEFAULT_PROBE_EVERY_S
    prompt_tokens: int = 32
    max_tokens: int = 16
    api: str = "completions"
    timeout_s: float = DEFAULT_PROBE_TIMEOUT_S
    engine: EngineTarget | None = None

    @property
    def same_origin(self) -> bool:
        """Whether the probe URL has its engine target's scheme, host and port: only then does it
        carry that target's credentials (they go to no other place than where they were configured)."""
        return self.engine is not None and _origin(self.url) == _origin(self.engine.url)


def _origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _default_target_name(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    name = parts.hostname or "engine"
    if parts.port:
        name = f"{name}:{parts.port}"
    return name


def normalize_engine_url(url: str) -> str:
    """Validate an engine URL; user[:password]@ is split as the user means it (redact.split_userinfo:
    an unencoded / ? # @ in the password stays in it) and re-encoded, so every later reader of the
    URL (urllib) sees the same host. An error shows the URL redacted and never a bad port's text
    (a comma-cut password could sit there)."""
    head, userinfo, rest, ambiguous = split_userinfo(url)
    if ambiguous:
        raise ConfigError("engine", redact_url(url), "no host after the last '@'; percent-encode an '@' in a "
                          "password or path as %40")
    if userinfo is not None:
        url = f"{head}{encode_userinfo(*decode_userinfo(userinfo))}@{rest}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as error:  # an unclosed IPv6 bracket, ...
        raise ConfigError("engine", redact_url(url), f"not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("engine", redact_url(url), "expected an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        raise ConfigError("engine", f"{parts.scheme}://{host}:<port>{parts.path}",
                          "bad port (expected a number from 0 to 65535)") from None
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


# Options of an engine target that carry a secret inline: refused everywhere, because a file or an
# environment variable is the only place a secret may come from (never the command line or a YAML
# file that is usually world-readable and checked in).
INLINE_SECRET_KEYS = frozenset({"bearer_token", "token", "password", "credentials", "authorization"})
_SECRET_ADVICE = ("put the secret in a file (bearer_token_file=PATH, password_file=PATH) or an environment "
                  "variable (bearer_token_env=VAR, password_env=VAR)")
# The options of one engine target, with their meaning (docs/configuration.md lists them).
TARGET_OPTIONS: Mapping[str, str] = MappingProxyType({
    "kind": "engine format (vllm, sglang, tgi, ...); default: detected from the exposition",
    "name": "the `target` label; default: host:port of the URL",
    "timeout": "scrape timeout of this target; default: engine_timeout",
    "role": "the instance's part in prefill/decode disaggregated serving: prefill, decode or both (the `role` of "
            "llm_engine_info), for engines whose page does not say (vLLM, Triton, Dynamo, llm-d); a role the page "
            "names (SGLang `engine_type`) wins; default: both",
    "model": "the `model` label of the target's series, for engines whose page names no model (llama.cpp): "
             "without it their replicas group under an empty model on the fleet board and in the per-model "
             "rules; a model the page names wins; default: none",
    "bearer_token_file": "file holding a bearer token, re-read on every scrape",
    "bearer_token_env": "name of an environment variable holding a bearer token",
    "username": "basic-auth user name (with password_file or password_env)",
    "password_file": "file holding the basic-auth password, re-read on every scrape",
    "password_env": "name of an environment variable holding the basic-auth password",
    "ca_file": "CA bundle for an https:// engine; default: the system store",
    "insecure_skip_verify": "true: do not verify the engine's TLS certificate",
})
# Where a YAML target may group options the Prometheus way.
_TARGET_BLOCKS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "basic_auth": ("username", "password_file", "password_env", "password"),
    "tls_config": ("ca_file", "insecure_skip_verify")})


def _flatten_target_mapping(spec: Mapping[str, Any]) -> dict[str, Any]:
    """YAML targets may group options the Prometheus way: basic_auth: {username, password_file,
    password_env} and tls_config: {ca_file, insecure_skip_verify}."""
    options = {str(k): v for k, v in spec.items()}
    for block, allowed in _TARGET_BLOCKS.items():
        inner = options.pop(block, None)
        if inner is None:
            continue
        if not isinstance(inner, Mapping):
            raise ConfigError(f"engine.{block}", "<mapping expected>", "expected a mapping")
        unknown = sorted(set(map(str, inner)) - set(allowed))
        if unknown:
            hint = did_you_mean(unknown[0], allowed)
            raise ConfigError(f"engine.{block}", unknown,
                              f"unknown option(s){hint}; expected {', '.join(allowed)}")
        options.update({str(k): v for k, v in inner.items()})
    return options


def _options_start() -> re.Pattern[str]:
    """Where the options of a `URL,key=value` spec start: a comma before a known option key."""
    keys = sorted({*TARGET_OPTIONS, *INLINE_SECRET_KEYS, *PROBE_OPTIONS}, key=len, reverse=True)
    return re.compile(r",\s*(?:" + "|".join(map(re.escape, keys)) + r")\s*=")


def _spec_url_end(spec: str) -> int:
    """Where the URL of a spec ends: the first comma after its user[:password]@, which may hold
    commas itself (split_userinfo with spec=True; an @ in an option's value is not the URL's)."""
    head, userinfo, _, ambiguous = split_userinfo(spec, spec=True, stop=_options_start())
    start = 0 if userinfo is None else len(head) + len(userinfo) + 1
    if ambiguous:  # no host after the last @: the options' keys are the only safe place to cut
        found = _options_start().search(spec, len(head))
        return found.start() if found else len(spec)
    comma = spec.find(",", start)
    return len(spec) if comma < 0 else comma


def _split_spec(spec: str, what: str) -> tuple[str, dict[str, str]]:
    """`URL,key=value,...` -> (URL, {key: value}); `what` names the setting in the error."""
    spec = spec.strip()
    end = _spec_url_end(spec)
    url, rest = spec[:end], spec[end + 1:].split(",") if end < len(spec) else []
    options = {}
    for item in rest:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(what, redact_url(url), "expected key=value after the URL")
        key = key.strip()
        # No option but a file path holds an @: one that does is most likely the rest of a password
        # with ",name=" in it, cut there; its value must not be echoed in the error.
        if "@" in value and not key.endswith("_file"):
            # Even the URL's head may be user:password-prefix here: show its scheme alone.
            raise ConfigError(what, url.partition("://")[0][:16] + "://<redacted>",
                              f"the value of {key!r} holds an '@': if a password holds "
                              "',<option>=', write that comma as %2C (or use password_file)")
        options[key] = value.strip()
    return url, options


def parse_engine_spec(spec: str | Mapping[str, Any], default_timeout: float,
                      env: Mapping[str, str] | None = None, *, kinds: tuple[str, ...] | None = None,
                      what: str = "engine") -> EngineTarget:
    """`URL[,kind=K][,name=N][,timeout=T][,bearer_token_file=PATH]...` or a YAML mapping with the same
    keys (plus basic_auth/tls_config blocks). Secrets come from files or environment variables."""
    if isinstance(spec, Mapping):
        options = _flatten_target_mapping(spec)
        url = str(options.pop("url", ""))
    else:
        url, options = _split_spec(str(spec), "engine")
    inline = set(options) & INLINE_SECRET_KEYS
    if inline:
        raise ConfigError("engine", redact_url(url),
                          f"{sorted(inline)[0]} must not be given inline: {_SECRET_ADVICE}")
    unknown = sorted(set(options) - set(TARGET_OPTIONS))
    if unknown:
        known = (*TARGET_OPTIONS, *(("url", *_TARGET_BLOCKS) if isinstance(spec, Mapping) else ()))
        hint = did_you_mean(unknown[0], known)
        raise ConfigError("engine", redact_url(url), f"unknown option(s) {unknown}{hint}")
    url = normalize_engine_url(url)
    kind = options.get("kind")
    if kind is not None:
        kind = str(kind)
        known = _engine_kinds() if kinds is None else kinds
        if kind not in known and kind != "auto":
            raise ConfigError(f"{what}.kind", kind, f"expected one of {', '.join(('auto',) + known)}")
        kind = None if kind == "auto" else kind
    role = _opt(options, "role")
    if role is not None and role not in ROLES:
        raise ConfigError("engine.role", role, f"expected one of {', '.join(ROLES)}")
    model = _opt(options, "model")
    if model is not None and not MODEL_NAME_RE.match(model):
        raise ConfigError("engine.model", model[:80], "printable characters without quotes or backslashes, "
                                                      f"1-{MAX_MODEL_NAME} characters")
    name = str(options.get("name") or _default_target_name(url))
    if not TARGET_NAME_RE.match(name):
        raise ConfigError("engine.name", name, "letters, digits and _.:- only, 1-64 characters")
    timeout = default_timeout
    if "timeout" in options:
        timeout = parse_duration(options["timeout"], "engine.timeout")
    credentials = _target_credentials(url, options, os.environ if env is None else env)
    return EngineTarget(url=url, name=name, kind=kind, timeout_s=timeout, role=role, model=model,
                        **credentials)


def _opt(options: Mapping[str, Any], key: str) -> str | None:
    """A target's text option, None when unset; a list or mapping, or text with a control character
    (a NUL made open() raise), is refused naming the option."""
    value = options.get(key)
    if value is None or value == "":
        return None
    return Text().parse(value, f"engine.{key}")


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
        raise ConfigError("engine", where,
                          "the URL already carries user:password@; remove it or the other credentials")
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
    insecure = as_bool(options.get("insecure_skip_verify", False), "engine.insecure_skip_verify")
    if ca_file and insecure:
        raise ConfigError("engine", where, "ca_file and insecure_skip_verify exclude each other")
    if ca_file:
        try:  # read by us, a regular file only: OpenSSL would wait on a FIFO for ever
            ssl.create_default_context(cadata=read_pem_file(ca_file))
        except ssl.SSLError as error:  # before OSError, its base class
            reason = f"not a PEM CA bundle ({error.reason or error})"
            raise ConfigError("engine.ca_file", ca_file, reason) from None
        except OSError as error:
            raise ConfigError("engine.ca_file", ca_file, error.strerror or str(error)) from None
    values["ca_file"], values["insecure_skip_verify"] = ca_file, insecure
    return values


def _check_secret_file(path: str, field_name: str) -> None:
    try:
        read_secret_file(path)
    except CredentialError as error:
        raise ConfigError(field_name, path, str(error)) from None


def reject_command_line_secrets(specs: str | Iterable[object] | None) -> None:
    """`--engine` values are visible to every local user (ps, /proc/PID/cmdline): refuse a secret
    there, inline or as user:password@ in the URL, with advice on where to put it."""
    if not specs:
        return
    for spec in [specs] if isinstance(specs, str) else specs:
        if not isinstance(spec, str):
            continue
        spec = spec.strip()
        end = _spec_url_end(spec)
        url, rest = spec[:end], spec[end + 1:].split(",")
        keys = {item.partition("=")[0].strip() for item in rest}
        secret_keys = sorted(keys & INLINE_SECRET_KEYS)
        # Any userinfo, split as normalize_engine_url would (an unencoded / ? # in the password
        # included), or an @ that leaves it unclear: a token is often the user name alone (http://TOKEN@host/).
        _, userinfo, _, ambiguous = split_userinfo(url)
        if secret_keys or userinfo is not None or ambiguous:
            what = secret_keys[0] if secret_keys else "user[:password]@ in the URL"
            raise ConfigError("engine", redact_url(url), f"{what}: a secret on the command line is visible "
                              f"to every local user; {_SECRET_ADVICE}")


# The options of one probe, with their meaning (docs/configuration.md lists them).
PROBE_OPTIONS: Mapping[str, str] = MappingProxyType({
    "model": "the `model` field of the request; default: the first model of GET /v1/models",
    "every": f"time between the starts of two probes; default {DEFAULT_PROBE_EVERY_S:g}s, at least "
             f"{MIN_PROBE_EVERY_S:g}s (one in flight at a time: a slow one delays the next)",
    "prompt_tokens": "prompt length in words (about one token each); default 32",
    "max_tokens": "tokens to generate (`ignore_eos` is sent: engines that know it generate exactly this); default 16",
    "target": "the engine target it belongs to (its `target` label and credentials); default: the engine target "
              "with the URL's host and port, else host:port",
    "api": "completions (/v1/completions, default) or chat (/v1/chat/completions)",
    "timeout": f"bound on one probe request, connect to the end of the stream; default "
               f"{DEFAULT_PROBE_TIMEOUT_S:g}s",
})
_PROBE_INTS = {"prompt_tokens": (1, 8192), "max_tokens": (1, 4096)}


def parse_probe_spec(spec: str | Mapping[str, Any], engines: tuple[EngineTarget, ...] = ()) -> ProbeTarget:
    """`URL[,model=M][,every=15s][,prompt_tokens=N][,max_tokens=K][,target=NAME][,api=chat][,timeout=T]`
    or a YAML mapping with `url:` and the same keys. Credentials are the engine target's, never given here."""
    if isinstance(spec, Mapping):
        options = {str(k): v for k, v in spec.items()}
        url = str(options.pop("url", ""))
    else:
        url, options = _split_spec(str(spec), "probe")
    url = url.strip()
    # Credential and TLS options of an engine target: refused by name, with the way to get them.
    plain = {"kind", "name", "timeout", "role", "model"}
    secret = sorted(set(options) & (INLINE_SECRET_KEYS | (set(TARGET_OPTIONS) - plain)))
    if secret:
        raise ConfigError("probe", redact_url(url), f"{secret[0]}: a probe takes no credentials or TLS options; it "
                          "uses those of the engine target named by target=")
    unknown = sorted(set(options) - set(PROBE_OPTIONS))
    if unknown:
        hint = did_you_mean(unknown[0], (*PROBE_OPTIONS, *(("url",) if isinstance(spec, Mapping) else ())))
        raise ConfigError("probe", redact_url(url), f"unknown option(s) {unknown}{hint}")
    url = _probe_url(url)
    values: dict[str, Any] = {}
    for key, (low, high) in _PROBE_INTS.items():
        if key in options:
            values[key] = Integer(low, high).parse(options[key], f"probe.{key}")
    if "every" in options:
        values["every_s"] = Duration(minimum_s=MIN_PROBE_EVERY_S, minimum_reason="a probe is a real request to "
                                     "the engine").parse(options["every"], "probe.every")
    if "timeout" in options:
        values["timeout_s"] = parse_duration(options["timeout"], "probe.timeout")
    if "api" in options:
        values["api"] = Choice(("completions", "chat")).parse(options["api"], "probe.api")
    model = options.get("model")
    if model is not None:
        model = str(model).strip()
        if not model or len(model) > 256 or not model.isprintable():
            raise ConfigError("probe.model", model, "1-256 printable characters")
        values["model"] = model
    engine: EngineTarget | None = None
    if options.get("target"):
        name = str(options["target"])
        if not TARGET_NAME_RE.match(name):
            raise ConfigError("probe.target", name, "letters, digits and _.:- only, 1-64 characters")
        engine = next((e for e in engines if e.name == name), None)
        if engine is None and engines:  # a typo would silently break the join with the engine's series
            hint = did_you_mean(name, [e.name for e in engines])
            raise ConfigError("probe.target", name, f"no engine target has this name{hint}")
    else:
        engine = next((e for e in engines if _origin(e.url)[1:] == _origin(url)[1:]), None)
        name = engine.name if engine is not None else _default_target_name(url)
    return ProbeTarget(url=url, target=name, engine=engine, **values)


def refuse_userinfo(url: str, what: str, advice: str) -> None:
    """A URL given on a command line (doctor --url, loadtest URL and --exporter, plan --from) carries
    no user[:password]@: it would be visible to every local user. The error never shows it. And it
    is an http:// or https:// URL with a host and a port in range: a bad one is a bad argument (exit
    2) before anything is sent, not a ValueError (`http://[::1`) nor a sweep of requests that all
    fail without ever connecting (`:99999`)."""
    _, userinfo, _, ambiguous = split_userinfo(url)
    if userinfo is not None or ambiguous:
        raise ConfigError(what, redact_url(url), "user[:password]@ in the URL: a secret on the command line is "
                          f"visible to every local user; {advice}")
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as error:
        raise ConfigError(what, url, f"not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(what, url, "expected an http:// or https:// URL with a host")


def _probe_url(url: str) -> str:
    _, userinfo, _, ambiguous = split_userinfo(url)
    if userinfo is not None or ambiguous:
        raise ConfigError("probe", redact_url(url), "no user[:password]@ in a probe URL: it uses the credentials "
                          "of its engine target")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as error:
        raise ConfigError("probe", redact_url(url), f"not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("probe", redact_url(url), "expected the engine's base http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ConfigError("probe", redact_url(url), "no user[:password]@ in a probe URL: it uses the credentials "
                          "of the engine target named by target=")
    if parts.query or parts.fragment:
        raise ConfigError("probe", redact_url(url), "a base URL takes no query or fragment")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urllib.parse.urlunsplit(parts._replace(path=path))


def probe_targets(raw: Any, engines: tuple[EngineTarget, ...]) -> tuple[ProbeTarget, ...]:
    raw = raw or ()
    if isinstance(raw, str | Mapping):
        raw = [raw]
    if not isinstance(raw, list | tuple):
        raise ConfigError("probes", raw, "expected a list of probes (URL strings or mappings)")
    probes = tuple(parse_probe_spec(spec, engines) for spec in raw)
    names = [p.target for p in probes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError("probe.target", duplicates[0], "two probes for one target; one probe per target")
    return probes


def _engine_kinds() -> tuple[str, ...]:
    # Only when a target names its kind: the registry loads every engine's table.
    from exporter.sources.engines.registry import KINDS

    return tuple(KINDS)


def _router_kinds() -> tuple[str, ...]:
    from exporter.sources.routers.registry import KINDS

    return tuple(KINDS)


def engine_targets(raw: Any, timeout_s: float, env: Mapping[str, str] | None, *,
                   routers: bool = False, taken: tuple[EngineTarget, ...] = ()) -> tuple[EngineTarget, ...]:
    """The engine targets, or with `routers` the router targets (same options, the router kinds;
    their names must differ from the engine targets' `taken`: both are `target` label values)."""
    raw = raw or ()
    field = "routers" if routers else "engines"
    if isinstance(raw, str | Mapping):
        raw = [raw]
    if not isinstance(raw, list | tuple):
        raise ConfigError(field, raw, "expected a list of targets (URL strings or mappings)")
    kinds = _router_kinds() if routers else None
    engines = tuple(parse_engine_spec(spec, timeout_s, env, kinds=kinds, what=field[:-1]) for spec in raw)
    names = [e.name for e in (*taken, *engines)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError("engine.name", duplicates[0], "two targets share this name; set name= on one")
    return engines


