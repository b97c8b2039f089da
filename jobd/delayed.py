"""Delayed jobs: retries waiting for their backoff, and jobs enqueued for later.

Both wait in the queue's delayed set (``keys.QueueKeys.delayed``), scored by their due time.
Every daemon runs the forwarder, which moves due jobs back to the stream in one script
(``lua/promote.lua``): several daemons moving at once never duplicate or lose a job, and a
job survives any crash because it is always in exactly one place. Whether a job is due is
decided by Redis's clock, inside the script; this host's clock only sets how often to look.
A member that is not a job (others may write members too) is dead-lettered as ``malformed``
by the same script, so it never holds up the jobs behind it.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from redis.client import Pipeline

from jobd.config import QueueConfig
from jobd.scripts import Scripts

log = logging.getLogger("jobd.delayed")

FORWARD_EVERY = 0.25  # seconds: a due job reaches the stream within this (plus a read)
FORWARD_BATCH = 500  # jobs moved per script call; the forwarder loops while there are more


def now_ms() -> int:
    """This host's clock, for picking due times; Redis's decides when they are reached."""
    return int(time.time() * 1000)


def flatten(fields: dict[bytes, bytes]) -> list[bytes]:
    return [x for item in fields.items() for x in item]


def schedule(
    scripts: Scripts,
    queue: QueueConfig,
    fields: dict[bytes, bytes],
    due_ms: int,
    client: Pipeline | None = None,
) -> None:
    """Add a new job that becomes due at ``due_ms`` (Unix milliseconds); into ``client`` when
    it is a pipeline."""
    token = secrets.token_hex(8)
    args = [due_ms, token, *flatten(fields)]
    scripts.schedule(keys=[queue.keys.delayed], args=args, client=client)


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
        q = self.queue
        keys = [q.keys.delayed, q.stream, q.dead_letter.stream]
        moved = 0
        while True:
            count, _next_due, malformed = self.scripts.promote(
                keys=keys, args=[FORWARD_BATCH, q.name, q.dead_letter.maxlen]
            )
            moved += count
            if malformed:
                log.error(
                    "queue=%s: %d member(s) of %s were not jobs: dead-lettered as malformed "
                    "on %s (jobd_member holds each one's bytes)",
                    q.name, malformed, q.keys.delayed, q.dead_letter.stream,
                )  # fmt: skip
            if count + malformed < FORWARD_BATCH:
                return moved
