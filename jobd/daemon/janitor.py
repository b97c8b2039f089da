"""Removing the consumers that dead daemons left in a group, without ever losing an entry.

Every daemon process is a consumer of its own (``host-pid-random``), so restarts leave names behind,
and since Redis 7.2 even a claim creates one. A consumer is removed only when it holds nothing and
has been idle for ``IDLE_FACTOR`` × ``lease.reclaim_after``: the check and the delete are one script
(``Store.drop_consumer``, ``lua/drop_consumer.lua``), because XGROUP DELCONSUMER drops the
consumer's pending entries for good. A consumer holding entries stays until another daemon has
reclaimed them. Deleting a live consumer by mistake is harmless: it holds nothing, and its next read
creates it again.
"""

from __future__ import annotations

import logging
import os

from jobd.config import QueueConfig
from jobd.store.store import Store

log = logging.getLogger("jobd.janitor")

IDLE_FACTOR = 10


def max_idle_ms(queue: QueueConfig) -> int:
    return int(IDLE_FACTOR * queue.lease.reclaim_after * 1000)


def sweep(store: Store, queue: QueueConfig) -> int:
    """Remove the queue's empty, long-idle consumers but the store's own; returns how many
    were removed."""
    limit = max_idle_ms(queue)
    removed = 0
    for c in store.consumers(queue):
        name = os.fsdecode(c.name)  # any bytes another client named it: fsencode gives them back
        if name == store.consumer or c.pending or c.idle_ms < limit:
            continue
        if store.drop_consumer(queue, c.name, limit):
            log.info("queue=%s removed consumer %s: idle and holding nothing", queue.name, name)
            removed += 1
    return removed


class Janitor:
    """The duty that sweeps one queue's consumers, every ``lease.reclaim_after``."""

    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.name = f"consumer sweep of queue {queue.name}"
        self.interval = queue.lease.reclaim_after
        self.store, self.queue = store, queue

    def tick(self) -> None:
        sweep(self.store, self.queue)


def duties(store: Store, queue: QueueConfig) -> list[Janitor]:
    """A queue's janitors: one per stream (each priority level has its own group)."""
    return [Janitor(store, q) for q in queue.all_levels()]
