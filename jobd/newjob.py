"""A job before it is added: ``NewJob``, what a producer gives, and the entry it becomes (its
fields, its due time), checked before anything is written. ``jobd.producer`` writes it.

``NewJob`` (every attribute but ``payload`` optional)::

    payload        bytes, handed to the handler on stdin; at most the queue's max_payload
                   (``jobd.producer`` refuses a larger one: the daemon would not run it)
    job_id         the job's stable id (default: the stream id; a generated one for a timed job);
                   not empty, no NUL byte (the daemon could not use it: it would run the job
                   under its stream id, and a unique job's mark would stay behind), at most
                   ``job.MAX_JOB_ID`` (1024) bytes (the daemon would not run it)
    fields         extra fields, name -> str or bytes. Names starting ``jobd_`` are jobd's and
                   refused, except the three per-job limits below; ``payload`` and ``job_id``
                   too (they are the attributes above)
    delay / at     seconds from now on Redis's clock / Unix seconds (not both); at most ten
                   years ahead (Redis's clock), not negative
    unique         only if ``job_id`` (required) is not queued, running or done already
    timeout        seconds an attempt may run                -> field jobd_timeout ("2.5")
    max_attempts   attempts in all, the first included       -> field jobd_max_attempts ("3")
    expires_in / expires_at   seconds from now on Redis's clock / Unix seconds (not both): a
                   job not started by then is not run         -> field jobd_expires_at (Unix ms)
    traceparent, tracestate, baggage   the W3C trace context the handler gets (TRACEPARENT,
                   TRACESTATE, BAGGAGE: ``jobd.trace``)  -> fields of the same names. None: the
                   fields of those names, if any, else this process's TRACEPARENT, TRACESTATE
                   and BAGGAGE (a handler's follow-up keeps its trace); "": none. Checked,
                   given or as fields (ValueError); the environment's left out unless usable

The three ``jobd_`` fields are the ones a producer in any language may write; the daemon caps
them by the queue's own values. A value given as a field is checked like the attribute. They
are refused unless sane: a timeout from 1 ms to 365 days (kept to the millisecond), 1 to
1 000 000 attempts, an expiry later than now and than the job's due time, at most ten years
ahead (Redis's clock).
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from jobd import job as _job
from jobd.job import EXPIRES_AT, JOB_ID, LIMIT_FIELDS, MAX_ATTEMPTS, PAYLOAD, TIMEOUT, UNIQUE
from jobd.store.admin import NewEntry
from jobd.store.delayed import Due, after
from jobd.trace import BAGGAGE, TRACEPARENT, TRACESTATE, producer_fields

# What a producer may ask for (the daemon reads the fields in ``jobd.job``, capped by the queue).
MAX_TIMEOUT = 365 * 86400  # seconds: a longer one is a mistake (a unit), not a job
MOST_ATTEMPTS = 1_000_000
MAX_AHEAD_MS = 10 * 365 * 86400 * 1000  # how far ahead a due time or an expiry may be
# The most seconds any time or duration may say (Unix seconds of the year 9999): more is no time
# a producer meant, and in milliseconds no longer a finite number (1e308).
MAX_SECONDS = 253_402_300_800
# How far apart this host's clock and Redis's may be for the coarse check of ``at``: a time
# within ten years of this host's clock, less this, is taken without asking Redis the time
# (one round trip saved per job; a host more than this ahead could pass a little beyond).
SKEW_MS = 86400 * 1000

_DECIMAL = re.compile(rb"[0-9]+(\.[0-9]+)?")
_COUNT = re.compile(rb"[1-9][0-9]*")


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to add (the module docstring says what each attribute means)."""

    payload: bytes = b""
    job_id: str | None = None
    fields: Mapping[str, str | bytes] = field(default_factory=dict)
    delay: float | None = None
    at: float | None = None
    unique: bool = False
    timeout: float | None = None
    max_attempts: int | None = None
    expires_in: float | None = None
    expires_at: float | None = None
    # W3C trace context (fields traceparent, tracestate, baggage): None takes it from the
    # fields, else from this process's TRACEPARENT, TRACESTATE, BAGGAGE; "" sends none.
    traceparent: str | None = None
    tracestate: str | None = None
    baggage: str | None = None
    # Workflows (jobd.workflows): the batch it is a member of (field jobd_batch); the jobs it
    # waits for ("JOB_ID" of its queue, or (QUEUE, JOB_ID)), and whether it runs after any of
    # their ends (else only once all are done); how long it waits at most (seconds; None: the
    # queue's max_wait, if it has one, else no bound). ``after`` given one job id as a str
    # (not a tuple of one) is that job, not its characters: after="i-42" is after=("i-42",).
    batch: str | None = None
    on_complete: str | None = None  # the batch's callback queue (the first enqueue's to name one)
    after: tuple[str | tuple[str, str], ...] = ()
    after_any: bool = False
    after_timeout: float | None = None

    def __post_init__(self) -> None:
        after = self.after
        if isinstance(after, (bytes, bytearray)):
            raise TypeError(f"after={after!r}: job ids are str: a str, or a tuple of them")
        if isinstance(after, str):  # one job id, not a tuple of its characters
            object.__setattr__(self, "after", (after,) if after else ())
        elif not isinstance(after, tuple):  # a list, say: kept as given, in order
            object.__setattr__(self, "after", tuple(after))


class Clock(Protocol):
    """Where "now" comes from, in Unix ms."""

    def now_ms(self) -> int: ...


class HostClock:
    """This host's clock: for checking a job before Redis is asked (``check_limits``), and
    for taking an ``at`` surely within ten years without asking (``prepare``)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)


class RedisTime(Protocol):
    """What reads Redis's clock (TIME, in ms): a ``jobd.store.store.Store``."""

    def clock_ms(self) -> int: ...


class RedisClock:
    """Redis's clock (TIME), read once when first needed and then advanced by this host's
    monotonic clock: expiries are counted on the clock the daemons judge them by, for one
    round trip per enqueue, not per job (``jobd.producer``'s)."""

    def __init__(self, store: RedisTime) -> None:
        self._store = store
        self._base: tuple[int, float] | None = None

    def now_ms(self) -> int:
        if self._base is None:
            self._base = (self._store.clock_ms(), time.monotonic())
        redis_ms, then = self._base
        return redis_ms + int((time.monotonic() - then) * 1000)


class JobClock:
    """Redis's clock as the reader measured it when it read ``job`` (``Job.redis_now``): a
    daemon's follow-ups of that job count their ``expires_in`` on the clock the daemons judge
    expiry by, as ``jobd enqueue``'s do (``RedisClock``), with no round trip; this
    host's clock when it was not measured (Redis did not answer)."""

    def __init__(self, job: _job.Job) -> None:
        self.job = job

    def now_ms(self) -> int:
        now = self.job.redis_now()
        return int((time.time() if now is None else now) * 1000)


def too_wide(fields: Mapping[bytes, bytes]) -> str | None:
    """Why a job of these fields is wider than jobd runs one (``job.MAX_FIELDS``: its scripts
    could not copy it), or None. Counted as the daemon that reads it counts (``Job.too_wide``:
    its own fields, and jobd's a retry carries, jobd_job_id, jobd_attempt and jobd_origin
    added), so that no job is added that its queue would dead-letter unrun."""
    if len(fields) <= _job.MAX_FIELDS - len(_job.KEPT):  # nearly every job: nothing to count
        return None
    width = _job.Job.from_entry("", b"0-0", dict(fields)).too_wide()
    if width is None:
        return None
    return (f"a job has at most {_job.MAX_FIELDS} fields with jobd's own (jobd.job.MAX_FIELDS); "
            f"this one would have {width}")  # fmt: skip


def prepare(job: NewJob, clock: Clock) -> tuple[NewEntry, str | None]:
    """The entry that adds ``job``, and its job id when known before the write (given, or
    generated for a timed job); ValueError, saying why, when the job is refused."""
    if job.unique and job.job_id is None:
        raise ValueError("a unique job needs a job_id")
    if job.at is not None and job.delay is not None:
        raise ValueError("give at or delay, not both")
    due = due_arg(job.at, job.delay)
    if isinstance(due, int) and due > HostClock().now_ms() + MAX_AHEAD_MS - SKEW_MS:
        _check_ahead(f"at {job.at!r}", due, clock.now_ms())
    named = due is not None or job.after  # a timed or held job's id is known before it is added
    job_id = uuid.uuid4().hex if named and job.job_id is None else job.job_id
    fields = job_fields(job.payload, job_id, job.unique)
    if job.fields:
        fields.update(_own_fields(job.fields))
    given = {TRACEPARENT: job.traceparent, TRACESTATE: job.tracestate, BAGGAGE: job.baggage}
    fields.update(producer_fields(given, fields, os.environ))
    for name, value in _limit_fields(job, clock).items():
        if name in fields:
            raise ValueError(f"{name.decode()} given twice: as an argument and as a field")
        fields[name] = value
    if any(name in fields for name in LIMIT_FIELDS):
        _check_limits(fields, due, clock)
    if job.batch is not None:  # which batch of that id: known once it opens (jobd.batches)
        fields[_job.BATCH], fields[_job.BATCH_INCARNATION] = job.batch.encode(), b""
    return NewEntry(fields, due, job_id if job.unique else None), job_id


def check_limits(job: NewJob) -> None:
    """ValueError when ``job``'s due time or per-job limits are not sane, for a command line to
    refuse a bad flag before any job is sent. Whether an expiry is past, or before the due
    time, and whether an ``at`` is more than ten years ahead, are left to ``prepare``: only
    Redis's clock says (this host's may be off)."""
    due_arg(job.at, job.delay)
    _check_limits(_limit_fields(job, HostClock()), None, None)


def check_trace(job: NewJob) -> None:
    """ValueError when the trace context ``job`` gives is not usable (``jobd.trace``), for a
    command line to refuse a bad flag before any job is sent."""
    given = {TRACEPARENT: job.traceparent, TRACESTATE: job.tracestate, BAGGAGE: job.baggage}
    if any(value is not None for value in given.values()):
        producer_fields(given, {}, {})


def job_fields(payload: bytes, job_id: str | None, unique: bool) -> dict[bytes, bytes]:
    """The fields jobd itself gives a job's entry."""
    fields: dict[bytes, bytes] = {PAYLOAD: payload}
    if job_id is not None:
        fields[JOB_ID] = _job_id_bytes(job_id)
    if unique:
        fields[UNIQUE] = b"1"
    return fields


def due_arg(at: float | None, delay: float | None) -> Due | None:
    """The scripts' due time: ``at`` in Unix ms, or ``delay`` as ms after Redis's clock
    (``store.delayed.after``); None for now. ValueError for a delay more than ten years long,
    or an ``at`` not a time (how far ahead it is, only a clock says: ``_check_ahead``)."""
    if delay is not None:
        ms = round(_ms("delay", delay, "more than ten years"))
        if ms > MAX_AHEAD_MS:
            raise ValueError(f"delay {delay!r}: more than ten years")
        return after(ms)
    return None if at is None else int(_ms("at", at))


def _check_ahead(shown: str, due_ms: int, now_ms: int) -> None:
    """ValueError when ``due_ms`` is more than ten years after ``now_ms``: a mistake (a unit),
    and beyond what the scripts can count (their due times are 64-bit milliseconds)."""
    if due_ms > now_ms + MAX_AHEAD_MS:
        raise ValueError(f"{shown}: more than ten years ahead")


def _job_id_bytes(job_id: str) -> bytes:
    """``job_id`` as the field holds it (any bytes: see Job.job_id); ValueError for one the
    daemon cannot use (``jobd.job._job_id``: it would run the job under its stream id)."""
    try:
        raw = os.fsencode(job_id)
    except (TypeError, UnicodeError):
        raise ValueError(f"job_id {job_id!r}: give a string (UTF-8)") from None
    if not raw:
        raise ValueError("job_id '': give a non-empty job id (or none: the stream id)")
    if len(raw) > _job.MAX_JOB_ID:
        raise ValueError(
            f"job_id of {len(raw)} bytes (it begins {raw[:32]!r}): a job id has at most "
            f"{_job.MAX_JOB_ID} bytes (jobd.job.MAX_JOB_ID)"
        )
    if b"\0" in raw:
        raise ValueError(f"job_id {job_id!r}: holds a NUL byte, which no job id may hold")
    return raw


def _own_fields(fields: Mapping[str, str | bytes]) -> dict[bytes, bytes]:
    """A producer's extra fields as bytes; ValueError for a name that is not its to set."""
    own: dict[bytes, bytes] = {}
    for name, value in fields.items():
        key = os.fsencode(name)
        if key in (PAYLOAD, JOB_ID):
            raise ValueError(f"field {name!r}: give it as the job's {name}, not as a field")
        if key.startswith(b"jobd_") and key not in LIMIT_FIELDS:
            allowed = ", ".join(limit.decode() for limit in LIMIT_FIELDS)
            raise ValueError(f"field {name!r}: names starting jobd_ are jobd's ({allowed} only)")
        if not isinstance(value, str | bytes):
            raise ValueError(f"field {name!r}: a value is a string, not {type(value).__name__}")
        own[key] = value.encode() if isinstance(value, str) else value
    return own


def _limit_fields(job: NewJob, clock: Clock) -> dict[bytes, bytes]:
    """The fields of ``job``'s per-job limit attributes, unchecked but for their type."""
    limits: dict[bytes, bytes] = {}
    if job.timeout is not None:
        limits[TIMEOUT] = f"{_seconds('timeout', job.timeout):.3f}".rstrip("0").rstrip(".").encode()
    if job.max_attempts is not None:
        if isinstance(job.max_attempts, bool) or not isinstance(job.max_attempts, int):
            raise ValueError(f"max_attempts {job.max_attempts!r}: give a whole number")
        limits[MAX_ATTEMPTS] = str(job.max_attempts).encode()
    if job.expires_in is not None and job.expires_at is not None:
        raise ValueError("give expires_in or expires_at, not both")
    if job.expires_in is not None:
        ms = round(_ms("expires_in", job.expires_in, "more than ten years")) + clock.now_ms()
        limits[EXPIRES_AT] = str(ms).encode()
    elif job.expires_at is not None:
        limits[EXPIRES_AT] = str(round(_ms("expires_at", job.expires_at))).encode()
    return limits


def _check_limits(fields: Mapping[bytes, bytes], due: Due | None, clock: Clock | None) -> None:
    """ValueError when a per-job limit field holds what the daemon cannot use; an expiry is
    compared with now and ``due`` only given the ``clock``."""
    timeout = fields.get(TIMEOUT)
    if timeout is not None and not (
        _DECIMAL.fullmatch(timeout) and 0.001 <= float(timeout) <= MAX_TIMEOUT
    ):
        raise ValueError(
            f"timeout (jobd_timeout) {timeout.decode(errors='replace')!r}: give from 1ms to "
            f"365d (as the field: seconds, a decimal string from 0.001 to {MAX_TIMEOUT})"
        )
    attempts = fields.get(MAX_ATTEMPTS)
    if attempts is not None and not (_COUNT.fullmatch(attempts) and int(attempts) <= MOST_ATTEMPTS):
        raise ValueError(
            f"max_attempts (jobd_max_attempts) {attempts.decode(errors='replace')!r}: give a "
            f"whole number from 1 to {MOST_ATTEMPTS}"
        )
    expires = fields.get(EXPIRES_AT)
    if expires is not None:
        _check_expiry(expires, due, clock)


def _check_expiry(expires: bytes, due: Due | None, clock: Clock | None) -> None:
    """ValueError unless ``expires`` is Unix ms after now and after ``due``, within reach."""
    shown = f"expiry (jobd_expires_at) {expires.decode(errors='replace')!r}"
    if not _COUNT.fullmatch(expires):
        raise ValueError(f"{shown}: give Unix milliseconds, a whole number")
    if clock is None:
        return
    now = clock.now_ms()
    if int(expires) <= now:
        raise ValueError(f"{shown}: already past (now is {now})")
    _check_ahead(shown, int(expires), now)
    if due is not None:
        due_ms = now + int(due[1:]) if isinstance(due, str) else int(due)
        if int(expires) <= due_ms:
            raise ValueError(f"{shown}: the job would expire before it is due ({due_ms})")


def _seconds(name: str, value: float) -> float:
    """``value`` when it is a finite number of seconds, not negative; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} {value!r}: give a number of seconds")
    if value < 0:
        raise ValueError(f"{name} {value!r}: negative")
    return float(value)


def _ms(name: str, value: float, ahead: str = "more than ten years ahead") -> float:
    """``value`` seconds (``_seconds``) in milliseconds; ValueError saying ``ahead`` past
    MAX_SECONDS (1e308 seconds are finite, but not in milliseconds: no int holds them)."""
    seconds = _seconds(name, value)
    if seconds > MAX_SECONDS:
        raise ValueError(f"{name} {value!r}: {ahead}")
    return seconds * 1000


def parse_time(text: str, what: str) -> float:
    """Unix seconds from ISO 8601 (a time without an offset is local time) or Unix seconds;
    ValueError saying which forms are meant (``what`` names the value)."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise ValueError(
                f"{what} {text!r}: write ISO 8601 (2026-12-01T09:00:00+00:00) or Unix seconds"
            ) from None
    if not math.isfinite(seconds):
        raise ValueError(f"{what} {text!r}: not a time")
    return seconds


def follow_up_id(parent: str, n: int | str) -> str:
    """The job id of a parent's ``n``th follow-up: ``PARENT.N``; for a parent id too long to
    take the suffix, a digest of it in its place."""
    derived = f"{parent}.{n}"
    if len(os.fsencode(derived)) <= _job.MAX_JOB_ID:
        return derived
    return f"{hashlib.sha256(os.fsencode(parent)).hexdigest()}.{n}"


def follow_up_template(parent: _job.Job) -> NewJob:
    """What a line starts from: the parent's trace context (its follow-ups stay in its trace),
    never the daemon's environment."""
    t = parent.trace
    if t is None or t.traceparent is None:
        return NewJob(traceparent="", tracestate="", baggage="")
    return NewJob(traceparent=t.traceparent, tracestate=t.tracestate or "", baggage=t.baggage or "")
