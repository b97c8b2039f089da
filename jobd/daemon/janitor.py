"""Removing the consumers that dead daemons left in a group, without ever losing an entry.

Every daemon process is a consumer of its own (``host-pid-random``), so restarts leave names
behind, and since Redis 7.2 even a claim creates one. A consumer is removed only when it holds
nothing and has been idle for ``IDLE_FACTOR`` × ``lease.reclaim_after``: the check and the
delete are one script (``lua/drop_consumer.lua``), because XGROUP DELCONSUMER drops the
consumer's pending entries for good. A consumer holding entries stays until another daemon has
reclaimed them. Deleting a live consumer by mistake is harmless: it holds nothing, and its next
read creates it again.
"""

from __future__ import annotations

import logging
import os

import redis

from jobd.config import QueueConfig
from jobd.store.scripts import Scripts

log = logging.getLogger("jobd.janitor")

IDLE_FACTOR = 10


def max_idle_ms(queue: QueueConfig) -> int:
    return int(IDLE_FACTOR * queue.lease.reclaim_after * 1000)


def sweep(client: redis.Redis, scripts: Scripts, queue: QueueConfig, me: str) -> int:
    """Remove the queue's empty, long-idle consumers; returns how many were removed."""
    try:
        consumers = client.xinfo_consumers(queue.stream, queue.group)
    except redis.ResponseError:
        return 0  # no stream or group yet
    limit = max_idle_ms(queue)
    removed = 0
    for c in consumers:
        name = os.fsdecode(c["name"])  # any bytes another client named it: fsencode gives them back
        if name == me or c["pending"] or c["idle"] < limit:
            continue
        args = [queue.group, c["name"], limit]
        if scripts.drop_consumer(keys=[queue.stream], args=args):
            log.info("queue=%s removed consumer %s: idle and holding nothing", queue.name, name)
            removed += 1
    return removed


class Janitor:
    """The duty that sweeps one queue's consumers, every ``lease.reclaim_after``."""

    def __init__(self, client: redis.Redis, scripts: Scripts, queue: QueueConfig, me: str) -> None:
        self.name = f"consumer sweep of queue {queue.name}"
        self.interval = queue.lease.reclaim_after
        self.client, self.scripts, self.queue, self.me = client, scripts, queue, me

    def tick(self) -> None:
        sweep(self.client, self.scripts, self.queue, self.me)
