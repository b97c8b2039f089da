"""Operator controls held in Redis, so every daemon on every host obeys them and they survive
restarts: a queue's pause (``lua/pause.lua``, ``lua/resume.lua``; readers ask ``paused``), and
cancellations (``lua/cancel.lua`` marks, ``lua/cancel_delayed.lua``; readers drop what is
cancelled with ``lua/cancelled.lua``, lease renewals report it: ``lua/renew.lua``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.store import connection, notes
from jobd.store.base import StoreBase
from jobd.store.keys import STATS_TTL


@dataclass(frozen=True, slots=True)
class Paused:
    since_ms: int  # Redis's time when it was paused
    by: str  # user@host of who paused it


class ControlOps(StoreBase):
    def pause(self, queue: QueueConfig, by: str) -> tuple[Paused, bool]:
        """Pause ``queue`` (all its priority levels); the pause in force, and whether this call
        made it (False: it was paused already, since then)."""
        since, who, made = self.scripts.pause(
            keys=[queue.keys.paused, *notes.keys(queue)], args=[by, notes.settings(queue)]
        )
        return paused_from({b"since": since, b"by": who}) or Paused(0, ""), bool(made)

    def resume(self, queue: QueueConfig, by: str) -> Paused | None:
        """Resume ``queue`` (``by``: user@host, for the events); the pause it ended, or None
        when it was not paused."""
        reply = self.scripts.resume(
            keys=[queue.keys.paused, *notes.keys(queue)], args=[by, notes.settings(queue)]
        )
        return paused_from({b"since": reply[0], b"by": reply[1]}) if reply else None

    def paused(self, queue: QueueConfig) -> Paused | None:
        """The queue's pause, if it is paused (a pause key someone else wrote counts, since 0)."""
        try:
            fields: Mapping[bytes, bytes] | Exception = self.client.hgetall(queue.keys.paused)
        except redis.ResponseError as exc:
            if connection.away(exc):  # busy, out of memory: Redis cannot say now
                raise
            fields = exc
        return paused_from(fields)


def paused_from(reply: Mapping[bytes, bytes] | Exception) -> Paused | None:
    """A pause key as read (HGETALL, or the error it gave): None when there is no key. A key of
    another type there (someone else's), or a ``since`` that is no number, still means paused."""
    if isinstance(reply, Exception):
        return Paused(0, "?")
    if not reply:
        return None
    by = os.fsdecode(reply.get(b"by") or b"")
    try:
        return Paused(int(reply.get(b"since") or b""), by)
    except ValueError:
        return Paused(0, by)


@dataclass(frozen=True, slots=True)
class Found:
    """Where ``jobd cancel`` found a job: 'running' (on ``consumer``, entry ``entry``),
    'waiting' (in the stream, not delivered), 'delayed' (removed from the delayed set, due at
    ``due_ms``) or 'marked' (nowhere yet: a mark waits for it)."""

    job_id: str
    where: str
    consumer: str = ""
    entry: str = ""
    due_ms: int = 0


DELAYED_PAGE = 1000  # members of a delayed set cancel_delayed.lua looks at per call
PENDING_PAGE = 1000  # entries of a pending list cancel.lua looks at per call


def _found(row: list) -> Found:
    jid, where = os.fsdecode(row[0]), row[1].decode()
    if where == "running":
        return Found(jid, where, os.fsdecode(row[2]), row[3].decode())
    return Found(jid, where, entry=row[2].decode() if len(row) > 2 else "")


class CancelOps(StoreBase):
    def cancel(self, level: QueueConfig, job_ids: list[str], wait_ms: int, by: str) -> list[Found]:
        """Mark ``job_ids`` cancelled on one stream (the queue's or a level's): a pending one is
        stopped by its daemon at its next lease renewal, any other is acked unrun when read;
        marks last ``wait_ms``. The pending list is walked a page per call. ``by`` (user@host)
        asked: each job id is in the queue's events with it ('': none, for a second level)."""
        left = [os.fsencode(j) for j in job_ids]
        found: list[Found] = []
        start = "-"
        while start:
            after, rows = self.scripts.cancel(
                keys=[level.stream, level.keys.cancels, *notes.keys(level)],
                args=[level.group, wait_ms, start, PENDING_PAGE, notes.settings(level), by, *left],
            )
            start = after.decode()
            found += [_found(row) for row in rows]
            running = {os.fsencode(f.job_id) for f in found if f.where == "running"}
            left = [j for j in left if j not in running]
            if not left:
                break
        return found

    def cancel_delayed(self, level: QueueConfig, job_ids: list[str], by: str) -> list[Found]:
        """Remove the delayed jobs of ``job_ids`` from the level's delayed set, walking it a
        bounded page per call (never one long script); each one's history says ``by`` did."""
        ids = [os.fsencode(j) for j in job_ids]
        found: list[Found] = []
        start = 0
        while start >= 0:
            start, removed = self.scripts.cancel_delayed(
                keys=[
                    level.keys.delayed,
                    level.keys.stats(),
                    level.keys.cancels,
                    *notes.keys(level),
                    *map(level.keys.job_mark, ids),
                ],
                args=[start, DELAYED_PAGE, STATS_TTL, notes.settings(level), by, *ids],
            )
            found += [Found(os.fsdecode(j), "delayed", due_ms=int(due)) for j, due in removed]
        return found

    def cancelled(self, level: QueueConfig, jobs: list[Job]) -> set[str]:
        """Of jobs this consumer just read, acknowledge unrun those cancelled (a --unique one's
        'queued' mark deleted with it); their message ids."""
        keys: list[str | bytes] = [
            level.stream, level.keys.cancels, level.keys.stats(), *notes.keys(level),
        ]  # fmt: skip
        pairs: list[object] = []
        for job in jobs:
            mark = job.mark_key(level.keys, False)  # --unique jobs only
            if mark is not None:
                keys.append(mark)
            pairs += [job.message_id, len(keys) if mark is not None else 0]
        acked = self.scripts.cancelled(
            keys=keys, args=[level.group, self.consumer, STATS_TTL, notes.settings(level), *pairs]
        )
        return {mid.decode() for mid in acked}

    def has_cancels(self, queue: QueueConfig) -> bool:
        """Whether any cancellation mark of the queue exists (expired ones included)."""
        return bool(self.client.exists(queue.keys.cancels))
