"""`--web.config.file`: TLS and basic auth in the exporter-toolkit format, reloaded when it changes.

    tls_server_config:
      cert_file: server.crt            # paths are relative to this file's folder
      key_file: server.key
      client_ca_file: clients-ca.crt   # with a verifying client_auth_type: mutual TLS
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12               # TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

A bad file at start is a config error (exit 2, one line). A key written twice, at any depth, makes
a bad file (exporter/yamlsafe.py), as in the exporter-toolkit's strict parsing: a second
`basic_auth_users: {}` after the users would otherwise start, or reload, with no authentication. At
run time the file, and the certificate, key and CA files it names, are polled every few seconds,
and reload() (SIGHUP) checks them at once; reading, parsing and validating run in a daemon thread,
never on the event loop, only of regular files, and for at most READ_TIMEOUT_S
(exporter/safefile.py: a file swapped for a FIFO is refused, one on a hung mount is given up on
without keeping the process from exiting). A change is validated in full before it replaces the
running one, so a bad edit, or files that cannot be read, keep the last good config, log one line
and set llm_exporter_web_config_last_reload_successful to 0 until a good file comes back.

Fail closed: a reload that would take authentication away is refused like a bad file: basic
auth users to none, TLS on to off, client-certificate verification to weaker. A rewrite that is
not atomic leaves an empty or partly written file for a moment, and it must not open the
exporter; removing authentication on purpose needs a restart.

Basic auth costs bcrypt time on every uncached check, which a client without credentials can
make the exporter spend: checks run in a small pool with a bounded queue (beyond it: 503 at
once), a credential that has already succeeded is answered from the cache without queueing, an
unknown user costs as much as a known one, and failures are counted by reason and logged at most
once per AUTH_FAILURE_LOG_INTERVAL_S.

TLS reload without a restart: the HTTP server (exporter/httpserver.py) gets one server SSLContext for the life of the
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
import concurrent.futures
import contextlib
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

from exporter.config import ConfigError
from exporter.safefile import MAX_PEM_BYTES, READ_TIMEOUT_S, Detached, FileReadError, read_pem_file, read_regular_file
from exporter.snapshot import Sample
from exporter.yamlsafe import YamlLoadError, load_yaml_file, shorten

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
_BCRYPT_RE = re.compile(rb"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}\Z")
_BCRYPT_DIGEST_CHARS = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
AUTH_CACHE_SIZE = 256
# Each cost step doubles a check: 10 takes ~60 ms on one core, 16 ~4 s. Above 16 one check of a
# wrong password holds a worker for longer than a Prometheus scrape timeout (10 s by default).
MAX_BCRYPT_COST = 16
# bcrypt releases the GIL, so each worker can use a core. The exporter runs beside an engine whose
# own CPU may be the bottleneck, so a flood of bad passwords gets at most half the cores (one on a
# 2-core node, two from 4 cores on); a cached good credential never waits for a worker.
BCRYPT_WORKERS = max(1, min(2, (os.cpu_count() or 2) // 2))
# Checks allowed to wait for a worker; one more gets 503 at once (counted as "overloaded"). At
# cost 10 a full queue drains in about half a second, which bounds a first correct login's wait.
BCRYPT_MAX_WAITING = 16
AUTH_FAILURE_LOG_INTERVAL_S = 10.0  # failed logins are summarised in one line at most this often
AUTH_FAILURE_REASONS = ("missing", "malformed", "unknown_user", "bad_password", "overloaded")


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
    # Checked when the user is unknown, at the cost most of the users have, so that a wrong user
    # costs as much as a wrong password and timing does not reveal which users exist.
    unknown_user_hash: bytes = field(default=b"", repr=False)


def _resolve(base_dir: str, value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise WebConfigError(f"tls_server_config.{key}: expected a file path")
    path = os.path.join(base_dir, value.strip())
    try:
        # A regular file only (a FIFO would stall the reload for ever); OpenSSL then opens it by
        # path, and should it meet a FIFO swapped in since, the reload's timeout ends the wait.
        read_regular_file(path, MAX_PEM_BYTES)
    except OSError as error:
        raise WebConfigError(f"tls_server_config.{key} {path!r}: {error.strerror or error}") from None
    except ValueError:  # a NUL in the name: open() raises ValueError, not OSError
        raise WebConfigError(f"tls_server_config.{key} {shorten(repr(path))}: not a file name") from None
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
            context.load_verify_locations(cadata=read_pem_file(ca_file))
        except (ssl.SSLError, OSError) as error:
            reason = getattr(error, "reason", None) or getattr(error, "strerror", None) or error
            raise WebConfigError(f"tls_server_config.client_ca_file {ca_file!r}: "
                                 f"not a PEM CA bundle ({reason})") from None
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
            raise WebConfigError(f"basic_auth_users: bad user name {shorten(repr(user), 64)} (non-empty, no ':')")
        raw = str(hashed or "").strip().encode()
        match = _BCRYPT_RE.match(raw)
        if not match:
            # The hash is not a secret worth hiding, but say nothing of it beyond its shape.
            raise WebConfigError(f"basic_auth_users.{shorten(user, 64)}: not a bcrypt hash "
                                 "(expected $2y$<cost>$<53 chars>)")
        if not 4 <= int(match.group(1)) <= MAX_BCRYPT_COST:
            raise WebConfigError(f"basic_auth_users.{shorten(user, 64)}: bcrypt cost {int(match.group(1))} is outside "
                                 f"4..{MAX_BCRYPT_COST} (each step doubles the time of every check)")
        users[user] = raw
    return users


def _cost(hashed: bytes) -> int:
    match = _BCRYPT_RE.match(hashed)
    return int(match.group(1)) if match else 10


def unknown_user_hash(users: Mapping[str, bytes]) -> bytes:
    """A bcrypt hash that no password matches, at the cost most of `users` have (the higher on a
    tie): a real salt and a random digest, so making it costs nothing at load."""
    costs = collections.Counter(_cost(h) for h in users.values())
    cost = max(costs, key=lambda c: (costs[c], c)) if costs else 10
    return bcrypt.gensalt(cost) + bytes(secrets.choice(_BCRYPT_DIGEST_CHARS) for _ in range(31))


def parse_web_config(path: str) -> WebConfig:
    """Read and fully validate a web config file, loading its certificates; raise WebConfigError."""
    try:
        data = load_yaml_file(path)
    except YamlLoadError as error:
        raise WebConfigError(str(error)) from None
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise WebConfigError("top level must be a mapping")
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise WebConfigError(shorten(f"unsupported key(s) {unknown}; supported: {sorted(_TOP_KEYS)}", 400))
    http_block = data.get("http_server_config") or {}
    # http2 is accepted for copy-paste compatibility and ignored (exporter/httpserver.py serves HTTP/1.1 only).
    if not isinstance(http_block, Mapping) or set(map(str, http_block)) - {"http2"}:
        raise WebConfigError("http_server_config: only http2 is accepted (and ignored)")
    base_dir = os.path.dirname(os.path.abspath(path))
    tls = _parse_tls(data["tls_server_config"], base_dir) if data.get("tls_server_config") is not None else None
    users = _parse_users(data.get("basic_auth_users"))
    watched = [os.path.abspath(path)]
    if tls is not None:
        watched += [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p]
    return WebConfig(tls, MappingProxyType(users), tuple(watched), unknown_user_hash(users))


def named_files(path: str) -> tuple[str, ...]:
    """The certificate, key and CA paths a web config file names, read leniently (never raises):
    after a failed reload they are watched too, so creating a file it names retries the reload."""
    try:
        data = load_yaml_file(path)
    except YamlLoadError:
        return ()
    block = data.get("tls_server_config") if isinstance(data, Mapping) else None
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
            data = read_regular_file(path, MAX_PEM_BYTES)
        except (OSError, ValueError) as error:  # missing, refused, a NUL in the name: the parse says why
            digest.update(f"missing:{getattr(error, 'errno', None)}:{error}".encode())
            continue
        digest.update(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:".encode())
        digest.update(hashlib.sha256(data).digest())
    return digest.digest()


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes. bcrypt is slow by design (tens to
    hundreds of ms), so a successful check is cached: per (user, stored hash), an HMAC of the
    password under a per-process random key, compared in constant time, before anything waits.
    Other checks run in a pool of `workers` threads with at most `max_waiting` queued behind
    them; past that a check is not attempted (None: the caller answers 503), so a flood of bad
    passwords costs at most `workers` cores and delays a first correct login by a bounded time."""

    def __init__(self, max_entries: int = AUTH_CACHE_SIZE, *, workers: int | None = None,
                 max_waiting: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._key = secrets.token_bytes(32)
        self._cache: collections.OrderedDict[tuple[str, bytes], bytes] = collections.OrderedDict()
        self._max = max_entries
        self._workers = workers if workers is not None else BCRYPT_WORKERS
        self._max_waiting = max_waiting if max_waiting is not None else BCRYPT_MAX_WAITING
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_pool = 0  # checks submitted and not finished, running or waiting (event loop only)
        self._clock = clock
        self.failures = dict.fromkeys(AUTH_FAILURE_REASONS, 0)
        self._unlogged: collections.Counter[str] = collections.Counter()
        self._last_log = -float("inf")

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

    async def check(self, users: Mapping[str, bytes], header: bytes | None,
                    unknown_hash: bytes | None = None) -> bool | None:
        """True for good credentials, False for bad or missing ones, None when too many checks
        are waiting already. `unknown_hash`: what an unknown user is checked against (see
        unknown_user_hash; made from `users` when not given)."""
        credentials = self.parse_header(header)
        if credentials is None:
            self._failed("malformed" if header else "missing")
            return False
        user, password = credentials
        stored = users.get(user)
        hashed = stored if stored is not None else (unknown_hash or unknown_user_hash(users))
        mac = hmac.new(self._key, password, hashlib.sha256).digest()
        cached = self._cache.get((user, hashed))
        if cached is not None and hmac.compare_digest(cached, mac):
            self._cache.move_to_end((user, hashed))
            return True  # only known users' successes are cached
        if self._in_pool >= self._workers + self._max_waiting:
            self._failed("overloaded")
            return None
        ok = await self._checkpw_in_pool(password, hashed)
        if not ok or stored is None:
            self._failed("unknown_user" if stored is None else "bad_password")
            return False
        self._cache[(user, hashed)] = mac
        self._cache.move_to_end((user, hashed))
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return True

    async def _checkpw_in_pool(self, password: bytes, hashed: bytes) -> bool:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(self._workers, thread_name_prefix="bcrypt")
        loop = asyncio.get_running_loop()
        future = self._executor.submit(_checkpw, password, hashed)
        self._in_pool += 1

        # Counted down when the work is finished (or cancelled before it started), not when the
        # awaiting request goes away: a client that disconnects does not stop a running check.
        def finished(_: concurrent.futures.Future[bool]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is counting any more
                loop.call_soon_threadsafe(self._release)

        future.add_done_callback(finished)
        return await asyncio.wrap_future(future)

    def _release(self) -> None:
        self._in_pool -= 1

    def _failed(self, reason: str) -> None:
        """Count a refused request; log a summary line at most once per AUTH_FAILURE_LOG_INTERVAL_S
        (a flood of bad passwords is thousands a minute). No user names: they are the client's
        text, unbounded, and sometimes a password typed in the wrong field."""
        self.failures[reason] += 1
        self._unlogged[reason] += 1
        now = self._clock()
        if now - self._last_log < AUTH_FAILURE_LOG_INTERVAL_S:
            return
        since = "" if self._last_log == -float("inf") else f" in the last {now - self._last_log:.0f}s"
        log.warning("basic auth refused %d request(s)%s (%s); this line comes at most every %gs, "
                    "llm_exporter_http_auth_failures_total counts each one", sum(self._unlogged.values()), since,
                    ", ".join(f"{r}={n}" for r, n in sorted(self._unlogged.items())), AUTH_FAILURE_LOG_INTERVAL_S)
        self._unlogged.clear()
        self._last_log = now


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # over bcrypt's 72-byte limit, or a hash bcrypt rejects
        return False


def weakened(old: WebConfig, new: WebConfig) -> str | None:
    """Why replacing `old` with `new` at run time would take protection away, or None. Such a
    reload is refused: a non-atomic rewrite leaves an empty or partial file for a moment, and it
    must not open the exporter. On purpose, it takes a restart with the new file."""
    if old.tls is not None and new.tls is None:
        return ("it has no tls_server_config, which would turn TLS off (an empty or partly written file?); "
                "turning TLS on or off needs a restart of the exporter")
    if old.tls is None and new.tls is not None:
        return "turning TLS on or off needs a restart of the exporter"
    if old.users and not new.users:
        return ("it has no basic_auth_users, which would turn basic auth off (an empty or partly written file?); "
                "removing basic auth needs a restart of the exporter")
    if old.tls is not None and new.tls is not None and new.tls.verify_mode < old.tls.verify_mode:
        return (f"client_auth_type {new.tls.client_auth_type} would verify client certificates less than "
                f"{old.tls.client_auth_type}; lowering it needs a restart of the exporter")
    return None


_Outcome = tuple[bytes, "WebConfig | WebConfigError", tuple[str, ...]]


class WebConfigManager:
    """Holds the current web config, reloads it when its files change or on reload(), and
    reports the result as self-metrics."""

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
        self._refusal: str | None = None  # the last refusal logged by the watcher, until a success
        self.basic_auth = BasicAuth()
        self._server_context: ssl.SSLContext | None = None
        self._reload_lock = asyncio.Lock()  # one reload at a time: the watch and reload()
        self._reload_waiting = False  # a reload() waits for the lock; another one joins it
        # Reading, parsing and validating run in a daemon thread with a timeout: a file on a hung
        # mount must neither stall the reload for ever nor keep the process from exiting.
        self._reader: Detached[_Outcome | None] = Detached("web config files", READ_TIMEOUT_S)

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

    def _evaluate(self, force: bool) -> _Outcome | None:
        """Read, parse and validate (a worker thread: YAML and certificates take milliseconds to
        seconds); change nothing. None when no watched file changed and `force` is off."""
        current = self.current
        watched = current.watched + self._also_watched
        # Taken before the files are read: an edit made while they are parsed is seen next poll.
        seen = fingerprint(watched)
        if not force and seen == self._fingerprint:
            return None
        try:
            new = parse_web_config(self.path)
            why = weakened(current, new)
            if why is not None:
                raise WebConfigError(why)
        except WebConfigError as error:
            # Remember what was seen so one bad edit logs one line, not one per poll; and watch
            # the files it names, so that creating a missing one retries without touching it.
            also = tuple(p for p in named_files(self.path) if p not in current.watched)
            return (seen if current.watched + also == watched else fingerprint(current.watched + also)), error, also
        return (seen if new.watched == watched else fingerprint(new.watched)), new, ()

    def _commit(self, outcome: _Outcome | None, reason: str) -> bool | None:
        """Apply what _evaluate found (the event loop: the listening context is changed here)."""
        if outcome is None:
            return None
        self._fingerprint, result, self._also_watched = outcome
        if isinstance(result, WebConfigError):
            self.last_reload_successful = False
            self.reloads_failed += 1
            # One line per bad state: a file caught mid-write can be seen twice with the same content
            # (its stat taken before the write, its bytes after), which is one state, not two edits.
            # A reload someone asked for (SIGHUP) always answers.
            if reason != "file changed" or str(result) != self._refusal:
                log.warning("web config %s not reloaded (%s), keeping the last good one: %s", self.path, reason,
                            result)
            self._refusal = str(result)
            return False
        self._refusal = None
        self.current = result
        if result.tls is not None:
            self._apply_connection_settings(result.tls)
        self.last_reload_successful = True
        self.last_success_ts = self.clock()
        log.info("web config %s reloaded (%s; tls=%s, basic_auth_users=%d)", self.path, reason,
                 "on" if result.tls else "off", len(result.users))
        return True

    def check(self, *, force: bool = False, reason: str = "file changed") -> bool | None:
        """Poll once, in the caller's thread: None when nothing changed, else whether the reload succeeded."""
        return self._commit(self._evaluate(force), reason)

    async def _evaluate_detached(self, force: bool) -> _Outcome | None:
        """_evaluate in the reader's thread. One that does not finish in time is a failed reload
        (metric 0, one line), and while it runs on, later reloads fail at once rather than start
        another thread. The fingerprint is forgotten, so the first reload after it returns reads
        the files again, changed or not, and can set the metric back to 1."""
        try:
            return await self._reader.acall(lambda: self._evaluate(force))
        except FileReadError as error:
            return b"", WebConfigError(str(error)), self._also_watched

    async def reload(self, reason: str) -> bool | None:
        """Re-read the web config now (SIGHUP), changed or not, off the event loop, and log one
        line naming `reason`: True when loaded, False when refused (the last good one stays).
        None when another reload() was already waiting to start: that one reads the files after
        this request, so it stands for both."""
        if self._reload_waiting:
            log.info("web config %s: reload (%s) joins the one about to start", self.path, reason)
            return None
        self._reload_waiting = True
        try:
            await self._reload_lock.acquire()
        finally:
            self._reload_waiting = False
        try:
            return self._commit(await self._evaluate_detached(True), reason)
        finally:
            self._reload_lock.release()

    async def watch(self, interval_s: float | None = None) -> None:
        while True:
            await asyncio.sleep(interval_s or RELOAD_POLL_S)  # the module value is read each time (tests lower it)
            try:
                async with self._reload_lock:
                    self._commit(await self._evaluate_detached(False), "file changed")
            except Exception:  # noqa: BLE001 - the watcher must outlive any surprise
                log.exception("web config check failed")

    def samples(self) -> list[Sample]:
        failures = self.basic_auth.failures
        return [
            Sample("llm_exporter_web_config_last_reload_successful", (), 1.0 if self.last_reload_successful else 0.0),
            Sample("llm_exporter_web_config_last_reload_success_timestamp_seconds", (), self.last_success_ts),
            *(Sample("llm_exporter_http_auth_failures_total", (("reason", reason),), float(failures[reason]))
              for reason in AUTH_FAILURE_REASONS),
        ]

    async def authorize(self, path: str, header: bytes | None) -> bool | None:
        """True when the request may go on: an open path, no users configured, or good
        credentials; False: 401; None: too many checks waiting, answer 503 at once."""
        current = self.current
        if not current.users or path in OPEN_PATHS:
            return True
        return await self.basic_auth.check(current.users, header, current.unknown_user_hash)
