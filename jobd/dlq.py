"""Inspecting and acting on dead-lettered jobs: what `jobd dlq` does.

Records are found by their id on the dead-letter stream, or by the job id they carry
(``jobd_job_id``). Requeueing moves a record's job back to its queue's stream with its job id
kept and its attempts reset, and deletes the record, in one script (``lua/requeue.lua``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.scripts import Scripts

STREAM_ID = re.compile(r"^\d+-\d+$")
SCAN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Record:
    id: str
    fields: dict[bytes, bytes]

    def get(self, name: str) -> str:
        return self.fields.get(name.encode(), b"").decode("utf-8", "backslashreplace")


def records(client: redis.Redis, queue: QueueConfig, limit: int | None = None) -> list[Record]:
    """Newest first."""
    rows = client.xrevrange(queue.dead_letter.stream, count=limit)
    return [Record(mid.decode(), fields) for mid, fields in rows]


def find(client: redis.Redis, queue: QueueConfig, ref: str) -> Record | None:
    """The record with id ``ref``, else the newest record whose job id is ``ref``."""
    dead = queue.dead_letter.stream
    if STREAM_ID.match(ref):
        rows = client.xrange(dead, ref, ref)
        if rows:
            return Record(rows[0][0].decode(), rows[0][1])
    end = "+"
    while True:
        rows = client.xrevrange(dead, end, "-", count=SCAN_CHUNK)
        for mid, fields in rows:
            if fields.get(b"jobd_job_id") == ref.encode():
                return Record(mid.decode(), fields)
        if len(rows) < SCAN_CHUNK:
            return None
        end = f"({rows[-1][0].decode()}"


def requeue(scripts: Scripts, queue: QueueConfig, record_ids: list[str]) -> list[str]:
    """Move these records' jobs back to the queue; returns the record ids moved."""
    moved: list[str] = []
    for i in range(0, len(record_ids), SCAN_CHUNK):
        chunk = record_ids[i : i + SCAN_CHUNK]
        reply = scripts.requeue(keys=[queue.dead_letter.stream, queue.stream], args=chunk)
        moved += [x.decode() for x in reply]
    return moved


def requeue_all(client: redis.Redis, scripts: Scripts, queue: QueueConfig) -> list[str]:
    moved: list[str] = []
    while True:
        rows = client.xrange(queue.dead_letter.stream, count=SCAN_CHUNK)
        if not rows:
            return moved
        moved += requeue(scripts, queue, [mid.decode() for mid, _ in rows])


def purge(client: redis.Redis, queue: QueueConfig) -> int:
    """Delete every record; returns how many there were."""
    pipe = client.pipeline(transaction=True)
    pipe.xlen(queue.dead_letter.stream)
    pipe.delete(queue.dead_letter.stream)
    count, _ = pipe.execute()
    return int(count)
