"""One queue's settings as the file gives them, and what follows from them.

A queue's settings are its own keys over ``defaults`` over the schema's defaults, merged once
(mappings key by key, lists and scalars replaced) and remembered with where each was written.
What is derived from them (the stream and every key, the program, the handler's environment,
the working directory, limits, schedules) is derived here only: the checks and the build both
read a queue through a QueueSettings. Reading a value that did not pass the schema raises
``config_view.Unchecked``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobd.config import convert, durations
from jobd.config.problems import Problem
from jobd.config.schema import QUEUE_DEFAULTS
from jobd.config.types import Rate, Resources, ScheduleConfig
from jobd.config.view import ABSENT, ConfigView, lookup, value_at, within
from jobd.config.yamlsrc import Path
from jobd.process.environment import base_environment
from jobd.store.keys import QueueKeys


def queues_of(view: ConfigView) -> dict[str, QueueSettings]:
    """Every queue of the file that is a mapping, in file order."""
    queues = view.data.get("queues")
    if not isinstance(queues, dict):
        return {}
    defaults = view.data.get("defaults")
    defaults = defaults if isinstance(defaults, dict) else {}  # not a mapping: reported
    base_env = base_environment(view.source.environ)
    return {
        name: QueueSettings.merged(name, own, defaults, view, base_env)
        for name, own in queues.items()
        if isinstance(own, dict)
    }


def merge_defaults(
    defaults: dict[str, Any], queue: dict[str, Any]
) -> tuple[dict[str, Any], dict[Path, Path]]:
    """``defaults`` under ``queue``, mappings merged key by key, lists and scalars replaced.

    Also returns, for each merged path that came from ``defaults``, its path in the file.
    """
    origins: dict[Path, Path] = {}

    def merge(low: Any, high: Any, path: Path) -> Any:
        if not (isinstance(low, dict) and isinstance(high, dict)):
            return high
        result = dict(high)
        for key, value in low.items():
            if key in high:
                result[key] = merge(value, high[key], (*path, key))
            else:
                result[key] = value
                origins[(*path, key)] = ("defaults", *path, key)
        return result

    return merge(defaults, queue, ()), origins


@dataclass(frozen=True)
class QueueSettings:
    name: str
    view: ConfigView
    own: Mapping[str, Any]  # the queue's mapping as written
    values: Mapping[str, Any]  # its own over defaults over the schema's defaults
    origins: Mapping[Path, Path]  # merged paths inherited from defaults: their path in the file
    base_env: Mapping[str, str]  # the handler's inherited environment (handler_env)

    @classmethod
    def merged(
        cls,
        name: str,
        own: dict[str, Any],
        defaults: dict[str, Any],
        view: ConfigView,
        base_env: Mapping[str, str],
    ) -> QueueSettings:
        merged, origins = merge_defaults(defaults, own)
        values, _ = merge_defaults(QUEUE_DEFAULTS, merged)  # built in: written nowhere
        return cls(name, view, own, values, origins, base_env)

    # -- values and where they are written ----------------------------------------------------

    def get(self, *sub: str | int, default: Any = ABSENT) -> Any:
        """The merged value at ``sub``, or ``default`` when unset; Unchecked when it, or
        anything it holds, did not pass the schema."""
        if self.view.invalid:  # else the whole file passed the schema: nothing to skip
            self._require(sub)
        return value_at(self.values, sub, default)

    def _require(self, sub: Path) -> None:
        self.view.require(self.written_at(sub))  # first: what holds it may be no mapping
        value = lookup(self.values, sub)
        if isinstance(value, Mapping):  # merged key by key: defaults may hold more of it
            self.view.require(("defaults", *sub))
        for inner in within(value, sub):
            self.view.require(self.written_at(inner))

    def has(self, key: str) -> bool:
        return key in self.values

    def inherited(self, sub: Path) -> Path | None:
        """Where in ``defaults`` the value at ``sub`` is written, when it comes from there."""
        for i in range(len(sub), 0, -1):
            if sub[:i] in self.origins:
                return (*self.origins[sub[:i]], *sub[i:])
        return None

    def written_at(self, sub: Path) -> Path:
        """Where the value at ``sub`` is written: in the queue, in ``defaults``, or for a
        built-in default, where ``defaults`` would have set it."""
        inherited = self.inherited(sub)
        if inherited is not None:
            return inherited
        return ("queues", self.name, *sub) if _written(self.own, sub) else ("defaults", *sub)

    def problem(self, sub: Path, message: str) -> Problem:
        """A problem with the setting at ``sub``, placed where it is written: a value inherited
        from defaults is reported there; a built-in default at the nearest key written."""
        doc = self.view.doc
        path = ("queues", self.name, *sub)
        inherited = self.inherited(sub)
        if inherited is not None:
            return Problem(doc.value_pos(inherited), path, f"{message} (value set in defaults)")
        where = doc.value_pos(path) if sub and path in doc.values else doc.key_pos(path)
        return Problem(where, path, message)

    # -- what follows from them -----------------------------------------------------------------

    def base_dir(self) -> str:
        return self.view.source.base_dir

    def stream(self) -> str:
        return str(self.get("stream", default=f"jobd:{self.name}"))

    def keys(self) -> QueueKeys:
        """Every Redis key of the queue (keys.py), its dead-letter stream as configured."""
        return QueueKeys.of(self.stream(), self.get("dead_letter", "stream", default=None))

    def command(self) -> tuple[str, ...]:
        """The command; a program naming a path resolves against the config file's folder."""
        command = list(self.get("command"))
        if "/" in command[0]:
            command[0] = os.path.normpath(os.path.join(self.base_dir(), command[0]))
        return tuple(command)

    def env(self) -> dict[str, str]:
        """The handler's whole environment, less the JOBD_* variables."""
        env = dict(self.base_env)
        user = self.get("run_as", "user", default=None)
        if user:  # the handler's own identity, not the daemon's (root's)
            with contextlib.suppress(KeyError):  # an unknown user is a problem of its own
                account = pwd.getpwnam(user)
                env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
        env.update(self.get("env", default={}))  # text, exactly as written (schema.is_text)
        return env

    def cwd(self) -> str:
        return os.path.normpath(os.path.join(self.base_dir(), self.get("cwd", default=".")))

    def duration(self, *sub: str) -> float:
        return durations.parse(self.get(*sub))

    def optional_duration(self, *sub: str) -> float | None:
        value = self.get(*sub, default=None)
        return None if value is None else durations.parse(value)

    def resources(self) -> Resources:
        given = {n: self.get("resources", n, default=None) for n in convert.RESOURCES}
        return convert.resources({n: v for n, v in given.items() if v is not None})

    def rate(self) -> Rate | None:
        text = self.get("limits", "rate", default=None)
        if text is None:
            return None
        return convert.rate(text, self.get("limits", "burst", default=None))

    def schedule(self) -> tuple[ScheduleConfig, ...]:
        return tuple(convert.schedule(entry) for entry in self.get("schedule", default=[]))

    def priorities(self) -> tuple[list[str] | None, str | None]:
        """The priority levels, highest first, and the default level's name as written."""
        return self.get("priorities", default=None), self.get("default_priority", default=None)


def _written(own: Any, sub: Path) -> bool:
    """Whether the queue's own mapping writes ``sub`` (or a value that stands where a mapping
    or list holding it belongs)."""
    for part in sub:
        if isinstance(own, Mapping) and isinstance(part, str):
            if part not in own:
                return False
        elif isinstance(own, list) and isinstance(part, int):
            if not 0 <= part < len(own):
                return False
        else:
            return True
        own = own[part]
    return True
