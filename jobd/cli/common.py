"""What the one-shot commands share: the queue a command names, the store they open, what they
say when Redis cannot be reached (they exit ``exitcodes.UNAVAILABLE``, 69), who runs them
(the events' ``by``), and how their ``--json`` is printed (``print_json``)."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import io
import os
import socket
import sys
from collections.abc import Iterator

import orjson

from jobd.config import Config, QueueConfig
from jobd.logs import safe_json
from jobd.store import connection
from jobd.store.store import Store


def queue_named(config: Config, name: str, parser: argparse.ArgumentParser) -> QueueConfig:
    """The config's queue ``name``; a usage error (exit 2) listing the queues when none is."""
    if name not in config.queues:
        names = ", ".join(config.queues)
        parser.error(f"no queue {name!r} in {config.path}; queues: {names}")
    return config.queues[name]


class Unreachable(Exception):
    """Redis could not be reached; already said on stderr."""


@contextlib.contextmanager
def store_for(config: Config, role: str) -> Iterator[Store]:
    """A store named ``jobd-ROLE`` for one command, closed after it; Redis away becomes one line
    on stderr and ``Unreachable`` (the caller exits ``exitcodes.UNAVAILABLE``)."""
    store = Store.open(config.redis, role)
    store.know(config.queues.values())  # the config in force, for the notices it moves
    try:
        yield store
    except connection.UNAVAILABLE as exc:
        if not from_redis(exc):  # stdout closed (`jobd … | head`), a full disk: not Redis away
            raise
        print(f"jobd: cannot reach Redis at {config.redis.describe()}: {exc}", file=sys.stderr)
        raise Unreachable from exc
    finally:
        store.close()


def from_redis(exc: BaseException) -> bool:
    """Whether ``exc``, one of ``connection.UNAVAILABLE``, says Redis is away: any but an
    OSError (redis-py's connection and timeout errors, a cluster's), and an OSError raised inside
    redis-py (its socket); not one a write to stdout or a date raised in the command's code."""
    if not isinstance(exc, OSError):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").partition(".")[0] == "redis":
            return True
        tb = tb.tb_next
    return False


def operator() -> str:
    """Who runs this command, as the audit trail names them: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container without /etc/passwd)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def print_json(body: object) -> None:
    """One JSON document on stdout (indented, then a newline): what every ``--json`` prints.
    Others' bytes are escaped by the encoder and ``safe_json``, never by the text output's
    ``printable`` (its escapes would be taken for the value). A reader that closed stdout
    (`… --json | head`) has all it wanted."""
    try:
        sys.stdout.buffer.write(safe_json(orjson.dumps(body, option=orjson.OPT_INDENT_2)) + b"\n")
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush


def text(value: str | bytes) -> str:
    """Redis's bytes (or a command line's text) as JSON can carry them: bytes that are not
    UTF-8 as ``\\xff``."""
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "backslashreplace")


class _Dropping(io.RawIOBase):
    """File descriptor 1 whose reader may be gone: what it cannot take is dropped, never an
    error (``reader_may_go``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gone = False  # the reader went: nothing more is written

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        size = memoryview(data).nbytes
        if self.closed or self.gone:
            return size
        try:
            return os.write(1, data)
        except BrokenPipeError:  # `jobd … | head`: the reader has all it wanted
            self.gone = True
            return size


@contextlib.contextmanager
def reader_may_go() -> Iterator[None]:
    """While inside, stdout's reader may go away (`jobd dlq q requeue --all | head -1`): what
    is written after it went is dropped, and the command goes on to the end, its errors said on
    stderr and its exit code its own (review 35ab); stdout flushed before leaving."""
    old = sys.stdout
    old.flush()
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Dropping()), encoding=old.encoding,
                                  errors=old.errors, line_buffering=old.line_buffering)  # fmt: skip
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = old
