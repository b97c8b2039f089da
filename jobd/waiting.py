"""Waiting for a job's end: what `jobd enqueue --wait` and ``producer.submit(...).wait()`` do.

The script that settles a job writes its event to the queue's events stream (``{S}:events``,
docs/concepts/history.md) in the same step as its outcome and its history record. A waiter
reads where that stream ends before the job is enqueued (``mark``), then blocks (XREAD BLOCK)
on the entries after that id until an event of its job that ends it comes: ``done``,
``dead-lettered``, ``poison``, ``expired`` or ``cancelled`` (``ENDS``), or ``deduped`` (a queue's
dedupe window acknowledged it unrun, its job id done within the window: an end as good as
done, its result the earlier run's). An end that comes between the enqueue and the wait is read
all the same, and none from before it is taken for this job's.

"Its job" is this enqueue's, not another of the same job id (one still running, or enqueued
later): an event counts when it names the entry the enqueue added (``entry``), or carries it as
its ``origin`` (a retry's attempts, each a new entry, carry their first entry's id in the
field ``jobd_origin``; a timed job carries a token the producer gave it: ``job.ORIGIN``).

The events stream is capped (``history.events``, MAXLEN ~): a waiter that reads late may find
its job's end trimmed away. Whenever the stream's first entry is past where the waiter has read
(and after Redis came back), the job's history is read too (one HGET): an end record of its own
there ends the wait. A done job's result is read from its done record (one HGET). One key a
read: the same on a cluster (one slot) and through Sentinel; when Redis goes away (a failover)
the wait goes on from the last event read once it is back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import redis

from jobd.config import QueueConfig
from jobd.store import connection
from jobd.store.history import MAX_BLOCK_MS
from jobd.store.records import Record, parse_records, result_of
from jobd.store.store import Store

ENDS = frozenset({"done", "dead-lettered", "poison", "expired", "cancelled", "deduped", "lost"})
DONE = frozenset({"done", "deduped"})  # the ends a result comes with
SHOWN = ("event", "entry", "origin", "attempt", "error", "exit_code", "signal", "duration_ms")
COUNT = 1000  # events a read takes at most
OUTAGE_LIMIT = 60.0  # seconds Redis may stay away during a wait without a timeout


class WaitError(Exception):
    """The wait could not go on (Redis away for longer than OUTAGE_LIMIT)."""


class WaitRefused(WaitError):
    """Redis answered a read the wait needs with an error (someone else's key at the
    history's name, say): the job's end, or its result, cannot be read."""


class WaitTimeout(WaitError):
    """The job had not ended when the wait's time ran out (it goes on without the waiter)."""


class JobFailed(Exception):
    """The job ended, not done: dead-lettered (or poison), expired or cancelled (``ended``)."""

    def __init__(self, ended: Ended) -> None:
        error = ended.fields.get("error")
        why = f" (error: {error})" if error else ""
        super().__init__(f"job {ended.job_id!r} ended {ended.event}{why}")
        self.ended = ended


@dataclass(frozen=True, slots=True)
class Ended:
    """How a job ended: its event (one of ENDS), the event's fields (decoded as `jobd events`
    has them; when found in the history instead, its record's), and, when done (or deduped),
    its result (None: it gave none, or its record is not kept)."""

    job_id: str
    event: str
    fields: dict[str, str] = field(default_factory=dict)
    result: bytes | None = None

    @property
    def done(self) -> bool:
        return self.event in DONE


def mark(store: Store, queue: QueueConfig) -> str:
    """Where the queue's events end now ('0-0': none yet): a wait reads what comes after."""
    newest = store.events([queue], None, 1)
    return newest[-1].id if newest else "0-0"


@dataclass(slots=True)
class Pending:
    """A job enqueued to be waited for: ``wait`` returns its result, ``outcome`` how it ended.
    ``origin`` is the entry its enqueue added (or its token: see the module's docstring);
    ``after`` is where its queue's events ended before it was enqueued."""

    store: Store
    queue: QueueConfig
    job_id: str
    origin: str
    after: str
    own: bool = True  # the store is this object's: closed once the job ended
    ended: Ended | None = None  # once known

    def wait(self, timeout: float | None = None) -> bytes | None:
        """The job's result once it is done (None: it gave none); JobFailed when it ended
        otherwise, WaitTimeout after ``timeout`` seconds (None: as long as it takes)."""
        ended = self.outcome(timeout)
        if not ended.done:
            raise JobFailed(ended)
        return ended.result

    def outcome(self, timeout: float | None = None) -> Ended:
        """How the job ended; WaitTimeout after ``timeout`` seconds, WaitError when Redis
        stays away longer than OUTAGE_LIMIT, WaitRefused when it answers with an error."""
        if self.ended is not None:
            return self.ended
        try:
            self.ended = self._wait(timeout)
        except redis.ResponseError as exc:
            self._close()
            raise WaitRefused(f"cannot read the end of job {self.job_id!r}: {exc}") from exc
        self._close()
        return self.ended

    def _wait(self, timeout: float | None) -> Ended:
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = os.fsencode(self.job_id).decode("utf-8", "backslashreplace")  # as events have it
        away: float | None = None
        block: int | None = None  # the first read, and the first after an outage: at once
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"job {self.job_id!r} had not ended after {timeout:g}s")
            since = self.after
            try:
                events = self.store.events([self.queue], {self.queue.name: since}, COUNT, block)
                for event in events:
                    if event.fields.get("job") == wanted and self._ends(event.fields):
                        return self._ended(event.fields)
                    self.after = event.id  # only once handled: a failed read comes back to it
                # Checked after the read: nothing after ``since`` trimmed by now, none was
                # when it was read (a stream is trimmed from its start only).
                if self._trimmed(since) and (ended := self._recorded()):
                    return ended
            except connection.UNAVAILABLE as exc:
                away = away or time.monotonic()
                if deadline is None and time.monotonic() - away > OUTAGE_LIMIT:
                    raise WaitError(f"Redis away for more than {OUTAGE_LIMIT:g}s: {exc}") from exc
                time.sleep(0.5)
                self.store.refresh()
                block = None
                continue
            away = None
            left = None if deadline is None else deadline - time.monotonic()
            block = MAX_BLOCK_MS if left is None else max(1, min(MAX_BLOCK_MS, int(left * 1000)))

    def _ends(self, fields: dict[str, str]) -> bool:
        """Whether an event (or a record) of the job id is an end of this enqueue's job."""
        ours = (fields.get("origin") or fields.get("entry")) == self.origin
        return ours and fields.get("event") in ENDS

    def _trimmed(self, since: str) -> bool:
        """Whether events after ``since`` may have been trimmed away: the stream's first entry
        is past it, or it has none (ids are Redis's time: compared as numbers). Someone else's
        key there holds no events: as good as trimmed."""
        try:
            first = self.store.client.xrange(self.queue.keys.events, "-", "+", count=1)
        except redis.ResponseError:
            return True
        return not first or _id(first[0][0]) > _id(since)

    def _recorded(self) -> Ended | None:
        """The job's end as its history records it, when it has ended (the last such)."""
        ends = [fields for fields in map(_shown, self._records()) if self._ends(fields)]
        return self._ended(ends[-1]) if ends else None

    def _ended(self, fields: dict[str, str]) -> Ended:
        event = fields["event"]
        result = self._result(fields) if event in DONE else None
        return Ended(self.job_id, event, fields, result)

    def _result(self, fields: dict[str, str]) -> bytes | None:
        """The result its done record keeps; deduped, the latest done record's (the run the
        dedupe window found done)."""
        entry = fields.get("entry", "")
        done = [r for r in self._records() if r.event == "done"]
        if fields["event"] == "done":
            done = [r for r in done if r.entry in ("", entry)]
        return result_of(done[-1].raw) if done else None

    def _records(self) -> list[Record]:
        blob = self.store.client.hget(self.queue.keys.history, os.fsencode(self.job_id))
        return parse_records(blob if isinstance(blob, bytes) else None)[0]

    def _close(self) -> None:
        if self.own:
            self.store.close()


def _shown(record: Record) -> dict[str, str]:
    """A history record's fields as its event has them (text)."""
    return {name: str(record.raw[name]) for name in SHOWN if record.raw.get(name) is not None}


def _id(stream_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (stream_id.decode() if isinstance(stream_id, bytes) else stream_id).partition("-")
    return int(ms), int(seq or 0)
