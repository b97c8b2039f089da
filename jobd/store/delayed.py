"""The delayed set in Redis: a job added to wait for its due time (``lua/schedule.lua``), due
jobs moved to their stream (``lua/promote.lua``), the members listed, decoded
(``lua/delayed_list.lua``). A due time is Unix milliseconds, or ``after(ms)``: that long after
Redis's clock, so the caller's clock plays no part. Members are cmsgpack arrays
{unique id, field, value, …} (``keys``); why jobs wait there: ``jobd.daemon.delayed``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.store import notes
from jobd.store.base import StoreBase
from jobd.store.browse import score_ms
from jobd.store.keys import STATS_TTL, flatten

Due = int | str  # Unix ms, or after(ms)


def after(delay_ms: int) -> str:
    """schedule.lua's and enqueue_unique.lua's due time ``delay_ms`` after Redis's clock."""
    return f"+{max(0, delay_ms)}"


def schedule_call(
    queue: QueueConfig, fields: dict[bytes, bytes], due: Due, to_stream: bool
) -> tuple[list[str], list[object]]:
    """KEYS and ARGV of schedule.lua (a new member id each call)."""
    keys = [queue.keys.delayed, queue.stream] if to_stream else [queue.keys.delayed]
    return keys, [due, secrets.token_hex(8), *flatten(fields)]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A member of the delayed set."""

    due_ms: int | None  # None: its score is no time (``browse.score_ms``)
    fields: dict[bytes, bytes]  # empty for a malformed member
    malformed: str = ""  # why the member is not a job (promote.lua dead-letters it when due)
    member: bytes = b""  # a malformed member's bytes


@dataclass(frozen=True, slots=True)
class Promoted:
    """What one promote.lua call did."""

    moved: int  # jobs moved to the stream
    malformed: int  # members that were not jobs, dead-lettered as malformed
    held: int  # members that were not jobs and could not be dead-lettered: held back
    why: str  # the error that held them back ('' when none were)
    cancelled: int = 0  # jobs `jobd cancel` marked by job id: removed, recorded cancelled


class DelayedOps(StoreBase):
    def schedule(
        self, queue: QueueConfig, fields: dict[bytes, bytes], due: Due, to_stream: bool = False
    ) -> str | None:
        """Add a new job that becomes due at ``due``. With ``to_stream``, a job already due by
        Redis's clock goes to the stream at once: returns its entry id then, else None."""
        keys, args = schedule_call(queue, fields, due, to_stream)
        reply = self.scripts.schedule(keys=keys, args=args)
        return reply.decode() if isinstance(reply, bytes) else None

    def promote(self, queue: QueueConfig, batch: int, hold_malformed_ms: int) -> Promoted:
        """Move up to ``batch`` due jobs to the stream. A member that is not a job is
        dead-lettered as malformed, or held back ``hold_malformed_ms`` when its record cannot
        be written; a job `jobd cancel` marked by job id is removed, recorded cancelled."""
        settings = notes.settings(queue)
        moved, _next_due, malformed, held, why, cancelled = self.scripts.promote(
            keys=[
                queue.keys.delayed, queue.stream, queue.dead_letter.stream, *notes.keys(queue),
                queue.keys.cancels, queue.keys.stats(self.minute(queue.stream)), queue.keys.waiters,
                queue.keys.outbox,
            ],
            args=[
                batch, queue.name, queue.dead_letter.maxlen, hold_malformed_ms, settings,
                STATS_TTL, queue.keys.job_mark(""),
            ],
        )  # fmt: skip
        text = why.decode(errors="replace") if isinstance(why, bytes) else ""
        return Promoted(int(moved), int(malformed), int(held), text, int(cancelled))

    def delayed_list(self, queue: QueueConfig, limit: int = 1000, first: int = 0) -> list[Waiting]:
        """The members of the delayed set, soonest first, from index ``first`` on (a page, read
        by index: ZRANGE, never the whole set); a malformed one says why."""
        rows = self.scripts.delayed_list(keys=[queue.keys.delayed], args=[limit, first])
        return [_waiting(row) for row in rows]

    def delayed_count(self, queue: QueueConfig) -> int:
        """How many members the delayed set holds."""
        return int(self.client.zcard(queue.keys.delayed))


def _waiting(row: list[bytes]) -> Waiting:
    due_ms, why = score_ms(row[0]), row[1].decode()
    if why:
        return Waiting(due_ms, {}, why, row[2])
    return Waiting(due_ms, dict(zip(row[2::2], row[3::2], strict=True)))
