"""Dependencies and batches, the producer's side (docs/workflows.md; Redis's side:
``store.workflows``). ``jobd.producer`` calls these for a job that has ``after`` or ``batch``
(``newjob.NewJob``); a job that has neither costs nothing here.

A job with ``after`` is *held* in its queue (its id is known before: given, or generated), then
registered with each job it waits for; a job waited for that ended already (its history says)
is counted at once; one never seen is waited for (it may be enqueued later). An enqueue cut
short can be sent again with the same job id: holding, registering and counting are each once,
also when the job was released (or dead-lettered) meanwhile, within the queue's
history.max_age.

A batch is *open* while an enqueue adds to it (``Member``): its total grows before each
round trip of jobs (and shrinks by the jobs Redis refused), and the enqueue *seals* it when it
ends; several enqueues may add to one batch at once. Once sealed and every member counted, it is
complete (with one member at least: an enqueue that added nothing seals with a count of 0, and
a batch no enqueue added a job to is gone with its last seal, never complete): its callback is
enqueued once, by whoever sees it complete first (the daemons that count the last members, or
the move of the enqueue's seal notice). A complete batch takes no more jobs. Each enqueue's
batch calls carry a token of its own, so that one sent again after a lost reply changes the
batch once (``Member``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import TypeVar

import orjson
import redis

from jobd.cancel import move_notices
from jobd.config import Config, QueueConfig
from jobd.newjob import NewJob, RedisClock
from jobd.store import connection
from jobd.store.admin import Enqueued, NewEntry
from jobd.store.keys import batch
from jobd.store.store import Store
from jobd.store.workflows import BatchState, callback_spec, waiter_line
from jobd.workflow_input import (  # what a producer may ask of a workflow, re-exported here
    MAX_AFTER_TIMEOUT,
    WorkflowError,
    check_after_timeout,
    check_batch_id,
    check_dep_id,
    check_utf8,
)

MAX_AFTER = 100  # jobs one job may wait for (each job id at most job.MAX_JOB_ID bytes)
# Seconds between the tries of a batch call while Redis is away (its reply lost, a failover):
# each is sent again as it was, and changes the batch once (lua/batch.lua); none is begun
# RETRY_FOR seconds after the first (a try that times out takes connection.SOCKET_TIMEOUT).
RETRY = (0.1, 0.4, 1.0, 2.5)
RETRY_FOR = 10.0

log = logging.getLogger("jobd.workflows")
T = TypeVar("T")


def dependencies(
    queues: Mapping[str, QueueConfig], queue: str, after: tuple[str | tuple[str, str], ...]
) -> list[tuple[QueueConfig, str]]:
    """The jobs ``after`` names: (queue, job id). A ``str`` is a job id of ``queue``, or
    ``QUEUE:JOB_ID`` when the part before its first ``:`` names a queue of the config; a
    tuple is (QUEUE, JOB_ID). TypeError for anything else."""
    if len(after) > MAX_AFTER:
        raise WorkflowError(f"a job waits for {MAX_AFTER} jobs at most, not {len(after)}")
    deps: list[tuple[QueueConfig, str]] = []
    for spec in after:
        if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, str) for s in spec):
            name, job_id = spec
        elif not isinstance(spec, str):
            raise TypeError(f"after: {spec!r} is no job id: a str, or a (QUEUE, JOB_ID) tuple")
        else:
            head, colon, rest = spec.partition(":")
            name, job_id = (head, rest) if colon and head in queues else (queue, spec)
        if name not in queues:
            raise WorkflowError(f"after {spec!r}: queue {name!r} is not in the config")
        check_dep_id(job_id, spec)
        deps.append((queues[name], job_id))
    unique = {(dq.name, jid): (dq, jid) for dq, jid in deps}  # each once, in order
    return list(unique.values())


Deps = list[tuple[QueueConfig, str]]


def waited_for(config: Config, q: QueueConfig, job: NewJob, job_id: str,
               store: Store | None = None) -> Deps:  # fmt: skip
    """The jobs ``job`` (job id ``job_id``, for ``q``) waits for (``dependencies``), checked:
    WorkflowError (a usage error) for a job id not UTF-8 or no job can have, a job that waits
    for itself, a bound (``after_timeout``) not from 0 (excluded) to MAX_AFTER_TIMEOUT, or (with
    ``store``) a job held already that waits otherwise (other jobs, after_any, bound). Called
    before anything is written (its batch opened too: a refused enqueue writes nothing)."""
    deps = dependencies(config.queues, q.name, job.after)
    check_utf8(job_id, "--after")
    if job.after_timeout is not None:
        check_after_timeout(job.after_timeout)
    if any(dq.name == q.name and jid == job_id for dq, jid in deps):
        raise WorkflowError(f"job {job_id!r} cannot wait for itself (--after {job_id})")
    want = _waits(q, job, [f"{dq.name} {jid}" for dq, jid in deps])
    if store is not None and (differs := _held_deps(store, config, q, job_id, want)[1]):
        raise _other_after(job_id, differs)  # held since, it is refused in ``hold``
    return deps


def sent_before(store: Store, q: QueueConfig, job_id: str, clock: RedisClock,
                unique: bool) -> str | None:  # fmt: skip
    """Whether the hold of ``job_id`` in ``q`` ended within its window (hold.lua's -1: this
    enqueue was sent before, nothing is to be done): 'ended'; or, for a ``unique`` job, its
    job id's mark ('queued', 'done': a duplicate), which answers first, as in hold.lua; None
    otherwise. Read before its batch opens: one complete since would refuse it. Redis's
    clock; a key of another type there is no hold's (nor mark)."""
    try:
        until = store.client.zscore(q.keys.held_ended, job_id)
        if until is None or until <= clock.now_ms():  # the enqueue's one read of TIME
            return None
        mark = store.client.get(q.keys.job_mark(job_id)) if unique else None
    except redis.ResponseError:
        return None
    return "ended" if mark is None else mark.decode()


def _bound_ms(q: QueueConfig, job: NewJob) -> int | None:
    """How long ``job`` is held at most (its after_timeout, else ``q``'s max_wait), in ms: at
    least 1 (a bound under it, written 0, was due at once: dead-lettered unrun); rounded, as
    --delay is (2.007 s x 1000 is 2007.0000000000002: ceil made it 2008)."""
    timeout = job.after_timeout if job.after_timeout is not None else q.max_wait
    return None if timeout is None else max(1, round(min(timeout, MAX_AFTER_TIMEOUT) * 1000))


def _waits(q: QueueConfig, job: NewJob, names: list[str]) -> dict[str, object]:
    """How ``job`` waits, as its hold's after hash says it (``_held_deps`` compares them)."""
    return {"all": names, "any": job.after_any, "timeout_ms": _bound_ms(q, job)}


def _other_after(job_id: str, differs: str) -> WorkflowError:
    return WorkflowError(
        f"job {job_id!r} is held already, {differs}: nothing changed (to change how it waits, "
        "cancel it and enqueue it again)"
    )


def hold(store: Store, config: Config, q: QueueConfig, entry: NewEntry, job_id: str,
         job: NewJob, deps: Deps, member: Member | NoBatch) -> Enqueued:  # fmt: skip
    """Hold ``job`` (its ``entry``, in ``q``: a queue or a level of it) until the jobs it waits
    for end (``deps``: ``waited_for``), registered with each; those ended already are counted
    now. A member of ``member``'s batch when held now; not when it was held already (this
    enqueue sent before: registered then with what that hold waits for only, WorkflowError
    when this enqueue names other jobs), nor when its hold ended already (released or
    dead-lettered within the queue's history.max_age: nothing more is done). A --unique job
    whose job id is queued, running or done within the dedupe window is not held: its mark
    ('queued', 'done') is the reply's ``exists``."""
    names = [f"{dq.name} {jid}" for dq, jid in deps]
    want = _waits(q, job, names)
    spec: dict[str, object] = {"deps": names, "all": names, "any": job.after_any}
    # where each is registered: a hold that ends unreleased takes its registrations off there
    spec["waiters"] = {n: dq.keys.waiters for (dq, _), n in zip(deps, names, strict=True)}
    if (bound := want["timeout_ms"]) is not None:  # a bound (expire_held.lua); where a
        spec["timeout_ms"] = bound  # record of each dep would be (said when it expires)
        spec["seen"] = {n: [dq.keys.history, dq.keys.active]
                        for (dq, _), n in zip(deps, names, strict=True)}  # fmt: skip
    after = orjson.dumps(spec)
    record = orjson.dumps({"event": "waiting", "after": names, "any": job.after_any,
                           "stream": q.stream})  # fmt: skip
    held, token = store.hold_token(q, job_id, after, entry.due, secrets.token_hex(8), record,
                                   entry.fields, entry.unique_id is not None)  # fmt: skip
    if isinstance(held, str):
        member.added(0)
        return Enqueued(exists=held)
    member.added(max(held, 0))
    if held < 0:  # held, then released or dead-lettered already: this enqueue was sent before
        return Enqueued()
    # held already (this enqueue sent before): what that hold waits for, not what it names
    deps, differs = _held_deps(store, config, q, job_id, want) if held == 0 else (deps, None)
    told = _register(store, q, job_id, token, deps)
    if told:  # it was dead-lettered: its own waiters and batch are told now
        move_notices(store, config.queues[q.name], "a held job's")
    if differs:
        raise _other_after(job_id, differs)
    return Enqueued()


def _held_deps(store: Store, config: Config, q: QueueConfig, job_id: str,
               want: dict[str, object]) -> tuple[Deps, str | None]:  # fmt: skip
    """What the hold of ``job_id`` (held already) still waits for, by its after hash (a queue
    not in the config left out); and how it waits when that is not as ``want`` (``_waits``)
    says: the jobs named, after_any, the bound (else None)."""
    spec = store.after_of(q, job_id) or {}
    deps = []
    for name in spec.get("deps", []):
        queue, _, jid = name.partition(" ")
        if queue in config.queues:
            deps.append((config.queues[queue], jid))
    if not spec:  # no hash: its hold ended since
        return deps, None
    every, names = spec.get("all", []), want["all"]
    if set(every) != set(names):  # type: ignore[call-overload]
        return deps, (f"waiting for {', '.join(every) or 'nothing'}, not for what this "
                      f"enqueue names ({', '.join(names)})")  # type: ignore[arg-type]  # fmt: skip
    if bool(spec.get("any")) != want["any"]:
        said = ("with", "without") if spec.get("any") else ("without", "with")
        return deps, f"{said[0]} --after-any-outcome, this enqueue {said[1]}"
    if spec.get("timeout_ms") != want["timeout_ms"]:
        return deps, (f"bound to {_said(spec.get('timeout_ms'))}, this enqueue to "
                      f"{_said(want['timeout_ms'])} (--after-timeout, else the queue's "
                      "max_wait)")  # fmt: skip
    return deps, None


def _said(ms: object) -> str:
    return "no bound" if ms is None else f"{int(ms) / 1000:g}s"  # type: ignore[call-overload]


def _register(store: Store, q: QueueConfig, job_id: str, token: str, deps: Deps) -> int:
    """Register hold ``token`` of ``job_id`` with each of ``deps`` (one ended already counted
    now); the notices written (it dead-lettered). A hold that ended meanwhile (its unwait
    notices maybe moved before a registration made here) has those taken off after: no
    registration outlives its hold, whatever the order."""
    line = waiter_line(q, job_id, token)
    told, made = 0, []
    for dq, jid in deps:
        ended = store.wait_on(dq, jid, line)
        if ended is None:
            made.append((dq, jid))
            continue
        script, keys, args = store.unblock_call(orjson.loads(line), f"{dq.name} {jid}", *ended)
        what, notices = script(keys=keys, args=args)
        told += int(notices)
        if what == b"dead":  # no hold left to register: the others are not waited for
            break
    if made and not store.holds(q, job_id, token):
        for dq, jid in made:
            store.unwait(dq, jid, job_id, token)
    return told


class Member:
    """Adding jobs to batch ``batch_id`` (a context: opened by the first ``grow`` of one job or
    more, sealed on exit when opened, the jobs not added taken off its total). ``grow`` before
    each round trip of jobs, with the jobs of it that passed their own checks; ``added(n)``
    after it, with how many Redis took. An enqueue whose every job is refused before it is sent
    leaves the batch as it was; one whose jobs were sent, none added, seals with 0 (batch.lua:
    a batch no adder counted a job into is never complete, and gone once sealed).

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
        self.opened = False
        self.incarnation = ""  # the batch opened (its open's reply): its seal names it

    def __enter__(self) -> Member:
        return self

    def _open(self) -> None:
        try:
            state = self._again(self.store.batch_op, self.batch_id, "open", self.token,
                                *self.opening)  # fmt: skip
        except Exception as exc:
            if "batch complete" in str(exc):
                raise WorkflowError(f"batch {self.batch_id!r} is complete: it takes no more "
                                    "jobs") from None  # fmt: skip
            if "is not a batch" in str(exc):  # batch.lua: someone else's key where it lives
                raise WorkflowError(f"batch {self.batch_id!r}: its key {batch(self.batch_id)} "
                                    "is not a batch (another type)") from None  # fmt: skip
            raise
        self.opened = True
        self.incarnation = state.incarnation if state is not None else ""

    def _count(self, count: int) -> None:
        self.seq += 1
        self._again(self.store.batch_op, self.batch_id, "add", self.token, self.seq, count)

    def grow(self, n: int) -> None:
        if n == 0:  # nothing to send: nothing to count (nor to open the batch for)
            self.sent = 0
            return
        if not self.opened:
            self._open()
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
        may or may not be added. Never opened (no job got as far as Redis): nothing."""
        if not self.opened:
            return
        if self.sent and kind is not None and (_unreachable(exc) or not isinstance(exc, Exception)):
            return
        self.sent, self.seq = 0, self.seq + 1
        fields = {b"kind": b"seal", b"batch": self.batch_id.encode(),
                  b"token": self.token.encode(), b"seq": b"%d" % self.seq,
                  b"count": b"%d" % self.counted,
                  b"incarnation": self.incarnation.encode()}  # fmt: skip
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
