"""Reading jobs: one thread per queue that takes free slots, then fills them: first with entries
whose lease lapsed (XAUTOCLAIM, min-idle = ``lease.reclaim_after``), then with new ones.

A reader never reads more than it has room for: it first takes the queue's free slots and the
read-ahead the loop allows (``prefetch``, ``slots``), then asks XREADGROUP for at most that
many, and gives back what it did not fill. The daemon's main loop gives a slot back when an
entry is settled. Reads stay off the main loop, so a Redis round trip never delays a spawn or a
reap.

An entry delivered more than ``max_deliveries`` times (poison) is never run: its dead letter
goes to the recorder like any outcome (not held meanwhile: see ``dead_letter``). Every Redis
call is the reader's own store's (``jobd.store.reading``, ``leases``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from jobd.config import QueueConfig, RedisConfig
from jobd.daemon import limits
from jobd.daemon.lease import Holdings
from jobd.daemon.slots import Slots
from jobd.job import Job
from jobd.outcome import POISON, Outcome, Verb
from jobd.store import connection as redisconn
from jobd.store.control import Paused
from jobd.store.keys import slot_member
from jobd.store.leases import key
from jobd.store.reading import Claimed, Entry, UnsupportedServer
from jobd.store.store import Store
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.reader")

RECLAIM_EVERY = 1.0  # seconds between reclaim passes at most (a quarter of reclaim_after if less)
# Seconds between two askings whether the queue is paused (`jobd pause`); no read blocks past
# the next one, so no job of a paused queue is read later than this after the pause.
PAUSE_POLL = 0.5


class Reader(threading.Thread):
    """Feeds one queue's free slots: first with entries whose lease lapsed, then new ones; on
    a queue with priority levels, from the highest non-empty level first."""

    def __init__(
        self,
        queue: QueueConfig,
        redis_config: RedisConfig,
        consumer: str,
        slots: Slots,
        holdings: Holdings,
        deliver: Callable[[QueueConfig, list[Job]], None],
        record: Callable[[list[Outcome]], None],
        metrics: Metrics,
    ) -> None:
        super().__init__(name=f"reader-{queue.name}", daemon=True)
        self.queue = queue
        self.consumer = consumer
        self.slots = slots
        self.holdings = holdings
        self.deliver = deliver
        self.record = record  # the recorder's inbox: poison entries' dead letters
        self.metrics = metrics
        self.store = Store.open(redis_config, f"reader-{queue.name}", consumer)
        self.limiter = limits.Limiter(self.store, queue) if limits.limited(queue) else None
        self.levels = queue.all_levels()
        self.taken: list[str] = []  # slots of the entries handed over in this read pass
        self.filled = 0  # local slots filled in this read pass
        self.stopping = threading.Event()
        self.ready = threading.Event()  # set once Redis answered and the group exists
        self.reclaim_every = min(RECLAIM_EVERY, queue.lease.reclaim_after / 4)
        self.next_reclaim = 0.0
        self.paused = False  # as last asked of Redis
        self.next_pause_check = 0.0
        self._group_ok = False
        self.outage = redisconn.Outage(log, f"queue={queue.name} ")

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            self._loop()
        finally:
            if self.limiter is not None and not self.outage.active:
                self.limiter.leave()  # no longer waiting
            self.store.close()
            self.deliver(self.queue, [])  # wakes the main loop, which waits for readers to end

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.read_once()
                self.outage.up()
            except redisconn.UNAVAILABLE as exc:
                self.store.refresh()
                self.stopping.wait(self.outage.down(exc, "retrying"))
            except redis.ResponseError as exc:
                if redisconn.away(exc):  # busy, out of memory: like an outage, for a while
                    self.stopping.wait(self.outage.down(exc, "retrying"))
                    continue
                if "NOGROUP" in str(exc) or "no longer exists" in str(exc):
                    log.warning("queue=%s group or stream vanished; recreating it", self.queue.name)
                elif "UNBLOCKED" in str(exc):  # a failover ended the blocking read
                    log.warning("queue=%s read interrupted (%s); again", self.queue.name, exc)
                else:
                    log.error("queue=%s read failed: %s", self.queue.name, exc)
                    self.stopping.wait(redisconn.BACKOFF_MAX)
                self._group_ok = False
            except UnsupportedServer as exc:
                log.error("queue=%s %s; checking again in a minute", self.queue.name, exc)
                self.stopping.wait(60)
            except Exception:
                log.exception("queue=%s reader failed; going on", self.queue.name)
                self.stopping.wait(redisconn.BACKOFF_MAX)

    def read_once(self) -> None:
        if not self._group_ok:
            self.store.check_server()
            for level in self.levels:
                if self.store.ensure_group(level):
                    log.info("queue=%s created group %r on stream %r",
                             level.name, level.group, level.stream)  # fmt: skip
                    if self.ready.is_set():
                        self.group_recreated(level)
            self._group_ok = True
            self.ready.set()
        if self.held_by_pause():
            return
        free = self.slots.take_all(timeout=0.5)
        if not free:
            return
        if self.stopping.is_set():
            self.slots.give(free)
            return
        self.filled = 0
        try:
            newest = self.fill(free)
        finally:
            # Whatever went wrong (Redis gone mid-acquire, mid-read, mid-bind), the local slots
            # not filled are given back: a slot kept by a failed pass is never read for again.
            self.slots.give(free - self.filled)
        if newest and self.filled == 0:
            self.wait_for_entries(newest)

    def fill(self, free: int) -> dict[str, str]:
        """Fill up to ``free`` local slots (``hand_over`` counts them in ``filled``); for a
        limited queue, returns each stream's newest id, to wait after when nothing was read."""
        granted = free
        if self.limiter is not None:
            granted, wait = self.limiter.acquire(free)
            if granted == 0:
                self.stopping.wait(wait)  # holding nothing meanwhile
                return {}
        self.taken = []
        newest: dict[str, str] = {}  # stream -> newest id, to wait after when nothing was read
        try:
            if self.until_reclaim() <= 0:
                self.next_reclaim = time.monotonic() + self.reclaim_every
                for level in self.levels:
                    self.reclaim(level, granted - self.filled)
            if self.filled < granted and len(self.levels) > 1:
                _, newest = self.read_levels(granted - self.filled)
            elif self.filled < granted:
                self.read_new(granted - self.filled, block=self.limiter is None)
        finally:
            if self.limiter is not None:
                newest = {self.queue.stream: self.limiter.bind(granted, self.taken)} | newest
        return newest

    def group_recreated(self, q: QueueConfig) -> None:
        """The group vanished while this daemon read from it (XGROUP DESTROY, or the stream
        deleted and added again) and was created again at the stream's start: every entry
        still in the stream, done or not, is delivered again. jobd cannot tell which ran (the
        group held that); at-least-once means running them again, so it says so loudly."""
        self.metrics.groups_recreated.labels(queue=q.name).inc()
        log.error(
            "queue=%s consumer group %r on stream %r vanished and was created again from the "
            "stream's start: its %d retained entries are delivered again, those already done "
            "included (deleting a group or its stream under a running daemon re-runs jobs)",
            q.name, q.group, q.stream, self.store.length(q.stream),
        )  # fmt: skip

    def until_reclaim(self) -> float:
        return max(0.0, self.next_reclaim - time.monotonic())

    def block_ms(self) -> int:
        until = min(self.until_reclaim(), self.next_pause_check - time.monotonic())
        return max(1, min(redisconn.BLOCK_MS, int(until * 1000)))

    def held_by_pause(self) -> bool:
        """While the queue is paused (``jobd pause``) read nothing and reclaim nothing, holding
        no slot: asked of Redis every PAUSE_POLL."""
        if time.monotonic() >= self.next_pause_check:
            self.learn_pause(self.store.paused(self.queue))
        if self.paused:
            self.stopping.wait(max(0.0, self.next_pause_check - time.monotonic()))
        return self.paused

    def learn_pause(self, paused: Paused | None) -> None:
        """The queue's pause as just read: asked again PAUSE_POLL from now."""
        if (paused is not None) != self.paused:
            what = f"paused by {paused.by}: reading nothing" if paused else "resumed"
            log.warning("queue=%s %s", self.queue.name, what)
            self.slots.paused = paused is not None
            self.deliver(self.queue, [])  # wakes the loop: it hands back what waits unstarted
        self.paused = self.slots.paused = paused is not None
        self.next_pause_check = time.monotonic() + PAUSE_POLL

    def read_new(self, count: int, block: bool = True) -> int:
        """XREADGROUP at most ``count`` new entries; blocks (with ``block``) until the next
        reclaim or pause check at most; the pause comes back with it (one round trip)."""
        q = self.queue
        read = self.store.read_new(q, count, self.block_ms() if block else None)
        if read.pause_known:
            self.learn_pause(read.paused)
        return self.hand_over(q, jobs_of(q, read.entries), read.cancels)

    def read_levels(self, count: int) -> tuple[int, dict[str, str]]:
        """At most ``count`` new entries, highest level first, in one script call (it never
        blocks); returns how many were handed over, and when none, each level's newest id."""
        read = self.store.read_levels(self.queue, count)
        used = sum(
            self.hand_over(level, jobs_of(level, entries), read.cancels)
            for level, entries in read.entries
        )
        return used, read.newest

    def wait_for_entries(self, newest: dict[str, str]) -> None:
        """Wait until a stream has an entry after its ``newest`` (or the next reclaim is due),
        holding no slot."""
        self.store.wait_for_entries(newest, self.block_ms())

    def reclaim(self, q: QueueConfig, count: int) -> int:
        """Take over up to ``count`` entries of ``q`` (the queue, or one of its levels) idle past
        ``reclaim_after``, following XAUTOCLAIM's cursor to its end; poison entries are
        dead-lettered, not run. Returns slots used."""
        if count <= 0:
            return 0
        cursor = "0-0"
        used = 0
        # Hand-backs Redis has not answered: a claim of one is the hand-back's too (reclaim.lua).
        backs = self.holdings.on_their_way_back(key(q))
        while used < count:
            page = self.store.reclaim(q, cursor, count - used, backs)
            cursor = page.cursor
            if backs:  # claimed now: whatever became of its hand-back, it is over
                self.holdings.handed_back(key(q), [c[0].decode() for c in page.claimed])
            used += self.take_over(q, page.claimed)
            for mid in page.deleted:
                log.warning(
                    "queue=%s entry %s was pending but its data is gone (trimmed or deleted); "
                    "dropped from the group",
                    q.name,
                    mid,
                )
            if cursor == "0-0":
                break
        return used

    def take_over(self, q: QueueConfig, claimed: list[Claimed]) -> int:
        """One page of entries this consumer just claimed: each is run, dead-lettered as poison,
        or (one of its own, still running) kept. Whatever fails on the way, what was claimed
        before is handed over (or recorded) and its own ones kept: a claim is a delivery, and
        one that reached no handler would count toward poison for nothing. Returns slots used."""
        held = set(self.holdings.snapshot(key(q))) if claimed else set()
        jobs: list[Job] = []
        poison: list[tuple[Job, int]] = []
        own: list[str] = []
        try:
            for raw_id, fields, deliveries in claimed:
                job = Job.from_entry(q.name, raw_id, fields)
                if job.message_id in held:
                    # Our own job, still running: its lease lapsed while Redis was away and this
                    # claim renewed it. It is not a new job, and not a delivery (keep.lua).
                    own.append(job.message_id)
                elif deliveries > q.max_deliveries:
                    poison.append((job, deliveries))
                else:
                    self.metrics.of(q.name).reclaimed.inc()
                    log.warning(
                        "queue=%s job=%s lease lapsed; taken over (delivery %d)",
                        q.name,
                        job.job_id,
                        deliveries,
                    )
                    jobs.append(job)
        finally:
            handed = self.hand_over(q, jobs)
            if own:
                self.store.keep(q, own)
            self.dead_letter(q, self.poison_outcomes(q, poison))
        return handed

    def poison_outcomes(self, q: QueueConfig, found: list[tuple[Job, int]]) -> list[Outcome]:
        """Dead letters of poison entries, but for those ``jobd cancel`` marked: a cancelled job
        is acked unrun as cancelled, never dead-lettered."""
        if found and self.store.has_cancels(q):
            left = {job.message_id for job in self.drop_cancelled(q, [job for job, _ in found])}
            found = [(job, n) for job, n in found if job.message_id in left]
        return [self.poisoned(q, job, n) for job, n in found]

    def poisoned(self, q: QueueConfig, job: Job, deliveries: int) -> Outcome:
        """The outcome of an entry delivered more than ``max_deliveries`` times: never run."""
        log.warning(
            "queue=%s job=%s delivered %d times with no outcome (max_deliveries %d): "
            "dead-lettering it as poison",
            q.name,
            job.job_id,
            deliveries,
            q.max_deliveries,
        )
        return Outcome(Verb.DEAD_LETTER, q, job, error=POISON, attempts=deliveries)

    def dead_letter(self, q: QueueConfig, outcomes: list[Outcome]) -> None:
        """Hand poison entries to the recorder, which counts and logs each once written. They
        are not held: a held entry's renewal would take it a cluster-wide slot (limits) it
        never acquired; one whose dead letter cannot be written is claimed again after
        reclaim_after, like before."""
        if outcomes:
            self.record(outcomes)

    def hand_over(self, q: QueueConfig, jobs: list[Job], cancels: bool | None = None) -> int:
        """Hold the jobs' leases from now on, and pass them to the main loop with ``q``, the
        queue or the level they were read from; returns how many (the slots they take). Jobs
        cancelled (``jobd cancel``) are acknowledged unrun first; ``cancels``: whether the queue
        has cancellation marks, when the read said (else asked when there are jobs)."""
        if jobs and (cancels if cancels is not None else self.store.has_cancels(q)):
            jobs = self.drop_cancelled(q, jobs)
        if jobs and q.dedupe_window is not None:
            try:
                jobs = self.drop_done(q, jobs)
            except redis.ResponseError as exc:  # never a reason to leave the batch unrun
                log.error("queue=%s dedupe check failed (%s); running the batch", q.name, exc)
        if jobs:
            offset = self.clock_offset(q, jobs)
            ids = [job.message_id for job in jobs]
            numbers = self.holdings.add(key(q), ids)
            jobs = [job.delivered(n, offset) for job, n in zip(jobs, numbers, strict=True)]
            if self.limiter is not None:
                self.taken += [slot_member(self.consumer, q.stream, mid) for mid in ids]
            self.deliver(q, jobs)
            self.filled += len(jobs)
        return len(jobs)

    def clock_offset(self, q: QueueConfig, jobs: list[Job]) -> float | None:
        """Redis's clock offset, for the jobs, when one of them can expire (its own
        jobd_expires_at, or the queue's max_wait): one TIME per read pass that needs it, none
        otherwise. Not measured (None: Redis did not answer), they are not expired: they run."""
        if not any(job.needs_clock(q) for job in jobs):
            return None
        try:
            return clock_offset(self.store.client)
        except redis.RedisError as exc:
            log.warning("queue=%s cannot read Redis's clock (%s): not checking expiry", q.name, exc)
            return None

    def drop_cancelled(self, q: QueueConfig, jobs: list[Job]) -> list[Job]:
        """Acknowledge, unrun, the jobs ``jobd cancel`` marked (one script call); the others.
        A check that fails (a marks key someone else wrote) runs the batch: never a wedge."""
        try:
            gone = self.store.cancelled(q, jobs)
        except redis.ResponseError as exc:
            log.error("queue=%s cancellation check failed (%s); running the batch", q.name, exc)
            return jobs
        for job in jobs:
            if job.message_id in gone:
                log.warning("%s cancelled (jobd cancel) before it started: acked unrun",
                            job.tag(q.name))  # fmt: skip
                self.metrics.cancelled.labels(queue=q.name).inc()
        return [job for job in jobs if job.message_id not in gone]

    def drop_done(self, q: QueueConfig, jobs: list[Job]) -> list[Job]:
        """Acknowledge, unrun, the jobs whose job id completed within the dedupe window (one
        script call for the batch); returns the others."""
        done = self.store.dedupe(q, jobs)
        for job in jobs:
            if job.message_id in done:
                log.info(
                    "%s already done within the dedupe window: acked, not run", job.tag(q.name)
                )
        return [job for job in jobs if job.message_id not in done]


def jobs_of(q: QueueConfig, entries: list[Entry]) -> list[Job]:
    """The jobs of entries read from ``q`` (the queue, or one of its levels)."""
    return [Job.from_entry(q.name, mid, fields) for mid, fields in entries]


def clock_offset(client: redis.Redis) -> float:
    """Redis's clock (TIME) minus this host's, seconds, to within half a round trip: what turns
    this host's time into Redis's, which stamped every entry's id (see policy.expired)."""
    before = time.time()
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6 - (before + time.time()) / 2
