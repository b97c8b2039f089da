"""Dead letters: the record of a job that will not run again, written atomically with its ack.

Every path that dead-letters a job (poison on reclaim, and the failure policy) goes through
``write``, which runs ``lua/dead_letter.lua``: the record exists if and only if the original
entry is acknowledged. The record holds the job's own fields plus the contract's ``jobd_*``
fields (``jobd_failed_at`` is Redis's time, see the script); nothing in it is unbounded (stderr
is cut to its last 4 KiB, and an entry wider than ``job.MAX_FIELDS`` keeps only its payload and
job_id).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.store.keys import STATS_TTL
from jobd.store.scripts import Scripts

STDERR_LIMIT = 4096

# jobd_error values
EXIT, SIGNAL, TIMEOUT, SPAWN, POISON, MALFORMED = (
    "exit",
    "signal",
    "timeout",
    "spawn",
    "poison",
    "malformed",
)


@dataclass(frozen=True, slots=True)
class Failure:
    error: str  # one of the jobd_error values
    attempts: int
    exit_code: int | None = None
    signal: int | None = None
    stderr: bytes = b""


def record_fields(queue: QueueConfig, job_id: str, message_id: str, failure: Failure) -> list:
    return [
        "jobd_job_id", os.fsencode(job_id),  # any bytes: see Job.job_id
        "jobd_queue", queue.name,
        "jobd_original_id", message_id,
        "jobd_error", failure.error,
        "jobd_exit_code", "" if failure.exit_code is None else str(failure.exit_code),
        "jobd_signal", "" if failure.signal is None else str(failure.signal),
        "jobd_attempts", str(failure.attempts),
        "jobd_stderr", failure.stderr[-STDERR_LIMIT:],
    ]  # fmt: skip


def script_call(
    queue: QueueConfig,
    consumer: str,
    job_id: str,
    message_id: str,
    failure: Failure,
    mark: bytes | None = None,
) -> tuple[list[str], list]:
    """KEYS and ARGV of ``lua/dead_letter.lua`` for this job (``mark``: its job id's mark, to
    clear, see ``Job.mark_key``)."""
    dead = queue.dead_letter
    max_age = "" if dead.max_age is None else int(dead.max_age * 1000)
    args = [
        queue.group, consumer, message_id, dead.maxlen, max_age, STATS_TTL,
        *record_fields(queue, job_id, message_id, failure),
    ]  # fmt: skip
    keys = [queue.stream, dead.stream, queue.keys.stats()]
    return (keys if mark is None else [*keys, mark]), args


def write(
    scripts: Scripts,
    queue: QueueConfig,
    consumer: str,
    job_id: str,
    message_id: str,
    failure: Failure,
    mark: bytes | None = None,
) -> str | None:
    """Dead-letter the entry and ack it; None when this consumer no longer holds it."""
    keys, args = script_call(queue, consumer, job_id, message_id, failure, mark)
    reply = scripts.dead_letter(keys=keys, args=args)
    return None if isinstance(reply, list) else reply.decode()
