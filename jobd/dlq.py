"""Inspecting and acting on dead-lettered jobs: what `jobd dlq` does.

Records are found by their id on the dead-letter stream, or by the job id they carry
(``jobd_job_id``). Requeueing moves a record's job back to its queue's stream with its job id
kept and its attempts reset, and deletes the record, in one script (``lua/requeue.lua``); a
``--unique`` job stays unique and gets its mark back. A record that holds no job jobd could
run (others may XADD to the stream too) is left in place and reported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import redis

from jobd.config import QueueConfig
from jobd.job import JOB_ID, RESERVED_JOB_ID, Job
from jobd.store.keys import UNIQUE_TTL
from jobd.store.scripts import Scripts

STREAM_ID = re.compile(r"^\d+-\d+$")
SCAN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Record:
    id: str
    fields: dict[bytes, bytes]

    def get(self, name: str) -> str:
        return self.fields.get(name.encode(), b"").decode("utf-8", "backslashreplace")


@dataclass(slots=True)
class Requeued:
    """What a requeue did: the record ids moved, and those left in place with why."""

    moved: list[str] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)


def records(client: redis.Redis, queue: QueueConfig, limit: int | None = None) -> list[Record]:
    """Newest first."""
    rows = client.xrevrange(queue.dead_letter.stream, count=limit)
    return [Record(mid.decode(), fields) for mid, fields in rows]


def find(client: redis.Redis, queue: QueueConfig, ref: str) -> Record | None:
    """The record with id ``ref``, else the newest record whose job id is ``ref`` (any bytes:
    a ``str`` from the command line is ``os.fsencode``'d back)."""
    dead = queue.dead_letter.stream
    if STREAM_ID.match(ref):
        rows = client.xrange(dead, ref, ref)
        if rows:
            return Record(rows[0][0].decode(), rows[0][1])
    job_id = os.fsencode(ref)
    end = "+"
    while True:
        rows = client.xrevrange(dead, end, "-", count=SCAN_CHUNK)
        for mid, fields in rows:
            if fields.get(b"jobd_job_id") == job_id:
                return Record(mid.decode(), fields)
        if len(rows) < SCAN_CHUNK:
            return None
        end = f"({rows[-1][0].decode()}"


def requeue_records(scripts: Scripts, queue: QueueConfig, found: list[Record]) -> Requeued:
    """Move these records' jobs back to the queue (a record gone meanwhile is skipped)."""
    done = Requeued()
    for i in range(0, len(found), SCAN_CHUNK):
        keys, args = _requeue_call(queue, found[i : i + SCAN_CHUNK])
        moved, left = scripts.requeue(keys=keys, args=args)
        done.moved += [x.decode() for x in moved]
        pairs = zip(left[::2], left[1::2], strict=True)
        done.left += [(x.decode(), why.decode()) for x, why in pairs]
    return done


def _requeue_call(queue: QueueConfig, chunk: list[Record]) -> tuple[list, list]:
    """KEYS and ARGV of ``lua/requeue.lua``, with the mark of each --unique job."""
    keys: list[str | bytes] = [queue.dead_letter.stream, queue.stream]
    args: list[str | int] = [UNIQUE_TTL * 1000]
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


def requeue_existing(client: redis.Redis, scripts: Scripts, queue: QueueConfig) -> Requeued:
    """Requeue every record there is now: up to the newest when called, so jobs that fail
    again meanwhile, dead-lettered anew, wait for the next requeue instead of looping."""
    dead = queue.dead_letter.stream
    done = Requeued()
    newest = client.xrevrange(dead, count=1)
    if not newest:
        return done
    start: str | bytes = "-"
    while True:
        rows = client.xrange(dead, start, newest[0][0], count=SCAN_CHUNK)
        found = [Record(mid.decode(), fields) for mid, fields in rows]
        more = requeue_records(scripts, queue, found)
        done.moved += more.moved
        done.left += more.left
        if len(rows) < SCAN_CHUNK:
            return done
        start = b"(" + rows[-1][0]


def requeue(scripts: Scripts, queue: QueueConfig, record_ids: list[str]) -> list[str]:
    """Move these records' jobs back to the queue; returns the record ids moved (missing or
    invalid ids, and records left in place, are not)."""
    client = scripts.requeue.registered_client
    pipe = client.pipeline(transaction=False)
    for rid in record_ids:
        pipe.xrange(queue.dead_letter.stream, rid, rid)
    found = [
        Record(rows[0][0].decode(), rows[0][1])
        for rows in pipe.execute(raise_on_error=False)
        if isinstance(rows, list) and rows
    ]
    return requeue_records(scripts, queue, found).moved


def requeue_all(client: redis.Redis, scripts: Scripts, queue: QueueConfig) -> list[str]:
    """``requeue_existing``'s record ids moved."""
    return requeue_existing(client, scripts, queue).moved


def purge(client: redis.Redis, queue: QueueConfig) -> int:
    """Delete every record; returns how many there were."""
    return int(Scripts(client).purge(keys=[queue.dead_letter.stream]))
