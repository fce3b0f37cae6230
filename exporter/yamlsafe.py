"""YAML from files a user or a config-management system writes (--config, --web.config.file),
loaded with bounds so that a hostile or broken file costs little and fails in one short line.

yaml.safe_load builds no objects of arbitrary classes but still expands aliases: a "billion
laughs" file of a few hundred bytes (nine aliases of nine aliases of ...) stands for billions of
nodes. PyYAML shares the aliased objects, so loading stays small, but anything that then walks or
prints the value (a validation error quoting it) expands it: seen as 11 GB of RSS and a 2 GB
error line. So the loader counts the nodes the document stands for, with every alias counted as
the whole subtree it refers to, and stops as soon as a bound is passed, before building more.

A key written twice in one mapping is refused, at any depth: PyYAML keeps the last one silently, so
a web config with `basic_auth_users: {...}` and later `basic_auth_users: {}` started with no
authentication, and a second `engines: []` ran with no sources. The Prometheus exporter-toolkit,
whose web config format we follow, refuses it too (yaml.UnmarshalStrict). Keys are compared as
the values they construct to, as the dict that receives them would (`1:` and `true:` collide, `1:`
and `"1":` do not). A merge key (`<<: *defaults`) is no duplicate of the keys it brings: an
explicit key overriding a merged one is the point of merging; `<<` written twice is one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NoReturn

import yaml

from exporter.safefile import read_regular_file

MAX_YAML_BYTES = 1 << 20  # a config file is a few KiB; refused before parsing, so parse time stays bounded
MAX_YAML_ALIASES = 100  # anchors/merge keys for shared target defaults need a handful
MAX_YAML_NODES = 100_000  # nodes the document stands for, aliases expanded
MAX_YAML_CHARS = 2 * MAX_YAML_BYTES  # characters of values it stands for: aliases may repeat long ones
MAX_YAML_DEPTH = 64  # the composer recurses per level; real configs nest 4 or 5 deep
MAX_YAML_SCALAR_CHARS = 16 * 1024  # paths, URLs and hashes are short; YAML 1.1's base-60 ints are quadratic
MAX_ECHO_CHARS = 200  # how much of a file's own content an error line may quote


class YamlLoadError(ValueError):
    """Why a YAML file was not loaded, in one bounded line (the caller adds the file name)."""


class DuplicateKeyError(yaml.composer.ComposerError):
    """A key written twice in one mapping; its problem text names the key, where the mapping sits
    in the document, and both lines."""


_MERGE_TAG = "tag:yaml.org,2002:merge"
_MERGE_KEY = object()  # the identity of every `<<`: written twice is a duplicate
_NULL_KEY = object()  # `null:`, `~:` and an empty key are one key
_LAST_WINS = "the last one would silently replace the first"
_MERGE_ADVICE = "merge several mappings with one `<<: [*a, *b]`"
MAX_PATH_SHOWN = 120  # characters of a key's place (engines[0].basic_auth) an error shows


def shorten(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text` on one line and at most about `limit` characters, saying how much was cut."""
    text = " ".join(text.split("\n")).replace("\r", " ")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


if TYPE_CHECKING:
    # What the mixin calls (peek_event, anchors, compose_node...) is the composer's it is mixed in
    # front of; PyYAML has no type hints, so to the checker this base is Any.
    from yaml.composer import Composer as _ComposerBase
else:
    _ComposerBase = object


class _Bounds(_ComposerBase):
    """The counting composer step, mixed in front of PyYAML's Composer: refuses a document over
    MAX_YAML_ALIASES aliases, MAX_YAML_NODES nodes or MAX_YAML_CHARS characters of scalars once
    aliases are expanded, MAX_YAML_DEPTH levels, a scalar over MAX_YAML_SCALAR_CHARS, and
    recursive aliases (`&a [*a]`), as soon as it meets them."""

    def _init_bounds(self) -> None:
        self._aliases = 0
        # Nodes and scalar characters composed so far, each alias counted as its target's whole size.
        self._expanded = [0, 0]
        self._open: list[list[int]] = []  # per node being composed: the expanded size of its children so far
        self._sizes: dict[int, tuple[int, int]] = {}  # id(anchored node) -> its expanded size, once complete
        self._path: list[str] = []  # where the node being composed sits: keys and [indices]

    def _refuse(self, problem: str, mark: Any) -> NoReturn:
        raise yaml.composer.ComposerError(None, None, problem, mark)

    def _count(self, nodes: int, chars: int, mark: Any) -> None:
        self._expanded[0] += nodes
        self._expanded[1] += chars
        if self._expanded[0] > MAX_YAML_NODES:
            self._refuse(f"more than {MAX_YAML_NODES} nodes once aliases are expanded (an alias bomb?)", mark)
        if self._expanded[1] > MAX_YAML_CHARS:
            self._refuse(f"more than {MAX_YAML_CHARS} characters of values once aliases are expanded "
                         "(an alias bomb?)", mark)
        if self._open:
            self._open[-1][0] += nodes
            self._open[-1][1] += chars

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                self._refuse(f"more than {MAX_YAML_ALIASES} aliases", event.start_mark)
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined one is the composer's own error
                size = self._sizes.get(id(target))
                if size is None:
                    self._refuse("an alias refers to a node that contains it", event.start_mark)
                self._count(*size, event.start_mark)
            return super().compose_node(parent, index)
        if len(self._open) >= MAX_YAML_DEPTH:
            self._refuse(f"nested more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
        chars = len(event.value) if isinstance(event, yaml.ScalarEvent) else 0
        if chars > MAX_YAML_SCALAR_CHARS:
            self._refuse(f"a value longer than {MAX_YAML_SCALAR_CHARS} characters", event.start_mark)
        self._count(1, chars, event.start_mark)
        self._open.append([0, 0])
        self._path.append(_step(parent, index))
        try:
            node = super().compose_node(parent, index)
        finally:
            children = self._open.pop()
            self._path.pop()
        if event.anchor is not None:
            self._sizes[id(node)] = (1 + children[0], chars + children[1])
        if self._open:  # the node itself was added to its parent by _count, its children now
            self._open[-1][0] += children[0]
            self._open[-1][1] += children[1]
        return node

    def compose_mapping_node(self, anchor: Any) -> Any:
        node = super().compose_mapping_node(anchor)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            identity = _key_identity(self, key_node)
            if identity is None:
                continue  # a sequence or mapping as a key: the constructor refuses it (unhashable)
            first = seen.setdefault(identity, key_node)
            if first is not key_node:
                where = "".join(self._path).lstrip(".")
                mark = key_node.start_mark
                raise DuplicateKeyError(
                    None, None, f"duplicate key {shorten(repr(key_node.value), 64)} at line {mark.line + 1}, column "
                    f"{mark.column + 1}{f' in {shorten(where, MAX_PATH_SHOWN)}' if where else ''} (first at line "
                    f"{first.start_mark.line + 1}): {_MERGE_ADVICE if identity is _MERGE_KEY else _LAST_WINS}", None)
        return node


def _step(parent: Any, index: Any) -> str:
    """The path element of a node composed under `parent`: .key in a mapping, [i] in a sequence."""
    if isinstance(parent, yaml.SequenceNode) and isinstance(index, int):
        return f"[{index}]"
    if isinstance(parent, yaml.MappingNode) and isinstance(index, yaml.ScalarNode):
        text = index.value if index.value.isprintable() else repr(index.value)[1:-1]  # no escapes to a terminal
        return "." + shorten(text, 64)
    return ""


def _key_identity(loader: Any, node: Any) -> Any:
    """What a scalar key constructs to, compared as the receiving dict compares its keys (so
    `1`, `0x1` and `true` collide, `1` and `"1"` do not); None for a key that is no scalar."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    if node.tag == _MERGE_TAG:
        return _MERGE_KEY
    construct = yaml.constructor.SafeConstructor.yaml_constructors.get(node.tag)
    if construct is None:  # a tag of its own: the constructor refuses it
        return (node.tag, node.value)
    try:
        # The scalar constructors read only the node (no state of the loader is changed).
        value = construct(loader, node)
        hash(value)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError):  # the constructor will say why
        return (node.tag, node.value)
    if value is None:
        return _NULL_KEY
    return value if value == value else (node.tag, "nan")  # NaN equals nothing, itself included


class BoundedSafeLoader(_Bounds, yaml.SafeLoader):
    """yaml.SafeLoader (pure Python) with the bounds above."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._init_bounds()


if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser

    class _BoundedCSafeLoader(_Bounds, yaml.composer.Composer, CParser, yaml.constructor.SafeConstructor,
                              yaml.resolver.Resolver):
        """The same with libyaml's scanner and parser (4x faster on a 1 MiB file); PyYAML's own
        composer, ahead of CParser's in the MRO, so that the bounds apply."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._init_bounds()

    _LOADER: type = _BoundedCSafeLoader
else:  # PyYAML built without libyaml
    _LOADER = BoundedSafeLoader


def _describe(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError):
        what = error.problem or error.context or type(error).__name__
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return shorten(f"{what}{where}")
    return shorten(str(error) or type(error).__name__)


def load_yaml_file(path: str | os.PathLike[str]) -> Any:
    """The one document in the UTF-8 YAML file at `path` (None when empty); YamlLoadError if the
    file cannot be read, is not a regular file (a FIFO would block for ever: exporter/safefile.py),
    is over MAX_YAML_BYTES, or is not YAML within the bounds above."""
    try:
        raw = read_regular_file(path, MAX_YAML_BYTES)
    except OSError as error:
        raise YamlLoadError(error.strerror or str(error)) from None
    except ValueError:  # a NUL in the name (YAML and LLM_EXPORTER_CONFIG can hold one)
        raise YamlLoadError("not a file name (it contains a NUL byte)") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise YamlLoadError(f"not UTF-8 (byte {error.start})") from None
    loader = _LOADER(text)
    try:
        return loader.get_single_data()
    except DuplicateKeyError as error:
        raise YamlLoadError(error.problem) from None
    except yaml.YAMLError as error:
        raise YamlLoadError(f"not valid YAML ({_describe(error)})") from None
    except (ValueError, RecursionError) as error:  # e.g. an integer over Python's digit limit
        raise YamlLoadError(f"not valid YAML ({shorten(str(error) or type(error).__name__)})") from None
    finally:
        loader.dispose()
