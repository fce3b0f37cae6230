"""Secrets and redaction: the one place a credential is read or hidden.

A leaf module (it imports only the leaf exporter.safefile), so config, sources, the server and the doctor
can all use it without importing each other. Nothing here logs a value, and error messages name
the file, never its contents."""

from __future__ import annotations

import hmac
import logging
import re
import urllib.parse

from exporter.safefile import read_regular_file

MAX_SECRET_BYTES = 64 * 1024  # a token or password is a few hundred bytes; more is the wrong file

# user:password@ after a scheme; quotes may be part of a password, so only / and spaces end it.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")


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


class CredentialError(Exception):
    """A credential could not be read; the message names the file, never the secret."""


def read_secret_file(path: str) -> str:
    """The stripped contents of a secret file; refuse empty files and embedded line breaks (which
    would otherwise end up as a broken or injected header), and anything but a regular file (a
    FIFO would block the reader for ever: exporter/safefile.py)."""
    try:
        data = read_regular_file(path, MAX_SECRET_BYTES)
    except OSError as error:
        raise CredentialError(error.strerror or str(error) or type(error).__name__) from None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CredentialError("not UTF-8 text") from None
    if not text:
        raise CredentialError("the file is empty")
    if any(c in text for c in "\r\n\0"):
        raise CredentialError("the secret contains a line break or NUL")
    return text


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


class RedactUrlCredentials(logging.Filter):
    """Last line of defence for logs: drop user:password@ from any URL in a record, whoever
    wrote it. On the root handlers (cli.setup_logging), so it holds for every logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _URL_USERINFO.sub(r"\1", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
