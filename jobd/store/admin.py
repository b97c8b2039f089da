"""What operators and producers do in Redis: dead letters read (XRANGE, XREVRANGE, and the
dashboard's cut view, ``lua/dead_letters_shown.lua``), moved back to their queue
(``lua/requeue.lua``) and purged (``lua/purge.lua``); a job added to its queue now (XADD), for
later (``lua/schedule.lua``) or only if its job id is not there already
(``lua/enqueue_unique.lua``), with the wait for its durability in the same round trip, or many
jobs in one pipeline (``enqueue_batch``). What the commands around them decide: ``jobd.dlq``
and ``jobd.producer``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from jobd.config import QueueConfig
from jobd.job import BATCH, BATCH_INCARNATION, JOB_ID
from jobd.store import connection, notes
from jobd.store.base import StoreBase
from jobd.store.browse import READ_BUDGET, shown_pairs
from jobd.store.delayed import Due, schedule_call
from jobd.store.keys import UNIQUE_TTL, flatten

REQUEUE_CHUNK = 500  # records per requeue.lua call
# Bytes of records one requeue.lua call moves (one record at least): each call holds Redis
# while it copies them, whatever their size.
REQUEUE_BYTES = 64 << 20
FIND_CHUNK = 500  # dead letters a dead_letter_find.lua call visits at most, looking for a job id
FIND_BYTES = 8 << 20  # and bytes of them it copies (one record at least), as REQUEUE_BYTES


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

    def dead_letters_by_id(self, queue: QueueConfig, ids: list[str]) -> list[Record]:
        """The records of these ids, in one round trip; an id missing or not valid is skipped."""
        pipe = self.client.pipeline(transaction=False)
        for rid in ids:
            pipe.xrange(queue.dead_letter.stream, rid, rid)
        replies = pipe.execute(raise_on_error=False)
        return [_records(rows)[0] for rows in replies if isinstance(rows, list) and rows]

    def dead_letter_id(self, queue: QueueConfig, record_id: str) -> str | None:
        """The id of the record ``record_id`` names (as Redis writes it), None when there is
        none or it is no stream id; the record is not read (``lua/dead_letter_find.lua``)."""
        found, _ = self.scripts.dead_letter_find(
            keys=[queue.dead_letter.stream], args=["id", record_id]
        )
        return found.decode() if found else None

    def dead_letter_of_job(self, queue: QueueConfig, job_id: bytes) -> str | None:
        """The id of the newest record whose ``jobd_job_id`` is ``job_id``, looked for in
        Redis (FIND_CHUNK records, FIND_BYTES of them, a call, newest first): no record is
        read here."""
        start: str | bytes = "+"
        while True:
            found, last = self.scripts.dead_letter_find(
                keys=[queue.dead_letter.stream], args=["job", job_id, start, FIND_CHUNK, FIND_BYTES]
            )
            if found or not last:
                return found.decode() if found else None
            start = b"(" + last

    def requeue(self, queue: QueueConfig, ids: list[str], by: str) -> Requeued:
        """Move the jobs of the records of these ids back to the queue, attempts reset, and
        delete the records; a record missing (or gone meanwhile) is skipped, one that holds no
        job jobd could run is left in place. ``by`` (user@host) is in the events. The script
        reads each record itself: none leaves Redis (``_requeue``)."""
        done, rest = Requeued(), list(ids)
        while rest:
            visited, _, _ = self._requeue(queue, by, done, ["ids", *rest[:REQUEUE_CHUNK]])
            rest = rest[visited:]
        return done

    def requeue_range(self, queue: QueueConfig, by: str) -> Requeued:
        """``requeue`` every record there is now, oldest first, up to the newest when called
        (a job dead-lettered anew meanwhile waits for the next requeue instead of looping)."""
        done, start, end = Requeued(), "-", "+"
        while True:
            more, last, upto = self._requeue(queue, by, done, ["range", start, end])
            if not more or last is None or upto is None:
                return done
            start, end = f"({last}", upto

    def _requeue(
        self, queue: QueueConfig, by: str, done: Requeued, what: list[str]
    ) -> tuple[int, str | None, str | None]:
        """One call of ``lua/requeue.lua`` (REQUEUE_CHUNK records, REQUEUE_BYTES of them at
        most), its moves added to ``done``; returns how many ids it visited (or, for a range,
        whether there may be more), the last id visited and the range's end."""
        keys = [queue.dead_letter.stream, queue.stream, *notes.keys(queue), queue.keys.cancels]
        args = [UNIQUE_TTL * 1000, notes.settings(queue), by, queue.keys.job_mark(b""),
                REQUEUE_CHUNK, REQUEUE_BYTES, *what]  # fmt: skip
        moved, left, visited, more, last, upto = self.scripts.requeue(keys=keys, args=args)
        done.moved += [x.decode() for x in moved]
        pairs = zip(left[::2], left[1::2], strict=True)
        done.left += [(x.decode(), why.decode()) for x, why in pairs]
        count = int(visited) if what[0] == "ids" else int(more)
        return count, last and last.decode(), upto and upto.decode()

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
                f = entry.fields  # its record names its batch (docs: Workflows)
                batch = [f.get(BATCH, b""), f.get(BATCH_INCARNATION, b"")]
                args = [notes.settings(queue), job_id, entry.due, *batch]
                self.scripts.scheduled(keys=notes.keys(queue), args=args, client=pipe)
        else:
            pipe.xadd(queue.stream, entry.fields)  # type: ignore[arg-type]


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
