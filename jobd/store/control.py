"""Operator controls held in Redis, so every daemon on every host obeys them and they survive
restarts: a queue's pause (``lua/pause.lua``, ``lua/resume.lua``; readers ask ``paused``), and
cancellations (``lua/cancel.lua`` marks, ``lua/cancel_waiting.lua``, ``lua/cancel_delayed.lua``;
readers drop what is cancelled with ``lua/cancelled.lua``, and learn that an entry their daemon
holds was cancelled from the cancel generation they poll with the pause (``controls``,
``cancelled_held``); lease renewals report it too: ``lua/renew.lua``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.store import connection, notes
from jobd.store.base import StoreBase
from jobd.store.browse import score_ms
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

    def controls(self, queue: QueueConfig) -> tuple[Paused | None, bytes | None]:
        """The queue's pause and its cancel generation, in one round trip (a reader's poll). A
        generation Redis cannot give (someone else's key there) is None: no change seen."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(queue.keys.paused)
        pipe.get(queue.keys.cancel_gen)
        fields, gen = pipe.execute(raise_on_error=False)
        if isinstance(fields, redis.ResponseError) and connection.away(fields):
            raise fields  # busy, out of memory: Redis cannot say now
        return paused_from(fields), generation(gen)


def generation(reply: object) -> bytes | None:
    """A cancel generation as read (GET, or the error it gave)."""
    return reply if isinstance(reply, bytes) else None


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
    ``due_ms``: None for a score that is no time, ``browse.score_ms``), 'held' (waiting for
    other jobs: removed, ``Store.cancel_held``) or 'marked' (nowhere yet: a mark waits for it)."""

    job_id: str
    where: str
    consumer: str = ""
    entry: str = ""
    due_ms: int | None = 0
    stream: str = ""  # the stream (the queue's or a level's) of ``entry``


DELAYED_PAGE = 1000  # members of a delayed set cancel_delayed.lua looks at per call
PENDING_PAGE = 1000  # entries of a pending list cancel.lua looks at per call
WAITING_PAGE = 1000  # entries not delivered yet cancel_waiting.lua looks at per call
WAITING_SCAN = 100_000  # entries not delivered yet one cancel looks at, at most, per stream


def _found(row: list, stream: str) -> Found:
    jid, where = os.fsdecode(row[0]), row[1].decode()
    if where == "running":
        return Found(jid, where, os.fsdecode(row[2]), row[3].decode(), stream=stream)
    return Found(jid, where, entry=row[2].decode() if len(row) > 2 else "", stream=stream)


def each_place_once(found: list[Found]) -> list[Found]:
    """``found`` with each place once (an entry whose job id is its id is found waiting twice),
    and a job id's 'marked' rows only when it was found nowhere else."""
    placed = {f.job_id for f in found if f.where != "marked"}
    return [f for f in dict.fromkeys(found) if f.where != "marked" or f.job_id not in placed]


class CancelOps(StoreBase):
    def cancel(
        self, level: QueueConfig, job_ids: list[str], unseen_ms: int, by: str
    ) -> list[Found]:
        """Mark ``job_ids`` cancelled on one stream (the queue's or a level's): a pending one is
        stopped by its daemon (its reader polls the cancel generation), a waiting one is acked
        unrun when read, each held until its entry is settled; a job found nowhere is acked
        unrun if read within ``unseen_ms``. Every entry of a job id counts (a producer may have
        sent it twice): the whole pending list is walked, a page per call, then the entries not
        delivered yet, for every job id (``_waiting``: one found running may have a copy
        waiting). ``by`` (user@host) asked: each job id is in the queue's events with it ('':
        none, for a second level). A job id's 'marked' row only when it was found nowhere."""
        ids = [os.fsencode(j) for j in job_ids]
        found: list[Found] = []
        start = "-"
        while start:
            after, rows = self.scripts.cancel(
                keys=[level.stream, level.keys.cancels, *notes.keys(level), level.keys.cancel_gen],
                args=[level.group, unseen_ms, start, PENDING_PAGE, notes.settings(level), by,
                      *ids],
            )  # fmt: skip
            start = after.decode()
            found += [_found(row, level.stream) for row in rows]
        return each_place_once(found + self._waiting(level, ids))

    def _waiting(self, level: QueueConfig, job_ids: list[bytes]) -> list[Found]:
        """The jobs of ``job_ids`` found among the level's entries no daemon has read yet, each
        marked until it is settled (``lua/cancel_waiting.lua``): a page per call, WAITING_SCAN
        entries at most (a job further back keeps its mark by job id, for ``unseen_ms``)."""
        found: list[Found] = []
        start, looked = "", 0
        while looked < WAITING_SCAN:
            after, rows = self.scripts.cancel_waiting(
                keys=[level.stream, level.keys.cancels],
                args=[level.group, start, WAITING_PAGE, *job_ids],
            )
            found += [Found(os.fsdecode(j), "waiting", entry=e.decode(), stream=level.stream)
                      for j, e in rows]  # fmt: skip
            start, looked = after.decode(), looked + WAITING_PAGE
            if not start:
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
                    level.keys.stats(self.minute(level.stream)),
                    level.keys.cancels,
                    *notes.keys(level),
                    level.keys.waiters,
                    level.keys.outbox,
                    *map(level.keys.job_mark, ids),
                ],
                args=[start, DELAYED_PAGE, STATS_TTL, notes.settings(level), by, *ids],
            )
            found += [Found(os.fsdecode(j), "delayed", due_ms=score_ms(due))
                      for j, due in removed]  # fmt: skip
        return found

    def cancelled(self, level: QueueConfig, jobs: list[Job]) -> set[str]:
        """Of jobs this consumer just read, acknowledge unrun those cancelled (a --unique one's
        'queued' mark deleted with it); their message ids."""
        keys: list[str | bytes] = [
            level.stream, level.keys.cancels, level.keys.stats(self.minute(level.stream)),
            *notes.keys(level),
            level.keys.waiters, level.keys.outbox,
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

    def cancelled_held(self, level: QueueConfig, ids: list[str]) -> list[str]:
        """Of entries of ``level`` this daemon holds, those ``jobd cancel`` marked: a ZSCORE of
        each one's mark, in one pipeline; none when the marks key is someone else's."""
        pipe = self.client.pipeline(transaction=False)
        for mid in ids:
            pipe.zscore(level.keys.cancels, f"id:{level.stream}|{mid}".encode())
        scores = pipe.execute(raise_on_error=False)
        for score in scores:
            if isinstance(score, redis.ResponseError) and connection.away(score):
                raise score
        return [mid for mid, score in zip(ids, scores, strict=True) if isinstance(score, float)]

    def still_pending(self, level: QueueConfig, entries: list[str]) -> list[str]:
        """Which of ``entries`` of ``level`` are still pending (delivered, not settled): one
        pipeline. A group or stream gone holds none."""
        pipe = self.client.pipeline(transaction=False)
        for mid in entries:
            pipe.xpending_range(level.stream, level.group, mid, mid, 1)
        replies = pipe.execute(raise_on_error=False)
        return [mid for mid, r in zip(entries, replies, strict=True) if isinstance(r, list) and r]

    def has_cancels(self, queue: QueueConfig) -> bool:
        """Whether any cancellation mark of the queue exists (expired ones included)."""
        return bool(self.client.exists(queue.keys.cancels))
