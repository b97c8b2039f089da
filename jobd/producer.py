"""Adding jobs: what `jobd enqueue` does, usable from Python too. The write, and the wait for
its durability in the same round trip, are the store's (``Store.enqueue``); this module decides
the job's fields and due time, and what the replies mean."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import redis
from redis.exceptions import AskError, MovedError

from jobd.config import Config, QueueConfig
from jobd.job import JOB_ID, MAX_FIELDS, PAYLOAD, UNIQUE
from jobd.store import connection as redisconn
from jobd.store.admin import Durability, Enqueued
from jobd.store.delayed import after
from jobd.store.store import Store


class ProducerError(Exception):
    pass


class NotDurable(ProducerError):
    """The job is enqueued, but not confirmed as durable as asked (fewer replicas acknowledged
    it in time, or the server cannot say): a failover now could lose it. Sending it again
    with the same job id is safe for handlers that do their work once per ``JOBD_JOB_ID``."""

    def __init__(self, job_id: str, message: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class Duplicate(ProducerError):
    """``unique=True`` and the job id is already queued or running (``state`` 'queued') or
    done within the queue's dedupe window ('done'): nothing was added."""

    def __init__(self, job_id: str, queue: str, state: str) -> None:
        what = "queued or running" if state == "queued" else "done within the dedupe window"
        super().__init__(f"job id {job_id!r} is already {what} in queue {queue!r}: not added")
        self.job_id, self.state = job_id, state


def enqueue(
    config: Config,
    queue: str,
    payload: bytes,
    job_id: str | None = None,
    at: float | None = None,
    client: redis.Redis | None = None,
    durability: Durability | None = None,
    unique: bool = False,
    priority: str | None = None,
    delay: float | None = None,
) -> str:
    """Add one job to ``queue``; returns its job id.

    Now: XADD to the stream, and the job id is the ``job_id`` given, else the stream id.
    With ``delay`` (seconds) or ``at`` (Unix seconds), not both: due that long after Redis's
    clock (TIME), or at that moment; one script decides, on Redis's clock, whether it is due
    already (then XADD to the stream now) or waits in the queue's delayed set, moved to the
    stream when due. This host's clock plays no part. A timed job gets a generated job id when
    none is given (whether it waits or not: the script decides after the fields are sent).
    With ``durability``: the write and a WAIT (or WAITAOF) go in one pipeline on one
    connection, so the wait covers this write; raises NotDurable when it falls short.
    With ``unique`` (a ``job_id`` is required): added only if that job id is not queued,
    running, or done within the dedupe window, checked and added in one script; else raises
    Duplicate. Its mark lasts until ``UNIQUE_TTL`` after the job is due (by Redis's clock), in
    case the job is lost.
    A job has at most ``job.MAX_FIELDS`` fields (ProducerError otherwise).
    With ``priority``: into that level's stream (the queue's own stream is its default level).
    """
    if unique and job_id is None:
        raise ValueError("a unique job needs a job_id")
    if at is not None and delay is not None:
        raise ValueError("give at or delay, not both")
    q = _target(config, queue, priority)
    due = due_arg(at, delay)
    if due is not None and job_id is None:
        job_id = uuid.uuid4().hex
    fields = job_fields(payload, job_id, unique)
    with _store(config, client) as store:
        added = store.enqueue(q, fields, due, job_id if unique else None, durability)
    if isinstance(added.error, (MovedError, AskError)) and client is not None:
        store.refresh()  # not written: the slot moved
    job_id = _added(added, queue, job_id)
    if durability is not None:
        _check(job_id, durability, added.wait)
    return job_id


def _target(config: Config, queue: str, priority: str | None) -> QueueConfig:
    """The queue, or its level ``priority``: the stream a job for it goes to."""
    q = config.queues[queue]
    if priority is None:
        return q
    try:
        return q.level(priority)
    except ValueError as exc:
        raise ProducerError(str(exc)) from None


def job_fields(payload: bytes, job_id: str | None, unique: bool) -> dict[bytes, bytes]:
    """The fields of the job's entry; ProducerError when they are more than jobd runs."""
    fields: dict[bytes, bytes] = {PAYLOAD: payload}
    if job_id is not None:
        fields[JOB_ID] = os.fsencode(job_id)  # any bytes: see Job.job_id
    if unique:
        fields[UNIQUE] = b"1"
    check_width(fields)
    return fields


@contextlib.contextmanager
def _store(config: Config, client: redis.Redis | None) -> Iterator[Store]:
    """A store on ``client``, else on a client of its own, closed after; ProducerError when
    Redis cannot be reached (a client given then looks again where the nodes are)."""
    own = client is None
    store = Store.open(config.redis, "enqueue") if client is None else Store(client)
    try:
        yield store
    except redisconn.UNAVAILABLE as exc:
        if not own:
            store.refresh()
        raise ProducerError(f"cannot reach Redis at {config.redis.describe()}: {exc}") from exc
    finally:
        if own:
            store.close()


def _added(added: Enqueued, queue: str, job_id: str | None) -> str:
    """The job id of the job the store says was added; ProducerError (Duplicate for a unique
    job already there) when none was."""
    if isinstance(added.error, (MovedError, AskError)):  # not written: the slot moved
        raise ProducerError(
            f"the queue's slot moved (a failover or resharding): not enqueued, send it again "
            f"({added.error})"
        )
    if added.error is not None:
        raise ProducerError(f"Redis refused the job: {added.error}")
    if added.exists is not None:
        raise Duplicate(job_id, queue, added.exists)  # type: ignore[arg-type]
    return job_id if job_id is not None else added.entry_id  # type: ignore[return-value]


def due_arg(at: float | None, delay: float | None) -> int | str | None:
    """The scripts' due time: ``at`` in Unix ms, or ``delay`` as ms after Redis's clock
    (``store.delayed.after``); None for now."""
    if delay is not None:
        return after(round(delay * 1000))
    return None if at is None else int(at * 1000)


def check_width(fields: dict[bytes, bytes]) -> None:
    """Refuse a job wider than jobd runs (``job.MAX_FIELDS``): its scripts could not copy it."""
    if len(fields) > MAX_FIELDS:
        raise ProducerError(
            f"a job has at most {MAX_FIELDS} fields (jobd.job.MAX_FIELDS); this one has "
            f"{len(fields)}: not added"
        )


def _check(job_id: str, want: Durability, reply: object) -> None:
    what = "fsynced it to their append-only files" if want.aof else "received it"
    if isinstance(reply, Exception):
        hint = ""
        if want.aof and "unknown command" in str(reply).lower():
            hint = " (WAITAOF needs Redis 7.2 or later)"
        raise NotDurable(job_id, f"job {job_id} is enqueued, but its durability is unknown: "
                                 f"{reply}{hint}")  # fmt: skip
    local, replicas = reply if want.aof else (1, reply)  # type: ignore[misc]
    if int(local) < 1 or int(replicas) < want.replicas:
        where = "the master did not fsync it and " if int(local) < 1 else ""
        raise NotDurable(
            job_id,
            f"job {job_id} is enqueued, but {where}only {replicas} of {want.replicas} "
            f"replica(s) {what} within {want.timeout:g}s: a failover now could lose it",
        )
