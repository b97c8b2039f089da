"""Retention: streams stay near ``retention.maxlen`` without ever dropping work.

A periodic duty runs ``lua/trim.lua`` on each queue with a ``retention.maxlen``: it removes
the oldest entries that every consumer group on the stream has received and acknowledged —
never one that is pending or not yet delivered, whichever application's group it belongs to —
and, behind long-running pending jobs, acknowledged entries one by one. That second step walks
the stream from a cursor kept in Redis (``{S}:trim``), so however many pending entries come
first, each call gets further. Any number of daemons may run it at once (they share the
cursor). Each call removes at most ``BATCH`` entries and looks at most at ``BATCH``, so Redis
is never blocked long.
"""

from __future__ import annotations

import logging

from jobd.config import QueueConfig
from jobd.store.scripts import Scripts

log = logging.getLogger("jobd.retention")

TRIM_EVERY = 1.0
BATCH = 1000
MAX_CALLS_PER_TICK = 10
CURSOR_TTL = 3600  # seconds the walk's cursor is kept; without it the walk starts over


def trim_call(scripts: Scripts, queue: QueueConfig, maxlen: int, batch: int) -> tuple[int, bool]:
    """One bounded trim call: the number of entries removed, and whether it stopped at its
    budget with the stream still above ``maxlen`` (another call can go on at once)."""
    trimmed, deleted, more = scripts.trim(
        keys=[queue.stream, queue.keys.trim_cursor()], args=[maxlen, batch, CURSOR_TTL * 1000]
    )
    return int(trimmed) + int(deleted), bool(more)


def trim(scripts: Scripts, queue: QueueConfig, maxlen: int, batch: int = BATCH) -> int:
    """One bounded trim call; returns the number of entries removed."""
    return trim_call(scripts, queue, maxlen, batch)[0]


class Trimmer:
    """The duty that keeps one queue's stream near its retention.maxlen."""

    def __init__(self, scripts: Scripts, queue: QueueConfig, maxlen: int) -> None:
        self.name = f"retention of queue {queue.name}"
        self.interval = TRIM_EVERY
        self.scripts, self.queue, self.maxlen = scripts, queue, maxlen

    def tick(self) -> None:
        """Calls while they remove entries and stop at their budget: a walk over pending
        entries alone goes one call further each tick."""
        for _ in range(MAX_CALLS_PER_TICK):
            removed, more = trim_call(self.scripts, self.queue, self.maxlen, BATCH)
            if not (more and removed):
                return
