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

# Where user[:password]@ ends. A generated password may hold / ? # @ unencoded, which urllib would
# take for the end of the authority (and then the user name for the host): the userinfo is everything
# up to the LAST @, which must be followed by a host[:port] ending the authority; else nothing after
# the scheme is trusted (docs/configuration.md).
_SCHEME = re.compile(r"(?i)[a-z][a-z0-9+.-]*://")
# Lenient on purpose (a bad port or an unclosed bracket is reported later, by the caller): what counts
# is that no @ follows and the text is not a password fragment with / ? # in it.
_HOST = r"(?:\[[0-9A-Za-z:.%_~-]*\]?|[A-Za-z0-9._~-]+)(?::[^/?#@,\s]*)?"
_HOST_PORT = re.compile(rf"{_HOST}(?=[/?#]|$)")
_HOST_PORT_SPEC = re.compile(rf"{_HOST}(?=[/?#,]|$)")  # `URL,key=value`: a comma ends it too
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://\S+")


def split_userinfo(url: str, *, spec: bool = False, stop: re.Pattern[str] | None = None
                   ) -> tuple[str, str | None, str, bool]:
    """`scheme://user:pass@host...` -> ("scheme://", "user:pass", "host...", False). No userinfo:
    (head, None, rest, ambiguous), ambiguous when no host[:port] follows the last @ (then nothing
    after the scheme can be shown safely: an earlier @ may be inside the password). spec: the URL
    of a `URL,key=value` spec; `stop` matches where its options start (an @ there, as in
    password_file=/run/a@b, is not the URL's)."""
    match = _SCHEME.match(url)
    if match is None:
        return "", None, url, False
    head, rest = url[:match.end()], url[match.end():]
    limit = len(rest)
    if stop is not None:
        found = stop.search(rest)
        limit = found.start() if found else limit
    host_port = _HOST_PORT_SPEC if spec else _HOST_PORT
    at = rest.rfind("@", 0, limit)
    if at < 0:
        return head, None, rest, False
    if host_port.match(rest, at + 1):
        return head, rest[:at], rest[at + 1:], False
    # No host after the last @: an earlier @ may be inside the password, so none is trusted.
    return head, None, rest, True


def decode_userinfo(userinfo: str) -> tuple[str, str | None]:
    """(user, password or None), percent-decoded where a % starts a valid escape (%40 is @); any other
    % is itself (a generated password may hold one)."""
    user, colon, password = userinfo.partition(":")
    return urllib.parse.unquote(user), urllib.parse.unquote(password) if colon else None


def encode_userinfo(user: str, password: str | None) -> str:
    """The canonical userinfo: everything but unreserved characters percent-encoded, so urllib (and
    every reader of EngineTarget.url) splits the URL where the user meant."""
    encoded = urllib.parse.quote(user, safe="")
    return encoded if password is None else f"{encoded}:{urllib.parse.quote(password, safe='')}"


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
    """The one way a URL is shown: logs, labels, /api/v1/snapshot, /api/v1/diagnosis, the status page,
    doctor and start-up errors. Drops user[:password]@ (split_userinfo, so an unencoded / ? # @ in the
    password does not hide it), and everything after the scheme when an @ leaves the end of the
    userinfo unclear. Never raises."""
    head, userinfo, rest, ambiguous = split_userinfo(url)
    if ambiguous:
        return f"{head}<redacted>"
    return url if userinfo is None else head + rest


class RedactUrlCredentials(logging.Filter):
    """Last line of defence for logs: drop user:password@ from any URL in a record, whoever
    wrote it. On the root handlers (cli.setup_logging), so it holds for every logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _URL_IN_TEXT.sub(lambda m: redact_url(m.group()), message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
