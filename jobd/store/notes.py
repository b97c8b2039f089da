"""What the settling scripts write about a job besides its outcome: its history record and the
queue's event (docs/concepts/history.md), sent as a "note" (lua/lib/jobs.lua ``note_at``) and
written in the same step as the outcome, so no job is ever settled without its record.

A record is a JSON object; the script puts Redis's time (``at``, and ``started_at`` from the
run time) in front of it, so every host's records are on one clock.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import time

import orjson

from jobd.config import QueueConfig
from jobd.job import BATCH, BATCH_INCARNATION, ORIGIN, PARENT, is_batch_id
from jobd.outcome import ENQUEUE, EXPIRED, POISON, RESULT, Outcome, Started, Verb
from jobd.store.keys import HISTORY_BYTES

HOST = socket.gethostname()
RECORD_BYTES = HISTORY_BYTES // 2  # one record's JSON at most (its output tails cut to fit)
FOLLOW_UPS_SHOWN = 20  # follow-ups a done record names ("QUEUE JOB_ID"); it counts them all

# The event of each verb (a dead letter's depends on why: see ``event_of``).
EVENTS = {
    Verb.ACK: "done",
    Verb.RETRY: "retried",
    Verb.CANCEL: "cancelled",
    Verb.HAND_BACK: "handed back",
}


def keys(queue: QueueConfig) -> list[str]:
    """KEYS of lua/lib/jobs.lua ``history_at``: history, history:at, active, events."""
    k = queue.keys
    return [k.history, k.history_at, k.active, k.events]


def settings(queue: QueueConfig) -> str:
    """ARGV of lua/lib/jobs.lua ``history_at``: "MAX_AGE_MS MAXLEN EVENTS QUEUE"."""
    h = queue.history
    return f"{int(h.max_age * 1000)} {h.maxlen} {h.events} {queue.name}"


def event_of(o: Outcome) -> str:
    if o.verb is Verb.DEAD_LETTER:
        return o.error if o.error in (POISON, EXPIRED) else "dead-lettered"
    return EVENTS[o.verb]


def note(o: Outcome, consumer: str) -> list[object]:
    """The note of an outcome (lua/lib/jobs.lua ``note_at``): event, job id, ms since it started
    (now, as it is sent: a write delayed by an outage still dates the start right), record, and
    the event's fields."""
    job, ran, keep = o.job, o.ran, o.queue.history.output
    record: dict[str, object] = {
        "event": event_of(o),
        "stream": o.queue.stream,
        "entry": o.message_id,
        "attempt": _number(job.attempt),
        "consumer": consumer,
        "host": HOST,
    }
    extras = _batch(job.fields)  # first
    extras += ["consumer", consumer, "attempt", job.attempt]
    if ORIGIN in job.fields:  # a retry's, or a timed job's: which enqueue it is of (a waiter's)
        record["origin"] = job.origin
        extras += ["origin", job.origin]
    if job.trace is not None and (trace_id := job.trace.trace_id) is not None:
        record["trace_id"] = trace_id
        extras += ["trace_id", trace_id]
    run_ms: object = ""
    if o.error:
        record["error"] = o.error
        extras += ["error", o.error]
    if ran is not None:
        run_ms = int((time.monotonic() - ran.started) * 1000)  # from its start to this write
        duration = int(ran.seconds * 1000)
        record.update(pid=ran.pid, duration_ms=duration, exit_code=ran.exit_code, signal=ran.signal)
        if ran.cpu_seconds is not None:
            record["cpu_seconds"] = round(ran.cpu_seconds, 6)
        record["max_rss_bytes"] = ran.max_rss_bytes  # null: not known (docs: concepts/containment)
        if ran.progress is not None:  # what its handler last told of itself (process.channel)
            record["progress"] = int(ran.progress) if ran.progress.is_integer() else ran.progress
        if ran.status is not None:
            record["status"] = _text(ran.status)
        extras += ["duration_ms", duration]
        if ran.exit_code is not None:
            extras += ["exit_code", ran.exit_code]
        if ran.signal is not None:
            extras += ["signal", ran.signal]
        if keep:
            record["stdout"] = _text(ran.stdout[-keep:])
            record["stderr"] = _text(ran.stderr[-keep:])
    elif o.detail and keep:  # why it never ran (malformed, expired, could not start)
        record["detail"] = _text(o.detail[-keep:])
    if o.error in (RESULT, ENQUEUE):  # why its result or follow-ups were refused: the last line
        record["detail"] = _text(o.detail.rpartition(b"\njobd: ")[2])
    record.update(links(o))
    return [event_of(o), os.fsencode(job.job_id), run_ms, _fit(record), len(extras) // 2, *extras]


def _batch(fields: dict[bytes, bytes]) -> list[object]:
    """A note's first extras: its job's batch, and which batch of that id (its incarnation: no
    event field, lib/jobs.lua note_at takes it out; lib/workflows.lua batch_of reads both). A
    jobd_batch jobd would not write (empty, over MAX_BATCH_BYTES, not a batch id: not UTF-8, a
    space…: someone's XADD) is none, as lib/jobs.lua ``linked`` has it: records and events stay
    bounded, and a record never names, escaped, another batch (``\\xff`` for the byte 0xff)."""
    if not is_batch_id(fields.get(BATCH, b"")):
        return []
    if incarnation := fields.get(BATCH_INCARNATION):
        return ["batch", fields[BATCH], "batch_incarnation", incarnation]
    return ["batch", fields[BATCH]]


def links(o: Outcome) -> dict[str, object]:
    """A record's result, if any, and its workflow links: the job whose JOBD_ENQUEUE file
    named this one (``parent``), its batch, the jobs this one enqueued (their count, the first
    FOLLOW_UPS_SHOWN named)."""
    found: dict[str, object] = {}
    if o.verb is Verb.ACK and o.result is not None:  # and what it gave back
        found.update(result_field(o.result))
    if PARENT in o.job.fields:
        found["parent"] = _text(o.job.fields[PARENT])
    if batch := _batch(o.job.fields):  # its end is counted there (lua/lib/workflows.lua batch_of)
        found["batch"] = _text(o.job.fields[BATCH])
        if len(batch) == 4 and batch[3].isdigit() and len(batch[3]) <= 32:  # which (lib/jobs.lua
            found["batch_incarnation"] = _text(batch[3])  # linked: `jobd job` tells it)
    if o.follow_ups:
        found["follow_ups"] = len(o.follow_ups)
        shown = o.follow_ups[:FOLLOW_UPS_SHOWN]
        found["follow_up_jobs"] = [f"{f.queue.name} {_text(f.job_id)}" for f in shown]
    return found


def active(s: Started, consumer: str, now: float) -> list[object]:
    """lua/start.lua's five arguments for a job running since ``s.at`` (monotonic; ``now``)."""
    record = {
        "stream": s.queue.stream,
        "entry": s.message_id,
        "consumer": consumer,
        "host": HOST,
        "pid": s.pid,
        "attempt": _number(s.job.attempt),
    }
    if s.job.trace is not None and (trace_id := s.job.trace.trace_id) is not None:
        record["trace_id"] = trace_id
    prefix = f"{s.queue.stream}|{s.message_id}\n"
    ran_ms, timeout_ms = int((now - s.at) * 1000), int(s.timeout * 1000)
    return [os.fsencode(s.job.job_id), prefix, ran_ms, timeout_ms, orjson.dumps(record)]


def result_field(result: bytes) -> dict[str, str]:
    """A result as its record keeps it (docs/concepts/history.md): ``result``, its text, when
    it is UTF-8 and JSON takes it in no more room than base64; else ``result_base64``. Either
    way its bytes come back exactly (``records.result_of``)."""
    encoded = base64.b64encode(result).decode("ascii")
    with contextlib.suppress(UnicodeDecodeError):
        text = result.decode("utf-8")
        if len(orjson.dumps(text)) <= len(encoded) + 2 or len(text) < 64:
            return {"result": text}
    return {"result_base64": encoded}


def _number(n: int) -> int | str:
    """``n`` as JSON takes it: a producer's jobd_attempt may be any digits, and JSON readers
    (and orjson) take integers of 64 bits at most."""
    return n if -(2**63) <= n < 2**63 else str(n)


def _fit(record: dict[str, object]) -> bytes:
    """The record's JSON, its output tails cut (from their start) until it takes at most
    RECORD_BYTES: escaped control bytes take six times their size, and a job keeps
    HISTORY_BYTES of records in all (lua/lib/jobs.lua)."""
    body = orjson.dumps(record)
    while len(body) > RECORD_BYTES and any(record.get(k) for k in ("stdout", "stderr")):
        for k in ("stdout", "stderr"):
            text = record.get(k)
            if isinstance(text, str):
                record[k] = text[(len(text) + 1) // 2 :]  # to '' in the end: a result stays
        body = orjson.dumps(record)
    return body


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")
