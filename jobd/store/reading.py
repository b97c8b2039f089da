"""Reading a queue in Redis: the server check and the consumer group, new entries (XREADGROUP,
or every priority level in one script: ``lua/read_levels.lua``), entries whose lease lapsed
(``lua/reclaim.lua``) and the ones this consumer still runs among them (``lua/keep.lua``),
deliveries of jobs already done (``lua/dedupe.lua``), and the wait for new entries that holds
nothing (XREAD). What a reader does with them: ``jobd.daemon.reader``.

While a queue's Redis Cluster slot migrates (resharding), Redis refuses a command of several of
its keys unless they are all on the node it reaches (TRYAGAIN), for as long as the migration
lasts: the queue is then read key by key for a while (``_read_apart``), each command routed to
wherever its key is, and the wait follows the slot's keys there (``doorbell``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis
from redis.exceptions import ClusterError, MovedError

from jobd.config import QueueConfig
from jobd.job import BATCH, BATCH_INCARNATION, ENTRY_SLACK, MAX_FIELDS, ORIGIN, OVERWIDE, Job
from jobd.store import doorbell, notes
from jobd.store.base import StoreBase
from jobd.store.connection import SlotMigrating, away, migrating, node_for
from jobd.store.control import Paused, generation, paused_from
from jobd.store.keys import STATS_TTL

Fields = dict[bytes, bytes]
Entry = tuple[bytes, Fields]  # a stream entry: its id as Redis sends it (Job.from_entry), fields
# An entry a reclaim took: its id, fields, delivery count, and whether it had been handed back
# (picked up again, not taken over from a lapsed lease).
Claimed = tuple[bytes, Fields, int, bool]
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
    paused: Paused | None = None  # the queue's pause after the read, when asked (read_new)
    cancel_gen: bytes | None = None  # and its cancel generation (None: none, or not asked)


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """One page of a reclaim: where the next page starts ('0-0': there is none), the entries
    claimed with their delivery count (this claim's included), the ids of pending entries
    whose data was gone (dropped from the group, their jobs ended 'lost'), and the job ids of
    the --unique ones among those, whose marks are still to be freed (``free_lost_marks``)."""

    cursor: str
    claimed: list[Claimed]
    deleted: list[str]
    unfreed: list[bytes] = field(default_factory=list)


def _fields(flat: list[bytes]) -> Fields:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _entry(flat: list[bytes]) -> Fields:
    """An entry's fields as a read script handed them over. More than MAX_FIELDS pairs, counted
    as they came (a name may repeat: the dict can be far narrower), are marked too wide as the
    script's stand-in is (lua/lib/jobs.lua sized, which hands over no such entry: a guard)."""
    fields = _fields(flat)
    if len(flat) > 2 * MAX_FIELDS:
        fields[OVERWIDE] = b"%d" % (len(flat) // 2)
    return fields


IDLE_TRUSTED = 5.0  # seconds read_new waits after the same ids without reading first
MIGRATING_FOR = 5.0  # seconds a queue's reads go key by key after its slot was found migrating
_WRONGTYPE = redis.ResponseError("WRONGTYPE the pause key holds another type")


def entry_limit(queue: QueueConfig) -> int:
    """The most bytes an entry's fields may hold to be read (lua/lib/jobs.lua ``sized``)."""
    return queue.max_payload + ENTRY_SLACK


@dataclass(frozen=True, slots=True)
class NewEntries:
    """What ``read_new`` found: the entries, whether the queue has cancellation marks, and its
    pause (None when it is not paused), asked after the read or the wait, in its round trip
    (``pause_known`` is always True now: a read that cannot say fails as a whole)."""

    entries: list[Entry]
    cancels: bool
    paused: Paused | None
    cancel_gen: bytes | None = None  # the queue's cancel generation (None: none yet)
    pause_known: bool = True


class ReadingOps(StoreBase):
    def check_server(self) -> None:
        """Refuse servers whose stream commands jobd cannot rely on (UnsupportedServer)."""
        version = self.client.info("server").get("redis_version", "0")
        parts = tuple(int(p) for p in str(version).split(".")[:3] if p.isascii() and p.isdigit())
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
        """At most ``count`` new entries, waiting up to ``block_ms`` for one; and, in the same
        round trip and after the read, whether the queue has cancellation marks (then the reader
        asks which of these are cancelled: a job cancelled before this read is caught there,
        one cancelled after it was pending, which cancel.lua sees), whether it is paused now and
        its cancel generation (so an idle reader asks nothing more between two blocking reads).

        Read by read_levels.lua (its one level), which hands over an entry larger than the
        queue's max_payload and ``job.ENTRY_SLACK`` as a stand-in; the wait is XREAD BLOCK on a
        reply this daemon skips unread (``doorbell``): no read brings such an entry in."""
        idle = self._idle.pop(queue.stream, None)
        if block_ms is None or idle is None or time.monotonic() - idle[1] > IDLE_TRUSTED:
            read = self._read_new_entries(queue, [queue], count, pause=True)
            if read.entries[0][1] or block_ms is None:
                return NewEntries(read.entries[0][1], read.cancels, read.paused, read.cancel_gen)
            idle = (read.newest, time.monotonic())
        came, pause, gen = doorbell.wait(
            self.client, idle[0], block_ms, queue.keys.paused, queue.keys.cancel_gen, self.bell
        )
        # Nothing came: the next call waits after the same ids without reading first (one
        # round trip an idle cycle); a reset of the group meanwhile is seen by the next read,
        # at most IDLE_TRUSTED later, or by the reclaim pass.
        if not came:
            self._idle[queue.stream] = idle
            assert pause is not None
            return NewEntries([], False, paused_from(pause), gen)
        read = self._read_new_entries(queue, [queue], count, pause=True)
        return NewEntries(read.entries[0][1], read.cancels, read.paused, read.cancel_gen)

    def read_levels(
        self, queue: QueueConfig, count: int, levels: Sequence[QueueConfig] | None = None
    ) -> Levels:
        """At most ``count`` new entries of the queue's levels (``levels``: those of them to
        read, default all), highest first, in one script call that never blocks; a lower
        level's entry that waited ``starvation_after`` (on Redis's clock) goes first."""
        return self._read_new_entries(queue, levels or queue.all_levels(), count)

    def migrating(self, stream: str) -> bool:
        """Whether a read of ``stream``'s queue found its cluster slot migrating, and no read
        since was served in one step (its reads go key by key meanwhile: ``_read_apart``)."""
        return stream in self._migrating

    def found_migrating(self, stream: str) -> None:
        """``stream``'s cluster slot was found migrating: for MIGRATING_FOR from now its
        queue's reads go key by key (then one tries the script again), and its reader reclaims
        nothing until a read is served in one step."""
        self._migrating[stream] = time.monotonic() + MIGRATING_FOR

    def _read_new_entries(
        self,
        queue: QueueConfig,
        levels: Sequence[QueueConfig],
        count: int,
        pause: bool = False,
    ) -> Levels:
        """read_levels.lua on ``levels`` (entries larger than ``entry_limit`` as stand-ins); with
        ``pause``, the queue's pause read after them. The script goes straight to the node of
        the queue's slot, so a refusal while the slot migrates comes back at once (not after the
        cluster client's 16 tries); then, and for MIGRATING_FOR, reads go key by key."""
        if time.monotonic() < self._migrating.get(queue.stream, 0.0):
            return self._read_apart(queue, levels, count, pause)
        after_ms = int((queue.starvation_after or 0) * 1000)
        keys = [*(level.stream for level in levels), queue.keys.cancels]
        keys += [queue.keys.paused, queue.keys.cancel_gen] if pause else []
        keys += [queue.keys.waiters, queue.keys.taken]  # workflow jobs taken (read_levels.lua)
        args = [queue.group, self.consumer, count, 0, after_ms, len(levels), entry_limit(queue),
                len(keys) - 1]  # fmt: skip
        try:  # ARGV[4] 0: Redis's clock
            try:
                reply = self.scripts.read_levels(keys, args, node_for(self.client, keys[0]))
            except MovedError:  # the cluster client follows it, and learns the slot's node
                reply = self.scripts.read_levels(keys=keys, args=args)
        except (redis.ResponseError, ClusterError) as exc:
            if not migrating(exc):
                raise
            self.found_migrating(queue.stream)
            return self._read_apart(queue, levels, count, pause)
        self._migrating.pop(queue.stream, None)
        entries, newest, marks, paused, gen = reply
        read = [
            (level, [(mid, _entry(flat)) for i, mid, flat in entries if i == index])
            for index, level in enumerate(levels, start=1)
        ]
        ids = {level.stream: mid.decode() for level, mid in zip(levels, newest, strict=False)}
        if not pause:
            return Levels(read, ids, bool(marks))
        state = paused_from(_WRONGTYPE if paused == b"wrongtype" else _fields(paused or []))
        return Levels(read, ids, bool(marks), state, generation(gen))

    def _read_apart(
        self, queue: QueueConfig, levels: Sequence[QueueConfig], count: int, pause: bool
    ) -> Levels:
        """What ``_read_new_entries`` reads, while the queue's cluster slot migrates (its keys
        may be on either node, or split): each level by read_levels.lua on its stream alone,
        highest first, then whether there are cancellation marks, and with ``pause`` the pause
        and the generation, each a command of one key, which the cluster client sends where
        the key is (following ASK). A few round trips more, and strict priority (no aging),
        for a while. A level that fails once an earlier one's entries were read (delivered)
        ends the read with them, as the script does. A queue whose entries a script of several
        keys must check before they run (dedupe, cancellation marks) is not read: those would
        wait, delivered, until the migration ends and then reclaim_after more (SlotMigrating,
        Redis away for the queue until then)."""
        if queue.dedupe_window is not None or self.client.exists(queue.keys.cancels):
            raise SlotMigrating(f"the cluster slot of {queue.stream} migrates")
        read: list[tuple[QueueConfig, list[Entry]]] = []
        newest: dict[str, str] = {}
        left = count
        for level in levels:
            args = [queue.group, self.consumer, left, 0, 0, 1, entry_limit(queue)]
            try:
                entries, last = self.scripts.read_levels(keys=[level.stream], args=args)[:2]
            except redis.RedisError:
                if any(got for _, got in read):
                    break
                raise
            read.append((level, [(mid, _entry(flat)) for _, mid, flat in entries]))
            newest |= {level.stream: last[0].decode()} if last else {}
            left -= len(entries)
            if left <= 0:
                break
        marks, paused, gen = self._controls_apart(queue, pause)
        if any(got for _, got in read):
            newest = {}
        return Levels(read, newest, marks, paused, gen)

    def _controls_apart(
        self, queue: QueueConfig, pause: bool
    ) -> tuple[bool, Paused | None, bytes | None]:
        """Whether the queue has cancellation marks; with ``pause``, its pause and generation:
        one command each, in one pipeline (a command the node sends elsewhere, ASK, is sent
        again on its own, after it). Redis being away is raised."""
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(queue.keys.cancels)
        if pause:
            pipe.hgetall(queue.keys.paused)
            pipe.get(queue.keys.cancel_gen)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and (
                not isinstance(reply, redis.ResponseError) or away(reply)
            ):
                raise reply
        if not pause:
            return bool(replies[0]), None, None
        return bool(replies[0]), paused_from(replies[1]), generation(replies[2])

    def reclaim(
        self, queue: QueueConfig, cursor: str, count: int, backs: Sequence[str] = ()
    ) -> Reclaimed:
        """One page of entries idle past the queue's ``lease.reclaim_after``, claimed by this
        consumer: at most ``count``, from ``cursor`` ('0-0' at first). ``backs``: entries this
        consumer handed back whose hand-back Redis has not answered yet (see reclaim.lua)."""
        min_idle = int(queue.lease.reclaim_after * 1000)
        after, claimed, deleted, unfreed = self.scripts.reclaim(
            keys=[queue.stream, *notes.keys(queue), queue.keys.waiters, queue.keys.outbox,
                  queue.keys.taken, queue.keys.cancels],
            args=[queue.group, self.consumer, min_idle, cursor, count, notes.settings(queue),
                  entry_limit(queue), *backs],
        )  # fmt: skip
        return Reclaimed(
            after.decode(),
            [
                (mid, _entry(flat), int(deliveries), bool(back))
                for mid, flat, deliveries, back in claimed
            ],
            [mid.decode() for mid in deleted],
            list(unfreed),
        )

    def free_lost_marks(self, queue: QueueConfig, job_ids: Sequence[bytes]) -> int:
        """Free the job ids of --unique jobs a reclaim ended 'lost' (``Reclaimed.unfreed``):
        each mark deleted while it says 'queued' (lua/lost_marks.lua). A second call, as the
        reclaim is not sent those keys: a daemon that dies in between leaves the marks to
        expire (UNIQUE_TTL), as before review 35z. Returns how many were freed."""
        marks = [queue.keys.job_mark(job_id) for job_id in job_ids]
        return int(self.scripts.lost_marks(keys=marks, args=[])) if marks else 0

    def keep(self, queue: QueueConfig, jobs: Sequence[Job]) -> int:
        """Jobs this consumer still runs that its own reclaim took back (as it read them):
        renewed, and the delivery the claim counted undone. A job whose entry was deleted
        meanwhile ends 'lost' under its job id, its cancellation marks and its --unique mark
        going with it (keep.lua). Returns how many were kept."""
        k = queue.keys
        keys: list[str | bytes] = [queue.stream, *notes.keys(queue), k.waiters, k.outbox]
        keys += [k.taken, k.cancels]
        at = []  # where keep.lua finds each one's --unique mark in KEYS (0: none)
        for job in jobs:
            mark = job.mark_key(k, dedupe=False)
            keys += [mark] if mark is not None else []
            at.append(len(keys) if mark is not None else 0)
        args: list[object] = [queue.group, self.consumer, notes.settings(queue), len(jobs)]
        args += [job.message_id for job in jobs] + [os.fsencode(job.job_id) for job in jobs]
        return int(self.scripts.keep(keys=keys, args=[*args, *at]))

    def dedupe(self, queue: QueueConfig, jobs: list[Job]) -> set[str]:
        """Acknowledge, unrun, the jobs whose job id's mark says done (within the queue's
        dedupe window), in one script call, each with its event (and record: lua/dedupe.lua);
        returns their message ids, and those of the done jobs this consumer no longer holds
        (taken over since its read: not to be run here, and nothing written for them)."""
        marks = [(job, mark) for job in jobs if (mark := job.mark_key(queue.keys, True))]
        if not marks:
            return set()
        args: list[object] = [queue.group, self.consumer, STATS_TTL, notes.settings(queue)]
        for job, _ in marks:
            origin = job.origin if ORIGIN in job.fields else ""
            batch = [job.fields.get(BATCH, b""), job.fields.get(BATCH_INCARNATION, b"")]
            args += [job.message_id, os.fsencode(job.job_id), origin, *batch]
        stats = queue.keys.stats(self.minute(queue.stream))
        keys = [queue.stream, stats, *notes.keys(queue), queue.keys.waiters, queue.keys.outbox,
                *(m for _, m in marks)]  # fmt: skip
        acked = self.scripts.dedupe(keys=keys, args=args)
        return {raw.decode() for raw in acked}

    def wait_for_entries(self, newest: dict[str, str], block_ms: int) -> bool:
        """Wait up to ``block_ms`` until a stream has an entry after its ``newest`` id; True
        when one has. XREAD holds nothing, and its reply (an entry: any size) is skipped as it
        comes, never held (``doorbell``)."""
        return doorbell.wait(self.client, newest, block_ms, None, bell=self.bell)[0]

    def length(self, stream: str) -> int:
        """How many entries ``stream`` holds (XLEN)."""
        return int(self.client.xlen(stream))
