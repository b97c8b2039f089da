"""A reader's consumer groups (``Reader`` mixes it in): made on each level's stream where
missing, from the stream's start; said loudly when one vanished under a running daemon and was
made again (its retained entries are delivered again); and a level whose stream is someone
else's key of another type set aside, said once, and checked again every ``SET_ASIDE_RETRY``,
while the queue's other levels are read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.store.store import Store
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.reader")

SET_ASIDE_RETRY = 5.0  # seconds between checks of a level set aside (someone else's key there)


class Groups:
    """The group checks of a reader: its queue, levels read, store and metrics."""

    queue: QueueConfig
    levels: tuple[QueueConfig, ...] | list[QueueConfig]
    aside: set[str]
    next_aside_check: float
    store: Store
    metrics: Metrics
    ready: threading.Event
    deliver: Callable[[QueueConfig, list[Job]], None]  # the loop's inbox (wakes the loop)
    _checked: bool
    _group_ok: bool

    def check_groups(self) -> None:
        """Make each level's group where missing. A level whose stream is someone else's key
        of another type (WRONGTYPE) is set aside, said once, and checked again every
        SET_ASIDE_RETRY: the other levels are read meanwhile. With every level set aside the
        error is the pass's (logged, BACKOFF_MAX)."""
        self._checked = True
        self.store.check_server()
        levels: list[QueueConfig] = []
        failed: redis.ResponseError | None = None
        for level in self.queue.all_levels():
            try:
                created = self.store.ensure_group(level)
            except redis.ResponseError as exc:
                if "WRONGTYPE" not in str(exc) or len(self.queue.all_levels()) == 1:
                    raise
                failed = exc
                if level.stream not in self.aside:
                    log.error(
                        "queue=%s level %r: stream %r is a key of another type (%s); reading "
                        "the other levels without it, checking it again every %gs",
                        self.queue.name, level.priority, level.stream, exc, SET_ASIDE_RETRY,
                    )  # fmt: skip
                self.aside.add(level.stream)
                continue
            if level.stream in self.aside:
                self.aside.discard(level.stream)
                log.warning("queue=%s level %r: stream %r readable again",
                            self.queue.name, level.priority, level.stream)  # fmt: skip
            if created:
                log.debug("queue=%s created group %r on stream %r",
                          level.name, level.group, level.stream)  # fmt: skip
                if self.ready.is_set():
                    self.group_recreated(level)
            levels.append(level)
        self.next_aside_check = time.monotonic() + SET_ASIDE_RETRY
        if failed is not None and not levels:
            raise failed
        self.levels = tuple(levels)
        self._group_ok = True
        if not self.ready.is_set():
            # Redis's clock read now (kept a minute: ``KeptClock``), not with the first jobs
            # read: a TIME that waits out a link gone bad would hold them, read, undelivered
            self.store.clock.offset(self.queue.stream)
            self.ready.set()
            self.deliver(self.queue, [])  # wakes the loop: ready (READY=1) now, not at a tick

    def group_recreated(self, q: QueueConfig) -> None:
        """The group vanished while this daemon read from it (XGROUP DESTROY, or the stream
        deleted and added again) and was created again at the stream's start: every entry
        still in the stream, done or not, is delivered again. jobd cannot tell which ran (the
        group held that); at-least-once means running them again, so it says so loudly."""
        self.metrics.add(self.metrics.groups_recreated, q.name)
        log.error(
            "queue=%s consumer group %r on stream %r vanished and was created again from the "
            "stream's start: its %d retained entries are delivered again, those already done "
            "included (deleting a group or its stream under a running daemon re-runs jobs)",
            q.name, q.group, q.stream, self.store.length(q.stream),
        )  # fmt: skip
