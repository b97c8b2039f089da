"""Reading a queue in Redis: the server check and the consumer group, new entries (XREADGROUP,
or every priority level in one script: ``lua/read_levels.lua``), entries whose lease lapsed
(``lua/reclaim.lua``) and the ones this consumer still runs among them (``lua/keep.lua``),
deliveries of jobs already done (``lua/dedupe.lua``), and the wait for new entries that holds
nothing (XREAD). What a reader does with them: ``jobd.daemon.reader``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.store import connection, notes
from jobd.store.base import StoreBase
from jobd.store.control import Paused, paused_from
from jobd.store.keys import STATS_TTL

Fields = dict[bytes, bytes]
Entry = tuple[bytes, Fields]  # a stream entry: its id as Redis sends it (Job.from_entry), fields
Claimed = tuple[bytes, Fields, int]  # an entry a reclaim took: its id, fields, delivery count
OLDEST_SERVER = (6, 2, 2)  # XAUTOCLAIM, and its cursor fixes in 6.2.2 (see REDIS-NOTES)


class UnsupportedServer(Exception):
    """The server lacks stream commands jobd relies on."""


@dataclass(frozen=True, slots=True)
class Levels:
    """What one read of a queue's priority levels took: each level's new entries, highest
    level first; when none was read, each level's newest entry id (its stream -> id), to wait
    for entries after them."""

    entries: list[tuple[QueueConfig, list[Entry]]]
    newest: dict[str, str]
    cancels: bool = False  # whether the queue has cancellation marks (asked after the read)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """One page of a reclaim: where the next page starts ('0-0': there is none), the entries
    claimed with their delivery count (this claim's included), and the ids of pending entries
    whose data was gone (dropped from the group)."""

    cursor: str
    claimed: list[Claimed]
    deleted: list[str]


def _fields(flat: list[bytes]) -> Fields:
    return dict(zip(flat[::2], flat[1::2], strict=True))


@dataclass(frozen=True, slots=True)
class NewEntries:
    """What ``read_new`` found: the entries, whether the queue has cancellation marks, and its
    pause (None when it is not paused), asked after the read; ``pause_known`` is False when
    Redis could not say (busy, out of memory: the pause is as it was)."""

    entries: list[Entry]
    cancels: bool
    paused: Paused | None
    pause_known: bool = True


class ReadingOps(StoreBase):
    def check_server(self) -> None:
        """Refuse servers whose stream commands jobd cannot rely on (UnsupportedServer)."""
        version = self.client.info("server").get("redis_version", "0")
        parts = tuple(int(p) for p in str(version).split(".")[:3] if p.isdigit())
        if parts < OLDEST_SERVER:
            raise UnsupportedServer(
                f"Redis {version} is not supported: jobd needs 6.2.2 or later "
                "(XAUTOCLAIM, and its cursor fixes in 6.2.2)"
            )

    def ensure_group(self, queue: QueueConfig) -> bool:
        """Create the queue's consumer group (and stream) when missing; from the stream's
        start, so jobs added before the first daemon ran are not skipped. True when created."""
        try:
            self.client.xgroup_create(queue.stream, queue.group, id="0", mkstream=True)
            return True
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False

    def read_new(self, queue: QueueConfig, count: int, block_ms: int | None) -> NewEntries:
        """At most ``count`` new entries (XREADGROUP), waiting up to ``block_ms`` for one; and,
        in the same round trip and after the read, whether the queue has cancellation marks
        (then the reader asks which of these are cancelled: a job cancelled before this read
        is caught there, one cancelled after it was pending, which cancel.lua sees) and whether
        it is paused now (so an idle reader asks nothing more between two blocking reads)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xreadgroup(
            queue.group, self.consumer, {queue.stream: ">"}, count=count, block=block_ms
        )
        pipe.exists(queue.keys.cancels)
        pipe.hgetall(queue.keys.paused)
        reply, cancels, pause = pipe.execute(raise_on_error=False)
        for answer in (reply, cancels):
            if isinstance(answer, Exception):
                raise answer
        entries = [(mid, fields) for mid, fields in reply[0][1]] if reply else []
        if isinstance(pause, Exception) and connection.away(pause):  # after the read: no raise
            return NewEntries(entries, bool(cancels), None, pause_known=False)
        return NewEntries(entries, bool(cancels), paused_from(pause))

    def read_levels(self, queue: QueueConfig, count: int) -> Levels:
        """At most ``count`` new entries of the queue's levels, highest first, in one script
        call that never blocks; a lower level's entry that waited ``starvation_after`` (on
        Redis's clock) goes first."""
        levels = queue.all_levels()
        after_ms = int((queue.starvation_after or 0) * 1000)
        entries, newest, marks = self.scripts.read_levels(
            keys=[*(level.stream for level in levels), queue.keys.cancels],
            args=[queue.group, self.consumer, count, 0, after_ms, len(levels)],  # 0: Redis's clock
        )
        read = [
            (level, [(mid, _fields(flat)) for i, mid, flat in entries if i == index])
            for index, level in enumerate(levels, start=1)
        ]
        ids = {level.stream: mid.decode() for level, mid in zip(levels, newest, strict=False)}
        return Levels(read, ids, bool(marks))

    def reclaim(
        self, queue: QueueConfig, cursor: str, count: int, backs: Sequence[str] = ()
    ) -> Reclaimed:
        """One page of entries idle past the queue's ``lease.reclaim_after``, claimed by this
        consumer: at most ``count``, from ``cursor`` ('0-0' at first). ``backs``: entries this
        consumer handed back whose hand-back Redis has not answered yet (see reclaim.lua)."""
        min_idle = int(queue.lease.reclaim_after * 1000)
        after, claimed, deleted = self.scripts.reclaim(
            keys=[queue.stream, *notes.keys(queue)],
            args=[queue.group, self.consumer, min_idle, cursor, count, notes.settings(queue),
                  *backs],
        )  # fmt: skip
        return Reclaimed(
            after.decode(),
            [(mid, _fields(flat), int(deliveries)) for mid, flat, deliveries in claimed],
            [mid.decode() for mid in deleted],
        )

    def keep(self, queue: QueueConfig, ids: list[str]) -> int:
        """Entries this consumer still runs that its own reclaim took back: renewed, and the
        delivery the claim counted undone. Returns how many were kept."""
        return int(self.scripts.keep(keys=[queue.stream], args=[queue.group, self.consumer, *ids]))

    def dedupe(self, queue: QueueConfig, jobs: list[Job]) -> set[str]:
        """Acknowledge, unrun, the jobs whose job id's mark says done (within the queue's
        dedupe window), in one script call; returns their message ids."""
        marks = [(job.message_id, mark) for job in jobs if (mark := job.mark_key(queue.keys, True))]
        if not marks:
            return set()
        acked = self.scripts.dedupe(
            keys=[queue.stream, queue.keys.stats(), *(mark for _, mark in marks)],
            args=[queue.group, STATS_TTL, *(mid for mid, _ in marks)],
        )
        return {raw.decode() for raw in acked}

    def wait_for_entries(self, newest: dict[str, str], block_ms: int) -> None:
        """Wait up to ``block_ms`` until a stream has an entry after its ``newest`` id; XREAD
        reads without consuming anything, and holds nothing."""
        self.client.xread(newest, count=1, block=block_ms)  # type: ignore[arg-type]

    def length(self, stream: str) -> int:
        """How many entries ``stream`` holds (XLEN)."""
        return int(self.client.xlen(stream))
