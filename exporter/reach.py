"""A target that cannot be reached, or answers an error, said the same way by doctor, loadtest and
plan (docs/cli.md, "Exit codes and dead targets").

- `exporter_base_url`: an exporter's base URL as the user may give it, `http://HOST:9480/metrics`
  included, made the base the API paths hang from.
- `why_unreachable`: why nothing accepts a TCP connection at a URL ("connection refused", "cannot
  resolve HOST: ...", "no connection within 2s"), or None when something does.
- `failure_words`: an HTTP client failure as a short reason for an error line: a status as its code
  and standard phrase, never the body the server sent with it (a web server's 404 page is HTML,
  and remote text on a terminal is the server's to choose)."""

from __future__ import annotations

import http
import os
import re
import socket
import urllib.parse

MAX_WORDS = 200  # characters of a failure message in an error line
_STATUS_IN_MESSAGE = re.compile(r"HTTP (\d{3})\b")
API_SUFFIXES = ("/metrics", "/api/v1/diagnosis", "/api/v1/snapshot")


def exporter_base_url(url: str) -> str:
    """`url` less trailing slashes and one trailing /metrics (or /api/v1/diagnosis, /api/v1/snapshot):
    what doctor --url, plan --from and loadtest --exporter append the API paths to."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        return url.rstrip("/")  # not a URL the client takes: its own check says so
    path = parts.path.rstrip("/")
    for suffix in API_SUFFIXES:
        if path.endswith(suffix):
            path = path[: -len(suffix)].rstrip("/")
            break
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def http_status_words(status: int) -> str:
    """`HTTP 404 (Not Found)`: the code and its standard phrase, whatever the server wrote."""
    try:
        return f"HTTP {status} ({http.HTTPStatus(status).phrase})"
    except ValueError:
        return f"HTTP {status}"


def failure_words(reason: str, message: str, status: int | None = None) -> str:
    """A client failure (exporter/sources/base.SourceError's reason, message and status) for an
    error line: an HTTP status as http_status_words, else `reason: message` bounded. An http_status
    message may end in the engine's own reason from a JSON error document (`HTTP 501 from URL:
    ... Start it with --metrics`; exporter/httpclient.py reads it bounded and printable,
    never a page): kept after the status words, as what to do."""
    if status is None and reason == "http_status" and (found := _STATUS_IN_MESSAGE.search(message)):
        status = int(found.group(1))
    if status is not None:
        hint = message.split(": ", 1)[1] if reason == "http_status" and ": " in message else ""
        words = http_status_words(status)
        return f"{words}: {hint}" if hint else words
    text = f"{reason}: {message}" if message else reason
    return text if len(text) <= MAX_WORDS else text[:MAX_WORDS - 3] + "..."


def why_unreachable(url: str, timeout_s: float = 2.0) -> str | None:
    """Why no TCP connection opens to `url`'s host and port, in words ("connection refused",
    "no route to host", "cannot resolve HOST: ...", "no connection within 2s"); None when one opens
    (the server is there: whatever failed, failed after connecting). Blocking: call it from a
    thread in async code."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port out of range: the URL checks say so elsewhere
        return None
    if not host:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as error:
        return f"cannot resolve {host}: {error.strerror or error}"
    except TimeoutError:
        return f"no connection within {timeout_s:g}s"
    except OSError as error:
        return os.strerror(error.errno).lower() if error.errno else (error.strerror or type(error).__name__)
