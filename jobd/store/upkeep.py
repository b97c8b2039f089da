"""The periodic duties' calls: retention's bounded trim of a stream (``lua/trim.lua``), the
consumers of a group (XINFO CONSUMERS) and the removal of one that holds nothing
(``lua/drop_consumer.lua``), and a periodic schedule's tick, enqueued once across every daemon
(``lua/tick.lua``), with the latest tick it enqueued. Why and when: ``jobd.daemon.retention``,
``janitor`` and ``periodic``.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.store import notes
from jobd.store.base import StoreBase
from jobd.store.keys import flatten

CURSOR_TTL = 3600  # seconds trim.lua's cursor is kept; without it the walk starts over
NO_DEADLINE = -1  # tick.lua's deadline for a tick due while the caller ran


@dataclass(frozen=True, slots=True)
class Consumer:
    """A consumer of a group, as XINFO CONSUMERS lists it."""

    name: bytes  # any bytes another client named it
    pending: int
    idle_ms: int


@dataclass(frozen=True, slots=True)
class Tick:
    """What tick.lua did: 'added', 'taken' (enqueued already) or 'late' (past its deadline:
    nothing written), and Redis's time (Unix seconds) when late."""

    outcome: str
    redis_time: float | None = None


class UpkeepOps(StoreBase):
    def trim(self, queue: QueueConfig, maxlen: int, batch: int) -> tuple[int, bool]:
        """One bounded trim call (``lua/trim.lua``): the number of entries removed, and whether
        it stopped at its budget with the stream still above ``maxlen`` (another call can go on
        at once). Nothing any group on the stream has pending or not yet delivered is removed
        (every group's, read in the script), and nothing at all while the queue's own group is
        missing from its stream (``queue`` is one stream's: the queue's, or a priority level's,
        with its group)."""
        trimmed, deleted, more = self.scripts.trim(
            keys=[queue.stream, queue.keys.trim_cursor()],
            args=[maxlen, batch, CURSOR_TTL * 1000, queue.group],
        )
        return int(trimmed) + int(deleted), bool(more)

    def forget(self, queue: QueueConfig) -> int:
        """Trim the queue's history by its caps (forget.lua); how many jobs' records are left."""
        return int(self.scripts.forget(keys=notes.keys(queue), args=[notes.settings(queue)]))

    def consumers(self, queue: QueueConfig) -> list[Consumer]:
        """The consumers of the queue's group; none while there is no stream or group yet."""
        try:
            found = self.client.xinfo_consumers(queue.stream, queue.group)
        except redis.ResponseError:
            return []
        return [Consumer(c["name"], int(c["pending"]), int(c["idle"])) for c in found]

    def drop_consumer(self, queue: QueueConfig, name: bytes, min_idle_ms: int) -> bool:
        """Delete consumer ``name`` from the group if it holds nothing and has been idle at
        least ``min_idle_ms``, in one step; True when deleted."""
        args = [queue.group, name, min_idle_ms]
        return bool(self.scripts.drop_consumer(keys=[queue.stream], args=args))

    def tick(
        self,
        queue: QueueConfig,
        schedule: str,
        at: int,
        fields: dict[bytes, bytes],
        keep_ms: int,
        deadline_ms: int | None,
    ) -> Tick:
        """Enqueue ``fields`` for the tick of ``schedule`` at Unix second ``at``, unless a
        daemon did already; its key is kept ``keep_ms``. With ``deadline_ms`` (a tick missed,
        caught up), refused when Redis's clock is more than that past it."""
        keys = [queue.stream, queue.keys.tick(schedule, at), queue.keys.schedule_last(schedule)]
        deadline = NO_DEADLINE if deadline_ms is None else deadline_ms
        reply = self.scripts.tick(keys=keys, args=[keep_ms, at, deadline, *flatten(fields)])
        outcome = bytes(reply[0]).decode()
        if outcome == "late":
            return Tick(outcome, int(reply[1]) / 1000)
        return Tick(outcome)

    def latest_tick(self, queue: QueueConfig, schedule: str) -> bytes | None:
        """What the key of the latest tick ``schedule`` enqueued holds (tick.lua writes a Unix
        second; another client may have written anything); a key of another type raises
        WRONGTYPE."""
        value = self.client.get(queue.keys.schedule_last(schedule))
        return None if value is None else bytes(value)
