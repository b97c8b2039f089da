"""The parsed config as the checks and the build read it: every value with the schema's verdict.

The checks read values only through a ConfigView (or a ``QueueSettings`` on top of it). Reading
a value that did not pass the schema or whose ``${VAR}`` did not expand, or a mapping or list
holding one, raises Unchecked, and the check that read it is skipped: that value's problem is
reported already, and a check built on it could only guess. So one wrong value hides no other
problem of the file. The build reads a view with nothing invalid in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from jobd.config import convert, schema
from jobd.config.problems import Problem
from jobd.config.source import Source
from jobd.config.yamlsrc import Document, Path

ABSENT: Any = object()  # no value at a path, and no default given


class Unchecked(Exception):
    """A check read a value that did not pass the schema; the check is skipped."""


T = TypeVar("T")


def run_checks(checks: Iterable[Callable[[T], list[Problem]]], subject: T) -> list[Problem]:
    """The problems every check finds in ``subject``; a check that reads a value the schema
    refused is skipped (that value's problem is reported already), the others still run."""
    problems: list[Problem] = []
    for check in checks:
        try:
            problems += check(subject)
        except Unchecked:
            continue
    return problems


@dataclass(frozen=True)
class ConfigView:
    source: Source
    problems: tuple[Problem, ...]  # the document's own: ${VAR}s not expanded, the schema's
    invalid: frozenset[Path]  # the values those problems make unfit to read

    @classmethod
    def of(cls, source: Source) -> ConfigView:
        doc = source.doc
        problems = [Problem(doc.value_pos(p), p, message) for p, message in source.expand_errors]
        unexpanded = {p for p, _ in source.expand_errors}
        invalid = set(unexpanded)
        for finding in schema.check(doc):
            if finding.problem.path not in unexpanded:  # the schema saw the ${VAR} as written
                problems.append(finding.problem)
            invalid.update(finding.invalid)
        return cls(source, tuple(problems), frozenset(invalid))

    @property
    def doc(self) -> Document:
        return self.source.doc

    @property
    def data(self) -> dict[str, Any]:
        return self.source.data

    def require(self, path: Path) -> None:
        """Unchecked unless the value at ``path``, all it holds and all that holds it passed."""
        for bad in self.invalid:
            if bad[: len(path)] == path or path[: len(bad)] == bad:
                raise Unchecked(path)

    def has(self, path: Path) -> bool:
        """Whether a value is written at ``path`` (fit or not); Unchecked when what would hold
        it did not pass (a list where a mapping belongs)."""
        parent = path[:-1]
        if any(parent[: len(bad)] == bad for bad in self.invalid):
            raise Unchecked(path)
        return lookup(self.data, path) is not ABSENT

    def get(self, path: Path, default: Any = ABSENT) -> Any:
        """The value at ``path``, or ``default`` when there is none; Unchecked when it did not
        pass (see ``require``)."""
        self.require(path)
        return value_at(self.data, path, default)

    def pick(self, path: Path, names: Iterable[str]) -> dict[str, Any]:
        """The keys ``names`` of the mapping at ``path`` that are written, with their values."""
        return {name: self.get((*path, name)) for name in names if self.has((*path, name))}

    def secret(self, section: Path, name: str) -> str | None:
        """The secret ``name`` of ``section``, however given (``convert.secret``); Invalid when
        it cannot be had."""
        given = self.pick(section, convert.secret_keys(name))
        return convert.secret(given, name, self.source.base_dir, self.source.environ)

    def problem(self, path: Path, message: str) -> Problem:
        """A problem with the value at ``path``."""
        return Problem(self.doc.value_pos(path), path, message)


def lookup(data: Any, path: Path) -> Any:
    """The value at ``path`` in ``data``, or ABSENT."""
    for part in path:
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not (in_list or (isinstance(data, Mapping) and part in data)):
            return ABSENT
        data = data[part]
    return data


def value_at(data: Any, path: Path, default: Any = ABSENT) -> Any:
    """The value at ``path`` in ``data``, else ``default``; KeyError when there is neither."""
    value = lookup(data, path)
    if value is ABSENT:
        if default is ABSENT:
            raise KeyError(path)
        return default
    return value


def within(value: Any, path: Path) -> Iterable[Path]:
    """The path of every value ``value`` (found at ``path``) holds, at any depth."""
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, item in items:
        yield (*path, key)
        yield from within(item, (*path, key))
