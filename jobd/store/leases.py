"""Leases and cluster-wide limits in Redis: renewing the entries this consumer holds, with their
slots (``lua/renew.lua``), and a reader's side of a queue's limits: slots and rate tokens taken
before a read (``lua/acquire.lua``), bound to the entries read after it (``lua/bind.lua``), and
its field in the waiting hash removed when it stops.

The scripts count every expiry on Redis's clock; what they are passed are durations, derived
here from the queue's lease (why: ``jobd.daemon.lease`` and ``jobd.daemon.limits``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.store import notes
from jobd.store.base import StoreBase
from jobd.store.connection import BLOCK_MS

LeaseKey = tuple[str, str]  # (stream, group): where an entry's lease lives

PENDING_SLACK = BLOCK_MS / 1000 + 5  # seconds a slot taken before a read may wait to be bound
# A waiting reader asks again at least every second (a poll, or a rate wait capped at 1 s), each
# time refreshing its field in the waiting hash; a field not refreshed for WAITING_STALE is a
# stopped or dead reader's (or one whose queue lost its limits), and acquire.lua removes it.
# Removing a live one by mistake (a stalled host) only hides it until its next ask.
WAITING_STALE = 10.0  # seconds


def key(queue: QueueConfig) -> LeaseKey:
    return (queue.stream, queue.group)


@dataclass(frozen=True, slots=True)
class Lost:
    key: LeaseKey
    message_id: str
    owner: str  # the consumer holding it now; '' when none (acknowledged, trimmed, handed back)
    cancelled: bool = False  # not lost: still ours, and `jobd cancel` asks for it to stop
    delivery: int = 0  # which delivery of it the report is about (``Job.delivery``; 0: unknown)

    def about(self, job: object) -> bool:
        """Whether this report is about ``job``'s delivery (where both are numbered), not an
        earlier one of the same entry."""
        other = getattr(job, "delivery", 0)
        return not (self.delivery and other) or self.delivery == other


@dataclass(frozen=True, slots=True)
class Grant:
    """What acquire.lua granted: at most the slots and tokens asked for; when none, how long
    until a token is due (rate), or 0: ask again soon (slots)."""

    granted: int
    wait_ms: int


def slot_lease_ms(queue: QueueConfig) -> int:
    """How long a slot renewed now lives, in ms: as long as its entry's lease. The scripts
    add it to Redis's clock."""
    return int(queue.lease.reclaim_after * 1000)


def pending_lease_ms(queue: QueueConfig) -> int:
    """How long a slot taken before a read lives if it is never bound, in ms."""
    return int(max(queue.lease.reclaim_after, PENDING_SLACK) * 1000)


class LeaseOps(StoreBase):
    def renew(self, queue: QueueConfig, ids: list[str]) -> list[Lost]:
        """Renew ``ids`` in one script call, with their cluster-wide slots when the queue has
        a limit; returns the ones this consumer no longer holds (all of them when the group or
        its stream was deleted)."""
        keys = [queue.stream, queue.keys.cancels, *notes.keys(queue)]
        keys += [queue.keys.running] if queue.slots else []
        args = [queue.group, self.consumer, slot_lease_ms(queue), notes.settings(queue), *ids]
        try:
            reply = self.scripts.renew(keys=keys, args=args)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return [Lost(key(queue), mid, "") for mid in ids]
        lost, cancelled = reply
        return [
            Lost(key(queue), lost[i].decode(), os.fsdecode(lost[i + 1]))  # owner: any bytes
            for i in range(0, len(lost), 2)
        ] + [Lost(key(queue), mid.decode(), self.consumer, cancelled=True) for mid in cancelled]

    def acquire(self, queue: QueueConfig, want: int) -> Grant:
        """Take up to ``want`` slots and rate tokens before a read."""
        rate = queue.rate
        granted, wait_ms = self.scripts.acquire(
            keys=[queue.keys.running, queue.keys.rate, queue.keys.waiting],
            args=[
                want, self.consumer, queue.slots or 0, pending_lease_ms(queue),
                rate.per_ms if rate else 0, rate.burst if rate else 0,
                int(WAITING_STALE * 1000),
            ],
        )  # fmt: skip
        return Grant(int(granted), int(wait_ms))

    def bind(self, queue: QueueConfig, granted: int, members: list[str]) -> str:
        """The entries read hold slots from now on (``members``: their ``keys.slot_member``);
        the slots and tokens of the ``granted`` not used are freed. Returns the id of the
        stream's newest entry ('0-0' when empty)."""
        rate = queue.rate
        newest = self.scripts.bind(
            keys=[queue.keys.running, queue.keys.rate, queue.stream],
            args=[
                self.consumer, granted, slot_lease_ms(queue), int(queue.slots is not None),
                int(rate is not None), rate.burst if rate else 0, *members,
            ],
        )  # fmt: skip
        return newest.decode() if isinstance(newest, bytes) else str(newest)

    def leave(self, queue: QueueConfig) -> None:
        """This consumer no longer waits for a slot or a token: its field in the waiting hash
        is removed."""
        self.client.hdel(queue.keys.waiting, self.consumer)
