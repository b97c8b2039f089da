"""Delayed jobs: retries waiting for their backoff, and jobs enqueued for later.

Both wait in the queue's delayed set (``keys.QueueKeys.delayed``), scored by their due time. Every
daemon runs the forwarder, which moves due jobs back to the stream in one script (``Store.promote``,
``lua/promote.lua``): several daemons moving at once never duplicate or lose a job, and a job
survives any crash because it is always in exactly one place. Whether a job is due is decided by
Redis's clock, inside the script; this host's clock only sets how often to look. A member that is
not a job (others may write members too) is dead-lettered as ``malformed`` by the same script, so it
never holds up the jobs behind it; when its record cannot be written, it is held back in the set for
``HOLD_MALFORMED_MS`` instead, and the jobs behind it go on. Adding a job to the set and listing it
are the store's (``jobd.store.delayed``).
"""

from __future__ import annotations

import logging
import time

from jobd.config import QueueConfig
from jobd.store.store import Store

log = logging.getLogger("jobd.delayed")

FORWARD_EVERY = 0.25  # seconds: a due job reaches the stream within this (plus a read)
FORWARD_BATCH = 500  # jobs moved per script call; the forwarder loops while there are more
# A member that is not a job and cannot be dead-lettered (the dead-letter key holds another
# type) waits this long before the next try; meanwhile the jobs behind it move (promote.lua).
HOLD_MALFORMED_MS = 60_000


def now_ms() -> int:
    """This host's clock, for picking due times; Redis's decides when they are reached."""
    return int(time.time() * 1000)


class Forwarder:
    """The duty that moves one queue's due jobs to its stream."""

    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.name = f"forwarding due jobs of queue {queue.name}"
        self.interval = FORWARD_EVERY
        self.store = store
        self.queue = queue

    def tick(self) -> int:
        """Move every due job (one script call per ``FORWARD_BATCH``); returns how many."""
        moved = 0
        while True:
            step = self.store.promote(self.queue, FORWARD_BATCH, HOLD_MALFORMED_MS)
            moved += step.moved
            self._report(step.malformed, step.held, step.why)
            if step.moved + step.malformed + step.held + step.cancelled < FORWARD_BATCH:
                return moved

    def _report(self, malformed: int, held: int, why: str) -> None:
        q = self.queue
        if malformed:
            log.error(
                "queue=%s: %d member(s) of %s were not jobs: dead-lettered as malformed "
                "on %s (jobd_member holds each one's bytes)",
                q.name, malformed, q.keys.delayed, q.dead_letter.stream,
            )  # fmt: skip
        if held:
            log.error(
                "queue=%s: %d member(s) of %s are not jobs and cannot be dead-lettered on %s "
                "(%s): held back %gs, the jobs behind them go on",
                q.name, held, q.keys.delayed, q.dead_letter.stream, why, HOLD_MALFORMED_MS / 1000,
            )  # fmt: skip


def duties(store: Store, queue: QueueConfig) -> list[Forwarder]:
    """A queue's forwarders: one per stream (each priority level has its own delayed set)."""
    return [Forwarder(store, q) for q in queue.all_levels()]
