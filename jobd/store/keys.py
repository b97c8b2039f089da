"""Every Redis key of a queue, derived in one place.

A queue's keys all hash to the Redis Cluster slot of its stream, so one Lua script can touch
them all: a key's slot is the hash of its first non-empty ``{...}`` when it has one, else of
the whole key. ``derive("media:thumbs", "dead")`` is ``{media:thumbs}:dead`` (slot of
``media:thumbs``); a stream that already carries a hash tag keeps it: ``{media}:thumbs`` →
``{media}:thumbs:dead``.

Layout of a queue whose stream is S:
  S                    the stream producers XADD jobs to; the consumer group lives on it
  derive(S, "dead")    the dead-letter stream (unless the config names another)
  derive(S, "delayed") sorted set of jobs waiting for a later time (retries, delayed enqueue),
                       scored by due time in Unix ms; members are cmsgpack arrays
                       {unique id, field, value, …} (see lua/retry.lua)
  derive(S, "stats:M") counters of minute M (Unix time // 60), a hash: done, failed, retried,
                       dead, deduped; kept STATS_TTL seconds, so any host can read recent
                       throughput
  derive(S, "job:J")   the mark of job id J (a string, with a TTL): "queued" from
                       `jobd enqueue --unique` until the job is done or dead-lettered (at most
                       UNIQUE_TTL), then "done" for the queue's dedupe window when it has one
  derive(S, "tick:N:T") set once the tick at Unix second T of the queue's schedule N was
                       enqueued (see periodic.py); kept catch_up + 10 minutes
  derive(S, "schedule:N") the latest tick of schedule N enqueued (Unix second); no expiry
  derive(L, "trim")    retention's cursor for stream L (the queue's or a priority level's):
                       the id of the last entry trim.lua's step 2 looked at; kept an hour
  derive(S, "timings:M") histograms of minute M, a hash: "wait:I" / "run:I" count the jobs
                       whose enqueue-to-start / run time fell in bucket I of figures.BUCKETS;
                       kept STATS_TTL seconds
  derive(S, "running") limits.concurrency: sorted set of the slots held across all daemons,
                       scored by their lease's expiry (Unix ms); members are "CONSUMER|STREAM|ID"
                       for running entries, "wait:CONSUMER:N" for slots taken before a read
                       (see limits.py)
  derive(S, "rate")    limits.rate: the token bucket, a hash: tokens, at (Unix ms)
  derive(S, "waiting") consumers waiting for a slot or a token: a hash, consumer -> reason
  derive(S, "paused")  `jobd pause`: a hash, since (Redis ms) and by (user@host); while it
                       exists no reader of the queue reads (resume deletes it)
  derive(S, "cancels") `jobd cancel`: a sorted set of cancellation marks, "id:STREAM|ENTRY"
                       (an entry found pending on that stream, the queue's or a level's: its
                       handler is stopped at its next lease renewal) and "job:JOB_ID" (acked
                       unrun when read), scored by when the mark expires (Redis ms)
  derive(S, "history")  job history: a hash, job id -> its records, oldest first, one JSON object a
                       line (docs/history.md has the format), written by the script that settles
                       each attempt; at most HISTORY_BYTES a job (the oldest records go)
  derive(S, "history:at") a sorted set, job id -> Redis ms of its latest record: history's age
                       and length caps (history.max_age, history.maxlen) trim both keys by it
  derive(S, "active")   the jobs running now: a hash, job id -> "STREAM|ENTRY\n" and a JSON object
                       (consumer, host, pid, since, attempt, deadline); the settling script
                       deletes it (a stale one, of a daemon killed -9, is checked against XPENDING)
  derive(S, "events")   the queue's events: a stream of outcomes and operator actions (the audit
                       trail; docs/history.md), capped at about history.events entries
  derive(S, "priority:L") the stream of priority level L (queues with `priorities`; the
                       default level's stream is S), with its own delayed set
                       derive(derive(S, "priority:L"), "delayed"); every other key is the queue's
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

STATS_TTL = 2 * 3600  # seconds a minute's counters are kept
UNIQUE_TTL = 7 * 86400  # seconds a --unique job's "queued" mark lasts if its job is lost
HISTORY_BYTES = 65536  # bytes of records the history keeps a job (lua/lib/jobs.lua's remember)


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes when it is not the whole key."""
    start = key.find("{")
    if start == -1:
        return None
    end = key.find("}", start + 1)
    if end == -1 or end == start + 1:
        return None
    return key[start + 1 : end]


def can_derive(stream: str) -> bool:
    """Whether ``derive`` keeps ``stream``'s slot: not for a stream with a ``}`` but no hash tag
    (``a}b``: ``{a}b}:dead`` would hash ``a``); such a stream needs a hash tag on a cluster."""
    return hash_tag(stream) is not None or (stream != "" and "}" not in stream)


def derive(stream: str, suffix: str) -> str:
    """A key in the same cluster slot as ``stream``, named after it (see ``can_derive``)."""
    if hash_tag(stream) is not None:
        return f"{stream}:{suffix}"
    return f"{{{stream}}}:{suffix}"


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue, or of one priority level of it (``level``): a level has its own
    stream and delayed set, and shares everything else with its queue."""

    stream: str
    base: str  # the queue's stream, from which the shared keys are derived
    dead_letter: str
    delayed: str
    running: str
    rate: str
    waiting: str
    paused: str
    cancels: str
    history: str
    history_at: str
    active: str
    events: str

    @classmethod
    def of(cls, stream: str, dead_letter: str | None = None) -> QueueKeys:
        return cls(
            stream=stream,
            base=stream,
            dead_letter=dead_letter or derive(stream, "dead"),
            delayed=derive(stream, "delayed"),
            running=derive(stream, "running"),
            rate=derive(stream, "rate"),
            waiting=derive(stream, "waiting"),
            paused=derive(stream, "paused"),
            cancels=derive(stream, "cancels"),
            history=derive(stream, "history"),
            history_at=derive(stream, "history:at"),
            active=derive(stream, "active"),
            events=derive(stream, "events"),
        )

    def level(self, name: str) -> QueueKeys:
        """The keys of priority level ``name``: its stream is ``{S}:priority:NAME``."""
        stream = derive(self.base, f"priority:{name}")
        return replace(self, stream=stream, delayed=derive(stream, "delayed"))

    def trim_cursor(self) -> str:
        """Where retention (trim.lua) keeps its walk over this stream's acknowledged entries
        behind pending ones."""
        return derive(self.stream, "trim")

    def job_mark(self, job_id: str | bytes) -> bytes:
        """The dedupe / uniqueness mark of a producer's job id. Bytes: a job id is any bytes
        a producer wrote (a ``str`` here is ``os.fsdecode``'d and goes back exactly)."""
        return derive(self.base, "job:").encode() + os.fsencode(job_id)

    def tick(self, schedule: str, at: int) -> str:
        """The key of a periodic schedule's tick at Unix second ``at``."""
        return derive(self.base, f"tick:{schedule}:{at}")

    def schedule_last(self, schedule: str) -> str:
        """The key holding the latest tick a periodic schedule enqueued."""
        return derive(self.base, f"schedule:{schedule}")

    def timings(self, minute: int | None = None) -> str:
        """The histograms of minute ``minute``: enqueue-to-start and run times (figures.py)."""
        if minute is None:
            minute = int(time.time() // 60)
        return derive(self.base, f"timings:{minute}")

    def stats(self, minute: int | None = None) -> str:
        """The counters of ``minute`` (Unix time // 60; default: now)."""
        if minute is None:
            minute = int(time.time() // 60)
        return derive(self.base, f"stats:{minute}")


def slot_member(consumer: str, stream: str, message_id: str) -> str:
    """A running entry's member of ``derive(S, "running")``: its holder's, so a lost lease's
    release frees nothing of the entry's new holder (who binds a slot of its own); with the
    stream, since two priority levels' streams can hold the same id. renew.lua builds the same
    string."""
    return f"{consumer}|{stream}|{message_id}"


def flatten(fields: dict[bytes, bytes]) -> list[bytes]:
    """A job's fields as a script's name, value, … arguments."""
    return [x for item in fields.items() for x in item]
