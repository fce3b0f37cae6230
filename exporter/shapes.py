"""The shape of a JSON document another process sent, checked before code reads it.

`doctor --url` and `loadtest --exporter` read another exporter's /api/v1/diagnosis. Code that reads
`t.get("evidence", [])` and loops over it dies with a traceback when that exporter (another
version, a proxy, a hostile one) sends `"evidence": 5`: 19 of 25 wrong-shaped documents did so in
doctor, and loadtest lost a whole sweep to one poll. So a reader declares the shape it reads (the
parts it reads only: other keys pass) and `check` refuses a document that differs, in one line
naming the first place that does (`targets.a.evidence is a number, not an array`).

Every key of an `Obj` is optional and may be null, as the readers treat an absent part, unless the
Obj lists it in `required`; list items and mapping values must have their shape (null only where
the shape is `Maybe`). The walk is as deep as the shape, never as deep as the document, and linear
in what it visits. A leaf: imports nothing from exporter/."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_KEY_SHOWN = 64  # characters of a document's own key an error line quotes


class ShapeError(ValueError):
    """Where a document differs from the shape its reader expects, in one line."""


@dataclass(frozen=True, slots=True)
class Obj:
    """A JSON object whose keys in `fields` have those shapes (others are not looked at)."""

    fields: Mapping[str, Any]
    required: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class MapOf:
    """A JSON object used as a mapping: every value has the shape `value`."""

    value: Any


@dataclass(frozen=True, slots=True)
class ListOf:
    """A JSON array whose every item has the shape `item`."""

    item: Any


@dataclass(frozen=True, slots=True)
class Maybe:
    """The shape `inner`, or null."""

    inner: Any


NUMBER = "number"  # an int or a float, not a boolean
TEXT = "text"
FLAG = "flag"  # a boolean
ANY = "any"

_WORDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
          int: "a number", float: "a number"}


def kind(value: object) -> str:
    """A JSON value's kind in words: `an object`, `an array`, `a string`, `a number`, ..."""
    return _WORDS.get(type(value), type(value).__name__)


def _key(key: object) -> str:
    text = str(key)
    return text if len(text) <= MAX_KEY_SHOWN else text[:MAX_KEY_SHOWN] + "..."


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def check(value: Any, shape: Any, where: str = "") -> None:
    """Raise ShapeError unless `value` has `shape` (see the module docstring); `where` is the
    value's place in the document (empty: the document itself)."""
    if shape == ANY:
        return
    if isinstance(shape, Maybe):
        if value is not None:
            check(value, shape.inner, where)
        return
    if shape == NUMBER:
        ok, expected = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif shape == TEXT:
        ok, expected = isinstance(value, str), "a string"
    elif shape == FLAG:
        ok, expected = isinstance(value, bool), "a boolean"
    elif isinstance(shape, ListOf):
        ok, expected = isinstance(value, list), "an array"
    elif isinstance(shape, Obj | MapOf):
        ok, expected = isinstance(value, dict), "an object"
    else:
        raise TypeError(f"not a shape: {shape!r}")
    if not ok:
        raise ShapeError(f"{where or 'the document'} is {kind(value)}, not {expected}")
    if isinstance(shape, ListOf):
        for index, item in enumerate(value):
            check(item, shape.item, f"{where or 'the document'}[{index}]")
    elif isinstance(shape, MapOf):
        for key, item in value.items():
            check(item, shape.value, _at(where, _key(key)))
    elif isinstance(shape, Obj):
        for key in shape.required:
            if key not in value:
                raise ShapeError(f"{_at(where, key)} is missing")
        for key, inner in shape.fields.items():
            item = value.get(key)
            if item is not None:
                check(item, inner, _at(where, key))


_WORDS_LIST = ListOf(TEXT)
# What `doctor` renders and `loadtest` polls of /api/v1/diagnosis (exporter/derive/diagnosis.py
# builds it): a reader that reads more of it adds the part here.
DIAGNOSIS = Obj({
    "ready": FLAG,
    "status": TEXT,
    "targets": MapOf(Obj({
        "engine": TEXT, "model": TEXT, "status": TEXT, "verdict": TEXT,
        "unhealthy_because": _WORDS_LIST, "also_limiting": _WORDS_LIST, "degraded_because": _WORDS_LIST,
        "slo": MapOf(Obj({"words": TEXT})),
        "probe": Obj({"words": TEXT}, required=frozenset({"words"})),
        "notes": _WORDS_LIST, "evidence": _WORDS_LIST, "remedies": _WORDS_LIST, "omitted": _WORDS_LIST,
        "unaccounted_families": _WORDS_LIST,
        "scores": MapOf(Maybe(NUMBER)),  # a non-finite score is null (diagnosis.finite)
        "numbers": MapOf(ANY),  # the load test reads a few, each checked as a number where it is read
    })),
    "unreachable": ListOf(Obj({"target": TEXT, "reason": TEXT, "message": TEXT})),
    "gpu_faults_unassigned": ListOf(Obj({"words": TEXT})),
    "notes": _WORDS_LIST,
})
