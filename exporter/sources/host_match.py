"""Matching a user's `engine_process_name` pattern against other processes' names and command
lines in time linear in the text, whatever the text.

Python's `re` backtracks: `vllm.*serve` over a command line that repeats `vllm` and never says
`serve` costs time quadratic in its length (256 KiB: 5.6 s; Linux allows 2 MiB), and `re` holds
the GIL all along, so one process that any local user can start stalled every endpoint and
SIGTERM. Here the pattern is parsed by `re`'s own parser (it means what `re` would make of it)
and run as a DFA built lazily from its Thompson NFA, as RE2 and Go's regexp do: a character costs
one dict lookup once its transition is known, at most one pass over the NFA otherwise. Only
whether the pattern occurs is asked (`re.search(...) is not None`), which a DFA answers without
backtracking. It is pure Python, so a long match still lets the event loop's thread run.

What only backtracking can answer is refused when the pattern is configured, as RE2 (the dialect
of Prometheus' own regexes) refuses it: backreferences, lookarounds, conditionals, atomic groups
and possessive repeats. So is a pattern whose counted repeats expand past MAX_PATTERN_STATES.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

# re's own parser: the pattern means exactly what re would make of it (Python >= 3.11 names them so).
# Private modules typeshed has no stubs for, so to the type checker _c and _p are untyped (Any).
from re import _constants as _c  # type: ignore[attr-defined]
from re import _parser as _p  # type: ignore[attr-defined]
from typing import Any

MAX_PATTERN_STATES = 4096
"""NFA states of a pattern with its counted repeats expanded (`x{1000}` is 1000): a process name
needs a few dozen; the bound keeps one step of the DFA cheap."""
MAX_DFA_STATES = 1024
"""DFA states cached; past it the cache starts over (RE2 does the same), so a pattern whose
subsets explode costs time per character, bounded by MAX_PATTERN_STATES, never memory."""
MAX_DFA_TRANSITIONS = 32768
"""Cached transitions (state, character) over all states: a command line of distinct Unicode
characters cannot grow the cache past this."""
DEADLINE_CHECK_CHARS = 256  # how often a search looks at its deadline, in characters

_MATCH = -1  # a transition that reached the end of the pattern: it occurs, the search is over
_CHAR, _SPLIT, _ASSERT, _END = range(4)
_CATEGORY_CLASS = {
    _c.CATEGORY_DIGIT: r"\d", _c.CATEGORY_NOT_DIGIT: r"\D", _c.CATEGORY_SPACE: r"\s",
    _c.CATEGORY_NOT_SPACE: r"\S", _c.CATEGORY_WORD: r"\w", _c.CATEGORY_NOT_WORD: r"\W",
}
_UNSUPPORTED = {
    "GROUPREF": "backreferences", "GROUPREF_EXISTS": "conditionals", "ASSERT": "lookarounds",
    "ASSERT_NOT": "lookarounds", "ATOMIC_GROUP": "atomic groups", "POSSESSIVE_REPEAT": "possessive repeats",
}
# The flags that change what one character matches, and their letters in a scoped group.
_CHAR_FLAGS = re.IGNORECASE | re.DOTALL | re.ASCII
_FLAG_LETTERS = ((re.IGNORECASE, "i"), (re.DOTALL, "s"), (re.ASCII, "a"))
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# What an assertion needs to know of the character before a position: (is a newline, is a word
# character in Unicode, in ASCII); None at the start of the text.
_Before = tuple[bool, bool, bool] | None


class PatternError(ValueError):
    """A pattern that is not a valid regex or needs backtracking; one line, for the config error."""


class LinearPattern:
    """`search(text)`: does the pattern occur in `text`, as `re.search(pattern, text)` would say."""

    def __init__(self, pattern: str) -> None:
        try:
            parsed = _p.parse(pattern, 0)
        except re.error as error:
            raise PatternError(f"not a valid regex: {error}") from None
        except RecursionError:
            raise PatternError("nested too deeply") from None
        self.pattern = pattern
        # Parallel lists, one entry per NFA state: what it is, where it goes, and its argument.
        self._kind: list[int] = []
        self._out: list[tuple[int, ...]] = []
        # A compiled one-character pattern for a _CHAR state, else what its kind needs: Any, as each
        # kind reads its own.
        self._arg: list[Any] = []
        self._global_flags = 0  # the pattern's own flags; a group's are scoped over them
        self._reads_before = False  # an assertion looks at the character before a position
        self._dollar = False  # `$` without MULTILINE also matches before a final newline
        self._global_flags = parsed.state.flags
        end = self._state(_END, (), None)
        try:
            self._start = self._sequence(list(parsed), parsed.state.flags, end)
        except RecursionError:
            raise PatternError("nested too deeply") from None
        self._reset()

    # --- the NFA -------------------------------------------------------------------------------

    def _state(self, kind: int, out: tuple[int, ...], arg: Any) -> int:
        if len(self._kind) >= MAX_PATTERN_STATES:
            raise PatternError(f"too large: over {MAX_PATTERN_STATES} states once its repeats are expanded")
        self._kind.append(kind)
        self._out.append(out)
        self._arg.append(arg)
        return len(self._kind) - 1

    def _sequence(self, items: list, flags: int, then: int) -> int:
        # Built from the end, so each state is made knowing where it goes next.
        for op, av in reversed(items):
            then = self._item(op, av, flags, then)
        return then

    def _item(self, op: object, av: Any, flags: int, then: int) -> int:
        # `av` is re's parser's argument of `op`, whose shape each op has its own (hence Any).
        name = str(op)
        if op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.IN):
            return self._state(_CHAR, (then,), self._predicate(op, av, flags))
        if op is _c.BRANCH:
            _, alternatives = av
            return self._state(_SPLIT, tuple(self._sequence(list(a), flags, then) for a in alternatives), None)
        if op is _c.SUBPATTERN:
            _, add, remove, body = av
            return self._sequence(list(body), (flags | add) & ~remove, then)
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):  # lazy or greedy: the same strings occur
            low, high, body = av
            return self._repeat(list(body), low, high, flags, then)
        if op is _c.AT:
            if av in (_c.AT_BEGINNING, _c.AT_BEGINNING_STRING, _c.AT_BOUNDARY, _c.AT_NON_BOUNDARY):
                self._reads_before = True
            elif av is _c.AT_END and not flags & re.MULTILINE:
                self._dollar = True
            elif av not in (_c.AT_END, _c.AT_END_STRING):
                raise PatternError(f"{av} is not supported")
            return self._state(_ASSERT, (then,), (av, flags))
        raise PatternError(f"{_UNSUPPORTED.get(name, name)} are not supported (matched without backtracking)")

    def _repeat(self, body: list, low: int, high: int, flags: int, then: int) -> int:
        if high == _c.MAXREPEAT:
            loop = self._state(_SPLIT, (), None)
            self._out[loop] = (self._sequence(body, flags, loop), then)
            tail = loop
        else:
            tail = then
            for _ in range(high - low):  # x{2,4} is xx(x(x)?)?
                tail = self._state(_SPLIT, (self._sequence(body, flags, tail), then), None)
        for _ in range(low):
            tail = self._sequence(body, flags, tail)
        return tail

    def _predicate(self, op: object, av: Any, flags: int) -> re.Pattern[str]:
        """One character's test, as a one-character `re` pattern with the flags in force there:
        case folding, `.` and classes mean exactly what they mean to re, at a cost that does not
        depend on the text."""
        if op is _c.LITERAL:
            source = re.escape(chr(av))
        elif op is _c.NOT_LITERAL:
            source = f"[^{re.escape(chr(av))}]"
        elif op is _c.ANY:
            source = "."
        else:
            parts = []
            for item_op, item in av:
                if item_op is _c.NEGATE:
                    parts.append("^")
                elif item_op is _c.LITERAL:
                    parts.append(re.escape(chr(item)))
                elif item_op is _c.RANGE:
                    parts.append(f"{re.escape(chr(item[0]))}-{re.escape(chr(item[1]))}")
                elif item_op is _c.CATEGORY and item in _CATEGORY_CLASS:
                    parts.append(_CATEGORY_CLASS[item])
                else:
                    raise PatternError(f"{item_op} in a character class is not supported")
            source = f"[{''.join(parts)}]"
        # A group's flags are scoped, as in the pattern: re does not treat `(?a:\W)` as `\W`
        # under a global ASCII flag, and the one-character test must say what re says.
        outer = self._global_flags & _CHAR_FLAGS
        add = "".join(c for f, c in _FLAG_LETTERS if flags & f and not outer & f)
        remove = "".join(c for f, c in _FLAG_LETTERS if outer & f and not flags & f)
        if add or remove:
            source = f"(?{add}{'-' + remove if remove else ''}:{source})"
        return re.compile(source, outer)

    # --- the DFA, built as the text asks for it ---------------------------------------------------

    def _reset(self) -> None:
        self._ids: dict[tuple[frozenset[int], _Before], int] = {}
        self._keys: list[tuple[frozenset[int], _Before]] = []
        self._rows: list[dict[str, int]] = []
        self._at_end: dict[int, bool] = {}
        self._transitions = 0
        self._initial = self._intern(frozenset((self._start,)), None)

    def _intern(self, states: frozenset[int], before: _Before) -> int:
        key = (states, before if self._reads_before else None)
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._keys)
            self._keys.append(key)
            self._rows.append({})
        return got

    def _closure(self, states: frozenset[int], before: _Before, after: str | None,
                 final_newline: bool) -> tuple[list[int], bool]:
        """The character-reading states reachable from `states` without reading, at a position
        between `before` and `after` (None: the end of the text); and whether the end of the
        pattern is among them."""
        kind, out, arg = self._kind, self._out, self._arg
        seen: set[int] = set()
        stack = list(states)
        reading: list[int] = []
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = kind[s]
            if k == _CHAR:
                reading.append(s)
            elif k == _SPLIT:
                stack.extend(out[s])
            elif k == _END:
                return reading, True
            elif _holds(arg[s], before, after, final_newline):
                stack.append(out[s][0])
        return reading, False

    def _step(self, sid: int, char: str, final_newline: bool) -> int:
        states, before = self._keys[sid]
        reading, matched = self._closure(states, before, char, final_newline)
        if matched:
            return _MATCH
        nxt = {self._out[s][0] for s in reading if self._arg[s].match(char)}
        nxt.add(self._start)  # a match may start at every position
        return self._intern(frozenset(nxt), (char == "\n", char.isalnum() or char == "_", char in _ASCII_WORD))

    def _transition(self, sid: int, char: str) -> int:
        if len(self._keys) >= MAX_DFA_STATES or self._transitions >= MAX_DFA_TRANSITIONS:
            key = self._keys[sid]
            self._reset()
            sid = self._intern(*key)
        nxt = self._step(sid, char, False)
        self._rows[sid][char] = nxt
        self._transitions += 1
        return nxt

    def search(self, text: str, deadline: float | None = None,
               clock: Callable[[], float] = time.monotonic) -> bool | None:
        """Does the pattern occur in `text`? None when `deadline` (of `clock`) passed first."""
        # `$` may match before a final newline: that last character's step is never cached.
        body = text[:-1] if self._dollar and text.endswith("\n") else text
        sid = self._initial
        for start in range(0, len(body), DEADLINE_CHECK_CHARS):
            if start and deadline is not None and clock() > deadline:
                return None
            rows = self._rows
            for char in body[start:start + DEADLINE_CHECK_CHARS]:
                nxt = rows[sid].get(char)
                if nxt is None:
                    nxt = self._transition(sid, char)
                    rows = self._rows  # a new list when the cache started over
                if nxt == _MATCH:
                    return True
                sid = nxt
        if body is not text:
            sid = self._step(sid, "\n", True)
            if sid == _MATCH:
                return True
        got = self._at_end.get(sid)
        if got is None:
            states, before = self._keys[sid]
            got = self._at_end[sid] = self._closure(states, before, None, False)[1]
        return got


def _holds(assertion: tuple[object, int], before: _Before, after: str | None, final_newline: bool) -> bool:
    code, flags = assertion
    if code is _c.AT_BEGINNING_STRING:
        return before is None
    if code is _c.AT_BEGINNING:
        return before is None or (bool(flags & re.MULTILINE) and before[0])
    if code is _c.AT_END_STRING:
        return after is None
    if code is _c.AT_END:
        if flags & re.MULTILINE:
            return after is None or after == "\n"
        return after is None or final_newline
    if before is None and after is None:  # re: no boundary, and no non-boundary, in ""
        return False
    ascii_only = bool(flags & re.ASCII)
    word_before = before is not None and (before[2] if ascii_only else before[1])
    word_after = after is not None and (after in _ASCII_WORD if ascii_only else (after.isalnum() or after == "_"))
    return (word_before != word_after) == (code is _c.AT_BOUNDARY)
