"""The config file as a document: its bytes read as UTF-8 text, parsed as YAML with the position
of every value, ``${VAR}`` expanded.

A file that is no document at all (unreadable, binary, not UTF-8, not YAML, not a mapping)
raises ConfigError at once with its one problem: there is nothing further to check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any

from jobd.config import yamlsrc
from jobd.config.problems import ConfigError, Problem
from jobd.config.schema import is_text
from jobd.config.yamlsrc import kind_of


@dataclass(frozen=True)
class Source:
    path: str  # as given
    doc: yamlsrc.Document
    expand_errors: tuple[tuple[yamlsrc.Path, str], ...]  # ${VAR}s that did not expand: why
    environ: Mapping[str, str]
    base_dir: str  # the config file's folder: relative paths in it resolve against this

    @property
    def data(self) -> dict[str, Any]:
        return self.doc.data  # a mapping: parse() refuses anything else


def read_text(path: str) -> str:
    """The config file's text; raises ConfigError with a one-line reason when unreadable."""
    try:
        raw = FilePath(path).read_bytes()
    except IsADirectoryError:
        raise ConfigError(path, [Problem.whole_file("is a directory, not a config file")]) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(path, [Problem.whole_file(f"cannot read the file: {reason}")]) from None
    if b"\x00" in raw:
        raise ConfigError(path, [Problem.whole_file("is a binary file, not a YAML config")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            path, [Problem.whole_file(f"is not UTF-8 text (byte {exc.start}); save it as UTF-8")]
        ) from None


def parse(path: str, environ: Mapping[str, str] | None = None, text: str | None = None) -> Source:
    """The file at ``path`` (or ``text``, as read from there earlier), parsed, with ``${VAR}``
    expanded from ``environ`` (default: this process's environment)."""
    environ = dict(os.environ if environ is None else environ)
    text = read_text(path) if text is None else text
    try:
        doc, expand_errors = yamlsrc.load(text, environ, is_text)
    except yamlsrc.SourceError as exc:
        raise ConfigError(path, [Problem(exc.pos or yamlsrc.Pos(1, 1), (), exc.message)]) from None
    if not isinstance(doc.data, dict):
        kind = kind_of(doc.data)  # not the value: it may be a secret
        message = f"the top level must be a mapping with a 'queues:' key, not {kind}"
        raise ConfigError(path, [Problem(yamlsrc.Pos(1, 1), (), message)])
    base_dir = str(FilePath(path).resolve().parent)
    return Source(path, doc, tuple(expand_errors), environ, base_dir)
