"""Adding jobs: what `jobd enqueue` does, usable from Python too. The writes, and the wait for
their durability in the same round trip, are the store's (``Store.enqueue``, ``enqueue_batch``);
this module decides each job's fields and due time, and what the replies mean.

One job: ``enqueue(config, queue, payload, job_id=..., delay=...)``, or ``enqueue_job`` with a
``NewJob``; to wait for its end and its result, ``submit(config, queue, NewJob(...)).wait()``
(``jobd.waiting``). Many: ``enqueue_many(config, queue, jobs)`` takes any iterable of ``NewJob`` and
sends them ``BATCH`` to a round trip (a timed or unique job through its script, in the same
pipeline); it returns a ``Bulk``: the job ids of the jobs added, in input order, and a
``Refused`` (its index in the input, why) for each job not added; or, with ``on_batch``, hands
each batch's outcomes over as they come, for inputs too large to hold.

``NewJob`` (``jobd.newjob``) says what a job is: payload, job id, extra fields, delay or
time, uniqueness, and the per-job limits (``jobd_timeout``, ``jobd_max_attempts``,
``jobd_expires_at``); its docstring lists them, ``after`` and ``batch`` too (``jobd.workflows``).
A payload above the queue's ``max_payload`` is refused (the daemon would not run it). A job
refused (by its own checks or by Redis) is never half-written, nor stops a bulk enqueue.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterable, Iterator

import redis
from redis.exceptions import AskError, MovedError

from jobd import waiting, workflows
from jobd.config import Config, QueueConfig
from jobd.enqueue_result import (  # jobd.producer has them all: its callers import them here
    Bulk,
    Duplicate,
    Interrupted,
    NotDurable,
    Outcome,
    Prepared,
    ProducerError,
    Refused,
)
from jobd.job import ORIGIN
from jobd.newjob import Clock, NewJob, RedisClock, prepare, too_wide
from jobd.store import connection as redisconn
from jobd.store.admin import Durability, Enqueued, NewEntry
from jobd.store.store import Store
from jobd.waiting import Ended as Ended  # submit's, for callers: jobd.producer has them all
from jobd.waiting import JobFailed as JobFailed
from jobd.waiting import Pending
from jobd.waiting import WaitError as WaitError
from jobd.waiting import WaitTimeout as WaitTimeout

BATCH = 1000  # jobs per round trip in enqueue_many: ~1 ms of Redis's time for small jobs
BATCH_BYTES = 16 * 2**20  # and payload bytes per round trip, at most (one job may be larger)


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
    case the job is lost. A job has at most ``job.MAX_FIELDS`` fields, jobd's own counted as
    its daemon counts them (``newjob.too_wide``; ProducerError otherwise).
    With ``priority``: into that level's stream (the queue's own stream is its default level).
    Per-job limits and extra fields: ``enqueue_job``.
    """
    job = NewJob(payload, job_id, delay=delay, at=at, unique=unique)
    return enqueue_job(config, queue, job, priority, client, durability)


def enqueue_job(
    config: Config,
    queue: str,
    job: NewJob,
    priority: str | None = None,
    client: redis.Redis | None = None,
    durability: Durability | None = None,
) -> str:
    """Add ``job`` to ``queue`` (as ``enqueue`` does, with its fields and per-job limits);
    returns its job id. ValueError, before anything is written, for a job refused."""
    return _enqueue(config, queue, job, priority, client, durability, None)[0]


def _enqueue(
    config: Config, queue: str, job: NewJob, priority: str | None, client: redis.Redis | None,
    durability: Durability | None, origin: str | None,
) -> tuple[str, str | None]:  # fmt: skip
    """``enqueue_job``, its entry carrying ``origin`` (``job.ORIGIN``) when given; its job id,
    the id of the entry it added (None: delayed, or held: ``jobd.workflows``); batches count it."""
    q = _target(config, queue, priority)
    with _store(config, client) as store:
        # All checked before its batch opens: a job refused leaves it as it was (jobd.workflows)
        entry, job_id = _prepare(job, clock := RedisClock(store), q)
        if origin is not None:
            entry.fields[ORIGIN] = origin.encode()
            check_width(entry.fields)
        deps = workflows.waited_for(config, q, job, job_id, store) if job.after else []  # type: ignore[arg-type]
        if job.after and (before := workflows.sent_before(store, q, job_id, clock, job.unique)):
            if before == "ended":  # sent before, its hold ended since: done
                return job_id, None
            raise Duplicate(job_id, queue, before)  # type: ignore[arg-type]  # the mark first
        with workflows.member(store, config, q, job) as member:
            try:  # counted before it is added: a batch never completes without it
                member.grow(1, [entry.fields])
            except workflows.BatchComplete:  # takes no new job: a --unique one there is a duplicate
                if job.unique and (mark := workflows.marks_of(store, q, [job_id])[0]):  # type: ignore[list-item]
                    raise Duplicate(job_id, queue, mark) from None
                raise
            if job.after:  # held until the jobs it waits for end (jobd.workflows)
                held = workflows.hold(store, config, q, entry, job_id, job, deps, member)  # type: ignore[arg-type]
                return _added(held, queue, job_id), None  # Duplicate: --unique, its id there
            added = store.enqueue(q, entry.fields, entry.due, entry.unique_id, durability)
            member.added(int(added.error is None and added.exists is None))
    if isinstance(added.error, (MovedError, AskError)) and client is not None:
        store.refresh()  # not written: the slot moved
    job_id = _added(added, queue, job_id)
    if durability is not None:
        _check(job_id, durability, added.wait)
    return job_id, added.entry_id


def submit(
    config: Config,
    queue: str,
    job: NewJob,
    priority: str | None = None,
    client: redis.Redis | None = None,
    durability: Durability | None = None,
) -> Pending:
    """Add ``job`` (as ``enqueue_job``) to be waited for: ``submit(...).wait(timeout)`` returns
    its result once it is done (bytes, or None), and raises ``JobFailed`` when it ended
    otherwise (dead-lettered, expired, cancelled: ``.ended``) or ``WaitTimeout``;
    ``.outcome(timeout)`` returns how it ended instead (``jobd.waiting``). Where the queue's
    events end is read before the job is added, so an end however soon is never missed.

    The wait is for this enqueue's job, not another of its job id: its ends are known by the
    entry the enqueue added, which its retries carry on (``job.ORIGIN``); a timed job, or one
    held until others end (``after``), which has no entry yet, carries a token of its own from
    the start (its release, and its end where it waits, dead-lettered or cancelled, say it)."""
    q = config.queues[queue]
    own = client is None
    store = Store.open(config.redis, "enqueue") if own else Store(client)
    later = job.delay is not None or job.at is not None or bool(job.after)  # no entry now
    token = uuid.uuid4().hex if later else None
    try:
        with _store(config, store.client) as reading:
            after = waiting.mark(reading, q)
        job_id, entry = _enqueue(config, queue, job, priority, store.client, durability, token)
    except BaseException:
        if own:
            store.close()
        raise
    return Pending(store, q, job_id, token or entry or "", after, own)


def enqueue_many(
    config: Config,
    queue: str,
    jobs: Iterable[NewJob],
    priority: str | None = None,
    client: redis.Redis | None = None,
    batch: int = BATCH,
    on_batch: Callable[[list[Outcome]], None] | None = None,
) -> Bulk:
    """Add ``jobs`` to ``queue``, ``batch`` to a round trip, holding one batch at a time. A
    job refused (by its own checks or by Redis) does not stop the others. With ``on_batch``,
    each batch's outcomes (one a job, in order) go to it as they come, and the Bulk returned
    stays empty: for inputs too large to hold (``jobd enqueue --lines`` uses it). A job with
    ``after`` is refused (holding is one job's round trips: ``enqueue_job`` holds it). Raises
    Interrupted when Redis cannot be reached: the batch being sent may or may not be written."""
    done = Bulk()
    keep = on_batch or done.add
    q = _target(config, queue, priority)
    source, start, chunk = iter(jobs), 0, []
    try:
        with _store(config, client) as store, workflows.member_of(store, config, q, source) as (
            member, source,
        ):  # fmt: skip
            clock = RedisClock(store)
            while chunk := _chunk(source, batch):
                prepared = _prepared(q, chunk, start, clock)
                sent = [p[0].fields for p in prepared if not isinstance(p, Refused)]
                try:
                    member.grow(len(sent), sent)  # opens it
                except workflows.BatchComplete:  # refuses them, unless each is a duplicate
                    if (outcomes := _duplicates(store, q, queue, prepared, start)) is None:
                        raise
                else:
                    outcomes = _send(store, q, queue, prepared, start)
                    member.added(sum(not isinstance(o, Refused) for o in outcomes))
                keep(outcomes)
                start += len(chunk)
    except ProducerError as exc:
        raise Interrupted(str(exc), done, range(start, start + len(chunk))) from exc
    return done


def _chunk(source: Iterator[NewJob], batch: int) -> list[NewJob]:
    """The next jobs to send together: up to ``batch`` of them, and payloads of no more than
    BATCH_BYTES in all (large payloads would otherwise fill this process's memory and Redis's
    query buffer, whose default limit of 1 GiB closes the connection)."""
    chunk: list[NewJob] = []
    size = 0
    for job in source:
        chunk.append(job)
        size += len(job.payload)
        if len(chunk) >= batch or size >= BATCH_BYTES:
            break
    return chunk


def _prepared(q: QueueConfig, chunk: list[NewJob], start: int, clock: Clock) -> list[Prepared]:
    """One batch's jobs, each prepared (its entry and job id) or refused, nothing written."""
    prepared: list[Prepared] = []
    for index, job in enumerate(chunk, start):
        try:
            if job.after:  # holding is one job's round trips (jobd.workflows hold): not here
                raise ValueError(
                    "a job with after (held until other jobs end) cannot go through "
                    "enqueue_many: add it with enqueue_job (or submit)"
                )
            prepared.append(_prepare(job, clock, q))
        except (ValueError, ProducerError) as exc:
            prepared.append(Refused(index, str(exc)))
    return prepared


def _send(store: Store, q: QueueConfig, queue: str, prepared: list[Prepared],
          start: int) -> list[Outcome]:  # fmt: skip
    """One batch (``_prepared``): the jobs not refused written in one pipeline."""
    entries = [p[0] for p in prepared if not isinstance(p, Refused)]
    replies = iter(store.enqueue_batch(q, entries) if entries else [])
    outcomes = [
        p if isinstance(p, Refused) else _outcome(index, next(replies), p[1], queue)
        for index, p in enumerate(prepared, start)
    ]
    if any(isinstance(o, Refused) and o.temporary for o in outcomes):
        store.refresh()  # on a cluster, the slot may have moved
    return outcomes


def _duplicates(store: Store, q: QueueConfig, queue: str, prepared: list[Prepared],
                start: int) -> list[Outcome] | None:  # fmt: skip
    """A batch's outcomes (``_prepared``) when their batch is complete: each job refused by its
    own checks as it was, each --unique one whose job id is there already a duplicate (as the
    job alone would be); None when another is neither (a new job: the batch refuses it)."""
    sent = [(i, p[0].unique_id, p[1]) for i, p in enumerate(prepared, start)
            if not isinstance(p, Refused)]  # fmt: skip
    if any(unique is None for _, unique, _ in sent):
        return None  # not --unique: a new job
    marks = workflows.marks_of(store, q, [unique for _, unique, _ in sent])  # type: ignore[misc]
    if None in marks:
        return None
    found = {i: Refused(i, str(Duplicate(job_id, queue, mark)), duplicate=True)  # type: ignore[arg-type]
             for (i, _, job_id), mark in zip(sent, marks, strict=True)}  # fmt: skip
    return [found.get(i, p) for i, p in enumerate(prepared, start)]  # type: ignore[misc]


def _prepare(job: NewJob, clock: Clock, q: QueueConfig) -> tuple[NewEntry, str | None]:
    """``newjob.prepare``, and a job jobd runs: its payload within the queue's max_payload
    (ValueError: a larger one would be dead-lettered unrun, or be more than Redis takes in
    one bulk string and lose the connection), no wider than ``job.MAX_FIELDS``."""
    if len(job.payload) > q.max_payload:
        raise ValueError(
            f"payload of {len(job.payload)} bytes is above the queue's max_payload "
            f"({q.max_payload}): jobd would not run it"
        )
    entry, job_id = prepare(job, clock)
    check_width(entry.fields)
    return entry, job_id


def _outcome(index: int, added: Enqueued, job_id: str | None, queue: str) -> Outcome:
    """One job's outcome from the store's reply."""
    try:
        return _added(added, queue, job_id)
    except Duplicate as exc:
        return Refused(index, str(exc), duplicate=True)
    except ProducerError as exc:
        error = added.error
        away = isinstance(error, (MovedError, AskError)) or (
            error is not None and redisconn.away(error)
        )
        return Refused(index, str(exc), temporary=away)


def _target(config: Config, queue: str, priority: str | None) -> QueueConfig:
    """The queue, or its level ``priority``: the stream a job for it goes to."""
    q = config.queues[queue]
    if priority is None:
        return q
    try:
        return q.level(priority)
    except ValueError as exc:
        raise ProducerError(str(exc)) from None


@contextlib.contextmanager
def _store(config: Config, client: redis.Redis | None) -> Iterator[Store]:
    """A store on ``client``, else on a client of its own, closed after; ProducerError when
    Redis cannot be reached (a client given then looks again where the nodes are)."""
    own = client is None
    store = Store.open(config.redis, "enqueue") if client is None else Store(client)
    store.know(config.queues.values())  # the config in force, for the notices it moves
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


def check_width(fields: dict[bytes, bytes]) -> None:
    """Refuse a job wider than jobd runs (``job.MAX_FIELDS``, jobd's fields counted as the
    daemon that reads it counts them: ``newjob.too_wide``): its scripts could not copy it."""
    if (why := too_wide(fields)) is not None:
        raise ProducerError(f"{why}: not added")


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
