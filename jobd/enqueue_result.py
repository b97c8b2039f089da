"""What an enqueue answers (``jobd.producer``): its errors, and what a bulk enqueue did with each
job. Kept apart from the producer so that the modules it calls (``jobd.batches``) can say a job
was refused in the producer's own terms; ``jobd.producer`` re-exports every name."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobd.store.admin import NewEntry


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


@dataclass(frozen=True, slots=True)
class Refused:
    """A job of a bulk enqueue that was not added: its index in the input, and why. A
    ``duplicate`` is a unique job whose job id was there already; a ``temporary`` refusal is
    Redis's state (a failover, out of memory…), not the job's: sending it again may work."""

    index: int
    reason: str
    duplicate: bool = False
    temporary: bool = False


Outcome = str | Refused  # a job's job id when it was added
Prepared = tuple[NewEntry, str | None] | Refused  # a job's entry and job id (known before)


@dataclass(slots=True)
class Bulk:
    """What ``enqueue_many`` did: the ids of the jobs added, in input order, and the rest."""

    job_ids: list[str] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)

    def add(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Refused):
                self.refused.append(outcome)
            else:
                self.job_ids.append(outcome)


class Interrupted(ProducerError):
    """Redis went away during ``enqueue_many``: ``done`` says what was settled before, and
    the jobs at the input indexes ``unsure`` were being sent: they may or may not be added."""

    def __init__(self, message: str, done: Bulk, unsure: range) -> None:
        super().__init__(message)
        self.done, self.unsure = done, unsure
