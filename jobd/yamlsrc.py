"""YAML with positions: the parsed document plus the line and column of every key and value.

Config errors must point at ``FILE:LINE:COL``, so the document is composed into nodes (which
carry marks) and built into plain Python values here, recording where each path came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]


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


class _Builder:
    def __init__(self, loader: yaml.SafeLoader, environ: dict[str, str]) -> None:
        self.loader = loader
        self.environ = environ
        self.doc = Document(data=None)
        self.expand_errors: list[tuple[Path, str]] = []

    def build(self, node: yaml.Node, path: Path) -> Any:
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
            key = self.loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise SourceError(
                    f"keys must be strings, not {type(key).__name__} {key!r}; quote the key",
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
        value = self.loader.construct_object(node, deep=True)
        if not isinstance(value, str) or "$" not in value:
            return value
        try:
            expanded = expand(value, self.environ)
        except ExpandError as exc:
            self.expand_errors.append((path, str(exc)))
            return value
        if node.style is None and expanded != value:
            # An unquoted ${PORT:-6379} should become the number it spells, as if written so.
            try:
                retyped = yaml.safe_load(expanded)
            except yaml.YAMLError:
                return expanded
            if isinstance(retyped, int | float | bool) or retyped is None:
                return retyped
        return expanded


def load(text: str, environ: dict[str, str]) -> tuple[Document, list[tuple[Path, str]]]:
    """Parse ``text``; returns the document and the ``${VAR}`` expansion errors found in it.

    Raises SourceError for anything that stops the file from being read as YAML.
    """
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # ReaderError: control characters
        raise SourceError(f"not a readable YAML text file: {exc}".splitlines()[0]) from None
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = exc.problem or exc.context or "invalid YAML"
            if exc.context and exc.problem:
                problem = f"{problem} ({exc.context})"
            raise SourceError(
                f"YAML syntax error: {problem}", _pos(mark) if mark else None
            ) from None
        except yaml.YAMLError as exc:  # ReaderError: control characters, binary data
            raise SourceError(f"not a readable YAML text file: {exc}".splitlines()[0]) from None
        if node is None:
            raise SourceError(
                "the file is empty; a config needs at least a 'queues:' mapping", Pos(1, 1)
            )
        builder = _Builder(loader, environ)
        try:
            data = builder.build(node, ())
        except yaml.constructor.ConstructorError as exc:
            mark = exc.problem_mark
            raise SourceError(str(exc.problem), _pos(mark) if mark else None) from None
        builder.doc.data = data
        return builder.doc, builder.expand_errors
    finally:
        loader.dispose()
