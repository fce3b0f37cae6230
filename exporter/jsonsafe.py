"""JSON from a remote party (an engine's error body or /v1/models, an OpenAI stream's events, the
twin's /sim documents, another exporter's /api/v1/diagnosis), parsed with its nesting bounded.

json.loads recurses once per level: a body of 100,000 `[` raised RecursionError, which the callers
did not expect and reported as an unnamed `exception`, and a depth just under the interpreter's
limit would reach code that walks the document recursively. Real documents are a few levels deep.
The check is C-level passes over the bytes (strings, where a bracket means nothing, are cut out
first), and a document with fewer opening brackets than the bound skips even that.

A leaf: imports nothing from exporter/."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 64
"""Levels of arrays and objects; the deepest real document (an OpenAI chunk with logprobs) has 6."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JsonTooDeep(ValueError):
    """Nested deeper than the bound. A ValueError, so a caller that handles bad JSON handles it; a
    caller with reasons of its own names it `too_deep`."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"JSON nested deeper than {max_depth} levels")


def depth_over(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """True when `data` nests arrays and objects deeper than `max_depth` (outside strings)."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    encoding = json.detect_encoding(data)
    if not encoding.startswith("utf-8"):
        # json.loads also reads UTF-16 and UTF-32 (no BOM needed), where a 0x22 byte can be half of
        # another character: read as a quote it opened a string that hid every bracket after it
        # (`["\u0122",[[[...` in UTF-16-LE reached json.loads as depth 1). Measured on the text.
        try:
            data = data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return False  # json.loads fails the same decode before it parses anything
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > max_depth


def loads(data: str | bytes | bytearray, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, refusing a document nested deeper than `max_depth` (JsonTooDeep) before parsing."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if depth_over(raw, max_depth):
        raise JsonTooDeep(max_depth)
    return json.loads(data)
