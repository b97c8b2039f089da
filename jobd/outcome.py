"""What happens to one delivered job: the outcome, decided once and carried unchanged.

The policy decides it from how a handler ended (``process.policy.decide``); the loop decides it
for a job it cannot start (malformed, removed queue, shutdown); the reader decides it for a
poison entry. Every one goes the same way: to the recorder thread, which hands the batch to the
store (``store.outcomes``), where each verb is one script. Nothing on the way changes it.

| verb          | in Redis                                                   |
|---------------|------------------------------------------------------------|
| ``ACK``       | XACK (and the job id's mark set or cleared): settle.lua    |
| ``RETRY``     | into the delayed set with the next attempt's fields, acked |
| ``DEAD_LETTER`` | a dead-letter record, acked, in one script               |
| ``HAND_BACK`` | left pending, made to look idle: any consumer takes it now |
| ``CANCEL``    | XACK, counted as cancelled, its cancellation mark removed |
| ``RELEASE``   | nothing: the entry is someone else's to settle             |
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.job import Job

# Why a job failed: the dead-letter record's ``jobd_error``.
EXIT, SIGNAL, TIMEOUT, SPAWN, POISON, MALFORMED = (
    "exit",
    "signal",
    "timeout",
    "spawn",
    "poison",
    "malformed",
)
EXPIRED = "expired"  # not started by its jobd_expires_at, or within its queue's max_wait
MEMORY = "memory"  # stopped over resources.memory (sampled), or OOM-killed in its cgroup
RESULT = "result"  # exited 0 with a result jobd will not take (over result_max): dead at once
ENQUEUE = "enqueue"  # exited 0 with a JOBD_ENQUEUE file jobd will not take: dead at once


class Verb(enum.Enum):
    ACK = "ack"
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"
    HAND_BACK = "hand back"
    CANCEL = "cancelled"  # `jobd cancel`: acknowledged, not retried, not dead-lettered
    RELEASE = "release"  # record nothing, renew no more: the entry is someone else's to settle


# What the journal's JOBD_OUTCOME says of each verb (docs/operations/logs.md).
JOURNAL_OUTCOME = {Verb.ACK: "done", Verb.RETRY: "retry", Verb.DEAD_LETTER: "dead-lettered",
                   Verb.HAND_BACK: "handed-back", Verb.CANCEL: "cancelled",
                   Verb.RELEASE: "released"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Ran:
    """How an attempt's handler ran, for the job's history record (docs/concepts/history.md)."""

    pid: int
    started: float  # time.monotonic() when it started
    seconds: float  # from start to exit
    exit_code: int | None
    signal: int | None
    stdout: bytes  # the tails of its output
    stderr: bytes
    cpu_seconds: float | None = None  # what it cost (wait4's rusage: see process.handler)
    max_rss_bytes: int | None = None
    progress: float | None = None  # what it last told of itself (process.channel.Told)
    status: bytes | None = None


# Each field of a follow-up counts this many bytes at least towards max_follow_ups_bytes: what
# writing one costs Redis, besides its bytes (measured: some 200 ns a field, 2.5 ns a byte).
FIELD_BYTES = 128


def weight(fields: dict[bytes, bytes]) -> int:
    """What a follow-up of these fields weighs (``max_follow_ups_bytes``, and what one Redis
    call that writes follow-ups holds: ``store.outcomes``, ``store.outbox``): its fields' names
    and values, each field ``FIELD_BYTES`` at least."""
    return sum(max(len(name) + len(value), FIELD_BYTES) for name, value in fields.items())


@dataclass(frozen=True, slots=True)
class FollowUp:
    """A job a handler asked for in its JOBD_ENQUEUE file (``process.followups``), or its
    queue's ``then:`` (``process.chains``): written with its parent's acknowledgement only."""

    queue: QueueConfig  # where it goes
    fields: dict[bytes, bytes]
    due: int | str | None  # None: now; Unix ms, or store.delayed.after's "+MS"
    job_id: bytes
    mark: bytes  # in its queue's slot: set by the move that adds it (on a cluster)
    weight: int  # weight(fields), counted once where it is made


@dataclass(frozen=True, slots=True)
class Started:
    """A handler that has run ``handlers.ACTIVE_AFTER``: the recorder writes its job's active
    record (`jobd job`, the dashboard's running jobs), unless its outcome comes with it."""

    queue: QueueConfig
    job: Job
    pid: int
    at: float  # time.monotonic() when it started
    timeout: float  # seconds: this attempt's

    @property
    def message_id(self) -> str:
        return self.job.message_id


@dataclass(frozen=True, slots=True)
class Outcome:
    verb: Verb
    queue: QueueConfig  # the queue (or priority level) the job was read from, as it was then
    job: Job
    error: str | None = None  # why it failed: a jobd_error value (RETRY, DEAD_LETTER)
    delay: float = 0.0  # RETRY: seconds before the next attempt, from when it is written
    attempts: int = 0  # DEAD_LETTER: attempts made (deliveries, for poison)
    exit_code: int | None = None  # how the handler ended, when it ran
    signal: int | None = None
    detail: bytes = b""  # the stderr tail, or why the handler could not start
    timing: tuple[float, float] | None = None  # enqueue-to-start and run time, for figures
    ran: Ran | None = None  # how its handler ran, when one did
    # HAND_BACK: when the recorder first sent it (time.monotonic()); None until then. Sent
    # again (a lost reply or connection, Redis busy), it says how long ago that was, and
    # settle.lua leaves it alone if the entry was delivered since (by this daemon too): a
    # hand-back is about its own delivery, never a later one.
    sent_at: float | None = None
    result: bytes | None = None  # ACK: what the handler gave back (process.results), if any
    follow_ups: tuple[FollowUp, ...] = ()  # ACK: enqueued with it (process.followups)

    @property
    def message_id(self) -> str:
        return self.job.message_id

    def describe(self) -> str:
        """For the log line that ends a job."""
        if self.verb is Verb.RETRY:
            return f"retry in {self.delay:.1f}s"
        if self.verb is Verb.DEAD_LETTER:
            return f"dead-lettered ({self.error})"
        return self.verb.value

    def journal(self) -> dict[str, dict[str, str]]:
        """``extra`` for the log line that says this outcome: its fields in the journal
        (``logs.JournalHandler``), JOBD_OUTCOME, and JOBD_ERROR when it failed (``timeout``)."""
        fields = {"JOBD_OUTCOME": JOURNAL_OUTCOME[self.verb]}
        if self.error is not None:
            fields["JOBD_ERROR"] = self.error
        return {"journal": fields}
