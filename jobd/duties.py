"""Periodic duties on one thread and one Redis connection: lease renewal, moving due jobs,
trimming streams, removing dead consumers. Each duty is a small object with an ``interval``
and a ``tick()``; the ticker runs each on time, and a duty that fails because Redis is away
is retried on its next tick (logged once per outage, not once per tick).

The ticker stops last at shutdown (see ``daemon``): leases must be renewed until every
handler has ended and every outcome is written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from jobd import redisconn

log = logging.getLogger("jobd.duties")


class Duty(Protocol):
    name: str
    interval: float  # seconds between two ticks

    def tick(self) -> None: ...


class Ticker(threading.Thread):
    def __init__(self, duties: Sequence[Duty]) -> None:
        super().__init__(name="ticker", daemon=True)
        self.duties = list(duties)
        self.next_at = [0.0] * len(self.duties)
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # the duty list is replaced on reload, from the main loop
        self._failing: set[str] = set()  # duties whose last tick found Redis away

    def stop(self) -> None:
        self.stopping.set()

    def replace(self, duties: Sequence[Duty]) -> None:
        """A new list of duties; each runs soon, then on its own interval."""
        with self._lock:
            self.duties = list(duties)
            self.next_at = [0.0] * len(self.duties)

    def run(self) -> None:
        while not self.stopping.is_set():
            self.run_due(time.monotonic())
            with self._lock:
                soonest = min(self.next_at, default=time.monotonic() + 1.0)
            self.stopping.wait(max(0.0, soonest - time.monotonic()))

    def run_due(self, now: float) -> None:
        with self._lock:
            due = [(i, d) for i, d in enumerate(self.duties) if now >= self.next_at[i]]
            for i, duty in due:
                self.next_at[i] = now + duty.interval
            duties = self.duties
        for _, duty in due:
            if self.duties is not duties:
                return  # replaced meanwhile: the new list runs on the next pass
            self._guarded(duty)

    def _guarded(self, duty: Duty) -> None:
        try:
            duty.tick()
        except redisconn.UNAVAILABLE as exc:
            if not self._failing:
                log.warning("Redis unreachable (%s); periodic duties resume when it is back", exc)
            self._failing.add(duty.name)
            return
        except Exception:
            log.exception("%s failed; trying again on its next tick", duty.name)
            return
        if duty.name in self._failing:
            self._failing.discard(duty.name)
            if not self._failing:
                log.info("Redis reachable again; periodic duties resumed")
