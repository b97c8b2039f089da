"""Inspecting and acting on dead-lettered jobs: what `jobd dlq` does.

Records are found by their id on the dead-letter stream, or by the job id they carry
(``jobd_job_id``), in Redis (``lua/dead_letter_find.lua``). Requeueing moves a record's job
back to its queue's stream with its job id kept and its attempts reset, and deletes the record,
in one script (``Store.requeue``, ``lua/requeue.lua``, which reads the records itself, by id or
in order: none passes through Python, whatever its size); a ``--unique`` job stays unique and
gets its mark back. A record that holds no job jobd could run (others may XADD to the stream
too) is left in place and reported.
"""

from __future__ import annotations

import os
import re

from jobd.config import QueueConfig
from jobd.store.admin import Record, Requeued
from jobd.store.store import Store

STREAM_ID = re.compile(r"^\d+-\d+$")


def records(store: Store, queue: QueueConfig, limit: int | None = None) -> list[Record]:
    """Newest first."""
    return store.dead_letters(queue, limit)


def find(store: Store, queue: QueueConfig, ref: str) -> Record | None:
    """The record ``ref`` names (``find_id``), read whole: what `jobd dlq show` prints."""
    found = find_id(store, queue, ref)
    records = store.dead_letters_by_id(queue, [found]) if found else []
    return records[0] if records else None


def find_id(store: Store, queue: QueueConfig, ref: str) -> str | None:
    """The id of the record with id ``ref``, else of the newest record whose job id is ``ref``
    (any bytes: a ``str`` from the command line is ``os.fsencode``'d back); looked for in Redis,
    no record read here."""
    if STREAM_ID.match(ref):
        found = store.dead_letter_id(queue, ref)
        if found:
            return found
    return store.dead_letter_of_job(queue, os.fsencode(ref))


def requeue_ids(store: Store, queue: QueueConfig, ids: list[str], by: str) -> Requeued:
    """Move the jobs of the records of these ids back to the queue (a record gone meanwhile is
    skipped); ``by`` (who asked: user@host) is in the queue's events. Ids alone are sent: the
    script reads each record itself."""
    return store.requeue(queue, ids, by)


def requeue_existing(store: Store, queue: QueueConfig, by: str) -> Requeued:
    """Requeue every record there is now: up to the newest when called, so jobs that fail
    again meanwhile, dead-lettered anew, wait for the next requeue instead of looping. The
    records are walked in Redis (``Store.requeue_range``): none is read here."""
    return store.requeue_range(queue, by)


def requeue(store: Store, queue: QueueConfig, record_ids: list[str], by: str) -> list[str]:
    """Move these records' jobs back to the queue; returns the record ids moved (missing or
    invalid ids, and records left in place, are not). No record is read here."""
    return requeue_ids(store, queue, record_ids, by).moved


def requeue_all(store: Store, queue: QueueConfig, by: str) -> list[str]:
    """``requeue_existing``'s record ids moved."""
    return requeue_existing(store, queue, by).moved


def purge(store: Store, queue: QueueConfig, by: str) -> int:
    """Delete every record; returns how many there were. ``by`` is in the queue's events."""
    return store.purge(queue, by)
