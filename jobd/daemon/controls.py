"""A reader's poll of its queue's operator controls (``Reader`` mixes it in): twice a second
(``PAUSE_POLL``), in one round trip, whether the queue is paused (`jobd pause`) and its cancel
generation (`jobd cancel` changes it when it marks a job found pending).

While the queue is paused the reader reads and reclaims nothing, holding no slot. When the
generation changed, the reader asks which of the entries its daemon holds were cancelled (one
pipeline of ZSCOREs a level that holds any) and reports them to the loop as a lease renewal
would: their handlers are stopped then, within PAUSE_POLL and two round trips of the cancel,
whatever ``lease.renew_every`` (the renewal reports them too, as a fallback).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from jobd.config import QueueConfig
from jobd.daemon.lease import Holdings
from jobd.daemon.slots import Slots
from jobd.job import Job
from jobd.store.control import Paused
from jobd.store.leases import Lost, key
from jobd.store.store import Store

log = logging.getLogger("jobd.reader")

# Seconds between two askings; no read or wait of a reader blocks past the next one, so no job
# of a paused queue is read later than this after the pause.
PAUSE_POLL = 0.5


class ControlPoll:
    """The pause and cancel poll of a reader: its queue, levels, store, slots and holdings."""

    queue: QueueConfig
    levels: list[QueueConfig]
    consumer: str
    store: Store
    slots: Slots
    holdings: Holdings
    stopping: threading.Event
    deliver: Callable[[QueueConfig, list[Job]], None]
    report: Callable[[list[Lost]], None] | None
    paused: bool
    next_pause_check: float
    cancel_gen: bytes | None

    def held_by_pause(self) -> bool:
        """While the queue is paused (``jobd pause``) read nothing and reclaim nothing, holding
        no slot: asked of Redis every PAUSE_POLL, with the cancel generation."""
        if time.monotonic() >= self.next_pause_check:
            paused, gen = self.store.controls(self.queue)
            self.learn_pause(paused)
            self.learn_cancels(gen)
        if self.paused:
            self.stopping.wait(max(0.0, self.next_pause_check - time.monotonic()))
        return self.paused

    def learn_pause(self, paused: Paused | None) -> None:
        """The queue's pause as just read: asked again PAUSE_POLL from now."""
        if (paused is not None) != self.paused:
            what = f"paused by {paused.by}: reading nothing" if paused else "resumed"
            log.warning("queue=%s %s", self.queue.name, what)
            self.slots.paused = paused is not None
            self.deliver(self.queue, [])  # wakes the loop: it hands back what waits unstarted
        self.paused = self.slots.paused = paused is not None
        self.next_pause_check = time.monotonic() + PAUSE_POLL

    def learn_cancels(self, gen: bytes | None) -> None:
        """The queue's cancel generation as just read: when it moved, ask at once which entries
        this daemon holds were cancelled (one round trip a level that holds any) and report
        them, as a renewal would, so their handlers are stopped now, whatever renew_every."""
        if gen is None or gen == self.cancel_gen or self.report is None:
            return
        for level in self.levels:
            held = self.holdings.snapshot(key(level))
            found = self.store.cancelled_held(level, list(held)) if held else []
            if found:
                self.report([Lost(key(level), mid, self.consumer, cancelled=True,
                                  delivery=held[mid]) for mid in found])  # fmt: skip
        self.cancel_gen = gen
