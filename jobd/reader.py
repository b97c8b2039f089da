"""Reading jobs: one thread per queue that takes free slots, then reads that many entries.

A reader never holds an entry it cannot start: it first takes the queue's free slots, then
asks XREADGROUP for at most that many, and gives back the slots it did not fill. The daemon's
main loop gives a slot back when a handler ends. Reads stay off the main loop, so a Redis
round trip never delays a spawn or a reap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from jobd import redisconn
from jobd.config import QueueConfig, RedisConfig
from jobd.job import Job

log = logging.getLogger("jobd.reader")

BACKOFF_START = 0.1
BACKOFF_MAX = 5.0


class Slots:
    """A queue's free handler slots, shared by its reader and the main loop."""

    def __init__(self, total: int) -> None:
        self._free = total
        self._cond = threading.Condition()

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


def ensure_group(client: redis.Redis, queue: QueueConfig) -> None:
    """Create the queue's consumer group (and stream) when missing; from the stream's start,
    so jobs added before the first daemon ran are not skipped."""
    try:
        client.xgroup_create(queue.stream, queue.group, id="0", mkstream=True)
        log.info("queue=%s created group %r on stream %r", queue.name, queue.group, queue.stream)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


class Reader(threading.Thread):
    def __init__(
        self,
        queue: QueueConfig,
        redis_config: RedisConfig,
        consumer: str,
        slots: Slots,
        deliver: Callable[[list[Job]], None],
    ) -> None:
        super().__init__(name=f"reader-{queue.name}", daemon=True)
        self.queue = queue
        self.consumer = consumer
        self.slots = slots
        self.deliver = deliver
        self.client = redisconn.client(redis_config, f"jobd-reader-{queue.name}")
        self.stopping = threading.Event()
        self.ready = threading.Event()  # set once Redis answered and the group exists
        self._group_ok = False
        self._outage: str | None = None

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            self._loop()
        finally:
            self.client.close()
            self.deliver([])  # wakes the main loop, which waits for readers to end

    def _loop(self) -> None:
        backoff = BACKOFF_START
        while not self.stopping.is_set():
            try:
                self.read_once()
                backoff = BACKOFF_START
                self._mark_up()
            except redisconn.UNAVAILABLE as exc:
                self._mark_down(exc)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc) and "UNBLOCKED" not in str(exc):
                    log.error("queue=%s read failed: %s", self.queue.name, exc)
                    self.stopping.wait(BACKOFF_MAX)
                else:
                    log.warning("queue=%s group or stream vanished; recreating it", self.queue.name)
                self._group_ok = False

    def read_once(self) -> None:
        if not self._group_ok:
            ensure_group(self.client, self.queue)
            self._group_ok = True
            self.ready.set()
        free = self.slots.take_all(timeout=0.5)
        if not free:
            return
        if self.stopping.is_set():
            self.slots.give(free)
            return
        entries: list = []
        try:
            reply = self.client.xreadgroup(
                self.queue.group,
                self.consumer,
                {self.queue.stream: ">"},
                count=free,
                block=redisconn.BLOCK_MS,
            )
            entries = reply[0][1] if reply else []
        finally:
            self.slots.give(free - len(entries))
        if entries:
            self.deliver([Job.from_entry(self.queue.name, mid, fields) for mid, fields in entries])

    def _mark_down(self, exc: BaseException) -> None:
        state = f"{type(exc).__name__}: {exc}"
        if self._outage is None:
            log.warning("queue=%s Redis unreachable (%s); retrying", self.queue.name, state)
        self._outage = state

    def _mark_up(self) -> None:
        if self._outage is not None:
            log.info("queue=%s Redis reachable again", self.queue.name)
            self._outage = None
