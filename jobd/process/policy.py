"""From how a handler ended to what happens to its job: the outcome policy, in one place.

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

import enum
import random
from dataclasses import dataclass

from jobd.config import QueueConfig, Retry
from jobd.process.handler import ExitStatus
from jobd.store import dead_letter

_RNG = random.Random()


class Action(enum.Enum):
    ACK = "ack"
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"
    HAND_BACK = "hand back"
    RELEASE = "release"  # record nothing, renew no more: the entry is someone else's to settle


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    error: str | None = None  # why it failed: a jobd_error value
    delay: float = 0.0  # seconds before the next attempt (RETRY)


def decide(
    queue: QueueConfig,
    attempt: int,
    status: ExitStatus | None,
    stopped_for_shutdown: bool = False,
    lease_lost: bool = False,
    rng: random.Random | None = None,
) -> Decision:
    """``status`` is None when the handler could not be started."""
    if lease_lost:
        return Decision(Action.RELEASE)
    if status is not None and status.ok:
        return Decision(Action.ACK)
    if stopped_for_shutdown:
        return Decision(Action.HAND_BACK)
    error = failure_kind(status)
    permanent = status is not None and status.code in queue.fail_exit_codes and not status.timed_out
    if permanent or attempt >= queue.retry.max_attempts:
        return Decision(Action.DEAD_LETTER, error)
    return Decision(Action.RETRY, error, backoff_delay(queue.retry, attempt, rng or _RNG))


def failure_kind(status: ExitStatus | None) -> str:
    if status is None:
        return dead_letter.SPAWN
    if status.timed_out:
        return dead_letter.TIMEOUT
    if status.signal is not None:
        return dead_letter.SIGNAL
    return dead_letter.EXIT


def backoff_delay(retry: Retry, attempt: int, rng: random.Random) -> float:
    """Seconds to wait after attempt ``attempt`` (1-based) failed."""
    delay = min(retry.backoff * 2 ** min(attempt - 1, 64), retry.max_backoff)
    return max(0.0, delay * (1 + rng.uniform(-retry.jitter, retry.jitter)))
