"""A job as delivered from the stream: its ids, its attempt, its own limits, and the bytes
for stdin.

A producer may set three reserved fields on a job (issue 19); each is read once per delivery:

| field               | value                               | effect                          |
|---------------------|-------------------------------------|---------------------------------|
| jobd_timeout        | seconds, a decimal ("2.5")          | this attempt's timeout          |
| jobd_max_attempts   | a positive integer ("3")            | attempts in all                 |
| jobd_expires_at     | Unix milliseconds ("1796000000000") | not started by then: expired    |

Each is capped by the queue's own (``timeout``, ``retry.max_attempts``): a producer can ask
for less than the operator allows, never more. An expired job is dead-lettered unrun
(``policy.refusal``), decided on Redis's clock.

A value jobd cannot use (not a number, negative or zero, NaN, infinite, too long, an
``expires_at`` before 1973 or after the year 9999: seconds sent as milliseconds, most likely)
is ignored with one warning for the delivery, and the job runs under the queue's limits: a
producer's typo never crashes the daemon, never wedges the job, never drops it. A retry
carries the usable values to the next attempt and leaves the unusable ones behind, so the
warning is not repeated for every attempt.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import orjson

from jobd import trace as _trace
from jobd.logs import word
from jobd.store.keys import QueueKeys

if TYPE_CHECKING:
    from jobd.config import QueueConfig

log = logging.getLogger("jobd.job")

PAYLOAD = b"payload"
JOB_ID = b"job_id"
RESERVED_JOB_ID = b"jobd_job_id"  # set by jobd when it re-adds a job (retries)
RESERVED_ATTEMPT = b"jobd_attempt"
UNIQUE = b"jobd_unique"  # set by `jobd enqueue --unique`: the job holds its job id's mark
# Which enqueue a job is of, across its retries (each a new entry): the id of the entry its
# enqueue added, set by jobd on its retries; or a producer's token, set on a timed job (which
# has no entry yet when it is enqueued). A waiter (jobd.waiting) knows its job's ends by it: the
# history records and events of an attempt carry it as "origin" when its entry has one.
ORIGIN = b"jobd_origin"
MAX_ORIGIN = 64  # bytes: a longer value (no id jobd wrote) is ignored
# The most fields (name, value pairs) an entry may have to be run. A Lua script can pass at most
# ~8000 values to one command (Lua's unpack limit, see REDIS-NOTES), so the scripts that copy an
# entry (retry, promote, dead letter, requeue) could not copy a wider one: such an entry is
# dead-lettered unrun as `malformed`. The scripts that copy fields name the same number.
MAX_FIELDS = 1000
# The longest job id jobd takes, in bytes: a job id is copied into every log line, event, history
# record and mark of its job, so a longer one (a producer's mistake, or an attack) is no job id:
# its entry is dead-lettered unrun as `malformed` under its stream id, and only a prefix of it is
# ever logged. lua/lib/jobs.lua (job_id_of) and the producers (newjob) name the same number.
MAX_JOB_ID = 1024
# What one entry's fields may hold besides max_payload (names and values, bytes), to be read at
# all: a reader's script hands a larger entry, or one of more than MAX_FIELDS fields (counted
# as they are in the stream: a name may repeat), over as a stand-in holding none of its data
# (OVERSIZE, its size, or OVERWIDE, its width; lua/lib/jobs.lua sized), dead-lettered as
# `malformed`, so what one read brings into the daemon is bounded by its count times
# max_payload plus this, in at most MAX_FIELDS fields an entry.
ENTRY_SLACK = 1 << 20
OVERSIZE = b"jobd_oversize"  # set by the read scripts only, on such a stand-in
OVERWIDE = b"jobd_overwide"
TIMEOUT = b"jobd_timeout"  # the producer's limits on this job (see the module docstring)
MAX_ATTEMPTS = b"jobd_max_attempts"
EXPIRES_AT = b"jobd_expires_at"
LIMIT_FIELDS = (TIMEOUT, MAX_ATTEMPTS, EXPIRES_AT)
# The job that enqueued this one through its JOBD_ENQUEUE file (docs: Workflows): "QUEUE JOB_ID"
# (a queue name has no space), set by jobd only; its history records name it "parent".
PARENT = b"jobd_parent"
# The batch the job is a member of (`jobd enqueue --batch ID`; docs: Workflows), set by jobd only:
# its end is counted there (lua/lib/workflows.lua).
BATCH = b"jobd_batch"
# A batch id's bytes at most (workflow_input.check_batch_id: 200 characters of UTF-8): a longer
# jobd_batch (someone's XADD) is no batch jobd made, left out of records and events (notes.py,
# lua/lib/jobs.lua linked) so that they stay bounded.
MAX_BATCH_BYTES = 800
# A batch id (workflow_input.check_batch_id): 1 to 200 characters, no space, no control, no brace.
BATCH_ID = re.compile(r"[^\s{}\x00-\x1f\x7f]{1,200}")


def is_batch_id(value: bytes) -> bool:
    """Whether a jobd_batch is an id check_batch_id takes, UTF-8: records link no other (notes.py
    _batch, lua/lib/jobs.lua linked: the same rule), so that none names, escaped, another batch
    (the text ``\\xff`` for the byte 0xff); one over MAX_BATCH_BYTES is none, undecoded."""
    if len(value) > MAX_BATCH_BYTES:
        return False
    try:
        return BATCH_ID.fullmatch(value.decode("utf-8")) is not None
    except UnicodeDecodeError:
        return False


# Which batch of that id (its incarnation: lua/batch.lua), as the enqueue's open of it answered;
# '' until it is opened (jobd.batches Member.grow). A batch made again under the id of one that
# expired is another: the end of a member of the one before is not counted in it.
BATCH_INCARNATION = b"jobd_batch_incarnation"
# jobd's fields that a retry carries (the limits only when usable: see next_attempt_fields)
KEPT = (
    RESERVED_JOB_ID,
    RESERVED_ATTEMPT,
    UNIQUE,
    ORIGIN,
    PARENT,
    BATCH,
    BATCH_INCARNATION,
    *LIMIT_FIELDS,
)

# What Python's repr of a float, a printf %g or a hand write: 2.5, 30, 2., 1e+06; no sign, no
# nan or inf, no spaces or underscores (float() alone would take those).
_DECIMAL = re.compile(rb"[0-9]{1,20}(?:\.[0-9]{0,20})?(?:[eE][+-]?[0-9]{1,3})?")
_INTEGER = re.compile(rb"[0-9]{1,18}")
# jobd_expires_at outside these (Unix ms) is no moment a producer meant: before 1973-03-03 it is
# most likely Unix seconds sent as milliseconds (every job would expire), after 9999 absurd.
EXPIRES_MIN_MS, EXPIRES_MAX_MS = 10**11, 253_402_300_800_000


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits a producer set on one job, as read from its reserved fields; None where the
    field is absent or its value unusable (then the queue's own limit applies)."""

    timeout: float | None = None  # seconds, > 0
    max_attempts: int | None = None  # >= 1
    expires_at: float | None = None  # Unix seconds (the field is milliseconds)


NO_LIMITS = Limits()
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Job:
    queue: str
    message_id: str  # this delivery's stream id
    fields: dict[bytes, bytes]
    # Stable across retries and redeliveries. Any bytes a producer wrote, decoded with
    # surrogateescape (os.fsdecode): os.fsencode gives the exact bytes back, for Redis and exec.
    job_id: str
    attempt: int  # 1 for the first attempt
    limits: Limits = NO_LIMITS  # the producer's own, from the reserved fields
    # Redis's clock minus this host's, seconds, measured by the reader that delivered the job
    # when it had an expiry to check (jobd_expires_at, or the queue's max_wait); None when not
    # measured. Expiry is decided on Redis's clock: see ``redis_now``.
    clock_offset: float | None = None
    # This daemon's number for this delivery of the entry (``lease.Holdings.add``; 0: none): a
    # late report about an earlier delivery of the same entry, handed back and claimed again by
    # this daemon, is told apart from this one.
    delivery: int = 0
    # Why this entry must not run under any queue, decided as it is read ('' for nearly every
    # entry): its job id is longer than MAX_JOB_ID (then ``job_id`` is the stream id), or it
    # was too large to read (OVERSIZE).
    malformed: str = ""
    # The producer's W3C trace context (``jobd.trace``); None for a job without one.
    trace: _trace.Trace | None = None

    @classmethod
    def from_entry(cls, queue: str, message_id: bytes, fields: dict[bytes, bytes]) -> Job:
        mid = message_id.decode("ascii")
        job_id, malformed = _job_id(queue, mid, fields)
        if OVERSIZE in fields:  # a stand-in (lua/lib/jobs.lua sized): the entry was not read
            size = _said(fields[OVERSIZE])
            malformed = (f"an entry of {size} bytes, more than max_payload and "
                         f"{ENTRY_SLACK} bytes for its other fields: not read")  # fmt: skip
        if OVERWIDE in fields:
            width = _said(fields[OVERWIDE])
            malformed = f"an entry of {width} fields, more than {MAX_FIELDS}: not read"
        return cls(
            queue, mid, fields, job_id, _attempt(queue, mid, fields), _limits(queue, mid, fields),
            malformed=malformed, trace=_trace.read(queue, mid, fields),
        )  # fmt: skip

    def delivered(self, delivery: int, clock_offset: float | None) -> Job:
        """This job as delivered to the loop: with its delivery number, and Redis's clock
        offset when the reader measured one (built directly: ``dataclasses.replace`` costs
        several times more, once for every job)."""
        offset = self.clock_offset if clock_offset is None else clock_offset
        return Job(self.queue, self.message_id, self.fields, self.job_id, self.attempt,
                   self.limits, offset, delivery, self.malformed, self.trace)  # fmt: skip

    def tag(self, queue: str) -> str:
        """How log lines name this job."""
        # One word, so JSON logs parse it, and no space or format character that could make
        # it pass for another job's (logs.word). A traced job's lines name its trace.
        tag = f"queue={queue} job={word(self.job_id)} attempt={self.attempt}"
        if self.trace is None or self.trace.traceparent is None:
            return tag
        return f"{tag} trace={self.trace.trace_id}"

    @property
    def origin(self) -> str:
        """Which enqueue this job is of (ORIGIN): its first entry's id, or a producer's token."""
        raw = self.fields.get(ORIGIN)
        if raw and len(raw) <= MAX_ORIGIN and raw.isascii() and raw.decode().isprintable():
            return raw.decode()
        return self.message_id

    def enqueued_at(self) -> float:
        """Unix time of this entry's stream id: when it was added (or re-added for a retry)."""
        return int(self.message_id.split("-", 1)[0]) / 1000

    def timeout(self, queue: QueueConfig) -> float:
        """Seconds this attempt may run: the job's own ``jobd_timeout``, capped by the queue's."""
        own = self.limits.timeout
        return queue.timeout if own is None else min(own, queue.timeout)

    def max_attempts(self, queue: QueueConfig) -> int:
        """Attempts in all: the job's own ``jobd_max_attempts``, capped by the queue's."""
        own = self.limits.max_attempts
        cap = queue.retry.max_attempts
        return cap if own is None else min(own, cap)

    @property
    def expires_at(self) -> float | None:
        """Unix time (seconds, Redis's clock) after which this job must not start, if any."""
        return self.limits.expires_at

    def needs_clock(self, queue: QueueConfig) -> bool:
        """Whether starting this job depends on the time: it expires, or its queue has a
        ``max_wait``; the reader then measures ``clock_offset``."""
        return self.limits.expires_at is not None or queue.max_wait is not None

    def redis_now(self, now: float | None = None) -> float | None:
        """Redis's clock now (Unix seconds), from this host's ``now`` and the offset measured
        when the job was read; None when it was not measured."""
        if self.clock_offset is None:
            return None
        return (time.time() if now is None else now) + self.clock_offset

    def waited(self) -> float:
        """Seconds since its entry was added (its stream id, Redis's clock), on Redis's clock
        (``redis_now``; this host's when the reader could not read it)."""
        now = self.redis_now()
        return max(0.0, (time.time() if now is None else now) - self.enqueued_at())

    def payload_size(self) -> int:
        payload = self.fields.get(PAYLOAD)
        return len(payload) if payload is not None else len(self.stdin_bytes())

    def next_attempt_fields(self) -> dict[bytes, bytes]:
        """The fields of this job's next attempt: its own, with jobd's bookkeeping renewed."""
        fields = {k: v for k, v in self.fields.items() if not k.startswith(b"jobd_")}
        if self.trace is not None and self.trace.dropped:  # said once: not carried on
            for name in _trace.FIELDS:
                if not self.trace.kept(name):
                    fields.pop(name, None)
        fields[RESERVED_JOB_ID] = os.fsencode(self.job_id)
        fields[RESERVED_ATTEMPT] = str(self.attempt + 1).encode()
        fields[ORIGIN] = self.origin.encode()
        # a retried member's end is its batch's
        for name in (UNIQUE, PARENT, BATCH, BATCH_INCARNATION):
            if name in self.fields:
                fields[name] = self.fields[name]
        usable = (self.limits.timeout, self.limits.max_attempts, self.limits.expires_at)
        for name, value in zip(LIMIT_FIELDS, usable, strict=True):
            if value is not None and name in self.fields:  # as written; unusable ones stay behind
                fields[name] = self.fields[name]
        return fields

    def too_wide(self) -> int | None:
        """The width of this job's next attempt (its own fields and jobd's), when that is more
        than MAX_FIELDS: a script could not copy it for a retry."""
        if len(self.fields) <= MAX_FIELDS - len(KEPT):  # nearly every job: nothing to count
            return None
        width = len(self.next_attempt_fields())
        return width if width > MAX_FIELDS else None

    def mark_key(self, keys: QueueKeys, dedupe: bool) -> bytes | None:
        """The key of this job's mark when it has one to keep: a producer's job id on a queue
        with a dedupe window, or a job enqueued with --unique (none when the producer's job id
        was refused: ``job_id`` is then the stream id)."""
        if self.malformed and self.job_id == self.message_id:
            return None
        if UNIQUE in self.fields or (dedupe and JOB_ID in self.fields):
            return keys.job_mark(self.job_id)
        return None

    def stdin_bytes(self) -> bytes:
        """The ``payload`` field byte for byte; else a JSON object of the entry's fields."""
        payload = self.fields.get(PAYLOAD)
        if payload is not None:
            return payload
        return orjson.dumps(
            {
                k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in self.fields.items()
            }
        )


def _said(value: bytes) -> str:
    """A stand-in's number as its script wrote it (decimal); a producer's field of that name
    may hold anything, of any length: then "?"."""
    said = value[:20]
    return said.decode() if said.isdigit() else "?"


def _job_id(queue: str, message_id: str, fields: dict[bytes, bytes]) -> tuple[str, str]:
    """The entry's job id, and why the entry is malformed ('' when it is not): a job id longer
    than MAX_JOB_ID makes the stream id the job's id, and the entry malformed (never run)."""
    for name in (JOB_ID, RESERVED_JOB_ID):
        raw = fields.get(name)
        if raw is None:
            continue
        if len(raw) > MAX_JOB_ID:
            why = f"field {name.decode()} of {len(raw)} bytes: a job id has at most {MAX_JOB_ID}"
            log.warning(
                "queue=%s message=%s: %s (it begins %r); using the stream id",
                queue, message_id, why, raw[:64],
            )  # fmt: skip
            return message_id, why
        if raw and b"\0" not in raw:
            # Environment values are bytes to the kernel: surrogateescape keeps them exact.
            return os.fsdecode(raw), ""
        log.warning(
            "queue=%s message=%s: field %s is empty or holds a NUL byte; using the stream id",
            queue,
            message_id,
            name.decode(),
        )
    return message_id, ""


def _attempt(queue: str, message_id: str, fields: dict[bytes, bytes]) -> int:
    raw = fields.get(RESERVED_ATTEMPT)
    if raw is None:
        return 1
    try:
        attempt = int(raw)
    except ValueError:
        attempt = 0
    if attempt < 1:
        log.warning("queue=%s message=%s: bad jobd_attempt %r; using 1", queue, message_id, raw)
        return 1
    return attempt


def _limits(queue: str, message_id: str, fields: dict[bytes, bytes]) -> Limits:
    """The producer's limits on this job; each unusable one is warned about once and ignored."""
    if TIMEOUT not in fields and MAX_ATTEMPTS not in fields and EXPIRES_AT not in fields:
        return NO_LIMITS  # nearly every job: three lookups, on the spawn path
    timeout = _field(queue, message_id, fields, TIMEOUT, _seconds)
    attempts = _field(queue, message_id, fields, MAX_ATTEMPTS, _positive_int)
    expires = _field(queue, message_id, fields, EXPIRES_AT, _unix_ms)
    return Limits(timeout, attempts, expires)


def _field(
    queue: str, message_id: str, fields: dict[bytes, bytes], name: bytes,
    parse: Callable[[bytes], T | None],
) -> T | None:  # fmt: skip
    """``parse`` of the field ``name``; None when absent, or unusable (then with a warning)."""
    raw = fields.get(name)
    if raw is None:
        return None
    value = parse(raw)
    if value is None:
        log.warning(
            "queue=%s message=%s: ignoring %s %r, not a usable value: the queue's limits apply",
            queue, message_id, name.decode(), raw[:40],
        )  # fmt: skip
    return value


def _seconds(raw: bytes) -> float | None:
    """A positive, finite number of seconds written as a decimal ("2.5", "30", "1e3")."""
    if not _DECIMAL.fullmatch(raw):
        return None
    value = float(raw)
    return value if value > 0 and math.isfinite(value) else None


def _positive_int(raw: bytes) -> int | None:
    """An integer of at least 1, digits only."""
    return int(raw) if _INTEGER.fullmatch(raw) and int(raw) >= 1 else None


def _unix_ms(raw: bytes) -> float | None:
    """Unix milliseconds (digits only), between 1973 and 9999, as Unix seconds."""
    if not _INTEGER.fullmatch(raw) or not EXPIRES_MIN_MS <= int(raw) <= EXPIRES_MAX_MS:
        return None
    return int(raw) / 1000
