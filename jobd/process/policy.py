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

"Retry" means: while attempts remain (``retry.max_attempts`` in all, the first included), the
job waits in the delayed set for ``backoff × 2^(n−1)`` (capped at ``max_backoff``, ± ``jitter``)
after attempt n, then runs again with ``JOBD_ATTEMPT`` n+1; after the last attempt it is
dead-lettered.
"""

from __future__ import annotations

import random

from jobd.config import QueueConfig, Retry
from jobd.job import MAX_FIELDS, Job
from jobd.outcome import EXIT, SIGNAL, SPAWN, TIMEOUT, Outcome, Verb
from jobd.process.handler import ExitStatus, StopReason

_RNG = random.Random()


def decide(
    queue: QueueConfig,
    job: Job,
    status: ExitStatus | None,
    stopped: StopReason | None = None,
    detail: bytes = b"",
    timing: tuple[float, float] | None = None,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of one attempt. ``status`` is None when the handler could not be started;
    ``stopped`` is why jobd stopped it, if it did (``Handler.ending``); ``detail`` the stderr
    tail or why it could not start; ``timing`` its enqueue-to-start and run time."""
    if stopped is StopReason.LEASE_LOST:
        return Outcome(Verb.RELEASE, queue, job)
    if status is not None and status.ok:
        return Outcome(Verb.ACK, queue, job, timing=timing)
    if stopped is StopReason.SHUTDOWN:
        return Outcome(Verb.HAND_BACK, queue, job, timing=timing)
    error = failure_kind(status)
    permanent = status is not None and status.code in queue.fail_exit_codes and not status.timed_out
    if permanent or job.attempt >= queue.retry.max_attempts:
        return Outcome(
            Verb.DEAD_LETTER, queue, job, error, attempts=job.attempt, detail=detail,
            exit_code=status.code if status else None, signal=status.signal if status else None,
            timing=timing,
        )  # fmt: skip
    delay = backoff_delay(queue.retry, job.attempt, rng or _RNG)
    return Outcome(Verb.RETRY, queue, job, error, delay=delay, timing=timing)


def refused(queue: QueueConfig, job: Job) -> str | None:
    """Why this job must not run at all, if it must not (it is dead-lettered as malformed)."""
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
