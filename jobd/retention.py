"""Retention: streams stay near ``retention.maxlen`` without ever dropping work.

A periodic duty runs ``lua/trim.lua`` on each queue with a ``retention.maxlen``: it removes
the oldest entries that every consumer group on the stream has received and acknowledged —
never one that is pending or not yet delivered, whichever application's group it belongs to —
and, behind a long-running pending job, acknowledged entries one by one. Any number of daemons
may run it at once. Each call removes at most ``BATCH`` entries, so Redis is never blocked long.
"""

from __future__ import annotations

import logging

from jobd.config import QueueConfig
from jobd.scripts import Scripts

log = logging.getLogger("jobd.retention")

TRIM_EVERY = 1.0
BATCH = 1000
MAX_CALLS_PER_TICK = 10


def trim(scripts: Scripts, queue: QueueConfig, maxlen: int, batch: int = BATCH) -> int:
    """One bounded trim call; returns the number of entries removed."""
    trimmed, deleted = scripts.trim(keys=[queue.stream], args=[maxlen, batch])
    return int(trimmed) + int(deleted)


class Trimmer:
    """The duty that keeps one queue's stream near its retention.maxlen."""

    def __init__(self, scripts: Scripts, queue: QueueConfig, maxlen: int) -> None:
        self.name = f"retention of queue {queue.name}"
        self.interval = TRIM_EVERY
        self.scripts, self.queue, self.maxlen = scripts, queue, maxlen

    def tick(self) -> None:
        for _ in range(MAX_CALLS_PER_TICK):
            if trim(self.scripts, self.queue, self.maxlen) < BATCH:
                return
