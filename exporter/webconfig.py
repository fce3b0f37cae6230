"""`--web.config.file`: TLS and basic auth in the exporter-toolkit format, reloaded when it changes.

    tls_server_config:
      cert_file: server.crt            # paths are relative to this file's folder
      key_file: server.key
      client_ca_file: clients-ca.crt   # with a verifying client_auth_type: mutual TLS
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12               # TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

A bad file at start is a config error (exit 2, one line). At run time the file, and the
certificate, key and CA files it names, are polled every few seconds from the event loop (stat
plus a hash of a few KiB, cheap); a change is parsed and validated in full before it replaces the
running one, so a bad edit keeps the last good config, logs one line and sets
llm_exporter_web_config_last_reload_successful to 0 until a good file comes back.

TLS reload without restarting uvicorn: uvicorn gets one server SSLContext for the life of the
process. Its sni_callback, which OpenSSL calls on every ClientHello (with or without SNI), swaps
the connection onto the context built from the current config, so new connections get the new
certificate, key and client-CA store, and open ones keep theirs. OpenSSL copies the verify mode
and protocol versions from the listening context when the connection is created, before the
callback runs, so those two are also set on the listening context at each reload. Switching TLS
on or off needs a new listener, so a reload that tries is refused like any bad file."""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import hmac
import logging
import os
import re
import secrets
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import bcrypt
import yaml

from exporter.config import ConfigError
from exporter.snapshot import Sample

log = logging.getLogger("llm_exporter.webconfig")

RELOAD_POLL_S = 3.0
# Open without credentials so kubelet and load-balancer probes need no secret; they reveal only
# "ok"/"ready" (docs/security.md).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
REALM = 'Basic realm="llm-exporter", charset="UTF-8"'

# Go's tls.ClientAuthType names -> Python verify modes. Python's ssl cannot request or require a
# certificate without verifying it: RequestClientCert asks for nothing (an unverified certificate
# would grant nothing anyway) and RequireAnyClientCert is refused rather than silently changed.
CLIENT_AUTH_TYPES: Mapping[str, ssl.VerifyMode | None] = MappingProxyType({
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": None,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
})
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType({
    "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3})
_TLS_KEYS = frozenset({"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"})
_TOP_KEYS = frozenset({"tls_server_config", "basic_auth_users", "http_server_config"})
_BCRYPT_RE = re.compile(rb"\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}\Z")
# A valid bcrypt hash checked when the user is unknown, so a wrong user costs as much as a wrong
# password and timing does not reveal which users exist (exporter-toolkit does the same).
_UNKNOWN_USER_HASH = b"$2b$10$KPoOSnRksg0kDpFOl3n/Z.VUtFiZQa.OSRqSNPtqDe3k4vQ5dbDeC"  # cost 10, random text
AUTH_CACHE_SIZE = 256


class WebConfigError(ValueError):
    """What is wrong with a web config file, in one line (the caller adds the file name)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_ca_file: str | None
    client_auth_type: str
    verify_mode: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    context: ssl.SSLContext = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class WebConfig:
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    watched: tuple[str, ...] = ()  # the files whose change triggers a reload


def _resolve(base_dir: str, value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise WebConfigError(f"tls_server_config.{key}: expected a file path")
    path = os.path.join(base_dir, value.strip())
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise WebConfigError(f"tls_server_config.{key} {path!r}: {error.strerror or error}") from None
    return path


def _parse_tls(block: object, base_dir: str) -> TlsSettings:
    if not isinstance(block, Mapping):
        raise WebConfigError("tls_server_config: expected a mapping")
    unknown = sorted(set(map(str, block)) - _TLS_KEYS)
    if unknown:
        raise WebConfigError(f"tls_server_config: unsupported key(s) {unknown}; supported: {sorted(_TLS_KEYS)}")
    for key in ("cert_file", "key_file"):
        if not block.get(key):
            raise WebConfigError(f"tls_server_config.{key} is required")
    cert_file = _resolve(base_dir, block["cert_file"], "cert_file")
    key_file = _resolve(base_dir, block["key_file"], "key_file")
    ca_file = _resolve(base_dir, block["client_ca_file"], "client_ca_file") if block.get("client_ca_file") else None
    auth_type = str(block.get("client_auth_type") or "NoClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth_type!r}: expected one of "
                             f"{', '.join(CLIENT_AUTH_TYPES)}")
    verify_mode = CLIENT_AUTH_TYPES[auth_type]
    if verify_mode is None:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth_type}: not supported (Python's ssl cannot "
                             "require a certificate without verifying it); use RequireAndVerifyClientCert with "
                             "client_ca_file")
    if verify_mode != ssl.CERT_NONE and ca_file is None:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth_type} needs client_ca_file")
    if verify_mode == ssl.CERT_NONE and ca_file is not None:
        raise WebConfigError("tls_server_config.client_ca_file is set but client_auth_type does not verify "
                             "client certificates; set client_auth_type: RequireAndVerifyClientCert")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = str(block.get(key) or default)
        if name not in TLS_VERSIONS:
            raise WebConfigError(f"tls_server_config.{key} {name!r}: expected TLS12 or TLS13")
        versions[key] = TLS_VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError("tls_server_config: min_version is above max_version")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = versions["min_version"], versions["max_version"]
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as error:
        raise WebConfigError(f"tls_server_config: cannot load cert_file {cert_file!r} with key_file {key_file!r} "
                             f"({error.reason or error})") from None
    except OSError as error:
        raise WebConfigError(f"tls_server_config: cannot load cert_file/key_file ({error.strerror or error})") from None
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (ssl.SSLError, OSError) as error:
            reason = getattr(error, "reason", None) or getattr(error, "strerror", None) or error
            raise WebConfigError(f"tls_server_config.client_ca_file {ca_file!r}: not a PEM CA bundle ({reason})") from None
    context.verify_mode = verify_mode
    return TlsSettings(cert_file, key_file, ca_file, auth_type, verify_mode, versions["min_version"],
                       versions["max_version"], context)


def _parse_users(block: object) -> dict[str, bytes]:
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        raise WebConfigError("basic_auth_users: expected a mapping of user name to bcrypt hash")
    users: dict[str, bytes] = {}
    for user, hashed in block.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: bad user name {user!r} (non-empty, no ':')")
        raw = str(hashed or "").strip().encode()
        if not _BCRYPT_RE.match(raw):
            # The hash is not a secret worth hiding, but say nothing of it beyond its shape.
            raise WebConfigError(f"basic_auth_users.{user}: not a bcrypt hash (expected $2y$<cost>$<53 chars>)")
        users[user] = raw
    return users


def parse_web_config(path: str) -> WebConfig:
    """Read and fully validate a web config file, loading its certificates; raise WebConfigError."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as error:
        raise WebConfigError(error.strerror or str(error)) from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise WebConfigError(f"not valid YAML ({str(error).splitlines()[0]})") from None
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise WebConfigError("top level must be a mapping")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise WebConfigError(f"unsupported key(s) {unknown}; supported: {sorted(_TOP_KEYS)}")
    http_block = data.get("http_server_config") or {}
    # http2 is accepted for copy-paste compatibility and ignored (uvicorn serves HTTP/1.1 only).
    if not isinstance(http_block, Mapping) or set(map(str, http_block)) - {"http2"}:
        raise WebConfigError("http_server_config: only http2 is accepted (and ignored)")
    base_dir = os.path.dirname(os.path.abspath(path))
    tls = _parse_tls(data["tls_server_config"], base_dir) if data.get("tls_server_config") is not None else None
    users = _parse_users(data.get("basic_auth_users"))
    watched = [os.path.abspath(path)]
    if tls is not None:
        watched += [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p]
    return WebConfig(tls, MappingProxyType(users), tuple(watched))


def named_files(path: str) -> tuple[str, ...]:
    """The certificate, key and CA paths a web config file names, read leniently (never raises):
    after a failed reload they are watched too, so creating a file it names retries the reload."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        block = data.get("tls_server_config") if isinstance(data, Mapping) else None
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return ()
    if not isinstance(block, Mapping):
        return ()
    base_dir = os.path.dirname(os.path.abspath(path))
    return tuple(os.path.join(base_dir, block[key].strip()) for key in ("cert_file", "key_file", "client_ca_file")
                 if isinstance(block.get(key), str) and block[key].strip())


def fingerprint(paths: tuple[str, ...]) -> bytes:
    """Hash of each file's stat and contents (a few KiB each): catches edits that keep the
    mtime and size, atomic renames, and Kubernetes' symlink swaps of mounted secrets."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.encode() + b"\0")
        try:
            st = os.stat(path)
            with open(path, "rb") as handle:
                data = handle.read(1 << 20)
        except OSError as error:
            digest.update(f"missing:{error.errno}".encode())
            continue
        digest.update(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:".encode())
        digest.update(hashlib.sha256(data).digest())
    return digest.digest()


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes. bcrypt is slow by design (tens to
    hundreds of ms), so a successful check is cached: per (user, stored hash), an HMAC of the
    password under a per-process random key, compared in constant time. Checks run one at a time
    in a worker thread, so a flood of bad passwords costs one core and never blocks the loop."""

    def __init__(self, max_entries: int = AUTH_CACHE_SIZE) -> None:
        self._key = secrets.token_bytes(32)
        self._cache: collections.OrderedDict[tuple[str, bytes], bytes] = collections.OrderedDict()
        self._max = max_entries
        self._lock: asyncio.Lock | None = None

    @staticmethod
    def parse_header(value: bytes | None) -> tuple[str, bytes] | None:
        if not value:
            return None
        scheme, _, token = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            raw = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return None
        user, sep, password = raw.partition(b":")
        if not sep:
            return None
        try:
            return user.decode("utf-8"), password
        except UnicodeDecodeError:
            return None

    async def check(self, users: Mapping[str, bytes], header: bytes | None) -> bool:
        credentials = self.parse_header(header)
        if credentials is None:
            return False
        user, password = credentials
        stored = users.get(user)
        hashed = stored if stored is not None else _UNKNOWN_USER_HASH
        mac = hmac.new(self._key, password, hashlib.sha256).digest()
        cached = self._cache.get((user, hashed))
        if cached is not None and hmac.compare_digest(cached, mac):
            self._cache.move_to_end((user, hashed))
            return stored is not None
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            ok = await asyncio.to_thread(_checkpw, password, hashed)
        if not ok or stored is None:
            return False
        self._cache[(user, hashed)] = mac
        self._cache.move_to_end((user, hashed))
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return True


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # over bcrypt's 72-byte limit, or a hash bcrypt rejects
        return False


class WebConfigManager:
    """Holds the current web config, reloads it when its files change, and reports the result
    as self-metrics."""

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        try:
            self.current = parse_web_config(path)
        except WebConfigError as error:
            raise ConfigError("web_config_file", path, str(error)) from None
        self._fingerprint = fingerprint(self.current.watched)
        self._also_watched: tuple[str, ...] = ()  # files a rejected edit names
        self.last_reload_successful = True
        self.last_success_ts = clock()
        self.reloads_failed = 0
        self.basic_auth = BasicAuth()
        self._server_context: ssl.SSLContext | None = None

    @property
    def tls_enabled(self) -> bool:
        return self.current.tls is not None

    @property
    def auth_enabled(self) -> bool:
        return bool(self.current.users)

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The one listening context (see the module docstring); None without TLS."""
        tls = self.current.tls
        if tls is None:
            return None
        if self._server_context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.cert_file, tls.key_file)  # used only if the swap below failed
            context.sni_callback = self._select_context
            self._server_context = context
            self._apply_connection_settings(tls)
        return self._server_context

    def _select_context(self, ssl_object: Any, server_name: str | None, listening: ssl.SSLContext) -> None:
        tls = self.current.tls
        if tls is not None:
            ssl_object.context = tls.context
        return None

    def _apply_connection_settings(self, tls: TlsSettings) -> None:
        context = self._server_context
        if context is None:
            return
        context.minimum_version, context.maximum_version = tls.min_version, tls.max_version
        context.verify_mode = tls.verify_mode

    def check(self) -> bool | None:
        """Poll once: None when nothing changed, else whether the reload succeeded."""
        current_fp = fingerprint(self.current.watched + self._also_watched)
        if current_fp == self._fingerprint:
            return None
        try:
            new = parse_web_config(self.path)
            if (new.tls is None) != (self.current.tls is None):
                raise WebConfigError("turning TLS on or off needs a restart of the exporter")
        except WebConfigError as error:
            # Remember what was seen so one bad edit logs one line, not one per poll; and watch
            # the files it names, so that creating a missing one retries without touching it.
            self._also_watched = tuple(p for p in named_files(self.path) if p not in self.current.watched)
            self._fingerprint = fingerprint(self.current.watched + self._also_watched)
            self.last_reload_successful = False
            self.reloads_failed += 1
            log.warning("web config %s not reloaded, keeping the last good one: %s", self.path, error)
            return False
        self.current = new
        if new.tls is not None:
            self._apply_connection_settings(new.tls)
        self._fingerprint = fingerprint(new.watched)
        self._also_watched = ()
        self.last_reload_successful = True
        self.last_success_ts = self.clock()
        log.info("web config %s reloaded (tls=%s, basic_auth_users=%d)", self.path,
                 "on" if new.tls else "off", len(new.users))
        return True

    async def watch(self, interval_s: float | None = None) -> None:
        while True:
            await asyncio.sleep(interval_s or RELOAD_POLL_S)  # the module value is read each time (tests lower it)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive any surprise
                log.exception("web config check failed")

    def samples(self) -> list[Sample]:
        return [
            Sample("llm_exporter_web_config_last_reload_successful", (), 1.0 if self.last_reload_successful else 0.0),
            Sample("llm_exporter_web_config_last_reload_success_timestamp_seconds", (), self.last_success_ts),
        ]

    async def authorize(self, path: str, header: bytes | None) -> bool:
        """True when the request may go on: an open path, no users configured, or good credentials."""
        users = self.current.users
        if not users or path in OPEN_PATHS:
            return True
        return await self.basic_auth.check(users, header)
