"""Cluster-wide limits of a queue: at most ``limits.concurrency`` handlers running across all
daemons, and at most ``limits.rate`` starts per window.

Slots are members of the queue's running set (``keys.QueueKeys.running``), each scored by the
expiry of its lease. Before a read, a reader takes slots (and rate tokens) for at most its free
local slots (``lua/acquire.lua``), then reads no more entries than it was granted, then binds
the slots to the entries it read and gives back the rest (``lua/bind.lua``): a daemon waiting
for a slot or a token has read nothing it cannot start. A slot is renewed with its entry's
lease (``lua/renew.lua``) and freed with its outcome (``lua/release.lua``, in the recorder's
round trip); the slot of a daemon that died expires with its lease, ``reclaim_after`` later.
The calls, and the leases they pass, are the store's (``jobd.store.leases``).

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
from jobd.store.store import Store

POLL = 0.1  # seconds a reader waits before asking again for a slot


def limited(queue: QueueConfig) -> bool:
    return queue.slots is not None or queue.rate is not None


class Limiter:
    """One reader's side of its queue's limits, as its store's consumer."""

    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.store, self.queue = store, queue

    def acquire(self, want: int) -> tuple[int, float]:
        """Take up to ``want`` slots and tokens; returns (granted, seconds to wait if none)."""
        grant = self.store.acquire(self.queue, want)
        wait = min(max(grant.wait_ms / 1000, 0.005), 1.0) if grant.wait_ms else POLL
        return grant.granted, wait

    def bind(self, granted: int, members: list[str]) -> str:
        """The entries read hold slots from now on (``members``: their ``slot_member``s); the
        slots and tokens not used are freed. Returns the id of the stream's newest entry."""
        return self.store.bind(self.queue, granted, members)

    def leave(self) -> None:
        """A reader that stops is no longer waiting: remove its field from the waiting hash, so
        ``jobd status`` does not list it. Best effort: a field left (Redis away) goes stale and
        acquire.lua removes it, ``store.leases.WAITING_STALE`` later."""
        with contextlib.suppress(redis.RedisError, OSError):
            self.store.leave(self.queue)
