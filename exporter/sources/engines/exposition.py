"""A hand-written parser for the Prometheus text format 0.0.4 and OpenMetrics 1.0.

Why not prometheus_client.parser: it reads about 3 MB/s (64 ms for a 211 KB vLLM page), and the
exporter must stay cheap beside an engine whose own CPU can be the bottleneck. Engines print the same
series on every scrape, so this parser caches, per target, each line's head (the text before the
last space: name and label block) with its parsed name and labels. A line whose head is known costs
one `rpartition`, one dict lookup and one `float`; any other line (comments, new series, timestamps,
exemplars, odd spacing, errors) goes through the full line parser, which also fills the cache.
Samples the caller does not want are dropped before their labels are parsed. It yields the same
samples as prometheus_client (tests/test_exposition.py proves it with hypothesis); `make bench`
measures the speed.

Timestamps come back in seconds: the text format writes integer milliseconds, OpenMetrics seconds.
A page is OpenMetrics when it has a `# EOF` line (mandatory there); nothing after it is read.

Hostile pages: every pass over the text is linear in its length (no search that restarts from a
line's start, no regular expression that backtracks over a label block; tests/test_hardening_parse.py
bounds the CPU time per byte), and a kept series whose labels exceed the limits below is rejected
(counted in `Exposition.rejected` by reason), never cached or passed on: a 1 MB label value would
otherwise be copied into every cache and every exported series of the target.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat

Labels = tuple[tuple[str, str], ...]
ParsedSample = tuple[str, Labels, float, float | None]
"""(name, labels sorted by name, value, timestamp in seconds or None)."""

# One stripped sample line. Label values are matched quote-aware (a `}`, `,` or `#` inside quotes is
# data); the inside of the label block is parsed (and cached) by parse_label_block. A value or
# timestamp never holds `_` (float() would read "1_0" as 10; the format does not allow it).
_SAMPLE_RE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"  # 1: metric name
    r'(?:[ \t]*\{([^"}]*(?:"[^"\\]*(?:\\.[^"\\]*)*"[^"}]*)*)\}[ \t]*|[ \t]+)'  # 2: label block
    r"([^ \t#_]+)"  # 3: value
    r"(?:[ \t]+([^ \t#_]+))?"  # 4: timestamp
    r"([ \t]+#.*)?\Z",  # 5: OpenMetrics exemplar, ignored like prometheus_client's sample value
    re.DOTALL,
)
_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"([^"\\\n]*(?:\\.[^"\\\n]*)*)"'
_LABEL_PAIR_RE = re.compile(rf"\s*({_LABEL_NAME})\s*=\s*{_LABEL_VALUE}\s*(?:,|\Z)")
_LABEL_BLOCK_RE = re.compile(
    rf'\s*(?:{_LABEL_NAME}\s*=\s*"[^"\\\n]*(?:\\.[^"\\\n]*)*"\s*(?:,\s*|\Z))*\Z'
)
_UNESCAPE_RE = re.compile(r"\\(.)")
_UNESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
# llama.cpp prints C's nan spellings; engines in the field do, so we accept them as NaN.
_NAN_SPELLINGS = frozenset({"nan", "-nan", "NaN", "-NaN", "-nan(ind)", "nan(ind)", "+nan"})

MAX_CACHED_LABEL_SETS = 20_000
MAX_CACHED_CHARS = 8 << 20
"""What a LabelCache may hold, in characters of its keys and values (about bytes for the ASCII that
engines print): a warm cache takes about 2.3 times its page (0.7 M for bench_parser's 290 KB
four-engine vLLM page), so pages up to about 3.5 MB stay warm. Entries alone do not bound memory
when every label value is long."""
MAX_CACHED_LINE_LENGTH = 64 << 10
"""Lines (heads, comments) longer than this are parsed every time, never cached: caching a few
fresh megabyte-long lines per scrape would only evict everything else."""
_ENTRY_OVERHEAD = 100
"""Approximate bytes of dict slot, tuple and str headers per cached entry, for the accounting."""
PAIR_OVERHEAD = 160
"""Approximate bytes of one parsed label pair beyond its characters: the pair's tuple, the str
headers of its name and value, its slot in the block's tuple. Counted per pair, since a block of
MAX_LABELS_PER_SERIES short labels holds ten times its raw text."""

MAX_LABEL_VALUE_LENGTH = 4096
"""Longest label value kept, in characters. 4096 is PATH_MAX: a model given as a local path fits
(real engines print values of at most a few hundred characters: model names, paths, LoRA names);
a longer one is no name but an attack or a bug, and it would be copied onto every normalized series
of the target and every cache on the way."""
MAX_LABEL_NAME_LENGTH = 256
"""Longest label name kept (engines use names of under 40 characters)."""
MAX_LABELS_PER_SERIES = 64
"""Most labels one series may carry (vLLM's cache_config_info, the widest seen, has about 20)."""
LABEL_VALUE_TOO_LONG = "label_value_too_long"
LABEL_NAME_TOO_LONG = "label_name_too_long"
TOO_MANY_LABELS = "too_many_labels"
# An OpenMetrics end line: `# EOF` with nothing but blanks around it on its line. One forward scan
# (re.M), so a line of many `# EOF` costs its length once.
_EOF_RE = re.compile(r"^[^\S\n]*# EOF[^\S\n]*$", re.M)


class ExpositionError(ValueError):
    """The payload is not a valid exposition (HTML error page, garbage, truncated line)."""

    def __init__(self, line_number: int, message: str) -> None:
        super().__init__(f"line {line_number}: {message}")
        self.line_number = line_number
        self.reason = message


@dataclass(slots=True)
class Exposition:
    samples: list[ParsedSample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    dropped_samples: int = 0
    dropped_names: set[str] = field(default_factory=set)
    """The names of the samples `keep` dropped (what the page has besides what was asked for)."""
    openmetrics_eof: bool = False
    rejected: dict[str, int] = field(default_factory=dict)
    """Kept samples refused for their labels, by reason (LABEL_VALUE_TOO_LONG, ...)."""


class TooManyNames(ValueError):
    """The page has more distinct metric names (TYPE lines and the names of dropped samples) than
    parse's `max_names`: raised as soon as the count passes it, before the rest of the page is read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} distinct metric names")
        self.limit = limit


class LabelLimitExceeded(Exception):
    """A label block over MAX_LABEL_VALUE_LENGTH, MAX_LABEL_NAME_LENGTH or MAX_LABELS_PER_SERIES."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def label_limit(raw: str, labels: Labels) -> str | None:
    """The limit a parsed label block breaks, or None."""
    if len(labels) > MAX_LABELS_PER_SERIES:
        return TOO_MANY_LABELS
    if len(raw) <= MAX_LABEL_NAME_LENGTH:  # no name or value can be longer than the block
        return None
    for name, value in labels:
        if len(value) > MAX_LABEL_VALUE_LENGTH:
            return LABEL_VALUE_TOO_LONG
        if len(name) > MAX_LABEL_NAME_LENGTH:
            return LABEL_NAME_TOO_LONG
    return None


class LabelCache:
    """Parsed label blocks keyed by their raw text, parsed line heads (`name{labels}`, the text
    before a sample line's value) keyed by theirs, and comment lines (what a TYPE line declares).
    Keep one per target across scrapes. Bounded: all are cleared when together they hold
    max_entries, or max_chars characters of keys and values, which costs one re-parse per series
    and never grows without limit (a cardinality bomb or fresh long label values cannot pin
    memory). Label blocks over the label limits are never cached."""

    __slots__ = ("_chars", "_comments", "_count", "_entries", "_heads", "_heads_keep", "max_chars", "max_entries")

    def __init__(self, max_entries: int = MAX_CACHED_LABEL_SETS, max_chars: int = MAX_CACHED_CHARS) -> None:
        self._entries: dict[str, Labels] = {}
        # head -> (name, labels); labels None when the `keep` filter drops the series
        self._heads: dict[str, tuple[str, Labels | None]] = {}
        # The filter whose verdicts _heads holds: another filter starts them afresh.
        self._heads_keep: Callable[[str], bool] | None = None
        # comment line -> (family, type) for a TYPE line, None for any other comment
        self._comments: dict[str, tuple[str, str] | None] = {}
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._chars = 0
        self._count = 0  # len(self), kept as it changes: a first parse asks once per line

    def get(self, raw: str, line_number: int) -> Labels:
        """The parsed block; raises ExpositionError when it is malformed, LabelLimitExceeded when
        it is over a label limit (neither is cached)."""
        labels = self._entries.get(raw)
        if labels is None:
            labels = parse_label_block(raw, line_number)
            over = label_limit(raw, labels)
            if over is not None:
                raise LabelLimitExceeded(over)
            # the key, the names and values parsed out of it, and the pairs' headers
            self._make_room(2 * len(raw) + PAIR_OVERHEAD * len(labels))
            self._entries[raw] = labels
        return labels

    def _remember_head(self, head: str, name: str, labels: Labels | None) -> None:
        if len(head) > MAX_CACHED_LINE_LENGTH:
            return
        if head not in self._heads:
            self._make_room(len(head))
        self._heads[head] = (name, labels)

    def _remember_comment(self, line: str, declared: tuple[str, str] | None) -> None:
        if len(line) > MAX_CACHED_LINE_LENGTH:
            return
        self._make_room(len(line))
        self._comments[line] = declared

    def _use_filter(self, keep: Callable[[str], bool] | None) -> None:
        # Bound methods of one set compare equal, so a normalizer's filter keeps its verdicts.
        if self._heads_keep != keep:
            self._count -= len(self._heads)
            self._heads.clear()
            self._heads_keep = keep

    def _make_room(self, chars: int = 0) -> None:
        """Account for an entry of `chars` characters about to be added, clearing all first when
        it would not fit."""
        chars += _ENTRY_OVERHEAD
        if self._count >= self.max_entries or self._chars + chars > self.max_chars:
            self._entries.clear()
            self._heads.clear()
            self._comments.clear()
            self._chars = 0
            self._count = 0
        self._chars += chars
        self._count += 1

    @property
    def chars(self) -> int:
        """The characters (about bytes) accounted to the cached entries."""
        return self._chars

    def __len__(self) -> int:
        return self._count


def _unescape(value: str) -> str:
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def parse_label_block(raw: str, line_number: int = 0) -> Labels:
    """Parse the text between `{` and `}` into sorted label pairs."""
    labels = _simple_label_block(raw)
    if labels is not None:
        return labels
    if not _LABEL_BLOCK_RE.match(raw):
        raise ExpositionError(line_number, f"malformed labels {{{raw[:80]}}}")
    pairs = _LABEL_PAIR_RE.findall(raw)
    if "\\" in raw:
        pairs = [(name, _unescape(value)) for name, value in pairs]
    if len({name for name, _ in pairs}) != len(pairs):
        raise ExpositionError(line_number, f"duplicate label name in {{{raw[:80]}}}")
    pairs.sort()
    return tuple(pairs)


def _simple_label_block(raw: str) -> Labels | None:
    """The common case, without regular expressions: `a="x",b="y"` (optional trailing comma), no
    escapes, no blanks around names. None sends anything else to the full parser."""
    if "\\" in raw:
        return None
    body = raw[:-1] if raw[-1:] == "," else raw
    if body[-1:] != '"':
        return None
    items = body[:-1].split('",')
    if raw.count('"') != 2 * len(items):  # then no value holds a quote: each item is name="value
        return None
    try:
        pairs = dict(map(str.split, items, repeat('="'), repeat(1)))
    except ValueError:  # an item without `="`
        return None
    if len(pairs) != len(items) or not "".join(pairs).isascii():
        return None
    if not all(map(str.isidentifier, pairs)):  # ASCII identifiers are exactly label names
        return None
    return tuple(sorted(pairs.items()))


def parse_value(text: str, line_number: int = 0) -> float:
    if "_" not in text:
        try:
            return float(text)
        except ValueError:
            pass
    if text in _NAN_SPELLINGS:
        return math.nan
    raise ExpositionError(line_number, f"bad value {text[:40]!r}")


def _split_at_eof(text: str) -> tuple[str, bool]:
    """The page up to an OpenMetrics `# EOF` line, and whether there was one."""
    if "# EOF" not in text:  # most pages (text format 0.0.4): one C-level scan
        return text, False
    match = _EOF_RE.search(text)
    if match is None:
        return text, False
    return text[: match.start()], True


def _diagnose(line: str) -> str:
    if line.startswith("<"):
        return f"not an exposition (HTML?): {line[:60]!r}"
    brace = line.find("{")
    if brace != -1 and "}" not in line[brace:]:
        return f"unterminated label block in {line[:60]!r}"
    return f"malformed sample line {line[:80]!r}"


class _Parser:
    """Everything the head cache does not answer: new series, comments, odd lines, errors."""

    __slots__ = ("cache", "dropped", "dropped_names", "keep", "limit", "max_names", "ms", "names", "rejected",
                 "samples", "types", "verdicts")

    def __init__(self, result: Exposition, cache: LabelCache, keep, limit: int, ms: float,
                 max_names: int | None = None) -> None:
        self.cache = cache
        self.dropped_names = result.dropped_names
        self.samples = result.samples
        self.types = result.types
        self.rejected = result.rejected
        self.keep = keep
        self.limit = limit
        self.ms = ms
        self.dropped = 0
        self.verdicts: dict[str, bool] = {}
        self.names: set[str] = set()
        self.max_names = max_names

    def count_names(self) -> None:
        """Raise TooManyNames once the page's declared and dropped names pass `max_names`: checked
        where a name can be new (a line the head cache does not know), so a page of made-up
        families stops after about that many lines, and its sets stop growing with it."""
        if self.max_names is not None and len(self.dropped_names) + len(self.types) > self.max_names:
            raise TooManyNames(self.max_names)

    def kept(self, name: str) -> bool:
        verdict = self.verdicts.get(name)
        if verdict is None:
            verdict = self.verdicts[name] = self.keep is None or bool(self.keep(name))
        return verdict

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def miss(self, line: str, head: str, value: str) -> None:
        """A line whose head is not cached. The common shape `name{labels} value` is split with
        string methods; comments are looked up whole; everything else goes to the full line parser."""
        if line[:1] == "#":
            self.comment(line)
            return
        if head[-1:] == "}":
            brace = head.find("{")
            if brace < 1:
                self.line(line)
                return
            name = head[:brace]
            raw = head[brace + 1 : -1]
        else:
            name = head
            raw = ""
        if name not in self.names:
            if not _NAME_RE.match(name):
                self.line(line)
                return
            self.names.add(name)
        if "_" in value:
            self.line(line)
            return
        try:
            number = float(value)
        except ValueError:
            self.line(line)
            return
        cache = self.cache
        if self.keep is not None and not self.kept(name):
            self.dropped += 1
            self.dropped_names.add(name)
            self.count_names()
            cache._remember_head(head, name, None)
            return
        samples = self.samples
        if len(samples) == self.limit:
            self.dropped += 1
            return
        if raw:
            labels = cache._entries.get(raw)
            if labels is None:
                try:
                    labels = cache.get(raw, 0)
                except ExpositionError:  # not a plain label block: an exemplar, or an error
                    self.line(line)
                    return
                except LabelLimitExceeded as over:
                    self.reject(over.reason)
                    return
        else:
            labels = ()
        samples.append((name, labels, number, None))
        cache._remember_head(head, name, labels)

    def comment(self, line: str) -> None:
        """A line starting with '#': HELP and TYPE lines repeat on every page, so each is read once."""
        try:
            declared = self.cache._comments[line]
        except KeyError:  # a line not seen yet (a hit, the usual case, costs no more than get())
            declared = _declared_type(line.strip())
            self.cache._remember_comment(line, declared)
        if declared is not None:
            self.types[declared[0]] = declared[1]
            self.count_names()

    def line(self, line: str) -> None:
        stripped = line.strip()
        if not stripped:
            return
        if stripped[0] == "#":
            declared = _declared_type(stripped)
            if declared is not None:
                self.types[declared[0]] = declared[1]
                self.count_names()
            return
        match = _SAMPLE_RE.match(stripped)
        if match is None:
            raise ExpositionError(0, _diagnose(stripped))
        name, raw, value, timestamp, exemplar = match.groups()
        if not self.kept(name):
            self.dropped += 1
            self.dropped_names.add(name)
            self.count_names()
            return
        if len(self.samples) == self.limit:
            self.dropped += 1
            return
        try:
            labels = self.cache.get(raw, 0) if raw else ()
        except LabelLimitExceeded as over:
            self.reject(over.reason)
            return
        number = parse_value(value)
        if timestamp is None:
            self.samples.append((name, labels, number, None))
            return
        try:
            seconds = float(timestamp) / self.ms
        except ValueError:
            raise ExpositionError(0, f"bad timestamp {timestamp[:40]!r}") from None
        self.samples.append((name, labels, number, seconds))


def _declared_type(comment: str) -> tuple[str, str] | None:
    """(family, type) of a `# TYPE` line, None for other comments (`# TYPES of ...` is one, as in
    prometheus_client); a TYPE line without a family and a type raises."""
    if not comment.startswith("# TYPE"):
        return None
    parts = comment.split(None, 3)
    if len(parts) < 2 or parts[1] != "TYPE":
        return None
    if len(parts) < 4:
        raise ExpositionError(0, "malformed TYPE line")
    return parts[2], parts[3].strip()


def parse(
    text: str,
    *,
    keep: Callable[[str], bool] | None = None,
    label_cache: LabelCache | None = None,
    max_samples: int | None = None,
    max_names: int | None = None,
) -> Exposition:
    """Parse an exposition. `keep(name)` filters samples before their labels are parsed;
    dropped ones are only counted. With a `label_cache`, `keep` must be pure: its verdicts are
    cached with the cache's heads while an equal `keep` is passed (a frozenset's __contains__). \
`max_samples` bounds the kept samples (cardinality bomb):
    the rest are counted in `dropped_samples`. `max_names` bounds the distinct names of TYPE lines
    and dropped samples (a page of made-up families): past it TooManyNames is raised at once."""
    result = Exposition()
    body, result.openmetrics_eof = _split_at_eof(text)
    lines = body.split("\n")
    cache = label_cache if label_cache is not None else LabelCache()
    limit = max_samples if max_samples is not None else -1
    cache._use_filter(keep)
    parser = _Parser(result, cache, keep, limit, 1.0 if result.openmetrics_eof else 1000.0, max_names)
    miss = parser.miss
    get = cache._heads.get
    dropped_name = result.dropped_names.add
    samples = result.samples
    append = samples.append
    line = ""
    try:
        if keep is None and (limit < 0 or limit >= len(lines)):
            for line in lines:
                head, _, value = line.rpartition(" ")
                entry = get(head)
                if entry is not None and "_" not in value:
                    try:
                        # Without a `keep` filter no head holds None labels (only a dropped series does).
                        append((entry[0], entry[1], float(value), None))  # type: ignore[arg-type]
                        continue
                    except ValueError:
                        pass
                miss(line, head, value)
        else:
            for line in lines:
                head, _, value = line.rpartition(" ")
                entry = get(head)
                if entry is not None and "_" not in value:
                    labels = entry[1]
                    if labels is None:  # this filter's verdict on the series, cached with its head
                        parser.dropped += 1
                        dropped_name(entry[0])
                        continue
                    if len(samples) != limit:
                        try:
                            append((entry[0], labels, float(value), None))
                            continue
                        except ValueError:
                            pass
                miss(line, head, value)
    except ExpositionError as error:
        # The first line equal to the failing one is where it failed (equal lines fail alike).
        raise ExpositionError(lines.index(line) + 1, error.reason) from None
    # Lines whose heads were cached skip the check in the loop (at most the cache's entries of them).
    parser.count_names()
    result.dropped_samples = parser.dropped
    return result
