"""YAML with positions: the parsed document plus the line and column of every key and value.

Config errors must point at ``FILE:LINE:COL``, so the document is composed into nodes (which
carry marks) and built into plain Python values here, recording where each path came from.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]
IsText = Callable[[Path], bool]  # whether a path's value is text, never a YAML number or boolean


@dataclass(frozen=True, order=True)
class Pos:
    line: int  # 1-based
    col: int  # 1-based


@dataclass
class Document:
    data: Any
    values: dict[Path, Pos] = field(default_factory=dict)  # where each value starts
    keys: dict[Path, Pos] = field(default_factory=dict)  # where each mapping key is written

    def key_pos(self, path: Path) -> Pos:
        """The position of the key naming ``path`` (its value's, or 1:1 for the root)."""
        while path:
            if path in self.keys:
                return self.keys[path]
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return Pos(1, 1)

    def value_pos(self, path: Path) -> Pos:
        return self.values.get(path) or self.key_pos(path)


class SourceError(Exception):
    """The file cannot be read as YAML at all; ``pos`` is where, when known."""

    def __init__(self, message: str, pos: Pos | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


class ExpandError(Exception):
    pass


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(text: str, environ: dict[str, str]) -> str:
    """``${VAR}`` and ``${VAR:-default}`` from ``environ``; ``$$`` is a literal ``$``."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        value = environ.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise ExpandError(
                    f"environment variable {name} is not set; set it, or write "
                    f"${{{name}:-default}} to give a default"
                )
            return default
        return value

    return _VAR.sub(substitute, text)


def _pos(mark: yaml.Mark) -> Pos:
    return Pos(mark.line + 1, mark.column + 1)


def _never(path: Path) -> bool:
    return False


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, environ: dict[str, str], is_text: IsText) -> None:
        self.loader = loader
        self.environ = environ
        self.is_text = is_text
        self.doc = Document(data=None)
        self.expand_errors: list[tuple[Path, str]] = []
        self.built = 0  # values built, each alias's again

    def build(self, node: yaml.Node, path: Path) -> Any:
        # An alias is built again where it is used: inside its own anchor it would never end,
        # and aliases of aliases grow exponentially ("billion laughs").
        if len(path) > MAX_DEPTH:
            why = f"{TOO_DEEP} once aliases are expanded"
            raise SourceError(f"{why} (an alias inside its own anchor?)", _pos(node.start_mark))
        self.built += 1
        if self.built > MAX_VALUES:
            why = f"more than {MAX_VALUES} values once aliases are expanded"
            raise SourceError(f"{why}; use fewer aliases of aliases", _pos(node.start_mark))
        self.doc.values[path] = _pos(node.start_mark)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        self.loader.flatten_mapping(node)  # YAML merge keys (<<: *anchor)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._construct(key_node)
            if not isinstance(key, str):  # its kind, never the key: it may hold a secret
                raise SourceError(
                    f"keys must be strings, not {kind_of(key)}; quote the key",
                    _pos(key_node.start_mark),
                )
            if key in result:
                raise SourceError(
                    f"duplicate key {'.'.join(map(str, (*path, key)))!r}; remove one of them",
                    _pos(key_node.start_mark),
                )
            self.doc.keys[(*path, key)] = _pos(key_node.start_mark)
            result[key] = self.build(value_node, (*path, key))
        return result

    def _scalar(self, node: yaml.ScalarNode, path: Path) -> Any:
        if self.is_text(path):  # exactly the text written: 0755, off and ~ stay as they are
            return self._expand(node.value, path)
        value = self._construct(node)
        if not isinstance(value, str) or "$" not in value:
            return value
        expanded = self._expand(value, path)
        if node.style is None and expanded != value:
            return self._retype(expanded, node)
        return expanded

    def _construct(self, node: yaml.Node, text: str | None = None) -> Any:
        """The node's value as YAML types it (or ``text``'s, read as a plain scalar there)."""
        if text is not None:
            tag = self.loader.resolve(yaml.ScalarNode, text, (True, False))
            node = yaml.ScalarNode(tag, text, node.start_mark, node.end_mark)
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except Exception:  # !!int abc, !!int with no value, 0x_, !!bool x: never the value
            raise SourceError(
                f"the value is not a valid {node.tag.rpartition(':')[2]} (as its tag or its form "
                "says it is); fix it, or quote it to make it a string",
                _pos(node.start_mark),
            ) from None

    def _expand(self, text: str, path: Path) -> str:
        if "$" not in text:
            return text
        try:
            return expand(text, self.environ)
        except ExpandError as exc:
            self.expand_errors.append((path, str(exc)))
            return text

    def _retype(self, text: str, node: yaml.ScalarNode) -> Any:
        """An unquoted ${PORT:-6379} becomes the number it spells, as if written so. Only the
        plain scalar types are read (numbers, booleans, null), never YAML structure: the text
        of a variable holding '3 # x', 'a: b' or '{x}' stays that text."""
        value = self._construct(node, text)
        return value if isinstance(value, int | float | bool) or value is None else text


def load(
    text: str, environ: dict[str, str], is_text: IsText = _never
) -> tuple[Document, list[tuple[Path, str]]]:
    """Parse ``text``; returns the document and the ``${VAR}`` expansion errors found in it.

    Scalars at paths where ``is_text`` holds are their text as written (then expanded); the
    others are typed as YAML types them, an unquoted one again after ``${VAR}`` expansion.

    Raises SourceError for anything that stops the file from being read as YAML.
    """
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # ReaderError: control characters
        raise SourceError(f"not a readable YAML text file: {exc}".splitlines()[0]) from None
    if (deep := _too_deep(text)) is not None:
        loader.dispose()
        raise SourceError(f"{TOO_DEEP}; a config needs a handful", deep)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = exc.problem or exc.context or "invalid YAML"
            if exc.context and exc.problem:
                problem = f"{problem} ({exc.context})"
            raise SourceError(
                f"YAML syntax error: {_unquoted(problem)}", _pos(mark) if mark else None
            ) from None
        except yaml.YAMLError as exc:  # ReaderError: control characters, binary data
            raise SourceError(f"not a readable YAML text file: {exc}".splitlines()[0]) from None
        if node is None:
            raise SourceError(
                "the file is empty; a config needs at least a 'queues:' mapping", Pos(1, 1)
            )
        builder = _Builder(loader, environ, is_text)
        try:
            data = builder.build(node, ())
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            raise SourceError(_unquoted(str(exc.problem)), _pos(mark) if mark else None) from None
        builder.doc.data = data
        return builder.doc, builder.expand_errors
    finally:
        loader.dispose()


MAX_DEPTH = 100  # mappings and sequences one in another; a config needs under ten
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep"  # the start of both messages
MAX_VALUES = 1_000_000  # values of a config, aliases expanded (a large one has some thousands)


def _too_deep(text: str) -> Pos | None:
    """Where ``text`` nests deeper than MAX_DEPTH, if it does: building such a document would
    exhaust Python's stack (a RecursionError, not a config problem). PyYAML's parser keeps a
    stack of its own, so its events are counted before anything recurses."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    return _pos(event.start_mark)
            elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return None  # the parse proper says what is wrong, and where
    return None


# A token PyYAML names ('<block end>', ',', '\\t'), kept; else a quoted text of 3 or more
# characters. Left to right, so "expected ',' or ']'" is two tokens, not the text "' or '".
_QUOTED = re.compile(r"'(<[a-z ]+>|\\?[^'])'|'[^']{3,}'")
HINTS = (  # (words of PyYAML's message, what to do), the first that matches
    ("'\\t'", "indent with spaces: YAML does not take tabs"),
    ("flow sequence", "a [ list is not closed: add its ], or quote a value holding , or ]"),
    ("flow mapping", "a { mapping is not closed: add its }, or quote a value holding , or }"),
    ("quoted scalar", "a quoted value is not closed: add its closing quote"),
    ("mapping values are not allowed", "quote a value holding ': ', or check the indentation"),
    ("<block end>", "check this line's indentation against the lines above it"),
)


def _unquoted(problem: str) -> str:
    """A YAML error without the text it quotes (an alias, an anchor, a tag): that text is what
    was written in the file, and where a secret was meant (``password: *Hunter2``) it is the
    secret. A token PyYAML names, or a quoted character (a tab, a '%'), stays: it says what to
    fix. Then a hint, for the mistakes people make most."""
    shown = _QUOTED.sub(
        lambda m: m.group() if m.group(1) else "(the text is not shown: it may be a secret)",
        problem,
    )
    hint = next((what for words, what in HINTS if words in problem), None)
    return f"{shown}; hint: {hint}" if hint else shown


def kind_of(value: Any) -> str:
    """What ``value`` is, in words that do not quote it."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, datetime.date):  # YAML's timestamps (2024-01-01) are dates
        return "a date"
    if isinstance(value, str):
        return "a string"
    return {dict: "a mapping", list: "a list", tuple: "a list"}.get(type(value), "a value")
