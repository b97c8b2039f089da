"""What a producer may ask of a workflow (``jobd.workflows``, which re-exports all of it): the
checks of a batch id, of the job ids a job waits for, and of a wait's bound, each refusing with
WorkflowError (a usage error: ``jobd enqueue`` exits 2) before anything is written."""

from __future__ import annotations

import math

from jobd.job import BATCH_ID, MAX_JOB_ID
from jobd.newjob import MAX_AHEAD_MS

# The longest wait's bound (--after-timeout, after_timeout; a queue's max_wait is cut to it): ten
# years, as far ahead as a due time or an expiry may be (newjob.MAX_AHEAD_MS). hold.lua cuts a
# longer one too: past 2^63 ms with Redis's clock, it was due at once.
MAX_AFTER_TIMEOUT = MAX_AHEAD_MS // 1000
_BATCH_ID = BATCH_ID


class WorkflowError(ValueError):
    """A batch or a dependency jobd will not take (a usage error)."""


def check_batch_id(batch_id: str) -> None:
    """Refuse (a usage error) a batch id jobd will not take: it names Redis keys and the
    callback's JSON payload, so it is UTF-8 (bytes that are not, taken from the command line
    as lone surrogates, are refused here, not by the first ``.encode()``)."""
    if not _BATCH_ID.fullmatch(batch_id):
        raise WorkflowError(
            f"batch id {batch_id!r}: 1 to 200 characters, no space, no control character, "
            "no '{' or '}'"
        )
    try:
        batch_id.encode("utf-8")
    except UnicodeEncodeError:
        raise WorkflowError(f"batch id {batch_id!r}: not UTF-8; a batch id is UTF-8") from None


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


def check_dep_id(job_id: str, spec: object) -> None:
    """Refuse (a usage error) a job id no job can have: empty, not UTF-8, longer than
    MAX_JOB_ID bytes (``jobd enqueue --job-id`` refuses it), or holding a NUL byte."""
    if not job_id:
        raise WorkflowError(f"after {spec!r}: no job id")
    check_utf8(job_id, f"after {spec!r}")
    size = len(job_id.encode("utf-8"))
    if size > MAX_JOB_ID:
        raise WorkflowError(f"after: a job id of {size} bytes (it begins {job_id[:32]!r}): a job "
                            f"id has at most {MAX_JOB_ID} bytes, no job has it")  # fmt: skip
    if "\0" in job_id:
        raise WorkflowError(f"after {spec!r}: holds a NUL byte, which no job id may hold")


def check_after_timeout(value: object, what: str = "after_timeout") -> float:
    """``value`` as a wait's bound in seconds: WorkflowError (a usage error) unless it is a
    finite number, more than 0, at most MAX_AFTER_TIMEOUT (ten years)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkflowError(f"{what} {value!r}: give a number of seconds")
    if isinstance(value, float) and not math.isfinite(value):  # an int of any size is finite
        raise WorkflowError(f"{what} {value!r}: give a number of seconds")
    if value <= 0:
        raise WorkflowError(f"{what}: more than 0, or leave it out for no bound")
    if value > MAX_AFTER_TIMEOUT:
        raise WorkflowError(f"{what}: at most ten years ({MAX_AFTER_TIMEOUT}s), or leave it out "
                            "for no bound")  # fmt: skip
    return float(value)
