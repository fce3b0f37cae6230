"""Find the metric names a PromQL expression reads, and the label names it matches or groups by,
without a regex scan of the whole text.

A small tokenizer walks the expression and keeps only identifiers in metric position. It skips
string literals, label matchers `{...}` (names, operators, values), range and subquery brackets
`[5m]`, `[1h:1m]`, numbers and durations, Grafana variables (`$job`, `${gpu}`, `$__rate_interval`),
functions and aggregations (an identifier followed by `(`, or an aggregation followed by `by`/`without`), \
keywords (`and`, `or`, `unless`,
`bool`, `offset`, `on`, `ignoring`, `group_left`, `group_right`, `by`, `without`, `inf`, `nan`)
and the label lists that follow `by`, `without`, `on`, `ignoring`, `group_left` and
`group_right`. A `{__name__="x"}` matcher counts as metric x.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "on", "ignoring", "group_left", "group_right",
    "by", "without", "inf", "nan", "start", "end",
})
# Keywords followed by a parenthesised label list (for group_left/right the list is optional).
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Aggregation operators may put their `by (...)`/`without (...)` clause before the parenthesis.
AGGREGATIONS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile", "limitk", "limit_ratio",
})

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|[0-9][0-9A-Za-z_.]*(?:[eE][+-]?[0-9]+)?")
_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|[A-Za-z0-9_]+)")
_NAME_MATCHER = re.compile(r"__name__\s*=\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')")


class PromqlSyntaxError(ValueError):
    pass


def _skip_string(expr: str, i: int) -> int:
    quote = expr[i]
    j = i + 1
    while j < len(expr):
        if expr[j] == "\\" and quote != "`":
            j += 2
            continue
        if expr[j] == quote:
            return j + 1
        j += 1
    raise PromqlSyntaxError(f"unterminated string at {i}: {expr[i:i + 30]!r}")


def _skip_block(expr: str, i: int, open_: str, close: str) -> tuple[int, str]:
    """Skip from expr[i] == open_ to just after the matching close; strings inside are skipped."""
    depth, j = 0, i
    while j < len(expr):
        c = expr[j]
        if c in "\"'`":
            j = _skip_string(expr, j)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1, expr[i + 1:j]
        j += 1
    raise PromqlSyntaxError(f"unbalanced {open_!r} at {i}: {expr[i:i + 30]!r}")


def _next_significant(expr: str, i: int) -> int:
    while i < len(expr) and expr[i].isspace():
        i += 1
    return i


def metric_names(expr: str) -> set[str]:
    """The metric (or recording rule) names `expr` selects."""
    names: set[str] = set()
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":
            nl = expr.find("\n", i)
            i = len(expr) if nl < 0 else nl + 1
        elif c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "{":
            i, body = _skip_block(expr, i, "{", "}")
            for matcher in _NAME_MATCHER.finditer(body):
                names.add(matcher.group(1)[1:-1])
        elif c == "[":
            i, _ = _skip_block(expr, i, "[", "]")
        elif c == "$":
            m = _VARIABLE.match(expr, i)
            if not m:
                raise PromqlSyntaxError(f"bad variable at {i}: {expr[i:i + 30]!r}")
            i = m.end()
        elif c.isdigit() or (c == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            m = _NUMBER.match(expr, i if c.isdigit() else i + 1)
            i = m.end() if m else i + 1
        elif _IDENT.match(expr, i):
            m = _IDENT.match(expr, i)
            assert m is not None
            word, i = m.group(0), m.end()
            nxt = _next_significant(expr, i)
            lowered = word.lower()
            if lowered in LABEL_LIST_KEYWORDS:
                if nxt < len(expr) and expr[nxt] == "(":
                    i, _ = _skip_block(expr, nxt, "(", ")")
                continue
            if lowered in KEYWORDS:
                continue
            if nxt < len(expr) and expr[nxt] == "(":
                continue  # a function or an aggregation
            if lowered in AGGREGATIONS:
                follower = _IDENT.match(expr, nxt)
                if follower and follower.group(0).lower() in ("by", "without"):
                    continue
            names.add(word)
        else:
            i += 1  # operators, parentheses, commas, @
    return names


_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def _blank_strings(text: str) -> str:
    """`text` with every string literal emptied, so a value never reads as a label name."""
    out, i = [], 0
    while i < len(text):
        if text[i] in "\"'`":
            end = _skip_string(text, i)
            out.append('""')
            i = end
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def label_names(expr: str) -> set[str]:
    """The label names `expr` matches on (`{cluster=~"..."}`) or lists after by, without, on, ignoring,
    group_left and group_right: what a renamed label must reach (the mixin's cluster_label)."""
    names: set[str] = set()
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "{":
            i, body = _skip_block(expr, i, "{", "}")
            names |= {m.group(1) for m in _MATCHER_LABEL.finditer(_blank_strings(body))} - {"__name__"}
        elif c == "[":
            i, _ = _skip_block(expr, i, "[", "]")
        elif c == "$":
            m = _VARIABLE.match(expr, i)
            i = m.end() if m else i + 1
        elif _IDENT.match(expr, i) and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:.")):
            m = _IDENT.match(expr, i)
            assert m is not None
            word, i = m.group(0), m.end()
            nxt = _next_significant(expr, i)
            if word.lower() in LABEL_LIST_KEYWORDS and nxt < len(expr) and expr[nxt] == "(":
                i, body = _skip_block(expr, nxt, "(", ")")
                names |= {label.strip() for label in body.split(",") if label.strip()}
        else:
            i += 1
    return names
