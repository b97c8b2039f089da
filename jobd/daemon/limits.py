"""Cluster-wide limits of a queue: at most ``limits.concurrency`` handlers running across all
daemons, and at most ``limits.rate`` starts per window.

Slots are members of the queue's running set (``keys.QueueKeys.running``), each scored by the
expiry of its lease. Before a read, a reader takes slots (and rate tokens) for at most its free
local slots (``lua/acquire.lua``), then reads no more entries than it was granted, then binds
the slots to the entries it read and gives back the rest (``lua/bind.lua``): a daemon waiting
for a slot or a token has read nothing it cannot start. A slot is renewed with its entry's
lease (``lua/renew.lua``) and freed with its outcome (``lua/release.lua``, in the recorder's
round trip); the slot of a daemon that died expires with its lease, ``reclaim_after`` later.

Every time these scripts decide (a slot's expiry, the bucket's refill, a stale waiting field)
is Redis's clock (``TIME`` inside the script): one clock for every host, so a daemon whose
clock is off can neither take more than the limit nor make others' live slots look expired.
Callers pass durations only; their own clock picks nothing but when to ask again.

A limited reader never blocks while it holds slots: it reads without BLOCK, and when it found
nothing it waits for new entries with ``XREAD BLOCK`` after the newest entry, holding nothing.

Cost in Redis round trips, only for queues with a limit: three per read pass (acquire, read,
bind) instead of one, none per renewal or outcome (folded into calls made anyway), one per
second per idle daemon (the XREAD wait), and one every ``POLL`` per daemon waiting for a slot
(or, for the rate, when the next token is due).
"""

from __future__ import annotations

import contextlib

import redis

from jobd.config import QueueConfig
from jobd.store.connection import BLOCK_MS
from jobd.store.scripts import Scripts

POLL = 0.1  # seconds a reader waits before asking again for a slot
PENDING_SLACK = BLOCK_MS / 1000 + 5  # seconds a slot taken before a read may wait to be bound
# A waiting reader asks again at least every second (POLL, or a rate wait capped at 1 s), each
# time refreshing its field in the waiting hash; a field not refreshed for WAITING_STALE is a
# stopped or dead reader's (or one whose queue lost its limits), and acquire.lua removes it.
# Removing a live one by mistake (a stalled host) only hides it until its next ask.
WAITING_STALE = 10.0  # seconds


def slot_lease_ms(queue: QueueConfig) -> int:
    """How long a slot renewed now lives, in ms: as long as its entry's lease. The scripts
    add it to Redis's clock."""
    return int(queue.lease.reclaim_after * 1000)


def pending_lease_ms(queue: QueueConfig) -> int:
    """How long a slot taken before a read lives if it is never bound, in ms."""
    return int(max(queue.lease.reclaim_after, PENDING_SLACK) * 1000)


def slot_member(consumer: str, stream: str, message_id: str) -> str:
    """A running entry's slot: its holder's, so a lost lease's release frees nothing of the
    entry's new holder (who binds a slot of its own); with the stream, since two priority
    levels' streams can hold the same id. renew.lua builds the same string."""
    return f"{consumer}|{stream}|{message_id}"


def limited(queue: QueueConfig) -> bool:
    return queue.slots is not None or queue.rate is not None


def leave(client: redis.Redis, queue: QueueConfig, consumer: str) -> None:
    """A reader that stops is no longer waiting: remove its field from the waiting hash, so
    ``jobd status`` does not list it. Best effort: a field left (Redis away) goes stale and
    acquire.lua removes it, ``WAITING_STALE`` later."""
    with contextlib.suppress(redis.RedisError, OSError):
        client.hdel(queue.keys.waiting, consumer)


class Limiter:
    """One reader's side of its queue's limits."""

    def __init__(self, scripts: Scripts, queue: QueueConfig, consumer: str) -> None:
        self.scripts, self.queue, self.consumer = scripts, queue, consumer
        rate = queue.rate
        self._rate_per_ms = rate.per_ms if rate else 0
        self._burst = rate.burst if rate else 0

    def acquire(self, want: int) -> tuple[int, float]:
        """Take up to ``want`` slots and tokens; returns (granted, seconds to wait if none)."""
        q = self.queue
        granted, wait_ms = self.scripts.acquire(
            keys=[q.keys.running, q.keys.rate, q.keys.waiting],
            args=[
                want, self.consumer, q.slots or 0, pending_lease_ms(q),
                self._rate_per_ms, self._burst, int(WAITING_STALE * 1000),
            ],
        )  # fmt: skip
        wait = min(max(int(wait_ms) / 1000, 0.005), 1.0) if int(wait_ms) else POLL
        return int(granted), wait

    def bind(self, granted: int, members: list[str]) -> bytes:
        """The entries read hold slots from now on (``members``: their ``slot_member``s); the
        slots and tokens not used are freed. Returns the id of the stream's newest entry."""
        q = self.queue
        return self.scripts.bind(  # type: ignore[no-any-return]
            keys=[q.keys.running, q.keys.rate, q.stream],
            args=[
                self.consumer, granted, slot_lease_ms(q), int(q.slots is not None),
                int(q.rate is not None), self._burst, *members,
            ],
        )  # fmt: skip
