"""Reading jobs: one thread per queue that takes free slots, then fills them: first with entries
whose lease lapsed (XAUTOCLAIM, min-idle = ``lease.reclaim_after``), then with new ones.

A reader never reads more than it has room for: it first takes the queue's free slots and the
read-ahead the loop allows (``prefetch``, ``slots``), then asks XREADGROUP for at most that
many, and gives back what it did not fill. The daemon's main loop gives a slot back when an
entry is settled. Reads stay off the main loop, so a Redis round trip never delays a spawn or a
reap.

Twice a second a reader asks whether its queue is paused and whether `jobd cancel` reached a job
its daemon holds (``controls.ControlPoll``).

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
from jobd.daemon.controls import PAUSE_POLL as PAUSE_POLL  # where tests and callers ask
from jobd.daemon.controls import ControlPoll
from jobd.daemon.groups import Groups
from jobd.daemon.lease import Holdings, lease_clock, marks_of
from jobd.daemon.screening import Screening
from jobd.daemon.slots import Slots
from jobd.job import Job
from jobd.logs import word
from jobd.outcome import POISON, Outcome, Verb
from jobd.store import connection as redisconn
from jobd.store.keys import slot_member
from jobd.store.leases import LeaseKey, Lost, key
from jobd.store.reading import Claimed, Entry, UnsupportedServer
from jobd.store.store import Store
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.reader")

RECLAIM_EVERY = 1.0  # seconds between reclaim passes at most (a quarter of reclaim_after if less)


class Reader(ControlPoll, Screening, Groups, threading.Thread):
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
        report: Callable[[list[Lost]], None] | None = None,
        earlier: frozenset[LeaseKey] = frozenset(),
    ) -> None:
        super().__init__(name=f"reader-{queue.name}", daemon=True)
        self.queue = queue
        self.consumer = consumer
        self.slots = slots
        self.holdings = holdings
        self.deliver = deliver
        self.record = record  # the recorder's inbox: poison entries' dead letters
        self.report = report  # the loop's inbox of leases lost: entries found cancelled
        self.metrics = metrics
        self.store = Store.open(redis_config, f"reader-{queue.name}", consumer)
        # ``earlier``: where the queue was read before a reload moved it (``limits.Limiter``)
        self.limiter = limits.limiter(self.store, queue, holdings, earlier)
        self.levels = queue.all_levels()  # the levels read: all, but those set aside
        self.aside: set[str] = set()  # streams of levels set aside: someone else's key there
        self.next_aside_check = 0.0
        self._checked = False  # whether this pass checked the groups (a WRONGTYPE is no level's)
        self.taken: list[str] = []  # slots of the entries handed over in this read pass
        self.filled = 0  # local slots filled in this read pass
        self.stopping = threading.Event()
        self.ready = threading.Event()  # set once Redis answered and the group exists
        self.reclaim_every = min(RECLAIM_EVERY, queue.lease.reclaim_after / 4)
        self.next_reclaim = 0.0
        self.paused = False  # as last asked of Redis
        self.next_pause_check = 0.0
        self.cancel_gen: bytes | None = None  # the queue's cancel generation, as last acted on
        self._group_ok = False
        self.migrating = False  # whether its cluster slot was found migrating (note_migration)
        self.outage = redisconn.Outage(log, f"queue={queue.name} ")

    def stop(self) -> None:
        """Stop at once: a wait for new entries under way is cut (it holds nothing: XREAD),
        anything else this thread is doing is let end."""
        self.stopping.set()
        self.store.bell.cut()

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
                self.note_migration()
                self.outage.up()
                self._checked = False
            except redisconn.UNAVAILABLE as exc:
                if self.stopping.is_set():
                    break  # its wait cut by ``stop``, or Redis away as it stops: nothing to say
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
                elif "WRONGTYPE" in str(exc) and not self._checked:
                    pass  # someone else's key at a level's name: the groups' check sets it aside
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
        if not self._group_ok or (self.aside and time.monotonic() >= self.next_aside_check):
            self.check_groups()
        if self.held_by_pause():
            return
        if self.limiter is not None:
            self.limiter.keep_earlier()  # even while every local slot is taken
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
            if granted == 0:  # holding nothing meanwhile; the pause and cancel poll goes on
                self.stopping.wait(min(wait, max(0.0, self.next_pause_check - time.monotonic())))
                return {}
        self.taken = []
        newest: dict[str, str] = {}  # stream -> newest id, to wait after when nothing was read
        try:
            if self.until_reclaim() <= 0:
                self.next_reclaim = time.monotonic() + self.reclaim_every
                self.reclaim_levels(granted)
            if self.filled < granted and len(self.queue.all_levels()) > 1:
                _, newest = self.read_levels(granted - self.filled)
            elif self.filled < granted:
                self.read_new(granted - self.filled, block=self.limiter is None)
        finally:
            if self.limiter is not None:
                newest = {self.queue.stream: self.limiter.bind(granted, self.taken)} | newest
        return newest

    def reclaim_levels(self, granted: int) -> None:
        """A reclaim pass over every level; none while the queue's cluster slot migrates (until a
        read is served in one step again): its keys may be on two nodes then, and Redis refuses
        reclaim.lua, a script of several, until the migration ends (TRYAGAIN). Entries whose
        lease lapsed wait until then."""
        if self.store.migrating(self.queue.stream):
            return
        try:
            for level in self.levels:
                self.reclaim(level, granted - self.filled)
        except redisconn.UNAVAILABLE as exc:
            if not redisconn.migrating(exc):
                raise
            self.store.found_migrating(self.queue.stream)

    def note_migration(self) -> None:
        """Log when the queue's cluster slot is found migrating, and when it no longer is."""
        now = self.store.migrating(self.queue.stream)
        if now != self.migrating:
            what = "migrating: reading key by key" if now else "stable again: reading as before"
            log.info("queue=%s its cluster slot is %s", self.queue.name, what)
            self.migrating = now

    def until_reclaim(self) -> float:
        return max(0.0, self.next_reclaim - time.monotonic())

    def block_ms(self) -> int:
        until = min(self.until_reclaim(), self.next_pause_check - time.monotonic())
        return max(1, min(redisconn.BLOCK_MS, int(until * 1000)))

    def read_new(self, count: int, block: bool = True) -> int:
        """XREADGROUP at most ``count`` new entries; blocks (with ``block``) until the next
        reclaim or pause check at most; the pause comes back with it (one round trip)."""
        q = self.queue
        sent = lease_clock()
        read = self.store.read_new(q, count, self.block_ms() if block else None)
        if read.pause_known:
            self.learn_pause(read.paused)
        self.learn_cancels(read.cancel_gen)
        return self.hand_over(q, jobs_of(q, read.entries), sent, read.cancels)

    def read_levels(self, count: int) -> tuple[int, dict[str, str]]:
        """At most ``count`` new entries, highest level first, in one script call (it never
        blocks); returns how many were handed over, and when none, each level's newest id."""
        sent = lease_clock()
        read = self.store.read_levels(self.queue, count, self.levels)
        used = sum(
            self.hand_over(level, jobs_of(level, entries), sent, read.cancels)
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
            sent = lease_clock()
            page = self.store.reclaim(q, cursor, count - used, backs)
            cursor = page.cursor
            if backs:  # claimed now: whatever became of its hand-back, it is over
                self.holdings.handed_back(key(q), [c[0].decode() for c in page.claimed])
            used += self.take_over(q, page.claimed, sent)
            for mid in page.deleted:
                log.warning(
                    "queue=%s entry %s was pending but its data is gone (trimmed or deleted); "
                    "dropped from the group, its job's end recorded as lost",
                    q.name,
                    mid,
                )
            self.store.free_lost_marks(q, page.unfreed)  # --unique ones' job ids: free again
            if cursor == "0-0":
                break
        return used

    def take_over(self, q: QueueConfig, claimed: list[Claimed], sent: float) -> int:
        """One page of entries this consumer just claimed (by a call sent at ``sent``, on
        ``lease_clock``): each is run, dead-lettered as poison, or (one of its own, still
        running) kept. Whatever fails on the way, what was claimed before is handed over (or
        recorded) and its own ones kept: a claim is a delivery, and one that reached no handler
        would count toward poison for nothing. Returns slots used."""
        held = set(self.holdings.snapshot(key(q))) if claimed else set()
        jobs: list[Job] = []
        poison: list[tuple[Job, int]] = []
        own: list[Job] = []
        try:
            for raw_id, fields, deliveries, back in claimed:
                job = Job.from_entry(q.name, raw_id, fields)
                if job.message_id in held:
                    # Our own job, still running: its lease lapsed while Redis was away and this
                    # claim renewed it. It is not a new job, and not a delivery (keep.lua).
                    own.append(job)
                elif deliveries > q.max_deliveries:
                    poison.append((job, deliveries))
                elif back:  # handed back unstarted (by any daemon): nothing went wrong
                    log.info("queue=%s job=%s handed back earlier; picked up again (delivery %d)",
                             q.name, word(job.job_id), deliveries)  # fmt: skip
                    jobs.append(job)
                else:
                    self.metrics.of(q.name).reclaimed.inc()
                    log.warning(
                        "queue=%s job=%s lease lapsed; taken over (delivery %d)",
                        q.name,
                        word(job.job_id),
                        deliveries,
                    )
                    jobs.append(job)
        finally:
            handed = self.hand_over(q, jobs, sent)
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
            word(job.job_id),
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

    def hand_over(
        self, q: QueueConfig, jobs: list[Job], sent: float, cancels: bool | None = None
    ) -> int:
        """Hold the jobs' leases from now on, and pass them to the main loop with ``q``, the
        queue or the level they were read from; returns how many (the slots they take).
        ``sent``: when the read or claim that delivered them was sent (``lease_clock``), their
        leases' first confirmation (``lease``: no handler starts once it is too old). Jobs
        cancelled (``jobd cancel``) are acknowledged unrun first; ``cancels``: whether the queue
        has cancellation marks, when the read said (else asked when there are jobs)."""
        if jobs and cancels is not False:

            def drop(q: QueueConfig, jobs: list[Job]) -> list[Job]:
                if cancels is None and not self.store.has_cancels(q):
                    return jobs  # no mark at all (most reads): no script call
                return self.drop_cancelled(q, jobs)

            jobs = self.checked(q, jobs, sent, "cancellation", drop)
        if jobs and q.dedupe_window is not None:
            jobs = self.checked(q, jobs, sent, "dedupe", self.drop_done)
        if jobs:
            offset = self.clock_offset(q, jobs)
            ids = [job.message_id for job in jobs]
            numbers = self.holdings.add(
                key(q), ids, sent, marks_of(q, jobs), {job.message_id: job.job_id for job in jobs}
            )
            jobs = [job.delivered(n, offset) for job, n in zip(jobs, numbers, strict=True)]
            if self.limiter is not None:
                self.taken += [slot_member(self.consumer, q.stream, mid) for mid in ids]
            self.deliver(q, jobs)
            self.filled += len(jobs)
        return len(jobs)

    def clock_offset(self, q: QueueConfig, jobs: list[Job]) -> float | None:
        """Redis's clock offset, for the jobs: when one of them can expire (its own
        jobd_expires_at, or the queue's max_wait), measured now (one TIME per read pass that
        needs it); else the store's kept one (a TIME a minute at most), which times their wait
        (figures). Not measured (None: Redis did not answer), they are not expired: they run."""
        if not any(job.needs_clock(q) for job in jobs):
            return self.store.clock.offset(q.stream)
        try:
            return clock_offset(self.store.client)
        except redis.RedisError as exc:
            log.warning("queue=%s cannot read Redis's clock (%s): not checking expiry", q.name, exc)
            return None


def jobs_of(q: QueueConfig, entries: list[Entry]) -> list[Job]:
    """The jobs of entries read from ``q`` (the queue, or one of its levels)."""
    return [Job.from_entry(q.name, mid, fields) for mid, fields in entries]


def clock_offset(client: redis.Redis) -> float:
    """Redis's clock (TIME) minus this host's, seconds, to within half a round trip: what turns
    this host's time into Redis's, which stamped every entry's id (see policy.expired)."""
    before = time.time()
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6 - (before + time.time()) / 2
