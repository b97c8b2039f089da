"""What the settling scripts write about a job besides its outcome: its history record and the
queue's event (docs/history.md), sent as a "note" (lua/lib/jobs.lua ``note_at``) and written in
the same step as the outcome, so no job is ever settled without its record.

A record is a JSON object; the script puts Redis's time (``at``, and ``started_at`` from the
run time) in front of it, so every host's records are on one clock.
"""

from __future__ import annotations

import os
import socket
import time

import orjson

from jobd.config import QueueConfig
from jobd.outcome import EXPIRED, POISON, Outcome, Started, Verb
from jobd.store.keys import HISTORY_BYTES

HOST = socket.gethostname()
RECORD_BYTES = HISTORY_BYTES // 2  # one record's JSON at most (its output tails cut to fit)

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
    extras: list[object] = ["consumer", consumer, "attempt", job.attempt]
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
        if ran.max_rss_bytes is not None:
            record["max_rss_bytes"] = ran.max_rss_bytes
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
    return [event_of(o), os.fsencode(job.job_id), run_ms, _fit(record), len(extras) // 2, *extras]


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
    prefix = f"{s.queue.stream}|{s.message_id}\n"
    ran_ms, timeout_ms = int((now - s.at) * 1000), int(s.timeout * 1000)
    return [os.fsencode(s.job.job_id), prefix, ran_ms, timeout_ms, orjson.dumps(record)]


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
                record[k] = text[len(text) // 2 :]
        body = orjson.dumps(record)
    return body


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")
