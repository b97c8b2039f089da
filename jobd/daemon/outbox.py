"""Moving follow-ups (on a Redis Cluster) and workflow notices (on any Redis) out of a queue's
outbox (``store.outbox``, ``store.workflows``): the daemon that settles a job moves what its
settle wrote at once (``daemon.recorder``); this duty moves what that one could not (it died
between the two steps, or Redis was away), every ``INTERVAL``, on every daemon of the queue: one
XRANGE of an empty stream, mostly. The same duty dead-letters the queue's held jobs that waited
their whole bound (``--after-timeout``, ``max_wait``: ``Store.expire_held``, a page of the due
ones a pass; one script call that finds none, mostly) and moves their ends' notices at once.
"""

from __future__ import annotations

import logging

from jobd.config import QueueConfig
from jobd.store.store import Store

log = logging.getLogger("jobd.outbox")

INTERVAL = 2.0  # seconds between two looks at a queue's outbox


class OutboxMover:
    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.name = f"outbox of queue {queue.name}"
        self.interval = INTERVAL
        self.store, self.queue = store, queue

    def tick(self) -> None:
        """Each step on its own: the held jobs' bounds failing (a key of another type someone
        wrote where it reads) does not keep the outbox from moving; its error is raised after
        (the duty's runner logs it and goes on)."""
        error: Exception | None = None
        try:
            expired, _ = self.store.expire_held(self.queue)
            if expired:
                log.warning("queue=%s %d held jobs past their bound or expiry: dead-lettered "
                            "(dependency, expired)", self.queue.name, expired)  # fmt: skip
        except Exception as exc:  # raised below: the outbox is moved all the same
            error = exc
        moved = self.store.move_follow_ups(self.queue)
        if moved:
            log.info("queue=%s moved %d entries out of its outbox", self.queue.name, moved)
        if error is not None:
            raise error


def duties(store: Store, queue: QueueConfig) -> list[OutboxMover]:
    store.know([queue])  # its max_payload and its on_dead_letter's in force, for notices moved
    return [OutboxMover(store, queue)]
