"""Retention: streams stay near ``retention.maxlen`` without ever dropping work.

A periodic duty runs ``lua/trim.lua`` (``Store.trim``) on each queue with a ``retention.maxlen``: it
removes the oldest entries that every consumer group on the stream has received and acknowledged —
never one that is pending or not yet delivered in any group (jobd's, another queue's of the
config, another application's: the script reads them all, XINFO GROUPS) — and, behind
long-running pending jobs, acknowledged entries one by one. That second step walks the stream
from a cursor kept in Redis (``{S}:trim``), so however many pending entries come first, each call
gets further; it reads no pending entry and only the entries it deletes (READ_BYTES a call). Any
number of daemons may run it at once (they share the cursor). Each call removes at most ``BATCH``
entries and passes at most ``BATCH``, so Redis is never blocked long by what producers wrote;
the groups are consumer-role data, read as they are (docs/security.md).

Every queue's history (``jobd job``) is trimmed by its caps as each outcome is written; a queue
that no longer settles anything has it trimmed here (``Store.forget``) once a minute, or twice a
``history.max_age`` when that is shorter, so its records still age out.
"""

from __future__ import annotations

from jobd.config import QueueConfig
from jobd.store.store import Store

TRIM_EVERY = 1.0
FORGET_EVERY = 60.0  # seconds between two trims of a queue's history (half max_age if less)
BATCH = 1000
READ_BYTES = 4 << 20  # bytes of entries a trim call's step 2 reads, one entry at least (trim.lua)
MAX_CALLS_PER_TICK = 10


class Trimmer:
    """The duty that keeps one queue's stream near its retention.maxlen."""

    def __init__(self, store: Store, queue: QueueConfig, maxlen: int) -> None:
        self.name = f"retention of queue {queue.name}"
        self.interval = TRIM_EVERY
        self.store, self.queue, self.maxlen = store, queue, maxlen

    def tick(self) -> None:
        """Calls (``Store.trim``) while they remove entries and stop at their budget: a walk
        over pending entries alone goes one call further each tick."""
        for _ in range(MAX_CALLS_PER_TICK):
            removed, more = self.store.trim(self.queue, self.maxlen, BATCH)
            if not (more and removed):
                return


class Forgetter:
    """The duty that ages out one queue's history when nothing is written to it."""

    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.name = f"history of queue {queue.name}"
        self.interval = min(FORGET_EVERY, max(queue.history.max_age / 2, 1.0))
        self.store, self.queue = store, queue

    def tick(self) -> None:
        self.store.forget(self.queue)


def duties(store: Store, queue: QueueConfig) -> list[Trimmer | Forgetter]:
    """A queue's trimmers, when it keeps a retention.maxlen: one per stream; and its history's."""
    trimmers: list[Trimmer | Forgetter] = [
        Trimmer(store, q, q.retention_maxlen)
        for q in queue.all_levels()
        if q.retention_maxlen is not None
    ]
    return [*trimmers, Forgetter(store, queue)]
