"""What other threads hand to the loop, through queues: jobs read (reader threads) and entries
whose lease was lost (the lease renewal, on the ticker thread). Each hand-over wakes the loop;
the loop alone takes from them, and alone keeps the memory of lost entries not started yet.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

from jobd.config import QueueConfig
from jobd.daemon.handlers import EntryKey, entry_key
from jobd.daemon.lease import Lost
from jobd.daemon.poller import Wakeup
from jobd.job import Job

LOST_MEMORY = 60.0  # seconds a lost entry that no handler runs is remembered, not to start it
Delivery = tuple[QueueConfig, Job, float]  # a job read, with when (monotonic)


class Inbox:
    def __init__(self) -> None:
        self.wakeup = Wakeup()
        self.delivered: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self.lost: queue.SimpleQueue[Lost] = queue.SimpleQueue()
        # Entries reported lost that no handler runs: if still to be started, they are not.
        self.lost_unstarted: dict[EntryKey, tuple[float, Lost]] = {}

    # -- other threads --------------------------------------------------------------------

    def deliver(self, queue: QueueConfig, jobs: list[Job]) -> None:
        """A reader's jobs, each with the queue (or level) they were read from."""
        now = time.monotonic()
        for job in jobs:
            self.delivered.put((queue, job, now))
        self.wakeup.wake()

    def report_lost(self, lost: list[Lost]) -> None:
        """Entries this daemon no longer holds (lease renewal)."""
        for item in lost:
            self.lost.put(item)
        self.wakeup.wake()

    # -- the loop -------------------------------------------------------------------------

    def has_deliveries(self) -> bool:
        return not self.delivered.empty()

    def deliveries(self) -> Iterator[Delivery]:
        while not self.delivered.empty():
            yield self.delivered.get_nowait()

    def losses(self) -> Iterator[Lost]:
        self.wakeup.drain()
        while not self.lost.empty():
            yield self.lost.get_nowait()

    def lost_unstarted_at(self, lost: Lost, now: float) -> None:
        """A lost (or cancelled) entry no handler runs: maybe delivered and not started yet."""
        self.lost_unstarted[(*lost.key, lost.message_id)] = (now, lost)
        cutoff = now - LOST_MEMORY
        for old in [k for k, (at, _) in self.lost_unstarted.items() if at < cutoff]:
            del self.lost_unstarted[old]  # settled before the report came: nothing to skip

    def lost_before(self, queue: QueueConfig, job: Job, delivered_at: float) -> Lost | None:
        """The report on this delivery of the entry, if it was reported lost or cancelled (a
        later delivery of the same entry, claimed back after its new owner died, was not)."""
        key = entry_key(queue, job)
        at, lost = self.lost_unstarted.get(key, (None, None))
        if at is None or lost is None or not lost.about(job):
            return None
        if not (lost.delivery and job.delivery) and delivered_at > at:
            return None
        del self.lost_unstarted[key]
        return lost
