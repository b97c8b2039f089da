"""Process-level protections for the daemon against its own handlers (issue 17).

A handler that runs as the daemon's user (no ``run_as``) could read the daemon's secrets in
``/proc/$PPID/environ`` (its environment: ``REDIS_PASSWORD=…``) and ``/proc/$PPID/mem`` (its
memory: the password, the dashboard token, every payload). ``protect_process()``:

- makes the daemon non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``, Linux): its ``/proc/PID``
  files become root's, and ``environ``, ``mem``, ``maps``, ``fd/`` cannot be read nor the
  process traced by anything without ``CAP_SYS_PTRACE``, same user included; no core dump is
  written (``fs.suid_dumpable=0``, the default). Root with its full capabilities still can; a
  handler of the same user cannot, nor a root handler bounded without ``CAP_SYS_PTRACE``.
  ``jobd``'s entry point (``cli.main``) already did so first thing, for every subcommand: a
  process of the same user could read the environment until then (the config load included).
- forgets the environment variables the config expanded into a secret key (``redis`` and
  ``dashboard`` passwords, tokens, the credentials of a URL, or a whole URL holding some): they
  leave ``os.environ``, so a process started without an explicit environment no longer
  inherits them, and their values are overwritten with NUL bytes in the block
  ``/proc/PID/environ`` shows (the kernel reads it from the process's memory each time: it is
  not a copy). What stays is the config in memory, which non-dumpable guards.

The block is found at the addresses ``/proc/self/stat`` gives and written in place: a
non-dumpable process that is not root can open neither ``/proc/self/environ`` nor
``/proc/self/mem``, but its own memory is its own. A reload must expand ``${VAR}`` with
``config_environ()``. A daemon of a supervisor (``processes`` over 1) never has the secrets in
its environment at all: they come on a socket, read once it is non-dumpable, and ``remember``
keeps them for ``config_environ()`` (``daemon.handover``).

Neither stops a handler of the daemon's user from reading what that user can read: a
``password_file``, the credential files systemd gives the service, the embedded Redis's socket.
Only another user (``run_as``) separates a handler from those.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import secrets
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobd.config import yamlsrc

# jobd.config.schema and jobd.config.yamlsrc (100 ms and more of imports) are imported where
# they are used: set_non_dumpable() is to be had before them, by an entry point that calls it
# first.

log = logging.getLogger("jobd.hardening")

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
SECRET_SECTIONS = ("redis", "dashboard")
SECRET_KEYS = ("password", "token")
URL_KEY = "url"
MAX_ENVIRONMENT = 1 << 30  # a sanity bound on the size of the initial environment block

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
    forget_variables(names)
    if names:
        log.info("removed from the environment once read (secrets): %s", ", ".join(names))
    non_dumpable = set_non_dumpable()
    if non_dumpable:
        log.debug("non-dumpable: processes of this user cannot read /proc/%d/environ or mem",
                 os.getpid())  # fmt: skip
    return Protection(non_dumpable, tuple(names))


def prctl(option: int, arg: int | bytes = 0) -> int:
    """Linux's prctl(option, arg): what it returns; OSError when it fails."""
    got = int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0))
    if got < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return got


# /proc/self/oom_score_adj, opened before the process is made non-dumpable: from then on its
# /proc/self files belong to root, and an unprivileged daemon could no longer open it to give
# its handlers their scores (``process.spawn.OomScore`` takes this descriptor).
OOM_SCORE_FD: int | None = None


def set_non_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0); True once it holds, False where there is no prctl. What of
    /proc/self is needed afterwards is opened first (``OOM_SCORE_FD``)."""
    global OOM_SCORE_FD
    if not sys.platform.startswith("linux"):
        return False
    if OOM_SCORE_FD is None:
        with contextlib.suppress(OSError):
            OOM_SCORE_FD = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
    try:
        prctl(PR_SET_DUMPABLE, 0)
    except OSError as exc:
        log.warning("cannot make jobd non-dumpable: %s", exc.strerror)
        return False
    return prctl(PR_GET_DUMPABLE) == 0


# -- which variables hold secrets ------------------------------------------------------------


def secret_variables(
    config_path: str, environ: Mapping[str, str], text: str | None = None
) -> list[str]:
    """The variables of ``environ`` whose value the config at ``config_path`` (or ``text``, as
    read from there) expands into a password or token of ``redis`` or ``dashboard``, or into a
    URL there where redacting it hides some of the value: the variable stands in its
    credentials (``redis://:${PW}@host``), or its own value holds some (``url: ${REDIS_URL}``).
    A variable that gives only a host name is not a secret: a URL's redaction shows it. Found
    by expanding each variable into a marker of its own and seeing which markers land in a
    secret."""
    names = [name for name, value in environ.items() if value]
    token = secrets.token_hex(6)
    marker = re.compile(f"jobd{token}v([0-9]+)e")
    markers = {name: f"jobd{token}v{i}e" for i, name in enumerate(names)}
    from jobd.config import schema, yamlsrc

    try:
        source = _read(config_path) if text is None else text
        doc, _ = yamlsrc.load(source, markers, schema.is_text)
    except (OSError, UnicodeDecodeError, yamlsrc.SourceError):
        return []
    values = [environ[name] for name in names]
    found: set[int] = set()
    for path, text in _strings(doc.data, ()):
        found |= _secret_markers(path, text, marker, values)
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


def _secret_markers(
    path: yamlsrc.Path, text: str, marker: re.Pattern[str], values: list[str]
) -> set[int]:
    """The markers of secrets in the string at ``path``: all of a password or token; in a URL,
    those whose variable's value its redaction hides some of; none elsewhere."""
    if not path or path[0] not in SECRET_SECTIONS:
        return set()
    if path[-1] in SECRET_KEYS:
        return _indices(text, marker)
    if path[-1] == URL_KEY:
        from jobd.config.redact import redact_url

        inside = _indices(text, marker)
        hidden = inside - _indices(redact_url(text), marker)
        return hidden | {i for i in inside if _hides_value(text, marker, i, values[i])}
    return set()


def _hides_value(text: str, marker: re.Pattern[str], index: int, value: str) -> bool:
    """Whether redacting the URL ``text``, with the marker ``index`` expanded to ``value``,
    hides some of that value (a variable holding a whole URL with its credentials, or a user
    name and password with the host)."""
    from jobd.config.redact import redact_url

    url = marker.sub(lambda m: value if int(m.group(1)) == index else m.group(0), text)
    return redact_url(url).count(value) < url.count(value)


def _indices(text: str, marker: re.Pattern[str]) -> set[int]:
    return {int(match.group(1)) for match in marker.finditer(text)}


# -- forgetting them -------------------------------------------------------------------------


def forget_variables(names: Iterable[str]) -> None:
    """Take ``names`` out of os.environ (kept here for ``config_environ``) and overwrite their
    values in the initial environment block."""
    taken = {name: os.environ.pop(name) for name in names if name in os.environ}
    _forgotten.update(taken)  # os.environ.pop: unsetenv(), libc's environ lets go of them
    if taken:
        wipe_initial_environment(taken)


def remember(variables: Mapping[str, str]) -> None:
    """Secrets given to this process otherwise than in its environment (a supervisor's daemon:
    ``daemon.handover``): kept for ``config_environ``, never put in os.environ."""
    _forgotten.update(variables)


def forget_remembered() -> None:
    """Let go of every secret kept here (a supervisor's fork server holds none: ``zygote``)."""
    _forgotten.clear()


def config_environ() -> dict[str, str]:
    """The environment to expand the config with on a reload: os.environ and the variables
    ``forget_variables`` took out of it."""
    return {**os.environ, **_forgotten}


def wipe_initial_environment(variables: Mapping[str, str]) -> int:
    """Overwrite with NUL bytes, in the environment block the process started with (what
    /proc/PID/environ shows), the value of each ``NAME=value`` entry of ``variables``; how many
    were overwritten. The block is read and written in this process's memory, where
    /proc/self/stat says it is: nothing is written but the value of an entry that reads
    exactly ``NAME=value``."""
    span = _environment_span()
    if span is None:
        return 0
    start, end = span
    wanted = {os.fsencode(name) + b"=" + os.fsencode(value) for name, value in variables.items()}
    wiped, offset = 0, 0
    for entry in ctypes.string_at(start, end - start).split(b"\0"):
        if entry in wanted:
            equals = entry.index(b"=") + 1
            ctypes.memset(start + offset + equals, 0, len(entry) - equals)
            wiped += 1
        offset += len(entry) + 1
    return wiped


def _environment_span() -> tuple[int, int] | None:
    """(env_start, env_end): fields 50 and 51 of /proc/self/stat (``man 5 proc``), which a
    process reads of itself even when non-dumpable; None when they cannot be had."""
    try:
        with open("/proc/self/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()  # fields 3 and on
        start, end = int(fields[50 - 3]), int(fields[51 - 3])
    except (OSError, IndexError, ValueError):
        return None
    if not 0 < start < end or end - start > MAX_ENVIRONMENT:
        return None
    return start, end
