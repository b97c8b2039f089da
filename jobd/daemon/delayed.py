"""Delayed jobs: retries waiting for their backoff, and jobs enqueued for later.

Both wait in the queue's delayed set (``keys.QueueKeys.delayed``), scored by their due time.
Every daemon runs the forwarder, which moves due jobs back to the stream in one script
(``lua/promote.lua``): several daemons moving at once never duplicate or lose a job, and a
job survives any crash because it is always in exactly one place. Whether a job is due is
decided by Redis's clock, inside the script; this host's clock only sets how often to look.
A member that is not a job (others may write members too) is dead-lettered as ``malformed``
by the same script, so it never holds up the jobs behind it; when its record cannot be written,
it is held back in the set for ``HOLD_MALFORMED_MS`` instead, and the jobs behind it go on.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from redis.client import Pipeline

from jobd.config import QueueConfig
from jobd.store.scripts import Scripts

log = logging.getLogger("jobd.delayed")

FORWARD_EVERY = 0.25  # seconds: a due job reaches the stream within this (plus a read)
FORWARD_BATCH = 500  # jobs moved per script call; the forwarder loops while there are more
# A member that is not a job and cannot be dead-lettered (the dead-letter key holds another
# type) waits this long before the next try; meanwhile the jobs behind it move (promote.lua).
HOLD_MALFORMED_MS = 60_000


def now_ms() -> int:
    """This host's clock, for picking due times; Redis's decides when they are reached."""
    return int(time.time() * 1000)


def flatten(fields: dict[bytes, bytes]) -> list[bytes]:
    return [x for item in fields.items() for x in item]


def after(delay_ms: int) -> str:
    """schedule.lua's and enqueue_unique.lua's due time ``delay_ms`` after Redis's clock."""
    return f"+{max(0, delay_ms)}"


def schedule(
    scripts: Scripts,
    queue: QueueConfig,
    fields: dict[bytes, bytes],
    due: int | str,
    client: Pipeline | None = None,
    due_now_to_stream: bool = False,
) -> None:
    """Add a new job that becomes due at ``due``: Unix milliseconds, or ``after(ms)`` (that
    long after Redis's clock); into ``client`` when it is a pipeline. With
    ``due_now_to_stream``, a job already due by Redis's clock goes to the stream at once (the
    script then returns its entry id instead of 1)."""
    token = secrets.token_hex(8)
    keys = [queue.keys.delayed, queue.stream] if due_now_to_stream else [queue.keys.delayed]
    scripts.schedule(keys=keys, args=[due, token, *flatten(fields)], client=client)


@dataclass(frozen=True, slots=True)
class Waiting:
    due_ms: int
    fields: dict[bytes, bytes]  # empty for a malformed member
    malformed: str = ""  # why the member is not a job (promote.lua dead-letters it when due)
    member: bytes = b""  # a malformed member's bytes


def waiting(scripts: Scripts, queue: QueueConfig, limit: int = 1000) -> list[Waiting]:
    """The members of the delayed set, soonest first; a malformed one says why."""
    rows = scripts.delayed_list(keys=[queue.keys.delayed], args=[limit])
    return [_waiting(row) for row in rows]


def _waiting(row: list[bytes]) -> Waiting:
    due_ms, why = int(float(row[0])), row[1].decode()
    if why:
        return Waiting(due_ms, {}, why, row[2])
    return Waiting(due_ms, dict(zip(row[2::2], row[3::2], strict=True)))


class Forwarder:
    """The duty that moves one queue's due jobs to its stream."""

    def __init__(self, scripts: Scripts, queue: QueueConfig) -> None:
        self.name = f"forwarding due jobs of queue {queue.name}"
        self.interval = FORWARD_EVERY
        self.scripts = scripts
        self.queue = queue

    def tick(self) -> int:
        """Move every due job (one script call per ``FORWARD_BATCH``); returns how many."""
        q = self.queue
        keys = [q.keys.delayed, q.stream, q.dead_letter.stream]
        args = [FORWARD_BATCH, q.name, q.dead_letter.maxlen, HOLD_MALFORMED_MS]
        moved = 0
        while True:
            count, _next_due, malformed, held, why = self.scripts.promote(keys=keys, args=args)
            moved += count
            self._report(malformed, held, why)
            if count + malformed + held < FORWARD_BATCH:
                return moved

    def _report(self, malformed: int, held: int, why: bytes | None) -> None:
        q = self.queue
        if malformed:
            log.error(
                "queue=%s: %d member(s) of %s were not jobs: dead-lettered as malformed "
                "on %s (jobd_member holds each one's bytes)",
                q.name, malformed, q.keys.delayed, q.dead_letter.stream,
            )  # fmt: skip
        if held:
            log.error(
                "queue=%s: %d member(s) of %s are not jobs and cannot be dead-lettered on %s "
                "(%s): held back %gs, the jobs behind them go on",
                q.name, held, q.keys.delayed, q.dead_letter.stream,
                (why or b"").decode(errors="replace"), HOLD_MALFORMED_MS / 1000,
            )  # fmt: skip
