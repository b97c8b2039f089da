"""Dependencies and batches, the producer's side (docs/workflows.md; Redis's side:
``store.workflows``). ``jobd.producer`` calls these for a job that has ``after`` or ``batch``
(``newjob.NewJob``); a job that has neither costs nothing here.

A job with ``after`` is *held* in its queue (its id is known before: given, or generated), then
registered with each job it waits for; a job waited for that ended already (its history says)
is counted at once; one never seen is waited for (it may be enqueued later). An enqueue cut
short can be sent again with the same job id: holding, registering and counting are each once,
also when the job was released (or dead-lettered) meanwhile, within the queue's
history.max_age.

Batches (``--batch``): ``jobd.batches`` (``Member``; ``RETRY``, ``RETRY_FOR``: how long its calls
are sent again), re-exported here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import orjson
import redis

from jobd.batches import RETRY as RETRY
from jobd.batches import RETRY_FOR as RETRY_FOR
from jobd.batches import BatchComplete as BatchComplete
from jobd.batches import Member as Member
from jobd.batches import NoBatch as NoBatch
from jobd.batches import marks_of as marks_of
from jobd.batches import member as member
from jobd.batches import member_of as member_of
from jobd.cancel import move_notices
from jobd.config import Config, QueueConfig
from jobd.newjob import NewJob, RedisClock
from jobd.store.admin import Enqueued, NewEntry
from jobd.store.store import Store
from jobd.store.workflows import waiter_line
from jobd.workflow_input import (  # what a producer may ask of a workflow, re-exported here
    MAX_AFTER_TIMEOUT,
    WorkflowError,
    check_after_timeout,
    check_dep_id,
    check_utf8,
)
from jobd.workflow_input import (
    check_batch_id as check_batch_id,
)

MAX_AFTER = 100  # jobs one job may wait for (each job id at most job.MAX_JOB_ID bytes)


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
