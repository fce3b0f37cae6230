"""Credentials and TLS settings for engine targets.

A secret comes from a file or an environment variable, never from the command line
(exporter/config.py refuses that). A file is re-read when it changes, because tokens rotate
(Kubernetes swaps projected tokens and secret volumes through a symlink, so the stat is what
changes): one stat per scrape, a read only when the stat differs, both in a daemon thread with a
timeout and only of a regular file (exporter/safefile.py). Nothing here logs a value, and
error messages name the file, never its contents."""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass

import certifi

from exporter.redact import CredentialError, read_secret_file
from exporter.safefile import READ_TIMEOUT_S, Detached, FileReadError, read_pem_file
from exporter.targets import EngineTarget


class SecretFile:
    """A secret file re-read when its stat (inode, size, mtime) changes. The stat and the read run
    in a daemon thread (exporter/safefile.py), never on the event loop: a hung mount would stall
    every endpoint there, and a file swapped for a FIFO is refused rather than waited on."""

    def __init__(self, path: str, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._value: str | None = None
        self._reader: Detached[tuple[tuple[int, int, int, int], str | None]] = Detached("secret file", timeout_s)

    def _read(self) -> tuple[tuple[int, int, int, int], str | None]:
        """(stat, secret or None when the stat is unchanged); in the reader's thread."""
        try:
            st = os.stat(self.path)
        except OSError as error:
            raise CredentialError(error.strerror or type(error).__name__) from None
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp and self._value is not None:
            return stamp, None
        return stamp, read_secret_file(self.path)

    async def value(self) -> str:
        try:
            stamp, fresh = await self._reader.acall(self._read)
        except (CredentialError, FileReadError) as error:
            self._value, self._stamp = None, None
            raise CredentialError(f"{self.path}: {error}") from None
        if fresh is not None:
            self._value, self._stamp = fresh, stamp
        if self._value is None:  # a read that raced a failure above; the next scrape reads again
            raise CredentialError(f"{self.path}: changed while it was read")
        return self._value


@dataclass(frozen=True, slots=True)
class _Fixed:
    secret: str

    async def value(self) -> str:
        return self.secret


class TargetAuth:
    """Builds the Authorization header of one target for each scrape."""

    def __init__(self, target: EngineTarget) -> None:
        self.kind = "none"
        self._username = target.basic_auth_username
        self._source: SecretFile | _Fixed | None = None
        if target.bearer_token_file or target.bearer_token_env:
            self.kind = "bearer"
        elif target.basic_auth_username is not None:
            self.kind = "basic"
        if self.kind == "none":
            return
        path = target.bearer_token_file or target.basic_auth_password_file
        if path:
            self._source = SecretFile(path)
        elif target.env_secret is not None:
            self._source = _Fixed(target.env_secret.reveal())
        else:  # config.py guarantees one of the two; fail closed rather than send no credentials
            raise ValueError(f"target {target.name}: credentials configured without a file or variable")

    async def headers(self) -> dict[str, str]:
        """{"Authorization": ...} or {}; raises CredentialError when the file cannot be read."""
        if self._source is None:
            return {}
        secret = await self._source.value()
        if self.kind == "bearer":
            return {"Authorization": f"Bearer {secret}"}
        raw = f"{self._username}:{secret}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}


def ssl_context(target: EngineTarget) -> ssl.SSLContext:
    """The client TLS context of an https:// target: the certifi bundle by default (what httpx
    used, so a deployment that worked keeps working), the target's CA bundle when set, or no
    verification at all only when insecure_skip_verify is explicitly on. Never read from the
    environment (no SSL_CERT_FILE), like the httpx client with trust_env off before it."""
    if target.insecure_skip_verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["http/1.1"])
        return context
    return client_context(target.ca_file)


def client_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A verifying client context: `ca_file` when given (a regular file only, read by us: OpenSSL
    would wait on a FIFO), else the certifi bundle."""
    if ca_file:
        context = ssl.create_default_context(cadata=read_pem_file(ca_file))
    else:
        context = ssl.create_default_context(cafile=certifi.where())
    context.set_alpn_protocols(["http/1.1"])
    return context
