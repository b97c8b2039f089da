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
import time

import redis

from jobd.config import QueueConfig
from jobd.daemon.lease import Holdings
from jobd.store.keys import slot_member
from jobd.store.leases import LeaseKey, key
from jobd.store.store import Store

POLL = 0.1  # seconds a reader waits before asking again for a slot


def limited(queue: QueueConfig) -> bool:
    return queue.slots is not None or queue.rate is not None


def limiter(
    store: Store, queue: QueueConfig, holdings: Holdings, earlier: frozenset[LeaseKey] = frozenset()
) -> Limiter | None:
    """A reader's limiter, for a queue with limits (``earlier``: see ``Limiter``)."""
    return Limiter(store, queue, holdings, earlier) if limited(queue) else None


class Limiter:
    """One reader's side of its queue's limits, as its store's consumer."""

    def __init__(
        self,
        store: Store,
        queue: QueueConfig,
        holdings: Holdings | None = None,
        earlier: frozenset[LeaseKey] = frozenset(),
    ) -> None:
        self.store, self.queue = store, queue
        # What this daemon holds, whose slots are taken before the first acquire (``adopt``).
        self.holdings = holdings
        self.all_held = holdings  # kept: ``keep_earlier`` looks at it at each pass
        # Where the queue's entries were read before a reload moved it to other streams: their
        # slots are in the old streams' running sets, which this reader does not count.
        self.earlier = earlier
        self.adopted: set[str] = set()  # their slots bound in this queue's running set
        self.next_keep = 0.0

    def adopt(self) -> None:
        """Before the first acquire: the entries this daemon holds of the queue take their
        slots. A reload that sets ``limits.concurrency`` finds handlers started without one
        (the queue had no limit); renewals would add their slots only at the next tick, and
        until then this reader would take the whole limit again on top of them."""
        if self.holdings is not None and self.queue.slots is not None:
            members = [
                slot_member(self.store.consumer, level.stream, mid)
                for level in self.queue.all_levels()
                for mid in self.holdings.snapshot(key(level))
            ]
            if members:
                self.store.bind(self.queue, 0, members)
        self.holdings = None

    def keep_earlier(self) -> None:
        """The entries this daemon still holds of the queue on the streams it was read from
        before a reload moved it (``earlier``) hold slots in this queue's running set too:
        bound at once, renewed at least every ``lease.renew_every`` (they live
        ``reclaim_after``), released once settled. Without this a move doubled the limit
        while the jobs started before it ran: their slots were counted on the old stream
        only. Called at each read pass, and at least twice a second while no slot is free."""
        if not self.earlier or self.all_held is None or self.queue.slots is None:
            return
        members = {
            slot_member(self.store.consumer, stream, mid)
            for stream, group in self.earlier
            for mid in self.all_held.snapshot((stream, group))
        }
        now = time.monotonic()
        if members and (members - self.adopted or now >= self.next_keep):
            self.store.bind(self.queue, 0, sorted(members))
            self.next_keep = now + self.queue.lease.renew_every
        if settled := self.adopted - members:
            self.store.release_slots(self.queue, sorted(settled))
        self.adopted = members

    def acquire(self, want: int) -> tuple[int, float]:
        """Take up to ``want`` slots and tokens; returns (granted, seconds to wait if none)."""
        self.adopt()
        self.keep_earlier()
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
