"""Inspecting and acting on dead-lettered jobs: what `jobd dlq` does.

Records are found by their id on the dead-letter stream, or by the job id they carry
(``jobd_job_id``). Requeueing moves a record's job back to its queue's stream with its job id
kept and its attempts reset, and deletes the record, in one script (``Store.requeue``,
``lua/requeue.lua``); a ``--unique`` job stays unique and gets its mark back. A record that
holds no job jobd could run (others may XADD to the stream too) is left in place and reported.
"""

from __future__ import annotations

import os
import re

from jobd.config import QueueConfig
from jobd.store.admin import Record, Requeued
from jobd.store.store import Store

STREAM_ID = re.compile(r"^\d+-\d+$")
SCAN_CHUNK = 500


def records(store: Store, queue: QueueConfig, limit: int | None = None) -> list[Record]:
    """Newest first."""
    return store.dead_letters(queue, limit)


def find(store: Store, queue: QueueConfig, ref: str) -> Record | None:
    """The record with id ``ref``, else the newest record whose job id is ``ref`` (any bytes:
    a ``str`` from the command line is ``os.fsencode``'d back)."""
    if STREAM_ID.match(ref):
        found = store.dead_letters_by_id(queue, [ref])
        if found:
            return found[0]
    job_id = os.fsencode(ref)
    before = "+"
    while True:
        page = store.dead_letters(queue, SCAN_CHUNK, before)
        for record in page:
            if record.fields.get(b"jobd_job_id") == job_id:
                return record
        if len(page) < SCAN_CHUNK:
            return None
        before = f"({page[-1].id}"


def requeue_records(store: Store, queue: QueueConfig, found: list[Record], by: str) -> Requeued:
    """Move these records' jobs back to the queue (a record gone meanwhile is skipped); ``by``
    (who asked: user@host) is in the queue's events."""
    return store.requeue(queue, found, by)


def requeue_existing(store: Store, queue: QueueConfig, by: str) -> Requeued:
    """Requeue every record there is now: up to the newest when called, so jobs that fail
    again meanwhile, dead-lettered anew, wait for the next requeue instead of looping."""
    done = Requeued()
    newest = store.dead_letters(queue, 1)
    if not newest:
        return done
    start = "-"
    while True:
        page = store.dead_letters_between(queue, start, newest[0].id, SCAN_CHUNK)
        more = store.requeue(queue, page, by)
        done.moved += more.moved
        done.left += more.left
        if len(page) < SCAN_CHUNK:
            return done
        start = f"({page[-1].id}"


def requeue(store: Store, queue: QueueConfig, record_ids: list[str], by: str) -> list[str]:
    """Move these records' jobs back to the queue; returns the record ids moved (missing or
    invalid ids, and records left in place, are not)."""
    return store.requeue(queue, store.dead_letters_by_id(queue, record_ids), by).moved


def requeue_all(store: Store, queue: QueueConfig, by: str) -> list[str]:
    """``requeue_existing``'s record ids moved."""
    return requeue_existing(store, queue, by).moved


def purge(store: Store, queue: QueueConfig, by: str) -> int:
    """Delete every record; returns how many there were. ``by`` is in the queue's events."""
    return store.purge(queue, by)
