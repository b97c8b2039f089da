"""Process-level protections for the daemon against its own handlers (issue 17).

A handler that runs as the daemon's user (no ``run_as``) could read the daemon's secrets in
``/proc/$PPID/environ`` (its environment: ``REDIS_PASSWORD=…``) and ``/proc/$PPID/mem`` (its
memory: the password, the dashboard token, every payload). ``protect_process()``:

- makes the daemon non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``, Linux): its ``/proc/PID``
  files become root's, and ``environ``, ``mem``, ``maps``, ``fd/`` cannot be read nor the
  process traced by anything without ``CAP_SYS_PTRACE``, same user included; no core dump is
  written (``fs.suid_dumpable=0``, the default). Root with its full capabilities still can; a
  handler of the same user cannot, nor a root handler bounded without ``CAP_SYS_PTRACE``.
- forgets the environment variables the config expanded into a secret key (``redis`` and
  ``dashboard`` passwords, tokens, the credentials of a URL): they leave ``os.environ``, so a
  process started without an explicit environment no longer inherits them, and their values
  are overwritten with NUL bytes in the block ``/proc/PID/environ`` shows (the kernel reads it
  from the process's memory each time: it is not a copy). What stays is the config in memory,
  which non-dumpable guards.

The variables go first: once non-dumpable, a process that is not root cannot open its own
``/proc/self/environ`` either. A reload must expand ``${VAR}`` with ``config_environ()``.

Neither stops a handler of the daemon's user from reading what that user can read: a
``password_file``, the credential files systemd gives the service, the embedded Redis's socket.
Only another user (``run_as``) separates a handler from those.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import secrets
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jobd import validation, yamlsrc

log = logging.getLogger("jobd.hardening")

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
SECRET_SECTIONS = ("redis", "dashboard")
SECRET_KEYS = ("password", "token")
URL_KEY = "url"

_forgotten: dict[str, str] = {}  # variables taken out of os.environ, for config_environ()


@dataclass(frozen=True)
class Protection:
    non_dumpable: bool  # False where prctl is not available (not Linux)
    forgotten: tuple[str, ...]  # the variables taken out of the environment


def protect_process(config_path: str | None = None) -> Protection:
    """Make this process non-dumpable and forget the variables that ``config_path``'s config
    expanded into secrets. Call it once the config is loaded and before any handler starts;
    from then on reload the config with ``load(path, config_environ())``."""
    names = secret_variables(config_path, os.environ) if config_path else []
    forget_variables(names)  # first: a non-dumpable process cannot open its own environ
    if names:
        log.info("removed from the environment once read (secrets): %s", ", ".join(names))
    non_dumpable = set_non_dumpable()
    if non_dumpable:
        log.info("non-dumpable: processes of this user cannot read /proc/%d/environ or mem",
                 os.getpid())  # fmt: skip
    return Protection(non_dumpable, tuple(names))


def set_non_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0); True once it holds, False where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        log.warning("cannot make jobd non-dumpable: %s", os.strerror(error))
        return False
    return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


# -- which variables hold secrets ------------------------------------------------------------


def secret_variables(config_path: str, environ: Mapping[str, str]) -> list[str]:
    """The variables of ``environ`` whose value the config at ``config_path`` expands into a
    password or token of ``redis`` or ``dashboard``, or into the credentials of a URL there
    (a variable that gives only a host name is not a secret). Found by expanding each variable
    into a marker of its own and seeing which markers land in a secret."""
    names = [name for name, value in environ.items() if value]
    token = secrets.token_hex(6)
    marker = re.compile(f"jobd{token}v([0-9]+)e")
    markers = {name: f"jobd{token}v{i}e" for i, name in enumerate(names)}
    try:
        doc, _ = yamlsrc.load(_read(config_path), markers, validation.is_text)
    except (OSError, UnicodeDecodeError, yamlsrc.SourceError):
        return []
    found: set[int] = set()
    for path, text in _strings(doc.data, ()):
        found |= _secret_markers(path, text, marker)
    return sorted(names[i] for i in found)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def _strings(value: Any, path: yamlsrc.Path) -> Iterator[tuple[yamlsrc.Path, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, index))
    elif isinstance(value, str):
        yield path, value


def _secret_markers(path: yamlsrc.Path, text: str, marker: re.Pattern[str]) -> set[int]:
    """The markers in the secret part of the string at ``path``: all of a password or token,
    the credentials of a URL (what redacting it hides), none elsewhere."""
    if not path or path[0] not in SECRET_SECTIONS:
        return set()
    if path[-1] in SECRET_KEYS:
        return _indices(text, marker)
    if path[-1] == URL_KEY:
        return _indices(text, marker) - _indices(validation.redact_url(text), marker)
    return set()


def _indices(text: str, marker: re.Pattern[str]) -> set[int]:
    return {int(match.group(1)) for match in marker.finditer(text)}


# -- forgetting them -------------------------------------------------------------------------


def forget_variables(names: Iterable[str]) -> None:
    """Take ``names`` out of os.environ (kept here for ``config_environ``) and overwrite their
    values in the initial environment block."""
    names = [name for name in names if name in os.environ]
    for name in names:
        _forgotten[name] = os.environ.pop(name)  # unsetenv(): libc's environ lets go of it
    if names:
        wipe_initial_environment(names)


def config_environ() -> dict[str, str]:
    """The environment to expand the config with on a reload: os.environ and the variables
    ``forget_variables`` took out of it."""
    return {**os.environ, **_forgotten}


def wipe_initial_environment(names: Iterable[str]) -> int:
    """Overwrite with NUL bytes the values of ``names`` in the environment block the process
    started with, what /proc/PID/environ shows; how many were overwritten. Nothing is written
    unless the block's address (from /proc/self/stat) holds exactly /proc/self/environ."""
    block = _initial_environment()
    if block is None:
        return 0
    start, data = block
    wanted = {name.encode() for name in names}
    wiped, offset = 0, 0
    for entry in data.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals and name in wanted and value:
            ctypes.memset(start + offset + len(name) + 1, 0, len(value))
            wiped += 1
        offset += len(entry) + 1
    return wiped


def _initial_environment() -> tuple[int, bytes] | None:
    """(address, bytes) of the initial environment block, or None if it cannot be trusted."""
    try:
        with open("/proc/self/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        with open("/proc/self/environ", "rb") as file:
            shown = file.read()
    except OSError:
        return None
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51
    if not start or end - start != len(shown):
        return None
    if ctypes.string_at(start, end - start) != shown:
        return None
    return start, shown
