"""What the one-shot commands share: the store they open, and what they say when Redis cannot
be reached (they exit ``exitcodes.UNAVAILABLE``, 69)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from jobd.config import Config
from jobd.store import connection
from jobd.store.store import Store


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
