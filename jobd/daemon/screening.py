"""A reader's screening of a batch it just read, before the batch reaches the loop
(``Reader`` mixes it in): jobs ``jobd cancel`` marked, and jobs whose job id completed within
the queue's dedupe window, are acknowledged unrun, each check one script call for the batch.

A check Redis refuses for a while (busy, loading, out of memory: ``connection.away``) is asked
again while the batch's leases surely hold; then the batch is left, unheld, to be taken over
after ``reclaim_after`` and checked again. A batch is never run unchecked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from jobd.config import QueueConfig
from jobd.daemon.lease import lease_clock
from jobd.job import Job
from jobd.store import connection as redisconn
from jobd.store.store import Store
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.reader")


class Screening:
    """The checks of a batch: its reader's store, metrics and stopping event."""

    store: Store
    metrics: Metrics
    stopping: threading.Event

    def checked(
        self,
        q: QueueConfig,
        jobs: list[Job],
        sent: float,
        what: str,
        check: Callable[[QueueConfig, list[Job]], list[Job]],
    ) -> list[Job]:
        """The ``jobs`` of a batch just read that ``check`` (a script that acknowledges some unrun:
        cancelled, or done) leaves to run. Redis away for a while (busy with another script,
        loading, out of memory, a replica: ``connection.away``) ran no part of the script, and
        says nothing about the batch: the check is asked again, while the batch's leases hold
        for sure (half of ``reclaim_after`` from the read); then the error is raised, and the
        batch, held by no one here, is taken over after ``reclaim_after`` (and checked again).
        A batch is never run unchecked. A reply lost on the way (the connection dropped) is
        raised at once: the script may have acknowledged some, asking again would not say."""
        delay = redisconn.BACKOFF_START
        until = sent + q.lease.reclaim_after / 2
        while True:
            try:
                return check(q, jobs)
            except redisconn.UNAVAILABLE:
                raise
            except redis.ResponseError as exc:
                if not redisconn.away(exc):
                    raise
                if lease_clock() + delay >= until or self.stopping.is_set():
                    log.warning("queue=%s %s check refused (%s): %d job(s) not run now, taken "
                                "over after lease.reclaim_after",
                                q.name, what, exc, len(jobs))  # fmt: skip
                    raise
                log.info("queue=%s %s check refused (%s); asking again", q.name, what, exc)
                self.stopping.wait(delay)
                delay = min(delay * 2, redisconn.BACKOFF_MAX)

    def drop_cancelled(self, q: QueueConfig, jobs: list[Job]) -> list[Job]:
        """Acknowledge, unrun, the jobs ``jobd cancel`` marked (one script call); the others.
        The script copes with keys of other types (someone else's): an error is Redis's, and
        raised (see ``checked``)."""
        gone = self.store.cancelled(q, jobs)
        for job in jobs:
            if job.message_id in gone:
                log.warning("%s cancelled (jobd cancel) before it started: acked unrun",
                            job.tag(q.name))  # fmt: skip
                self.metrics.add(self.metrics.cancelled, q.name)
        return [job for job in jobs if job.message_id not in gone]

    def drop_done(self, q: QueueConfig, jobs: list[Job]) -> list[Job]:
        """Acknowledge, unrun, the jobs whose job id completed within the dedupe window (one
        script call for the batch); returns the others."""
        done = self.store.dedupe(q, jobs)
        for job in jobs:
            if job.message_id in done:
                log.info("%s already done within the dedupe window: not run", job.tag(q.name))
        return [job for job in jobs if job.message_id not in done]
