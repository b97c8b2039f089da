"""What the one-shot commands share: the queue a command names, the store they open, what they
say when Redis cannot be reached (they exit ``exitcodes.UNAVAILABLE``, 69), and who runs them
(the events' ``by``)."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import socket
import sys
from collections.abc import Iterator

from jobd.config import Config, QueueConfig
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
    try:
        yield store
    except connection.UNAVAILABLE as exc:
        print(f"jobd: cannot reach Redis at {config.redis.describe()}: {exc}", file=sys.stderr)
        raise Unreachable from exc
    finally:
        store.close()


def operator() -> str:
    """Who runs this command, as the audit trail names them: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container without /etc/passwd)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
