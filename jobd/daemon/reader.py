"""Reading jobs: one thread per queue that takes free slots, then fills them: first with entries
whose lease lapsed (XAUTOCLAIM, min-idle = ``lease.reclaim_after``), then with new ones.

A reader never holds an entry it cannot start: it first takes the queue's free slots, then
asks XREADGROUP for at most that many, and gives back the slots it did not fill. The daemon's
main loop gives a slot back when a handler ends. Reads stay off the main loop, so a Redis
round trip never delays a spawn or a reap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from jobd.config import QueueConfig, RedisConfig
from jobd.daemon import lease, limits
from jobd.daemon.lease import Holdings
from jobd.job import Job
from jobd.store import connection as redisconn
from jobd.store import dead_letter
from jobd.store.keys import STATS_TTL
from jobd.store.scripts import Scripts
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.reader")

RECLAIM_EVERY = 1.0  # seconds between reclaim passes at most (a quarter of reclaim_after if less)


class Slots:
    """A queue's free handler slots, shared by its reader and the main loop."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = total
        self._cond = threading.Condition()

    def resize(self, total: int) -> None:
        """A reload changed the concurrency. Free slots may go below zero for a while: handlers
        already running finish, and only then is a new one started."""
        with self._cond:
            self._free += total - self.total
            self.total = total
            self._cond.notify()

    def take_all(self, timeout: float) -> int:
        """Wait up to ``timeout`` for a free slot; take every free slot and return how many."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free > 0, timeout):
                return 0
            taken, self._free = self._free, 0
            return taken

    def give(self, n: int = 1) -> None:
        if n:
            with self._cond:
                self._free += n
                self._cond.notify()


def ensure_group(client: redis.Redis, queue: QueueConfig) -> bool:
    """Create the queue's consumer group (and stream) when missing; from the stream's start,
    so jobs added before the first daemon ran are not skipped. True when it was created."""
    try:
        client.xgroup_create(queue.stream, queue.group, id="0", mkstream=True)
        log.info("queue=%s created group %r on stream %r", queue.name, queue.group, queue.stream)
        return True
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
        return False


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
        metrics: Metrics,
    ) -> None:
        super().__init__(name=f"reader-{queue.name}", daemon=True)
        self.queue = queue
        self.consumer = consumer
        self.slots = slots
        self.holdings = holdings
        self.deliver = deliver
        self.metrics = metrics
        self.client = redisconn.client(redis_config, f"jobd-reader-{queue.name}")
        self.scripts = Scripts(self.client)
        self.limiter = (
            limits.Limiter(self.scripts, queue, consumer) if limits.limited(queue) else None
        )
        self.levels = queue.all_levels()
        self.taken: list[str] = []  # slots of the entries handed over in this read pass
        self.filled = 0  # local slots filled in this read pass
        self.stopping = threading.Event()
        self.ready = threading.Event()  # set once Redis answered and the group exists
        self.reclaim_every = min(RECLAIM_EVERY, queue.lease.reclaim_after / 4)
        self.next_reclaim = 0.0
        self._group_ok = False
        self.outage = redisconn.Outage(log, f"queue={queue.name} ")

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            self._loop()
        finally:
            if self.limiter is not None and not self.outage.active:
                limits.leave(self.client, self.queue, self.consumer)  # no longer waiting
            self.client.close()
            self.deliver(self.queue, [])  # wakes the main loop, which waits for readers to end

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.read_once()
                self.outage.up()
            except redisconn.UNAVAILABLE as exc:
                redisconn.refresh(self.client)
                self.stopping.wait(self.outage.down(exc, "retrying"))
            except redis.ResponseError as exc:
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
            check_server(self.client)
            for level in self.levels:
                if ensure_group(self.client, level) and self.ready.is_set():
                    self.group_recreated(level)
            self._group_ok = True
            self.ready.set()
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

    def fill(self, free: int) -> dict[str, bytes]:
        """Fill up to ``free`` local slots (``hand_over`` counts them in ``filled``); for a
        limited queue, returns each stream's newest id, to wait after when nothing was read."""
        granted = free
        if self.limiter is not None:
            granted, wait = self.limiter.acquire(free)
            if granted == 0:
                self.stopping.wait(wait)  # holding nothing meanwhile
                return {}
        self.taken = []
        newest: dict[str, bytes] = {}  # stream -> newest id, to wait after when nothing was read
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
            q.name, q.group, q.stream, self.client.xlen(q.stream),
        )  # fmt: skip

    def until_reclaim(self) -> float:
        return max(0.0, self.next_reclaim - time.monotonic())

    def block_ms(self) -> int:
        return max(1, min(redisconn.BLOCK_MS, int(self.until_reclaim() * 1000)))

    def read_new(self, count: int, block: bool = True) -> int:
        """XREADGROUP at most ``count`` new entries; blocks (with ``block``) until the next
        reclaim at most."""
        reply = self.client.xreadgroup(
            self.queue.group,
            self.consumer,
            {self.queue.stream: ">"},
            count=count,
            block=self.block_ms() if block else None,
        )
        entries = reply[0][1] if reply else []
        return self.hand_over(
            self.queue, [Job.from_entry(self.queue.name, mid, fields) for mid, fields in entries]
        )

    def read_levels(self, count: int) -> tuple[int, dict[str, bytes]]:
        """At most ``count`` new entries, highest level first, in one script call (it never
        blocks); returns how many were handed over, and when none, each level's newest id."""
        after_ms = int((self.queue.starvation_after or 0) * 1000)
        entries, newest = self.scripts.read_levels(
            keys=[level.stream for level in self.levels],
            args=[self.queue.group, self.consumer, count, 0, after_ms],  # 0: aging on Redis's clock
        )
        used = 0
        for index, level in enumerate(self.levels, start=1):
            jobs = [
                Job.from_entry(level.name, mid, dict(zip(flat[::2], flat[1::2], strict=True)))
                for i, mid, flat in entries
                if i == index
            ]
            used += self.hand_over(level, jobs)
        return used, {level.stream: mid for level, mid in zip(self.levels, newest, strict=False)}

    def wait_for_entries(self, newest: dict[str, bytes]) -> None:
        """Wait until a stream has an entry after its ``newest`` (or the next reclaim is due),
        holding no slot; XREAD reads without consuming anything."""
        self.client.xread(newest, count=1, block=self.block_ms())  # type: ignore[arg-type]

    def reclaim(self, q: QueueConfig, count: int) -> int:
        """Take over up to ``count`` entries of ``q`` (the queue, or one of its levels) idle past
        ``reclaim_after``, following XAUTOCLAIM's cursor to its end; poison entries are
        dead-lettered, not run. Returns slots used."""
        if count <= 0:
            return 0
        min_idle = int(q.lease.reclaim_after * 1000)
        cursor: bytes | str = "0-0"
        used = 0
        while used < count:
            cursor, claimed, deleted = self.scripts.reclaim(
                keys=[q.stream], args=[q.group, self.consumer, min_idle, cursor, count - used]
            )
            used += self.take_over(q, claimed)
            for raw_id in deleted:
                log.warning(
                    "queue=%s entry %s was pending but its data is gone (trimmed or deleted); "
                    "dropped from the group",
                    q.name,
                    raw_id.decode(),
                )
            if cursor == b"0-0":
                break
        return used

    def take_over(self, q: QueueConfig, claimed: list) -> int:
        """One page of entries this consumer just claimed: each is run, dead-lettered as poison,
        or (one of its own, still running) kept. Whatever fails on the way, what was claimed
        before is handed over and its own ones kept: a claim is a delivery, and one that
        reached no handler would count toward poison for nothing. Returns slots used."""
        held = set(self.holdings.snapshot(lease.key(q))) if claimed else set()
        jobs: list[Job] = []
        own: list[str] = []
        try:
            for raw_id, flat, deliveries in claimed:
                job = Job.from_entry(q.name, raw_id, dict(zip(flat[::2], flat[1::2], strict=True)))
                if job.message_id in held:
                    # Our own job, still running: its lease lapsed while Redis was away and this
                    # claim renewed it. It is not a new job, and not a delivery (keep.lua).
                    own.append(job.message_id)
                elif deliveries > q.max_deliveries:
                    self.dead_letter_poison(q, job, deliveries)
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
                self.scripts.keep(keys=[q.stream], args=[q.group, self.consumer, *own])
        return handed

    def dead_letter_poison(self, q: QueueConfig, job: Job, deliveries: int) -> None:
        failure = dead_letter.Failure(dead_letter.POISON, attempts=deliveries)
        mark = job.mark_key(q.keys, q.dedupe_window is not None)
        try:
            written = dead_letter.write(
                self.scripts, q, self.consumer, job.job_id, job.message_id, failure, mark
            )
        except redisconn.UNAVAILABLE:
            raise
        except Exception as exc:  # one entry never stops the reading of its queue
            log.error(
                "queue=%s job=%s delivered %d times with no outcome, but its dead letter "
                "cannot be written: %s; left pending, not run, tried again after "
                "lease.reclaim_after",
                q.name, job.job_id, deliveries, exc,
            )  # fmt: skip
            return
        if written:
            self.metrics.dead_lettered.labels(queue=q.name, error=dead_letter.POISON).inc()
            log.error(
                "queue=%s job=%s delivered %d times with no outcome (max_deliveries %d): "
                "dead-lettered as poison",
                q.name,
                job.job_id,
                deliveries,
                q.max_deliveries,
            )

    def hand_over(self, q: QueueConfig, jobs: list[Job]) -> int:
        """Hold the jobs' leases from now on, and pass them to the main loop with ``q``, the
        queue or the level they were read from; returns how many (the slots they take)."""
        if jobs and q.dedupe_window is not None:
            try:
                jobs = self.drop_done(q, jobs)
            except redis.ResponseError as exc:  # never a reason to leave the batch unrun
                log.error("queue=%s dedupe check failed (%s); running the batch", q.name, exc)
        if jobs:
            ids = [job.message_id for job in jobs]
            self.holdings.add(lease.key(q), ids)
            if self.limiter is not None:
                self.taken += [limits.slot_member(self.consumer, q.stream, mid) for mid in ids]
            self.deliver(q, jobs)
            self.filled += len(jobs)
        return len(jobs)

    def drop_done(self, q: QueueConfig, jobs: list[Job]) -> list[Job]:
        """Acknowledge, unrun, the jobs whose job id completed within the dedupe window (one
        script call for the batch); returns the others."""
        marks = [(job, mark) for job in jobs if (mark := job.mark_key(q.keys, True))]
        if not marks:
            return jobs
        acked = self.scripts.dedupe(
            keys=[q.stream, q.keys.stats(), *(mark for _, mark in marks)],
            args=[q.group, STATS_TTL, *(job.message_id for job, _ in marks)],
        )
        done = {raw.decode() for raw in acked}
        for job in jobs:
            if job.message_id in done:
                log.info(
                    "%s already done within the dedupe window: acked, not run", job.tag(q.name)
                )
        return [job for job in jobs if job.message_id not in done]


class UnsupportedServer(Exception):
    pass


def check_server(client: redis.Redis) -> None:
    """Refuse servers whose stream commands jobd cannot rely on (see REDIS-NOTES)."""
    version = client.info("server").get("redis_version", "0")
    parts = tuple(int(p) for p in str(version).split(".")[:3] if p.isdigit())
    if parts < (6, 2, 2):
        raise UnsupportedServer(
            f"Redis {version} is not supported: jobd needs 6.2.2 or later "
            "(XAUTOCLAIM, and its cursor fixes in 6.2.2)"
        )
