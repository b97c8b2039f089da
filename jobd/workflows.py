"""Dependencies and batches, the producer's side (docs/workflows.md; Redis's side:
``store.workflows``). ``jobd.producer`` calls these for a job that has ``after`` or ``batch``
(``newjob.NewJob``); a job that has neither costs nothing here.

A job with ``after`` is *held* in its queue (its id is known before: given, or generated), then
registered with each job it waits for; a job waited for that ended already (its history says)
is counted at once; one never seen is waited for (it may be enqueued later). An enqueue cut
short can be sent again with the same job id: holding, registering and counting are each once.

A batch is *open* while an enqueue adds to it (``Member``): its total grows before each
round trip of jobs (and shrinks by the jobs Redis refused), and the enqueue *seals* it when it
ends; several enqueues may add to one batch at once. Once sealed and every member counted, it is
complete: its callback is enqueued once, by whoever sees it complete first (the daemons that
count the last members, or the move of the enqueue's seal notice). A complete batch takes no
more jobs. Each enqueue's batch calls carry a token of its own, so that one sent again after a
lost reply changes the batch once (``Member``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import TypeVar

import orjson

from jobd.config import Config, QueueConfig
from jobd.newjob import NewJob
from jobd.store import connection
from jobd.store.admin import Enqueued, NewEntry
from jobd.store.keys import batch
from jobd.store.store import Store
from jobd.store.workflows import BatchState, callback_spec, waiter_line

MAX_AFTER = 100  # jobs one job may wait for
# Seconds between the tries of a batch call while Redis is away (its reply lost, a failover):
# each is sent again as it was, and changes the batch once (lua/batch.lua); none is begun
# RETRY_FOR seconds after the first (a try that times out takes connection.SOCKET_TIMEOUT).
RETRY = (0.1, 0.4, 1.0, 2.5)
RETRY_FOR = 10.0

log = logging.getLogger("jobd.workflows")
T = TypeVar("T")
_BATCH_ID = re.compile(r"[^\s{}\x00-\x1f\x7f]{1,200}")


class WorkflowError(ValueError):
    """A batch or a dependency jobd will not take (a usage error)."""


def check_batch_id(batch_id: str) -> None:
    if not _BATCH_ID.fullmatch(batch_id):
        raise WorkflowError(
            f"batch id {batch_id!r}: 1 to 200 characters, no space, no control character, "
            "no '{' or '}'"
        )


def check_utf8(job_id: str, what: str) -> None:
    """Refuse (a usage error) a job id that is not UTF-8 where a dependency needs it: a held
    job's and those it waits for are named in JSON (``waiter_line``, the after hash)."""
    try:
        job_id.encode("utf-8")
    except UnicodeEncodeError:
        raise WorkflowError(
            f"{what}: job id {job_id!r} is not UTF-8; a job that waits for others (--after), "
            "and the jobs it waits for, need UTF-8 job ids"
        ) from None


def dependencies(
    queues: Mapping[str, QueueConfig], queue: str, after: tuple[str | tuple[str, str], ...]
) -> list[tuple[QueueConfig, str]]:
    """The jobs ``after`` names: (queue, job id). A ``str`` is a job id of ``queue``, or
    ``QUEUE:JOB_ID`` when the part before its first ``:`` names a queue of the config."""
    deps: list[tuple[QueueConfig, str]] = []
    for spec in after:
        if isinstance(spec, tuple):
            name, job_id = spec
        else:
            head, colon, rest = spec.partition(":")
            name, job_id = (head, rest) if colon and head in queues else (queue, spec)
        if name not in queues:
            raise WorkflowError(f"after {spec!r}: queue {name!r} is not in the config")
        if not job_id:
            raise WorkflowError(f"after {spec!r}: no job id")
        check_utf8(job_id, f"after {spec!r}")
        deps.append((queues[name], job_id))
    if len(deps) > MAX_AFTER:
        raise WorkflowError(f"a job waits for {MAX_AFTER} jobs at most, not {len(deps)}")
    unique = {(dq.name, jid): (dq, jid) for dq, jid in deps}  # each once, in order
    return list(unique.values())


def hold(store: Store, config: Config, q: QueueConfig, entry: NewEntry, job_id: str,
         job: NewJob, member: Member | NoBatch) -> Enqueued:  # fmt: skip
    """Hold ``job`` (its ``entry``, in ``q``: a queue or a level of it) until the jobs it waits
    for end, registered with each; those ended already are counted now. A member of ``member``'s
    batch when held now; not when it was held already (this enqueue sent before). A --unique
    job whose job id is queued, running or done within the dedupe window is not held: its
    mark ('queued', 'done') is the reply's ``exists``."""
    deps = dependencies(config.queues, q.name, job.after)
    check_utf8(job_id, "--after")
    if any(dq.name == q.name and jid == job_id for dq, jid in deps):
        raise WorkflowError(f"job {job_id!r} cannot wait for itself (--after {job_id})")
    names = [f"{dq.name} {jid}" for dq, jid in deps]
    spec: dict[str, object] = {"deps": names, "all": names, "any": job.after_any}
    timeout = job.after_timeout if job.after_timeout is not None else q.max_wait
    if timeout is not None:  # a bound (expire_held.lua); where a record of each dep would be
        spec["timeout_ms"] = int(timeout * 1000)
        spec["seen"] = {n: [dq.keys.history, dq.keys.active]
                        for (dq, _), n in zip(deps, names, strict=True)}  # fmt: skip
    after = orjson.dumps(spec)
    record = orjson.dumps({"event": "waiting", "after": names, "any": job.after_any,
                           "stream": q.stream})  # fmt: skip
    held = store.hold(q, job_id, after, entry.due, secrets.token_hex(8), record, entry.fields,
                      entry.unique_id is not None)  # fmt: skip
    if isinstance(held, str):
        member.added(0)
        return Enqueued(exists=held)
    member.added(int(held))
    line = waiter_line(q, job_id)
    told = 0
    for (dq, jid), name in zip(deps, names, strict=True):
        ended = store.wait_on(dq, jid, line)
        if ended is not None:
            script, keys, args = store.unblock_call(orjson.loads(line), name, *ended)
            _, notices = script(keys=keys, args=args)
            told += int(notices)
    if told:  # it was dead-lettered: its own waiters and batch are told now
        store.move_follow_ups(config.queues[q.name])
    return Enqueued()


class Member:
    """Adding jobs to batch ``batch_id`` (a context: open on entry, sealed on exit, the jobs
    not added taken off its total). ``grow`` before each round trip of jobs; ``added(n)``
    after it, with how many Redis took.

    Each call names this enqueue's token (made here, before the first) and says what this
    enqueue's count is now, not what to add: a call whose reply was lost is sent again as it
    was (``RETRY``), and Redis, knowing it, changes nothing twice. The seal is a notice in the
    queue's outbox (``Store.seal_notice``), applied at once, else by the daemons: a seal that
    completes the batch is followed by its callback whatever happens to this process or to
    Redis between the two."""

    def __init__(self, store: Store, config: Config, q: QueueConfig, job: NewJob) -> None:
        check_batch_id(job.batch or "")
        on_complete = job.on_complete
        if on_complete is not None and on_complete not in config.queues:
            raise WorkflowError(f"on_complete: queue {on_complete!r} is not in the config")
        self.store, self.batch_id = store, job.batch or ""
        self.token = secrets.token_hex(16)
        self.seq = 0  # calls made that change the count (add, seal): each sent with its number
        self.counted = 0  # jobs Redis took
        self.sent = 0  # jobs of the round trip under way
        self.outbox = config.queues[q.name].keys.outbox
        cb = b"" if on_complete is None else callback_spec(config.queues[on_complete])
        self.opening = (int(q.history.max_age) or 1, on_complete or "", cb)
        self.sealed: BatchState | None = None

    def __enter__(self) -> Member:
        try:
            self._again(self.store.batch_op, self.batch_id, "open", self.token, *self.opening)
        except Exception as exc:
            if "batch complete" in str(exc):
                raise WorkflowError(f"batch {self.batch_id!r} is complete: it takes no more "
                                    "jobs") from None  # fmt: skip
            if "is not a batch" in str(exc):  # batch.lua: someone else's key where it lives
                raise WorkflowError(f"batch {self.batch_id!r}: its key {batch(self.batch_id)} "
                                    "is not a batch (another type)") from None  # fmt: skip
            raise
        return self

    def _count(self, count: int) -> None:
        self.seq += 1
        self._again(self.store.batch_op, self.batch_id, "add", self.token, self.seq, count)

    def grow(self, n: int) -> None:
        self.sent = n
        try:
            self._count(self.counted + n)
        except BaseException:
            self.sent = 0  # not sent: its jobs are not in Redis, whatever the count says
            raise

    def added(self, n: int) -> None:
        sent, self.sent = self.sent, 0
        self.counted += n
        if n < sent:
            self._count(self.counted)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        """Sealed whatever happened (the jobs of a round trip that failed not counted), unless
        Redis could not be reached in the middle of one, or the enqueue was interrupted there
        (Ctrl-C, SystemExit: no Exception, nothing Redis said): then it stays open, those jobs
        may or may not be added."""
        if self.sent and kind is not None and (_unreachable(exc) or not isinstance(exc, Exception)):
            return
        self.sent, self.seq = 0, self.seq + 1
        fields = {b"kind": b"seal", b"batch": self.batch_id.encode(),
                  b"token": self.token.encode(), b"seq": b"%d" % self.seq,
                  b"count": b"%d" % self.counted}  # fmt: skip
        entry = self._again(self.store.seal_notice, self.outbox, fields)
        try:
            self.sealed = self._again(self.store.apply_seal, self.outbox, entry, fields)
        except Exception as exc:
            if not connection.away(exc):
                raise
            log.warning("batch %s: its seal is in %s, for the daemons to apply (%s)",
                        self.batch_id, self.outbox, exc)  # fmt: skip

    def _again(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)``, sent again as it was while Redis is away (``connection.away``),
        after each wait of RETRY (RETRY_FOR seconds at most); the last error raised."""
        end = time.monotonic() + RETRY_FOR
        for wait in (*RETRY, None):
            try:
                return call(*args)
            except Exception as exc:
                if wait is None or not connection.away(exc) or time.monotonic() + wait > end:
                    raise
                time.sleep(wait)
                self.store.refresh()
        raise AssertionError("unreachable")


class NoBatch:
    """A job of no batch: nothing to count."""

    def grow(self, n: int) -> None:
        pass

    def added(self, n: int) -> None:
        pass


def member(
    store: Store, config: Config, q: QueueConfig, job: NewJob
) -> contextlib.AbstractContextManager:
    """The batch ``job`` is added to (``Member``), or none."""
    if job.batch is None:
        return contextlib.nullcontext(NoBatch())
    return Member(store, config, q, job)


@contextlib.contextmanager
def member_of(
    store: Store, config: Config, q: QueueConfig, jobs: Iterable[NewJob]
) -> Iterator[tuple[Member | NoBatch, Iterator[NewJob]]]:
    """The batch of a bulk enqueue: its first job's, every job's (``_same_batch``); and the
    jobs, the first put back."""
    source = iter(jobs)
    first = next(source, None)
    if first is None:
        yield NoBatch(), source
        return
    source = itertools.chain([first], source)
    with member(store, config, q, first) as m:
        yield m, _same_batch(source, first.batch)


def _same_batch(jobs: Iterator[NewJob], batch: str | None) -> Iterator[NewJob]:
    """Every job of a bulk enqueue in the batch of its first (or none, as it)."""
    for job in jobs:
        yield job if job.batch == batch else dataclasses.replace(job, batch=batch)


def _unreachable(exc: BaseException | None) -> bool:
    return exc is not None and isinstance(exc, connection.UNAVAILABLE)
