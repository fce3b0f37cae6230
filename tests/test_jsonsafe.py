"""exporter/jsonsafe.py: remote JSON with its nesting bounded (issue 27, class 7).
tests/test_probe_run.py drives `llm-exporter run --probe` against an engine that sends it."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.jsonsafe import MAX_JSON_DEPTH, JsonTooDeep, depth_over, loads

_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(alphabet='[]{}"\\ab,:')
_DOCS = st.recursive(_LEAVES, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                                                          max_size=3), max_leaves=30)


def _depth(doc: object) -> int:
    if isinstance(doc, list):
        return 1 + max(map(_depth, doc), default=0)
    if isinstance(doc, dict):
        return 1 + max(map(_depth, doc.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_DOCS, st.integers(min_value=0, max_value=8))
def test_the_bound_is_exact_and_brackets_inside_strings_do_not_count(doc, bound):
    text = json.dumps(doc)
    assert depth_over(text.encode(), bound) == (_depth(doc) > bound)
    if _depth(doc) <= bound:
        assert loads(text, bound) == json.loads(text)
    else:
        with pytest.raises(JsonTooDeep):
            loads(text, bound)


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 100_000, b"[" * (MAX_JSON_DEPTH + 1) + b"]" * 65])
def test_a_deep_document_is_refused_before_json_recurses(body):
    with pytest.raises(JsonTooDeep) as caught:
        loads(body)
    assert isinstance(caught.value, ValueError)  # callers that handle bad JSON handle it too
    assert loads(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None


def test_an_escaped_quote_does_not_end_a_string():
    assert not depth_over(b'["\\"' + b"[" * 1000 + b'"]', 4)
    assert depth_over(b'["\\\\"' + b"[" * 10 + b"]" * 10 + b"]", 4)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "utf-16", "utf-8-sig"])
def test_utf16_and_utf32_are_measured_on_their_text(encoding):
    """json.loads reads these too. U+0122 is 0x22 0x01 in UTF-16-LE: a byte-level scan took its
    0x22 for a quote, and the next one opened a string that ran to the end and hid 5,000 levels."""
    deep = ('["\u0122", "\u2200", ' + "[" * 5_000 + "]" * 5_000 + "]").encode(encoding)
    with pytest.raises(JsonTooDeep):
        loads(deep)
    shallow = ('["\u0122", "\u2200", ' + "[" * 60 + "]" * 60 + "]").encode(encoding)
    assert loads(shallow) == json.loads(shallow)
    undecodable = b"[\x00" * 100 + b"]"  # an odd length: json.loads fails its decode before any parsing
    assert not depth_over(undecodable, 4)
    with pytest.raises(ValueError):
        loads(undecodable)


# Where json.loads may stay: text the operator wrote or the process made itself.
PLAIN_JSON_ALLOWED = {
    "exporter/settings.py": "a flag's or variable's value, written by the operator",
    "exporter/simulator/openai_api.py": "the twin's own error objects (err.body()), re-framed as SSE",
    "exporter/mixin/render.py": "the boards it has just written itself, read back for the undefined-metric check",
    "exporter/mixin/dashboards/generate.py": "its own boards and the committed copies of them, for --check",
}


def test_every_json_a_remote_party_sends_goes_through_the_bound():
    root = pathlib.Path(__file__).resolve().parent.parent
    found = {str(path.relative_to(root)) for path in (root / "exporter").rglob("*.py")
             if path.name != "jsonsafe.py" and re.search(r"\bjson\.loads?\(", path.read_text())}
    assert found <= set(PLAIN_JSON_ALLOWED), sorted(found - set(PLAIN_JSON_ALLOWED))
