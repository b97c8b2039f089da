"""Delayed jobs: retries waiting for their backoff, and jobs enqueued for later.

Both wait in the queue's delayed set (``keys.QueueKeys.delayed``), scored by their due time.
Every daemon runs the forwarder, which moves due jobs back to the stream in one script
(``lua/promote.lua``): several daemons moving at once never duplicate or lose a job, and a
job survives any crash because it is always in exactly one place.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from redis.client import Pipeline

from jobd.config import QueueConfig
from jobd.scripts import Scripts

FORWARD_EVERY = 0.25  # seconds: a due job reaches the stream within this (plus a read)
FORWARD_BATCH = 500  # jobs moved per script call; the forwarder loops while there are more


def now_ms() -> int:
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
    fields: dict[bytes, bytes]


def waiting(scripts: Scripts, queue: QueueConfig, limit: int = 1000) -> list[Waiting]:
    """The jobs in the delayed set, soonest first."""
    rows = scripts.delayed_list(keys=[queue.keys.delayed], args=[limit])
    return [
        Waiting(int(float(row[0])), dict(zip(row[2::2], row[3::2], strict=True))) for row in rows
    ]


class Forwarder:
    """The duty that moves one queue's due jobs to its stream."""

    def __init__(self, scripts: Scripts, queue: QueueConfig) -> None:
        self.name = f"forwarding due jobs of queue {queue.name}"
        self.interval = FORWARD_EVERY
        self.scripts = scripts
        self.queue = queue

    def tick(self) -> int:
        moved = 0
        while True:
            count, _next_due = self.scripts.promote(
                keys=[self.queue.keys.delayed, self.queue.stream], args=[now_ms(), FORWARD_BATCH]
            )
            moved += count
            if count < FORWARD_BATCH:
                return moved
