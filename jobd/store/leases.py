"""Leases and cluster-wide limits in Redis: renewing the entries this consumer holds, with their
slots (``lua/renew.lua``), and a reader's side of a queue's limits: slots and rate tokens taken
before a read (``lua/acquire.lua``), bound to the entries read after it (``lua/bind.lua``), and
its field in the waiting hash removed when it stops.

The scripts count every expiry on Redis's clock; what they are passed are durations, derived
here from the queue's lease (why: ``jobd.daemon.lease`` and ``jobd.daemon.limits``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import redis

from jobd.config import QueueConfig
from jobd.store import notes
from jobd.store.base import StoreBase
from jobd.store.connection import BLOCK_MS
from jobd.store.keys import UNIQUE_TTL

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
class Shown:
    """What a running handler told of itself (``process.channel.Told``), as its job's active
    record shows it (``jobd job``: ``running.progress``, ``running.status``,
    ``running.deadline``)."""

    message_id: str
    job_id: str
    progress: float | None
    status: bytes | None  # at most STATUS_MAX bytes, as sent
    # Its deadline, ms after its start, when it extended it (``running.deadline``: the record's
    # since plus this, on Redis's clock as start.lua's); None: as start.lua wrote it.
    deadline_ms: int | None = None

    def fields(self) -> bytes:
        """The record's members' text, '"progress":42,"status":"half way"' (those known): a
        status that is not UTF-8 is kept with its bytes escaped (``\\xff``)."""
        shown: dict[str, object] = {}
        if self.progress is not None:
            whole = self.progress.is_integer()
            shown["progress"] = int(self.progress) if whole else self.progress
        if self.status is not None:
            shown["status"] = self.status.decode("utf-8", "backslashreplace")
        return orjson.dumps(shown)[1:-1]


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
    def keep_marks(self, marks: list[bytes]) -> None:
        """Keep the 'queued' marks of --unique jobs this daemon holds (one queue's) for
        ``UNIQUE_TTL`` from now at least: a job that runs longer keeps its mark."""
        self.scripts.keep_marks(keys=marks, args=[UNIQUE_TTL * 1000] * len(marks))

    def renew(self, queue: QueueConfig, ids: list[str]) -> list[Lost]:
        """Renew ``ids`` in one script call, with their cluster-wide slots when the queue has
        a limit; returns the ones this consumer no longer holds (all of them when the group or
        its stream was deleted)."""
        return self.renew_telling(queue, ids, [])[0]

    def renew_telling(
        self,
        queue: QueueConfig,
        ids: list[str],
        told: list[Shown],
        jobs: Sequence[str] = (),
        marks: Sequence[bytes | None] = (),
    ) -> tuple[list[Lost], list[str]]:
        """``renew``, and in the same call what the handlers of some of ``ids`` told of
        themselves written into their jobs' active records, for those renewed (``told``: what
        changed since the last renewal). ``jobs``: the job ids of ``ids`` ('' where not known),
        under which a job whose entry was deleted ends 'lost' (renew.lua); ``marks``: their
        --unique marks (None: none), which such an end deletes while they say 'queued'. Returns
        the entries lost and the ids of ``told`` whose fields were written (one whose active
        record is not written yet is not)."""
        k = queue.keys
        keys: list[str | bytes] = [queue.stream, k.cancels, *notes.keys(queue), k.waiters]
        keys += [k.outbox, k.taken, k.running]
        lease = slot_lease_ms(queue) if queue.slots else 0  # 0: no slots, KEYS[10] left alone
        args: list[object] = [queue.group, self.consumer, lease]
        args += [notes.settings(queue), len(told)]
        for shown in told:
            deadline = "" if shown.deadline_ms is None else shown.deadline_ms
            args += [shown.message_id, os.fsencode(shown.job_id), shown.fields(), deadline]
        job_ids = [os.fsencode(job_id) for job_id in jobs] + [b""] * (len(ids) - len(jobs))
        at = []  # where renew.lua finds each one's mark in KEYS (0: none)
        for mark in [*marks, *[None] * (len(ids) - len(marks))]:
            keys += [mark] if mark is not None else []
            at.append(len(keys) if mark is not None else 0)
        try:
            reply = self.scripts.renew(keys=keys, args=[*args, len(ids), *ids, *job_ids, *at])
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return [Lost(key(queue), mid, "") for mid in ids], []
        lost, cancelled, written = reply
        gone = [
            Lost(key(queue), lost[i].decode(), os.fsdecode(lost[i + 1]))  # owner: any bytes
            for i in range(0, len(lost), 2)
        ]
        gone += [Lost(key(queue), mid.decode(), self.consumer, cancelled=True) for mid in cancelled]
        return gone, [mid.decode() for mid in written]

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

    def release_slots(self, queue: QueueConfig, members: list[str]) -> None:
        """Free these slots of the queue's running set (``keys.slot_member``s)."""
        self.scripts.release(keys=[queue.keys.running], args=members)

    def leave(self, queue: QueueConfig) -> None:
        """This consumer no longer waits for a slot or a token: its field in the waiting hash
        is removed."""
        self.client.hdel(queue.keys.waiting, self.consumer)
