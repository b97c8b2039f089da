"""A config problem, as `jobd validate` prints it: where (line, column, dotted path) and what is
wrong; and ConfigError, which carries every problem of one file, in file order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobd.config.redact import redact_urls
from jobd.config.yamlsrc import Path, Pos


@dataclass(frozen=True, order=True)
class Problem:
    pos: Pos
    path: Path = field(compare=False)
    message: str = field(compare=False)

    def __post_init__(self) -> None:  # defence in depth: no URL's credentials, wherever quoted
        object.__setattr__(self, "message", redact_urls(self.message))

    @classmethod
    def whole_file(cls, message: str) -> Problem:
        return cls(Pos(0, 0), (), message)

    def dotted(self) -> str:
        return ".".join(_component(p) for p in self.path)

    def format(self, filename: str) -> str:
        """``FILE:LINE:COL: error: PATH: MESSAGE`` (the contract of `jobd validate`)."""
        where = f"{filename}:{self.pos.line}:{self.pos.col}" if self.pos.line else filename
        what = f"{self.dotted()}: {self.message}" if self.path else self.message
        return f"{where}: error: {what}"

    def as_json(self) -> dict[str, Any]:
        return {
            "line": self.pos.line or None,
            "column": self.pos.col or None,
            "path": self.dotted(),
            "message": self.message,
        }


def _component(part: str | int) -> str:
    """A path component as written, or quoted when it holds anything unprintable."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


class ConfigError(Exception):
    """The config is invalid; ``problems`` lists every problem, in file order."""

    def __init__(self, path: str, problems: list[Problem]) -> None:
        super().__init__(f"{path}: {len(problems)} problem(s)")
        self.path = path
        self.problems = sorted(problems)
