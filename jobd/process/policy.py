"""From how a handler ended to what happens to its job: the outcome policy, in one place
(``decide``, which returns the ``Outcome`` carried unchanged to the recorder and the store).

| how the handler ended                              | outcome                                  |
|----------------------------------------------------|------------------------------------------|
| exit 0                                             | ack                                      |
| exit code in ``exit_codes.fail`` (default 64, 65)  | dead letter at once (``exit``)           |
| any other exit code                                | retry, then dead letter (``exit``)       |
| killed by a signal                                 | retry, then dead letter (``signal``)     |
| ran past ``timeout``                               | retry, then dead letter (``timeout``)    |
| could not be started (missing, not executable, …)  | retry, then dead letter (``spawn``)      |
| stopped because jobd is shutting down              | handed back at once; not an attempt      |
| its lease was lost to another consumer             | nothing: the new owner settles the job   |
| stopped by ``jobd cancel`` (and not exit 0)        | cancelled: acked, no retry, no dead letter |
| exit 0, its result refused (over ``result_max``…)  | dead letter at once (``result``)         |
| exit 0, its JOBD_ENQUEUE file refused              | dead letter at once (``enqueue``)        |
| exit 0, a ``then:`` step's payload refused         | dead letter at once (``enqueue``)        |

"Retry" means: while attempts remain (``retry.max_attempts`` in all, the first included, or the
job's own ``jobd_max_attempts`` when lower), the job waits in the delayed set for
``backoff × 2^(n−1)`` (capped at ``max_backoff``, ± ``jitter``) after attempt n, then runs
again with ``JOBD_ATTEMPT`` n+1; after the last attempt it is dead-lettered. A job whose next
attempt would be due after its ``jobd_expires_at`` is dead-lettered at once instead, with its
failure's own ``jobd_error`` (that failure's stderr is kept; an ``expired`` record would hide it).

Some jobs must not run at all (``refusal``, before a handler starts): too wide to retry or
with a payload above ``max_payload`` or a job id longer than ``job.MAX_JOB_ID``
(``malformed``), or too late (``expired``): its
``jobd_expires_at`` has passed, or it waited longer than the queue's ``max_wait`` since its
entry was added (a retry: since it was due again and re-added). "Now" is Redis's clock, the
one that stamped the entry's id: this host's clock plus the offset to Redis's ``TIME`` that
the reader measured when it read the job (``Job.clock_offset``), so a daemon whose clock is
off neither expires fresh jobs nor runs expired ones. When that offset could not be measured
(Redis answered the read, then not ``TIME``), the job is not expired: it runs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

from jobd.config import QueueConfig, Retry
from jobd.job import EXPIRES_MIN_MS, MAX_FIELDS, Job
from jobd.outcome import (
    ENQUEUE,
    EXIT,
    EXPIRED,
    MALFORMED,
    MEMORY,
    RESULT,
    SIGNAL,
    SPAWN,
    TIMEOUT,
    FollowUp,
    Outcome,
    Ran,
    Verb,
)
from jobd.process import chains, followups
from jobd.process.handler import ExitStatus, Handler, StopReason

_RNG = random.Random()


def succeeded(handler: Handler, status: ExitStatus) -> bool:
    """Whether a reaped handler's attempt succeeded, as far as its follow-ups are concerned:
    exit 0, not over its memory, its result taken."""
    return status.ok and handler.ending() is not StopReason.MEMORY and handler.result_error is None


def of_handler(
    handler: Handler, status: ExitStatus, took: float, queues: Mapping[str, QueueConfig],
    found: tuple[tuple[FollowUp, ...], str | None] | None = None,
) -> Outcome:  # fmt: skip
    """``decide`` on what a reaped handler says of its attempt, ``took`` seconds long; its
    follow-ups (JOBD_ENQUEUE), when it succeeded, go to ``queues`` (the config's): ``found``
    when its file was read already (``followups.collected``'s, off the loop:
    ``daemon.endings``), else read here."""
    ok = succeeded(handler, status)
    if found is None or not ok:
        found = followups.collected(handler.result_path, handler.job, handler.queue, queues, ok,
                                    handler.uid)  # fmt: skip
    follow_ups, error = found
    if handler.queue.then and ok and error is None:  # its then: steps (process.chains)
        steps, error = chains.then_follow_ups(handler.job, handler.queue, queues,
                                              handler.kept_result, handler.stdout)  # fmt: skip
        follow_ups += steps
    outcome = decide(handler.queue, handler.job, status, handler.ending(), handler.detail(),
                     (handler.waited, took), ran=handler.ran(status, took),
                     result=handler.kept_result, result_error=handler.result_error,
                     follow_up_error=error)  # fmt: skip
    if follow_ups and outcome.verb is Verb.ACK:
        return replace(outcome, follow_ups=follow_ups)
    return outcome


def decide(
    queue: QueueConfig,
    job: Job,
    status: ExitStatus | None,
    stopped: StopReason | None = None,
    detail: bytes = b"",
    timing: tuple[float, float] | None = None,
    rng: random.Random | None = None,
    ran: Ran | None = None,
    result: bytes | None = None,
    result_error: str | None = None,
    follow_up_error: str | None = None,
) -> Outcome:
    """The outcome of one attempt. ``status`` is None when the handler could not be started;
    ``stopped`` is why jobd stopped it, if it did (``Handler.ending``); ``detail`` the stderr
    tail or why it could not start; ``timing`` its enqueue-to-start and run time; ``ran`` how it
    ran, for its history; ``result`` what it gave back, or ``result_error`` why that fails it
    (it exited 0: dead-lettered at once, its work done, a run again would give as much); so
    does ``follow_up_error``, why its JOBD_ENQUEUE file fails it (``process.followups``)."""
    if stopped is StopReason.LEASE_LOST:
        return Outcome(Verb.RELEASE, queue, job)
    if status is not None and status.ok and stopped is not StopReason.MEMORY:
        if result_error is None and follow_up_error is None:
            return Outcome(Verb.ACK, queue, job, timing=timing, ran=ran, result=result)
        error, why = (ENQUEUE, follow_up_error) if result_error is None else (RESULT, result_error)
        detail = detail + f"\njobd: {why}".encode()
        return Outcome(Verb.DEAD_LETTER, queue, job, error, attempts=job.attempt,
                       detail=detail, exit_code=0, timing=timing, ran=ran)  # fmt: skip
    if stopped is StopReason.CANCEL:
        return Outcome(Verb.CANCEL, queue, job, timing=timing, ran=ran)
    if stopped is StopReason.SHUTDOWN:
        return Outcome(Verb.HAND_BACK, queue, job, timing=timing, ran=ran)
    error = MEMORY if stopped is StopReason.MEMORY else failure_kind(status)
    permanent = status is not None and status.code in queue.fail_exit_codes and not status.timed_out
    dead = Outcome(
        Verb.DEAD_LETTER, queue, job, error, attempts=job.attempt, detail=detail,
        exit_code=status.code if status else None, signal=status.signal if status else None,
        timing=timing, ran=ran,
    )  # fmt: skip
    if permanent or job.attempt >= job.max_attempts(queue):
        return dead
    delay = backoff_delay(queue.retry, job.attempt, rng or _RNG)
    if expires_before(job, delay):
        return dead
    return Outcome(Verb.RETRY, queue, job, error, delay=delay, timing=timing, ran=ran)


def expires_before(job: Job, delay: float, now: float | None = None) -> bool:
    """Whether the job's ``jobd_expires_at`` comes before its next attempt, ``delay`` seconds
    from ``now`` (on Redis's clock): then that attempt would only be dead-lettered as expired."""
    redis_now = job.redis_now(now)
    return (
        job.expires_at is not None and redis_now is not None and redis_now + delay >= job.expires_at
    )


def refusal(queue: QueueConfig, job: Job, now: float | None = None) -> Outcome | None:
    """The dead letter of a job that must not run at all, if it must not: ``malformed`` (see
    ``refused``) or ``expired`` (see ``expired``); ``now`` is this host's clock (default: read)."""
    if (reason := refused(queue, job)) is not None:
        error, attempts = MALFORMED, job.attempt
    elif (reason := expired(queue, job, now)) is not None:
        error, attempts = EXPIRED, job.attempt - 1  # the attempts that ran: this one did not
    else:
        return None
    return Outcome(Verb.DEAD_LETTER, queue, job, error, attempts=attempts, detail=reason.encode())


def expired(queue: QueueConfig, job: Job, now: float | None = None) -> str | None:
    """Why this job is too late to start, if it is: its ``jobd_expires_at`` has passed, or it
    waited longer than the queue's ``max_wait`` since its entry was added. Both on Redis's
    clock (``Job.redis_now``); a job whose clock offset is unknown never expires here."""
    redis_now = job.redis_now(now)
    if redis_now is None:
        return None
    if job.expires_at is not None and redis_now >= job.expires_at:
        late = redis_now - job.expires_at
        return f"expired: not started by its jobd_expires_at ({late:.1f}s ago)"
    waited = redis_now - job.enqueued_at()
    # An id a producer chose by hand ("1-1") says nothing of when it was added: no max_wait.
    timed = job.enqueued_at() * 1000 >= EXPIRES_MIN_MS
    if queue.max_wait is not None and timed and waited > queue.max_wait:
        return f"expired: waited {waited:.1f}s to start, more than max_wait ({queue.max_wait:g}s)"
    return None


def refused(queue: QueueConfig, job: Job) -> str | None:
    """Why this job must not run at all, if it must not (it is dead-lettered as malformed)."""
    if job.malformed:
        return job.malformed
    if (width := job.too_wide()) is not None:
        return f"{width} fields with jobd's: more than jobd can retry or dead-letter ({MAX_FIELDS})"
    if job.payload_size() > queue.max_payload:
        return f"payload of {job.payload_size()} bytes is above max_payload ({queue.max_payload})"
    return None


def failure_kind(status: ExitStatus | None) -> str:
    if status is None:
        return SPAWN
    if status.timed_out:
        return TIMEOUT
    if status.signal is not None:
        return SIGNAL
    return EXIT


def backoff_delay(retry: Retry, attempt: int, rng: random.Random) -> float:
    """Seconds to wait after attempt ``attempt`` (1-based) failed."""
    delay = min(retry.backoff * 2 ** min(attempt - 1, 64), retry.max_backoff)
    return max(0.0, delay * (1 + rng.uniform(-retry.jitter, retry.jitter)))
