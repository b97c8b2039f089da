"""The periodic duties' calls: retention's bounded trim of a stream (``lua/trim.lua``), the
consumers of a group (XINFO CONSUMERS) and the removal of one that holds nothing
(``lua/drop_consumer.lua``), and a periodic schedule's tick, enqueued once across every daemon
(``lua/tick.lua``), with the latest tick it enqueued. Why and when: ``jobd.daemon.retention``,
``janitor`` and ``periodic``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.store import notes
from jobd.store.base import StoreBase
from jobd.store.keys import flatten

CURSOR_TTL = 3600  # seconds trim.lua's cursor is kept; without it the walk starts over
GUEST_NAME_BYTES = 256  # a longer name of a group the config does not name: its stream not trimmed
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
        """One bounded trim call: the number of entries removed, and whether it stopped at its
        budget with the stream still above ``maxlen`` (another call can go on at once). Nothing
        is removed while the queue's own group is missing from its stream, nor while the stream
        has a group neither the config names nor ``guests`` (``trim_call``; ``queue`` is one
        stream's: the queue's, or a priority level's, with its group)."""
        removed, more, _foreign = self.trim_call(queue, maxlen, batch)
        return removed, more

    def trim_call(
        self, queue: QueueConfig, maxlen: int, batch: int, guests: Sequence[bytes] = ()
    ) -> tuple[int, bool, int]:
        """``trim``, and how many groups the stream has that neither the config nor ``guests``
        name (then nothing is trimmed: ``lua/trim.lua`` reads the groups it is given alone, by
        name: the queue's own, those in ``stream_groups``, and ``guests``, other applications'
        groups on the stream as ``guest_groups`` read them)."""
        others = [g for g in self.stream_groups.get(queue.stream, ()) if g != queue.group]
        trimmed, deleted, more, foreign = self.scripts.trim(
            keys=[queue.stream, queue.keys.trim_cursor()],
            args=[maxlen, batch, CURSOR_TTL * 1000, queue.group, *others, *guests],
        )
        return int(trimmed) + int(deleted), bool(more), int(foreign)

    def guest_groups(self, queue: QueueConfig) -> list[bytes] | None:
        """The groups on ``queue``'s stream that the config does not name (another
        application's), by XINFO GROUPS from this client (Redis writes the names to the reply
        buffer, where a script would copy each into Lua); None when one's name is longer than
        GUEST_NAME_BYTES (then ``trim.lua`` is never given it: the stream is not trimmed)."""
        known = {g.encode() for g in (queue.group, *self.stream_groups.get(queue.stream, ()))}
        try:
            found = self.client.xinfo_groups(queue.stream)
        except redis.ResponseError:
            return []
        names = [bytes(g["name"]) for g in found if bytes(g["name"]) not in known]
        if any(len(name) > GUEST_NAME_BYTES for name in names):
            return None
        return names

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
