"""What operators and producers do in Redis: dead letters read (XRANGE, XREVRANGE, and the
dashboard's cut view, ``lua/dead_letters_shown.lua``), moved back to their queue
(``lua/requeue.lua``) and purged (``lua/purge.lua``); a job added to its queue now (XADD), for
later (``lua/schedule.lua``) or only if its job id is not there already
(``lua/enqueue_unique.lua``), with the wait for its durability in the same round trip, or many
jobs in one pipeline (``enqueue_batch``). What the commands around them decide: ``jobd.dlq``
and ``jobd.producer``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from jobd.config import QueueConfig
from jobd.job import JOB_ID, RESERVED_JOB_ID, Job
from jobd.store import connection, notes
from jobd.store.base import StoreBase
from jobd.store.browse import READ_BUDGET, shown_pairs
from jobd.store.delayed import Due, schedule_call
from jobd.store.keys import UNIQUE_TTL, flatten

REQUEUE_CHUNK = 500  # records per requeue.lua call


@dataclass(frozen=True, slots=True)
class Record:
    """A dead letter: its id on the dead-letter stream, and its fields."""

    id: str
    fields: dict[bytes, bytes]

    def get(self, name: str) -> str:
        return self.fields.get(name.encode(), b"").decode("utf-8", "backslashreplace")


@dataclass(slots=True)
class Requeued:
    """What a requeue did: the record ids moved, and those left in place with why."""

    moved: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Shown:
    """A dead letter as the dashboard shows it: for each field asked for, in order, its value
    cut in Redis (None when the record has no such field) and its whole length in bytes; and
    how many fields it holds (``width``)."""

    id: str
    values: list[tuple[bytes | None, int]]
    width: int = 0


@dataclass(frozen=True)
class Durability:
    """What to wait for after the write: ``replicas`` replicas that received it (WAIT) or,
    with ``aof``, the master's and ``replicas`` replicas' append-only files fsynced (WAITAOF,
    Redis 7.2+); at most ``timeout`` seconds."""

    replicas: int = 0
    aof: bool = False
    timeout: float = 1.0


@dataclass(frozen=True, slots=True)
class NewEntry:
    """A job to add: its fields, when it is due (None: now; Unix ms, or ``delayed.after``)
    and, for a unique job, its job id (added only if that id is not there already)."""

    fields: dict[bytes, bytes]
    due: Due | None = None
    unique_id: str | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What adding a job did: refused (``error``: nothing written), found its job id there
    already (``exists``: 'queued' or 'done', nothing added), or added, to the stream now
    (``entry_id``) or to the delayed set (no entry id); and the durability wait's reply."""

    error: Exception | None = None
    entry_id: str | None = None
    exists: str | None = None
    wait: object = None  # WAIT's (replicas), WAITAOF's ([local, replicas]) or its error


def _records(rows: list) -> list[Record]:
    return [Record(mid.decode(), fields) for mid, fields in rows]


class AdminOps(StoreBase):
    def dead_letters(
        self, queue: QueueConfig, count: int | None = None, before: str = "+"
    ) -> list[Record]:
        """Up to ``count`` records, newest first, from ``before`` on (an id; '(' + id: after
        it)."""
        return _records(self.client.xrevrange(queue.dead_letter.stream, before, "-", count=count))

    def dead_letters_between(
        self, queue: QueueConfig, start: str, end: str, count: int | None = None
    ) -> list[Record]:
        """Up to ``count`` records from ``start`` to ``end`` (ids, '-' or '+'), oldest first."""
        return _records(self.client.xrange(queue.dead_letter.stream, start, end, count=count))

    def dead_letters_by_id(self, queue: QueueConfig, ids: list[str]) -> list[Record]:
        """The records of these ids, in one round trip; an id missing or not valid is skipped."""
        pipe = self.client.pipeline(transaction=False)
        for rid in ids:
            pipe.xrange(queue.dead_letter.stream, rid, rid)
        replies = pipe.execute(raise_on_error=False)
        return [_records(rows)[0] for rows in replies if isinstance(rows, list) and rows]

    def requeue(self, queue: QueueConfig, records: list[Record], by: str) -> Requeued:
        """Move these records' jobs back to the queue, attempts reset, and delete the records
        (one script call per ``REQUEUE_CHUNK``); a record gone meanwhile is skipped, one that
        holds no job jobd could run is left in place. ``by`` (user@host) is in the events."""
        done = Requeued()
        for i in range(0, len(records), REQUEUE_CHUNK):
            keys, args = _requeue_call(queue, records[i : i + REQUEUE_CHUNK], by)
            moved, left = self.scripts.requeue(keys=keys, args=args)
            done.moved += [x.decode() for x in moved]
            pairs = zip(left[::2], left[1::2], strict=True)
            done.left += [(x.decode(), why.decode()) for x, why in pairs]
        return done

    def purge(self, queue: QueueConfig, by: str) -> int:
        """Delete every record; returns how many there were. ``by`` (user@host) is in the
        queue's events."""
        keys = [queue.dead_letter.stream, *notes.keys(queue)]
        return int(self.scripts.purge(keys=keys, args=[notes.settings(queue), by]))

    def dead_letters_shown(
        self, queue: QueueConfig, count: int, fields: Sequence[tuple[str, int]]
    ) -> list[Shown]:
        """The newest ``count`` records, only ``fields`` of each: (name, bytes kept: the first
        N, or with -N the last N), cut in Redis, so a huge record never leaves it whole; no
        record read once those read hold ``READ_BUDGET`` bytes."""
        args: list[object] = [count, READ_BUDGET]
        for name, cap in fields:
            args += [name, cap]
        rows = self.scripts.dead_letters_shown(keys=[queue.dead_letter.stream], args=args)
        return [Shown(row[0].decode(), shown_pairs(row), int(row[1])) for row in rows]

    def enqueue(
        self,
        queue: QueueConfig,
        fields: dict[bytes, bytes],
        due: Due | None = None,
        unique_id: str | None = None,
        durability: Durability | None = None,
    ) -> Enqueued:
        """Add a job: now (XADD), or due at ``due`` (Unix ms, or ``delayed.after``), the script
        deciding on Redis's clock whether it is due already; with ``unique_id`` (its job id)
        only if that job id is not queued, running or done within the dedupe window. On a
        cluster, straight to the node of the queue's slot, so that the durability wait (WAIT
        or WAITAOF, in the same pipeline on the same connection) covers this write."""
        node = connection.node_for(self.client, queue.stream)
        pipe = node.pipeline(transaction=False)
        self._add(pipe, queue, NewEntry(fields, due, unique_id))
        writes = len(pipe)
        if durability is not None:
            _wait(pipe, durability)
        replies = pipe.execute(raise_on_error=False)
        wait = replies[writes] if durability is not None else None
        return _enqueued(replies[0], unique_id is not None, wait)

    def enqueue_batch(self, queue: QueueConfig, entries: Sequence[NewEntry]) -> list[Enqueued]:
        """Add many jobs in one round trip (``jobd enqueue --lines``/``--ndjson``): each as
        ``enqueue`` adds one (XADD, or its script for a timed or unique job), all in one
        pipeline to the node of the queue's slot (every key of a queue is in that slot). A
        batch with a script in it costs one more round trip (redis-py's SCRIPT EXISTS, which
        loads a script the server lacks). What each write did, in order; an error refuses its
        own job only."""
        pipe = connection.node_for(self.client, queue.stream).pipeline(transaction=False)
        first: list[int] = []  # where each entry's write is among the pipeline's commands
        for entry in entries:
            first.append(len(pipe))
            self._add(pipe, queue, entry)
        replies = pipe.execute(raise_on_error=False)
        return [
            _enqueued(replies[i], entry.unique_id is not None, None)
            for i, entry in zip(first, entries, strict=True)
        ]

    def clock_ms(self) -> int:
        """Redis's clock (TIME), Unix ms: what a job's expiry is counted on."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _add(self, pipe: redis.client.Pipeline, queue: QueueConfig, entry: NewEntry) -> None:
        """Queue on ``pipe`` the write that adds ``entry``'s job (its reply comes first), and
        for a delayed job with a job id its record (scheduled.lua)."""
        if entry.unique_id is not None:
            keys = [queue.stream, queue.keys.delayed, queue.keys.job_mark(entry.unique_id)]
            args = [UNIQUE_TTL * 1000, entry.due or 0, uuid.uuid4().hex, *flatten(entry.fields)]
            self.scripts.enqueue_unique(keys=keys, args=args, client=pipe)
        elif entry.due is not None:
            keys, args = schedule_call(queue, entry.fields, entry.due, to_stream=True)
            self.scripts.schedule(keys=keys, args=args, client=pipe)
            job_id = entry.fields.get(JOB_ID)
            if job_id:  # its history says it is delayed (scheduled.lua)
                args = [notes.settings(queue), job_id, entry.due]
                self.scripts.scheduled(keys=notes.keys(queue), args=args, client=pipe)
        else:
            pipe.xadd(queue.stream, entry.fields)  # type: ignore[arg-type]


def _requeue_call(queue: QueueConfig, chunk: list[Record], by: str) -> tuple[list, list]:
    """KEYS and ARGV of ``lua/requeue.lua``, with the mark of each --unique job."""
    keys: list[str | bytes] = [
        queue.dead_letter.stream, queue.stream, *notes.keys(queue), queue.keys.cancels,
    ]  # fmt: skip
    args: list[str | int] = [UNIQUE_TTL * 1000, notes.settings(queue), by]
    for record in chunk:
        mark = _mark(queue, record)
        if mark is not None and mark not in keys:
            keys.append(mark)
        args += [record.id, 0 if mark is None else keys.index(mark) + 1]
    return keys, args


def _mark(queue: QueueConfig, record: Record) -> bytes | None:
    """The mark key of a record's --unique job, as the daemon derives it from the requeued
    entry (``Job.mark_key``); None for a job that is not unique or carries no job id."""
    if not any(record.fields.get(name) for name in (JOB_ID, RESERVED_JOB_ID)):
        return None
    job = Job.from_entry(queue.name, record.id.encode(), record.fields)
    mark = job.mark_key(queue.keys, False)
    return None if mark is None else os.fsencode(mark)  # exact bytes, from str or bytes


def _wait(pipe: redis.client.Pipeline, want: Durability) -> None:
    timeout_ms = max(1, int(want.timeout * 1000))
    if want.aof:
        pipe.execute_command("WAITAOF", 1, want.replicas, timeout_ms)
    else:
        pipe.execute_command("WAIT", want.replicas, timeout_ms)


def _enqueued(reply: object, unique: bool, wait: object) -> Enqueued:
    """The write's reply: XADD's entry id, schedule.lua's (1: delayed; else the entry id), or
    enqueue_unique.lua's {'added', entry id or ''} / {'exists', mark}; or its error."""
    if isinstance(reply, Exception):
        return Enqueued(error=reply, wait=wait)
    if unique:
        verdict, detail = reply  # type: ignore[misc]
        if verdict == b"exists":
            return Enqueued(exists=detail.decode(), wait=wait)
        return Enqueued(entry_id=detail.decode() or None, wait=wait)
    return Enqueued(entry_id=reply.decode() if isinstance(reply, bytes) else None, wait=wait)
