"""Remote text on a terminal: the one sanitizer for what an engine, an exporter or a model server
sent before doctor, loadtest or a log line print it.

A model name or finish reason holding ESC [2J (clear the screen), ESC [1A (cursor up), BEL or a
bidi override could redraw or reorder a report ("status: HEALTHY" over a DEGRADED one). Every such
character is shown in its escaped form instead (\\x1b, \\x07, \\u202e): the text stays readable, the
terminal interprets nothing. A leaf module: it imports nothing from exporter."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# C0 controls (but \t; \n where a caller allows it), DEL, C1, the direction marks (U+061C, U+200E,
# U+200F), the line and paragraph separators (a terminal may break a line there) and the bidi
# embeddings/overrides and isolates.
_MARKS = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_MARKS}]")
_UNSAFE_KEEP_NEWLINE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_MARKS}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, newlines: bool = False) -> str:
    """`text` with every terminal control shown escaped. newlines=True keeps \\n (a multi-line
    message the caller wrote); a single remote field never keeps one (it could forge a line)."""
    return (_UNSAFE_KEEP_NEWLINE if newlines else _UNSAFE).sub(_escaped, text)


def terminal_safe_tree(value: Any) -> Any:
    """A JSON-like document (a diagnosis, a loadtest report) with every string, keys included,
    through terminal_safe: the boundary where such a document is rendered for a terminal."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, Mapping):
        return {terminal_safe_tree(k): terminal_safe_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [terminal_safe_tree(v) for v in value]
    return value
