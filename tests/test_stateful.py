"""A stateful model of one queue worked by two or three consumers, checked against a real Redis.

A hypothesis RuleBasedStateMachine drives jobd's own code paths, no mocks: Reader.read_new and
Reader.reclaim (reclaim.lua, poison handed to the recorder, keep.lua), Renewal.tick
(renew.lua), Recorder.write (settle.lua ack/back, retry.lua, dead_letter.lua in one batch),
Forwarder.tick (promote.lua) and dlq.requeue (requeue.lua). Rules interleave at random; the
model says where every job is and who holds what, and after every step it is compared with
Redis: the stream (undelivered region and pending list), the delayed set, the dead-letter
stream.

What the model promises (the invariants):
- every job is in exactly one place (undelivered, pending with one owner, delayed due or later,
  dead-lettered) or is done and has no trace left anywhere; a done job never comes back;
- a job is done (acknowledged) at most once; two consumers run the same job at once only after
  a reclaim took its entry from a consumer still running it (a lapsed lease, recorded);
- an outcome (ack, hand-back, retry, dead letter) written by a consumer that does not own the
  entry changes nothing and is answered 'not held' with the owner now;
- delivery counts: a read counts 1, a claim one more, a renewal or keep.lua none, a hand-back
  one less, so the claim after a hand-back sees no more than the count before it;
- a batch of outcomes sent again (its reply lost with a connection) does no harm (scripts.Batch):
  checked for acks, retries, dead letters and hand-backs of entries no one took since. A
  hand-back sent again after its entry was taken again would hand back the new run (the last
  test, xfail): the recorder never sends a hand-back again after a connection failed.

Rules: enqueue (XADD with a job_id); read (XREADGROUP, 1 to 3); lapse (an entry's lease lapses:
XCLAIM to its owner with IDLE 1 h, JUSTID); reclaim (min-idle reclaim_after, or 0: every lease
lapsed at once); renew; finish (a consumer records ack / back / retry due now or in an hour /
dead letter for some entries it holds, one batch); forged (an outcome from a consumer that does
not hold the entry); resend (the last batch again); promote; time_passes (retries due later
become due); requeue (a dead-letter record); requeue_again (a record requeued already); crash
(a consumer forgets what it holds); restart (hands everything back, then forgets);
redis_forgets_scripts (SCRIPT FLUSH).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from jobd import dlq
from jobd.config import Config, load
from jobd.daemon import lease
from jobd.daemon.delayed import Forwarder
from jobd.daemon.lease import Holdings, Renewal
from jobd.daemon.reader import Reader
from jobd.daemon.recorder import Recorder
from jobd.daemon.slots import Slots
from jobd.job import Job
from jobd.outcome import EXIT, Outcome, Verb
from jobd.store import connection as redisconn
from jobd.store.store import Store
from jobd.web.metrics import Metrics

MAX_DELIVERIES = 2  # low, so that poison is reached in a few steps
MAX_JOBS = 8  # jobs per example: few, so that they meet often
NAMES = ("c0", "c1", "c2")
LATER_MS = 3_600_000  # a retry due "later": an hour from now (time_passes makes it due)
IDLE_MS = 3_600_000  # how idle a lapsed lease looks (reclaim_after is 60 s)
# Where a job is.
UNDELIVERED, PENDING, DUE, LATER, DEAD, DONE = (
    "undelivered", "pending", "due", "later", "dead", "done",
)  # fmt: skip
KINDS = ("ack", "back", "retry_now", "retry_later", "dead")


def sid(mid: str) -> tuple[int, int]:
    ms, seq = mid.split("-")
    return int(ms), int(seq)


def text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


@dataclass
class Entry:
    """A pending entry, as the model sees it."""

    jid: str
    owner: str  # the consumer Redis says owns it
    count: int  # its delivery count
    idle: bool = False  # idle past reclaim_after (a lapse, or a hand-back)
    back_count: int | None = None  # its count just before a hand-back, until the next claim


@dataclass
class Where:
    place: str
    mid: str | None = None  # UNDELIVERED / PENDING: its entry
    rid: str | None = None  # DEAD: its record


class SpyRecorder(Recorder):
    """The daemon's recorder, whose replies the test reads (it only logs them)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.replies: list[tuple[list[Outcome], list[tuple[str, str]]]] = []

    def _report(self, outcomes: list[Outcome], not_held: list[tuple[str, str]]) -> None:
        self.replies.append((outcomes, not_held))
        super()._report(outcomes, not_held)


class Consumer:
    """One daemon's consumer on the queue: its reader, recorder and the leases it holds. A
    crash is a new Consumer with the same name (jobd's names are stable)."""

    def __init__(self, m: JobdMachine, name: str) -> None:
        self.name = name
        self.holdings = Holdings()
        self.handed: list[Job] = []  # jobs the reader handed over in the current step
        self.jobs: dict[str, Job] = {}  # message id -> the job it runs
        self.reader = Reader(
            m.q, m.redis_config, name, Slots(100), self.holdings, self._deliver, self._record,
            m.metrics,
        )  # fmt: skip
        self.recorder = SpyRecorder(m.redis_config, name, self.holdings)
        self.store = Store(m.r, name)
        for part in (self.reader, self.recorder):  # one connection for the whole machine
            part.store.close()
            part.store = self.store

    def _deliver(self, _q: object, jobs: list[Job]) -> None:
        self.handed += jobs
        for job in jobs:
            self.jobs[job.message_id] = job

    def _record(self, outcomes: list[Outcome]) -> None:
        """The reader's poison outcomes, written at once through this consumer's recorder."""
        assert self.recorder.write(outcomes) == [], "outcomes failed to write"


class JobdMachine(RuleBasedStateMachine):
    config: Config  # loaded once a test (``use``): each example runs on the same

    @classmethod
    def use(cls, config_path: str) -> None:
        cls.config = load(config_path)

    def __init__(self) -> None:
        super().__init__()
        config = self.config
        self.q = config.queues["q"]
        self.redis_config = config.redis
        self.r = redisconn.client(config.redis, "jobd-stateful")  # the daemon's own options
        self.r.flushall()
        self.store = Store(self.r)
        self.store.ensure_group(self.q)
        self.metrics = Metrics()
        self.names = list(NAMES)
        self.cons = {name: Consumer(self, name) for name in self.names}
        self.jobs: dict[str, Where] = {}
        self.entries: dict[str, Entry] = {}  # the pending list
        self.held: dict[str, set[str]] = {name: set() for name in self.names}
        self.lapsed: set[str] = set()  # jobs a reclaim took from a consumer still running them
        self.acks: Counter[str] = Counter()
        self.seen = "0-0"  # the newest stream id the model knows
        self.ran: dict[str, Job] = {}  # every entry ever handed to a consumer
        self.requeued: list[str] = []  # dead-letter records already requeued
        self.last_batch: tuple[str, list[Outcome]] | None = None
        self.flushes = 0

    def teardown(self) -> None:
        self.r.close()

    # -- helpers --------------------------------------------------------------------------

    def con(self, c: int) -> Consumer:
        return self.cons[self.names[c % len(self.names)]]

    def now_ms(self) -> int:
        sec, usec = self.r.time()
        return sec * 1000 + usec // 1000

    def new_entries(self) -> list[tuple[str, str]]:
        """(id, job id) of the stream entries added since the model last looked."""
        rows = self.r.xrange(self.q.stream, f"({self.seen}", "+")
        new = [(text(mid), Job.from_entry("q", mid, f).job_id) for mid, f in rows]
        if new:
            self.seen = new[-1][0]
        return new

    def snapshot(self) -> tuple:
        """Everything of the queue in Redis but idle times and counters, in one round trip."""
        return self.snapshot_at()[0]

    def snapshot_at(self) -> tuple[tuple, int]:
        """``snapshot``, and Redis's clock as it was read (the same round trip)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.xrange(self.q.stream)
        pipe.xpending_range(self.q.stream, self.q.group, "-", "+", 10_000)
        pipe.zrange(self.q.keys.delayed, 0, -1, withscores=True)
        pipe.xrange(self.q.dead_letter.stream)
        pipe.xinfo_groups(self.q.stream)
        pipe.time()
        stream, pel, delayed, records, groups, (sec, usec) = pipe.execute()
        return (
            stream,
            [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pel],
            delayed,
            records,
            groups[0]["last-delivered-id"],
        ), sec * 1000 + usec // 1000

    def record_id(self, jid: str, mid: str) -> str:
        rows = [
            text(rid)
            for rid, f in self.r.xrange(self.q.dead_letter.stream)
            if f.get(b"jobd_job_id") == jid.encode() and f.get(b"jobd_original_id") == mid.encode()
        ]
        assert len(rows) == 1, (jid, mid, rows)
        return rows[0]

    def write(self, con: Consumer, outcomes: list[Outcome]) -> dict[str, str]:
        """Write through the consumer's recorder; returns what the scripts refused."""
        con.recorder.replies = []
        again = con.recorder.write(outcomes)
        assert again == [], f"outcomes failed to write: {again}"
        refused: dict[str, str] = {}
        for _sent, not_held in con.recorder.replies:
            refused |= dict(not_held)
        return refused

    def outcome(self, con: Consumer, mid: str, kind: str) -> Outcome:
        job = con.jobs.get(mid) or self.ran[mid]
        if kind == "ack":
            return Outcome(Verb.ACK, self.q, job)
        if kind == "back":
            return Outcome(Verb.HAND_BACK, self.q, job)
        if kind == "dead":
            return Outcome(
                Verb.DEAD_LETTER, self.q, job, error=EXIT, attempts=job.attempt, exit_code=1
            )
        delay = 0 if kind == "retry_now" else LATER_MS  # retry.lua adds it to Redis's TIME
        return Outcome(Verb.RETRY, self.q, job, delay=delay / 1000)

    def settle(self, con: Consumer, picks: list[tuple[str, str]]) -> None:
        """The consumer records these outcomes of entries it holds, in one batch."""
        outcomes = [self.outcome(con, mid, kind) for mid, kind in picks]
        expected = {
            mid: self.entries[mid].owner if mid in self.entries else ""
            for mid, _ in picks
            if not (mid in self.entries and self.entries[mid].owner == con.name)
        }
        refused = self.write(con, outcomes)
        assert refused == expected, "'not held' must list exactly the entries owned elsewhere"
        for mid, kind in picks:
            self.held[con.name].discard(mid)
            con.jobs.pop(mid, None)
            if mid in expected:
                continue
            e = self.entries[mid]
            if kind == "back":
                e.back_count, e.count, e.idle = e.count, max(e.count - 1, 0), True
                continue
            del self.entries[mid]
            if kind == "ack":
                self.jobs[e.jid] = Where(DONE)
                self.acks[e.jid] += 1
            elif kind == "dead":
                self.jobs[e.jid] = Where(DEAD, rid=self.record_id(e.jid, mid))
            else:
                self.jobs[e.jid] = Where(DUE if kind == "retry_now" else LATER)
        self.last_batch = (con.name, outcomes)

    # -- rules ----------------------------------------------------------------------------

    @initialize(n=st.sampled_from([2, 3]))
    def consumers(self, n: int) -> None:
        self.names = list(NAMES[:n])

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule()
    def enqueue(self) -> None:
        jid = f"j{len(self.jobs)}"
        mid = text(self.r.xadd(self.q.stream, {"payload": jid, "job_id": jid}))
        assert self.new_entries() == [(mid, jid)]
        self.jobs[jid] = Where(UNDELIVERED, mid=mid)

    @precondition(lambda self: any(w.place == UNDELIVERED for w in self.jobs.values()))
    @rule(c=st.integers(0, 2), count=st.integers(1, 3))
    def read(self, c: int, count: int) -> None:
        con = self.con(c)
        waiting = [w.mid for w in self.jobs.values() if w.place == UNDELIVERED]
        expected = sorted(waiting, key=sid)[:count]  # type: ignore[arg-type]
        con.handed = []
        con.reader.read_new(count, block=False)
        assert [j.message_id for j in con.handed] == expected
        for job in con.handed:
            mid = job.message_id
            self.ran[mid] = job
            self.entries[mid] = Entry(job.job_id, con.name, 1)
            self.jobs[job.job_id] = Where(PENDING, mid=mid)
            self.held[con.name].add(mid)

    @precondition(lambda self: any(not e.idle for e in self.entries.values()))
    @rule(data=st.data())
    def lapse(self, data: st.DataObject) -> None:
        """Time passes and an entry's lease lapses (its owner did not renew: crashed, stalled,
        or cut off from Redis). The owner stays the same, the count too (JUSTID). An entry idle
        already (lapsed, or handed back: idle since 1970) is left as it is."""
        busy = [mid for mid, e in self.entries.items() if not e.idle]
        mid = data.draw(st.sampled_from(sorted(busy, key=sid)))
        e = self.entries[mid]
        self.r.xclaim(self.q.stream, self.q.group, e.owner, 0, [mid], idle=IDLE_MS, justid=True)
        e.idle = True
        if self.last_batch is not None:  # the time passed for the batch kept to send again too
            outcomes = self.last_batch[1]
            outcomes[:] = [o if o.sent_at is None else replace(o, sent_at=o.sent_at - IDLE_MS / 1000)
                           for o in outcomes]  # fmt: skip

    @precondition(lambda self: self.entries)
    @rule(c=st.integers(0, 2), idle_only=st.booleans())
    def reclaim(self, c: int, idle_only: bool) -> None:
        """The reader's reclaim pass: min-idle reclaim_after (entries that lapsed or were
        handed back), or min-idle 0 (every lease lapsed at once). Poison is dead-lettered,
        the consumer's own running entries are kept (keep.lua)."""
        con = self.con(c)
        q = self.q if idle_only else replace(self.q, lease=replace(self.q.lease, reclaim_after=0))
        eligible = sorted((m for m, e in self.entries.items() if e.idle or not idle_only), key=sid)
        con.handed = []
        con.reader.reclaim(q, 100)
        runs, poisoned, backs = [], [], {}
        for mid in eligible:
            e = self.entries[mid]
            if any(mid in self.held[d] for d in self.names if d != con.name):
                self.lapsed.add(e.jid)  # taken from a consumer still running it
            e.idle = False
            if mid in self.held[con.name]:  # its own job, still running: not a delivery
                e.owner, e.count, e.back_count = con.name, max(e.count, 1), None
                continue
            if e.back_count is not None:
                backs[mid] = e.back_count
            e.count += 1
            e.back_count = None
            if e.count > MAX_DELIVERIES:
                poisoned.append(mid)
                del self.entries[mid]
                self.jobs[e.jid] = Where(DEAD, rid=self.record_id(e.jid, mid))
            else:
                e.owner = con.name
                runs.append(mid)
                self.held[con.name].add(mid)
                self.jobs[e.jid] = Where(PENDING, mid=mid)
        assert [j.message_id for j in con.handed] == runs
        for job in con.handed:
            self.ran[job.message_id] = job
        pel = {
            text(p["message_id"]): p["times_delivered"]
            for p in self.r.xpending_range(self.q.stream, self.q.group, "-", "+", 10_000)
        }
        for mid, before in backs.items():
            # The hand-back fix: the claim after a hand-back sees no more than the count
            # before it (the hand-back ended a delivery with an outcome).
            if mid in pel:
                assert pel[mid] <= before, (
                    f"{mid}: {pel[mid]} deliveries after a hand-back at {before}"
                )

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in self.names if self.held[n]]))
        con = self.cons[name]
        lost: list[lease.Lost] = []
        Renewal(con.store, self.q, con.holdings, lost.extend).tick()
        expected = {
            mid: self.entries[mid].owner if mid in self.entries else ""
            for mid in self.held[name]
            if not (mid in self.entries and self.entries[mid].owner == name)
        }
        assert {x.message_id: x.owner for x in lost} == expected
        self.held[name] -= set(expected)
        for mid in expected:
            con.jobs.pop(mid, None)
        for mid in self.held[name]:
            self.entries[mid].idle = False

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), reply_lost=st.booleans())
    def finish(self, data: st.DataObject, reply_lost: bool) -> None:
        """A consumer's handlers end: it records their outcomes in one batch (an entry it lost
        meanwhile to a reclaim is answered 'not held'); reply_lost: the batch is sent again
        at once (resend)."""
        name = data.draw(st.sampled_from([n for n in self.names if self.held[n]]))
        mids = data.draw(
            st.lists(st.sampled_from(sorted(self.held[name], key=sid)), min_size=1, unique=True)
        )
        picks = [(mid, data.draw(st.sampled_from(KINDS))) for mid in mids]
        self.settle(self.cons[name], picks)
        if reply_lost:
            self.resend()

    @precondition(lambda self: self.ran)
    @rule(c=st.integers(0, 2), data=st.data(), kind=st.sampled_from(KINDS))
    def forged(self, c: int, data: st.DataObject, kind: str) -> None:
        """An outcome from a consumer that does not own the entry (and does not hold it):
        answered 'not held', nothing changes."""
        con = self.con(c)
        others = [
            mid
            for mid in sorted(self.ran, key=sid)
            if mid not in self.held[con.name]
            and not (mid in self.entries and self.entries[mid].owner == con.name)
        ]
        if not others:
            return
        mid = data.draw(st.sampled_from(others))
        before = self.snapshot()
        owner = self.entries[mid].owner if mid in self.entries else ""
        refused = self.write(con, [self.outcome(con, mid, kind)])
        assert refused == {mid: owner}
        assert self.snapshot() == before, "an outcome that was not held changed Redis"

    @precondition(lambda self: self.last_batch is not None)
    @rule()
    def resend(self) -> None:
        """The last batch is sent again, as after a connection lost with its reply (the
        recorder keeps a batch until Redis answers; redis-py may re-send too). scripts.Batch:
        'a batch sent again after a lost connection does no harm'."""
        assert self.last_batch is not None
        name, outcomes = self.last_batch
        before = self.snapshot()
        self.write(self.cons[name], outcomes)
        assert self.snapshot() == before, "a batch sent again changed Redis"

    @precondition(lambda self: any(w.place == DUE for w in self.jobs.values()))
    @rule()
    def promote(self) -> None:
        due = sorted(jid for jid, w in self.jobs.items() if w.place == DUE)
        moved = Forwarder(self.store, self.q).tick()
        assert moved == len(due)
        new = self.new_entries()
        assert sorted(jid for _, jid in new) == due
        for mid, jid in new:
            self.jobs[jid] = Where(UNDELIVERED, mid=mid)

    @precondition(lambda self: any(w.place == LATER for w in self.jobs.values()))
    @rule()
    def time_passes(self) -> None:
        """The clock passes every retry's due time (their scores move to now)."""
        now = self.now_ms()
        later = self.r.zrangebyscore(self.q.keys.delayed, f"({now}", "+inf")
        self.r.zadd(self.q.keys.delayed, dict.fromkeys(later, now - 1), xx=True)
        for w in self.jobs.values():
            if w.place == LATER:
                w.place = DUE

    @precondition(lambda self: any(w.place == DEAD for w in self.jobs.values()))
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(sorted(j for j, w in self.jobs.items() if w.place == DEAD)))
        rid = self.jobs[jid].rid
        assert rid is not None
        assert dlq.requeue(self.store, self.q, [rid], "t@h") == [rid]
        new = self.new_entries()
        assert [j for _, j in new] == [jid]
        self.jobs[jid] = Where(UNDELIVERED, mid=new[0][0])
        self.requeued.append(rid)

    @precondition(lambda self: self.requeued)
    @rule(data=st.data())
    def requeue_again(self, data: st.DataObject) -> None:
        """A record requeued already (an operator's second `jobd dlq requeue`): nothing."""
        rid = data.draw(st.sampled_from(self.requeued))
        before = self.snapshot()
        assert dlq.requeue(self.store, self.q, [rid], "t@h") == []
        assert self.snapshot() == before

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A daemon dies: it forgets everything it held (its entries stay pending in Redis,
        owned by its name, until they lapse and are reclaimed)."""
        self.forget(data.draw(st.sampled_from([n for n in self.names if self.held[n]])))

    def forget(self, name: str) -> None:
        self.cons[name] = Consumer(self, name)
        self.held[name] = set()
        if self.last_batch and self.last_batch[0] == name:
            self.last_batch = None  # its recorder's backlog died with it

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        """A graceful restart: every job held is handed back, then a new daemon starts."""
        name = data.draw(st.sampled_from([n for n in self.names if self.held[n]]))
        self.settle(self.cons[name], [(mid, "back") for mid in sorted(self.held[name], key=sid)])
        self.forget(name)

    @precondition(lambda self: self.flushes < 2)
    @rule()
    def redis_forgets_scripts(self) -> None:
        """SCRIPT FLUSH, as after a restart or failover: every path must load them again."""
        self.r.script_flush()
        self.flushes += 1

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def every_job_is_in_exactly_one_place(self) -> None:
        (stream, pel, members, records, last), now = self.snapshot_at()
        last_id = sid(text(last))
        owners = {text(mid): (text(owner), count) for mid, owner, count in pel}
        # The pending list, as the model has it: every entry with its owner and count.
        assert owners == {mid: (e.owner, e.count) for mid, e in self.entries.items()}
        places: dict[str, list[tuple[str, str | None]]] = {}

        def at(jid: str, where: tuple[str, str | None]) -> None:
            places.setdefault(jid, []).append(where)

        for raw, fields in stream:
            mid = text(raw)
            jid = Job.from_entry("q", raw, fields).job_id
            if sid(mid) > last_id:
                at(jid, (UNDELIVERED, mid))
            elif mid in owners:
                at(jid, (PENDING, mid))
        for w in self.store.delayed_list(self.q):
            assert not w.malformed, w
            at(text(w.fields[b"jobd_job_id"]), (DUE if w.due_ms <= now else LATER, None))
        assert len(members) == sum(w.place in (DUE, LATER) for w in self.jobs.values())
        for rid, fields in records:
            at(text(fields[b"jobd_job_id"]), (DEAD, text(rid)))
        assert set(places) <= set(self.jobs), "a job the model never saw"
        for jid, w in self.jobs.items():
            if w.place == DONE:
                assert jid not in places, f"{jid} was done, and is back: {places[jid]}"
            else:
                key = w.mid if w.place in (UNDELIVERED, PENDING) else w.rid
                assert places.get(jid) == [(w.place, key)], f"{jid}: {places.get(jid)} vs {w}"

    @invariant()
    def holdings_match(self) -> None:
        for name in self.names:
            held = set(self.cons[name].holdings.snapshot(lease.key(self.q)))
            assert held == self.held[name], name

    @invariant()
    def nothing_done_or_run_twice(self) -> None:
        assert all(n <= 1 for n in self.acks.values()), self.acks
        running: Counter[str] = Counter()
        for name in self.names:
            for mid in self.held[name]:
                jid = self.ran[mid].job_id
                running[jid] += 1
                owned = mid in self.entries and self.entries[mid].owner == name
                assert owned or jid in self.lapsed, f"{name} holds {mid} of {jid}, owned elsewhere"
        assert all(n == 1 or jid in self.lapsed for jid, n in running.items()), running


SETTINGS = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


@pytest.fixture
def config_path(tmp_path: Path, redis_server) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"redis: {{url: '{redis_server.url}'}}\n"
        "queues:\n"
        "  q:\n"
        "    command: [/bin/true]\n"
        f"    max_deliveries: {MAX_DELIVERIES}\n"
        "    lease: {renew_every: 10s, reclaim_after: 60s}\n"
    )
    return str(path)


# 15 000 steps against a real Redis: 35 s alone on the 2-core machine, up to three times that
# under the suite's 4 workers; the default 120 s cut it off inside a draw (FlakyStrategyDefinition)
@pytest.mark.timeout(300)
def test_queue_state_machine(config_path: str) -> None:
    JobdMachine.use(config_path)
    run_state_machine_as_test(JobdMachine, settings=SETTINGS)


def test_a_hand_back_sent_again_does_not_hand_back_the_next_run(config_path: str) -> None:
    """The shortest sequence the machine found when it sent hand-backs again: c0 hands a job back
    (graceful stop; the reply is lost with the connection), c0's reader takes it again at once
    (a hand-back makes it reclaimable by anyone, c0 included) and runs it, then the recorder
    sends the hand-back again. It used to hand back the run in progress, with one delivery
    less: any reader then took the job while c0 still ran it (two runs, no lease lapsed), and
    c0's holdings dropped it (no more renewals); so the recorder sent no hand-back again, and
    one lost with its connection counted toward poison. Sent again, a hand-back now says how
    long ago it was first sent, and settle.lua leaves an entry delivered since alone."""
    JobdMachine.use(config_path)
    m = JobdMachine()
    try:
        m.consumers(n=2)
        m.enqueue()
        m.read(c=0, count=1)
        (mid,) = m.held["c0"]
        m.settle(m.cons["c0"], [(mid, "back")])
        assert m.last_batch is not None
        batch = m.last_batch[1]
        m.reclaim(c=0, idle_only=True)  # c0 takes it again: a new run
        assert m.held["c0"] == {mid}
        m.write(m.cons["c0"], batch)  # the same hand-back, sent again
        (p,) = m.r.xpending_range(m.q.stream, m.q.group, "-", "+", 10)
        assert p["time_since_delivered"] < 60_000, "the run in progress was handed back"
        assert p["times_delivered"] == 1
        assert set(m.cons["c0"].holdings.snapshot(lease.key(m.q))) == {mid}
    finally:
        m.teardown()
