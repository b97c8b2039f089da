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
  derive(S, "stats:M") counters of minute M (Unix time // 60 on Redis's clock: ``minute``), a
                       hash: done, failed, retried, dead, deduped, cancelled; kept STATS_TTL
                       seconds, so any host can read recent throughput
  derive(S, "job:J")   the mark of job id J (a string, with a TTL): "queued" from
                       `jobd enqueue --unique` until the job is done or dead-lettered (UNIQUE_TTL
                       past its due time, kept by its holder's renewals and past a retry's due
                       time: lua/keep_marks.lua), then "done" for the dedupe window if any
  derive(S, "tick:N:T") set once the tick at Unix second T of the queue's schedule N was
                       enqueued (see periodic.py); kept catch_up + 10 minutes
  derive(S, "schedule:N") the latest tick of schedule N enqueued (Unix second); no expiry
  derive(L, "trim")    retention's cursor for stream L (the queue's or a priority level's):
                       the id of the last entry trim.lua's step 2 looked at; kept an hour
  derive(S, "timings:M") histograms of minute M (as stats:M), a hash: "wait:I" / "run:I"
                       count the jobs whose enqueue-to-start / run time fell in bucket I of
                       figures.BUCKETS; kept STATS_TTL seconds
  derive(S, "running") limits.concurrency: sorted set of the slots held across all daemons,
                       scored by their lease's expiry (Unix ms); members are "CONSUMER|STREAM|ID"
                       for running entries, "wait:CONSUMER:N" for slots taken before a read
                       (see limits.py)
  derive(S, "rate")    limits.rate: the token bucket, a hash: tokens, at (Unix ms)
  derive(S, "waiting") consumers waiting for a slot or a token: a hash, consumer -> reason
  derive(S, "paused")  `jobd pause`: a hash, since (Redis ms) and by (user@host); while it
                       exists no reader of the queue reads (resume deletes it)
  derive(S, "cancels") `jobd cancel`: a sorted set of cancellation marks, "id:STREAM|ENTRY"
                       (an entry found pending or waiting on that stream, the queue's or a
                       level's: its handler is stopped, or it is acked unrun when read), scored
                       +inf: held until the entry is settled; and "job:JOB_ID" (a job of that id
                       read meanwhile is acked unrun), scored by when it expires (Redis ms)
  derive(S, "cancels:gen") `jobd cancel`'s generation: a string, Redis's time (µs) of the last
                       cancel that found a job pending; readers read it with the pause (one
                       round trip) and, when it changed, ask at once whether an entry their
                       daemon holds was cancelled
  derive(S, "history")  job history: a hash, job id -> its records, oldest first, one JSON object a
                       line (docs/concepts/history.md has the format), written by the script that
                       settles each attempt; at most HISTORY_BYTES a job (the oldest records go)
  derive(S, "history:at") a sorted set, job id -> Redis ms of its latest record: history's age
                       and length caps (history.max_age, history.maxlen) trim both keys by it
  derive(S, "active")   the jobs running now: a hash, job id -> "STREAM|ENTRY\n" and a JSON object
                       (consumer, host, pid, since, attempt, deadline); the settling script
                       deletes it (a stale one, of a daemon killed -9, is checked against XPENDING)
  derive(S, "events")   the queue's events: a stream of outcomes and operator actions (the audit
                       trail; docs/concepts/history.md), capped at about history.events entries
  derive(S, "outbox")   on a Redis Cluster, the follow-ups (JOBD_ENQUEUE) of the queue's jobs,
                       written with their parents' acks and moved on to their queues by the
                       daemons (store/outbox.py): a stream, one entry a follow-up; on any
                       Redis also the notices of jobs' ends to their waiters and batches, and
                       the seals of the enqueues into a batch (store/workflows.py)
  derive(S, "follow-up:Q|N|L:O|J") the mark of the Nth follow-up of job J (of enqueue O, L its
                       length) of queue Q, once moved into this queue: kept FOLLOW_UP_TTL
  derive(S, "waiters")  the jobs waiting for jobs of this queue (`enqueue --after`): a hash, a few
                       fields per waiter named from the job id waited for, one holding its JSON
                       line (store/workflows.py; lua/lib/workflows.lua add_waiter), read and
                       deleted by the script that ends the job (lib/workflows.lua ended); a
                       waiter whose hold ends unreleased takes its fields off (lua/unwait.lua,
                       through its outbox)
  derive(S, "held")    jobs of this queue waiting for others: a hash, job id -> cmsgpack {due,
                       delayed member id, fields…} (lua/hold.lua), until released or dead-lettered
  derive(S, "after")   what each held job waits for: a hash, job id -> JSON {deps, all, any,
                       timeout_ms}
  derive(S, "held:until") the held jobs that wait at most so long (--after-timeout, max_wait): a
                       sorted set, job id scored by its deadline (Redis ms), popped by the
                       outbox duty (lua/expire_held.lua)
  derive(S, "held:ended") the holds that ended (released into the stream, or dead-lettered
                       `dependency`): a sorted set, job id scored by when its entry goes (Redis
                       ms: the end plus history.max_age); hold.lua answers an --after enqueue of
                       such a job id "ended already" and holds nothing (lua/lib/workflows.lua
                       hold_ended); pruned by the scripts that add to it
  derive(S, "taken")   the running jobs a deleted entry would leave untold (workflow jobs: of a
                       batch, or waited for by a held job) or with a mark to free (--unique): a
                       hash, "STREAM|ENTRY" -> cmsgpack {job id, batch, incarnation[, 1:
                       --unique]}, written by the read that takes the entry
                       (lua/read_levels.lua, lua/reclaim.lua) and by lua/wait_on.lua; read by
                       the script that finds the entry deleted (lib/workflows.lua lost_end);
                       removed with its job's end (settle.lua, dead_letter.lua), and a record
                       whose entry is pending no more otherwise is swept by later writes
  derive(S, "follow-up:batch|I|ID") the mark of batch ID's callback job in this (its
                       --on-complete) queue, once added; I is the batch's incarnation (Redis's
                       time in µs when it was made: a batch of that id made again after it
                       expired has another): kept FOLLOW_UP_TTL, or the batch's own TTL when
                       longer, again at each look (lua/callback.lua)
  derive(S, "priority:L") the stream of priority level L (queues with `priorities`; the
                       default level's stream is S), with its own delayed set
                       derive(derive(S, "priority:L"), "delayed"); every other key is the queue's

Batches (`enqueue --batch ID`): each in a slot of its own, not a queue's (its members may be in
several queues); under ``{jobd:batch:ID}``, covered by the documented ACL user's ``~{jobd:*``:
  batch(ID)            a hash: state, open, total, done, failed, ttl, created, completed,
                       incarnation, on_complete, callback (lua/batch.lua); expires with the
                       history's max_age
  batch_members(ID)    a set of the members' ends counted, each by the outbox notice that told
                       it ("OUTBOX ENTRY_ID")
  batch_adders(ID)     a hash: each enqueue that added to the batch (its token) -> what its
                       calls did, so that a call sent again changes the batch once

The daemon registry: one per Redis database, not per queue (every daemon on that Redis is in it,
whatever its config), all in the slot of ``jobd:daemons``, so one script writes a daemon's beat
(and under the documented ACL user's key pattern ``~{jobd:*``):
  DAEMONS              a sorted set, consumer name -> its last beat (Redis ms)
  DAEMONS_SWEEP        a sorted set, consumer name -> when its entry goes (Redis ms)
  daemon_record(C)     daemon C's record: a hash (host, pid, version, queues, running, slots,
                       started, beat, ...: ``store.registry``), expiring when its entry goes
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

# Families of keys a queue derives one of per name (job id, schedule, minute, level):
# derive(S, FAMILY + name). ``QueueKeys.derived`` lists them for the config's collision checks.
JOB_MARK, TICK, SCHEDULE, TIMINGS, STATS, PRIORITY, FOLLOW_UP = (
    "job:", "tick:", "schedule:", "timings:", "stats:", "priority:", "follow-up:"
)  # fmt: skip
TRIM = "trim"
# What each key of ``QueueKeys`` holds, for saying which key two queues would share.
HOLDS = {
    "dead_letter": "dead-letter stream", "delayed": "delayed set",
    "running": "cluster-wide slots (limits.concurrency)", "rate": "rate bucket (limits.rate)",
    "waiting": "waiting consumers (limits)", "paused": "pause mark", "cancels": "cancel marks",
    "cancel_gen": "cancel generation",
    "history": "job history", "history_at": "history index", "active": "running-job records",
    "events": "events stream", "outbox": "follow-ups outbox",
    "waiters": "waiters (--after)", "held": "held jobs (--after)",
    "after": "held jobs' dependencies", "held_until": "held jobs' deadlines",
    "held_ended": "ended holds (--after)", "taken": "taken workflow entries",
}  # fmt: skip
STATS_TTL = 2 * 3600  # seconds a minute's counters are kept
UNIQUE_TTL = 7 * 86400  # seconds a --unique job's "queued" mark lasts if its job is lost
HISTORY_BYTES = 65536  # bytes of records the history keeps a job (lua/lib/jobs.lua's remember)
# How long a follow-up's mark says it was moved out of an outbox (seconds): a move of it again (a
# mover that died between the move and the outbox's XDEL, two movers at once) within this
# time adds nothing (lua/follow_up.lua).
FOLLOW_UP_TTL = UNIQUE_TTL


def minute(redis_seconds: float) -> int:
    """The minute that names a queue's figures (``QueueKeys.stats``, ``timings``) at a time of
    Redis's clock (Unix seconds): never of the writing host's, whose clock may be minutes off
    (its counts would land where no chart looks); every host writes and reads the same minute."""
    return int(redis_seconds // 60)


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
    cancel_gen: str
    history: str
    history_at: str
    active: str
    events: str
    outbox: str
    waiters: str
    held: str
    after: str
    held_until: str
    held_ended: str
    taken: str

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
            cancel_gen=derive(stream, "cancels:gen"),
            history=derive(stream, "history"),
            history_at=derive(stream, "history:at"),
            active=derive(stream, "active"),
            events=derive(stream, "events"),
            outbox=derive(stream, "outbox"),
            waiters=derive(stream, "waiters"),
            held=derive(stream, "held"),
            after=derive(stream, "after"),
            held_until=derive(stream, "held:until"),
            held_ended=derive(stream, "held:ended"),
            taken=derive(stream, "taken"),
        )

    def level(self, name: str) -> QueueKeys:
        """The keys of priority level ``name``: its stream is ``{S}:priority:NAME``."""
        stream = derive(self.base, f"{PRIORITY}{name}")
        return replace(self, stream=stream, delayed=derive(stream, "delayed"))

    def at(self, stream: str) -> QueueKeys:
        """The keys of this queue's level whose stream is ``stream`` (the queue's own stream:
        these keys). Everything but the stream and the delayed set stays the queue's: a job
        mark, above all, is the queue's whichever level holds the job."""
        if stream == self.stream:
            return self
        return replace(self, stream=stream, delayed=derive(stream, "delayed"))

    def trim_cursor(self) -> str:
        """Where retention (trim.lua) keeps its walk over this stream's acknowledged entries
        behind pending ones."""
        return derive(self.stream, TRIM)

    def job_mark(self, job_id: str | bytes) -> bytes:
        """The dedupe / uniqueness mark of a producer's job id. Bytes: a job id is any bytes
        a producer wrote (a ``str`` here is ``os.fsdecode``'d and goes back exactly)."""
        return derive(self.base, JOB_MARK).encode() + os.fsencode(job_id)

    def follow_up(self, queue: str, job_id: str, origin: str, n: int | str) -> bytes:
        """The mark of the ``n``th follow-up of job ``job_id`` (of enqueue ``origin``) of queue
        ``queue``, in this (its target) queue's slot: set by the move that enqueues it, so
        that no second move does (lua/follow_up.lua). The job id last: any bytes. ``n`` is
        ``then.N`` for a ``then:`` step's, ``dead`` for an ``on_dead_letter`` job's."""
        head = f"{self.follow_up_head(queue, n)}{len(origin)}:{origin}|"
        return head.encode() + os.fsencode(job_id)

    def follow_up_head(self, queue: str, n: int | str) -> str:
        """``follow_up``'s mark up to its origin: a held job's on_dead_letter job's mark is
        ended in lua/lib/chains.lua (held_hook), the origin its hold's delayed member id."""
        return f"{derive(self.base, FOLLOW_UP)}{queue}|{n}|"

    def callback_mark(self, batch: str, incarnation: str) -> str:
        """The mark of batch ``batch``'s callback job in this (its --on-complete) queue; the
        batch's ``incarnation`` (lua/batch.lua: a batch of the same id made after this one
        expired has another) before its id, which may hold a ``|``."""
        return f"{derive(self.base, FOLLOW_UP)}batch|{incarnation}|{batch}"

    def tick(self, schedule: str, at: int) -> str:
        """The key of a periodic schedule's tick at Unix second ``at``."""
        return derive(self.base, f"{TICK}{schedule}:{at}")

    def schedule_last(self, schedule: str) -> str:
        """The key holding the latest tick a periodic schedule enqueued."""
        return derive(self.base, f"{SCHEDULE}{schedule}")

    def timings(self, minute: int) -> str:
        """The histograms of a minute (see ``minute``): enqueue-to-start and run times
        (figures.py)."""
        return derive(self.base, f"{TIMINGS}{minute}")

    def stats(self, minute: int) -> str:
        """The counters of a minute (see ``minute``)."""
        return derive(self.base, f"{STATS}{minute}")

    def derived(self, levels: Iterable[str] = ()) -> Derived:
        """Every key the queue derives from its stream (all but the stream and the dead-letter
        stream), with what it holds; ``levels``: its priority levels but the default one
        (which reads the queue's stream). What another queue must not use as a stream."""
        exact = {
            getattr(self, f.name): f"the {HOLDS[f.name]}"
            for f in fields(self)
            if f.name not in ("stream", "base", "dead_letter")  # every other field: in HOLDS
        }
        exact[self.trim_cursor()] = "the retention cursor"
        for name in levels:
            level = self.level(name)
            exact[level.stream] = f"the stream of priority level {name!r}"
            exact[level.delayed] = f"the delayed set of priority level {name!r}"
            exact[level.trim_cursor()] = f"the retention cursor of priority level {name!r}"
        families = {
            derive(self.base, JOB_MARK): "a job mark (--unique, dedupe)",
            derive(self.base, TICK): "a schedule's tick mark",
            derive(self.base, SCHEDULE): "a schedule's last tick",
            derive(self.base, TIMINGS): "a minute's timings",
            derive(self.base, STATS): "a minute's counters",
            derive(self.base, FOLLOW_UP): "a follow-up's mark (workflows)",
        }
        return Derived(exact, families)


@dataclass(frozen=True)
class Derived:
    """The keys a queue derives: ``exact`` keys, and ``families`` of keys (one per job id,
    schedule or minute) by the prefix they share; each with what it holds."""

    exact: dict[str, str]
    families: dict[str, str]

    def holds(self, key: str) -> str | None:
        """What ``key`` is among these (None: none of them)."""
        if key in self.exact:
            return self.exact[key]
        return next((what for p, what in self.families.items() if key.startswith(p)), None)


def batch(batch_id: str) -> str:
    """The hash of batch ``batch_id`` (its own slot: ``{jobd:batch:ID}``)."""
    return f"{{jobd:batch:{batch_id}}}"


def batch_members(batch_id: str) -> str:
    return f"{batch(batch_id)}:members"


def batch_adders(batch_id: str) -> str:
    return f"{batch(batch_id)}:adders"


DAEMONS = "{jobd:daemons}"
DAEMONS_SWEEP = "{jobd:daemons}:sweep"
DAEMON_RECORD = "{jobd:daemons}:daemon:"


def daemon_record(consumer: str | bytes) -> bytes:
    """The key of a daemon's record in the registry (bytes: a member another client wrote
    into the registry may be any bytes)."""
    return DAEMON_RECORD.encode() + os.fsencode(consumer)


def slot_member(consumer: str, stream: str, message_id: str) -> str:
    """A running entry's member of ``derive(S, "running")``: its holder's, so a lost lease's
    release frees nothing of the entry's new holder (who binds a slot of its own); with the
    stream, since two priority levels' streams can hold the same id. renew.lua builds the same
    string."""
    return f"{consumer}|{stream}|{message_id}"


def flatten(fields: dict[bytes, bytes]) -> list[bytes]:
    """A job's fields as a script's name, value, … arguments."""
    return [x for item in fields.items() for x in item]
