"""Periodic duties on one thread and one Redis connection: lease renewal, moving due jobs,
trimming streams, removing dead consumers. Each duty is a small object with an ``interval``
and a ``tick()``; the ticker runs each on time, and a duty that fails because Redis is away
is retried on its next tick (logged once per outage, not once per tick). A duty that fails
otherwise is retried too: its error is logged with its traceback when it first occurs or
changes, then at most once per ``REPEAT_LOG_EVERY`` with a count, and its recovery once.

The ticker stops last at shutdown (see ``daemon``): leases must be renewed until every
handler has ended and every outcome is written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from jobd.store import connection as redisconn

log = logging.getLogger("jobd.duties")

REPEAT_LOG_EVERY = 60.0  # seconds between two log lines for a duty failing the same way


class Duty(Protocol):
    name: str
    interval: float  # seconds between two ticks

    def tick(self) -> None: ...


@dataclass
class Failing:
    """How a duty keeps failing: the error (its type and message) and how often."""

    error: str
    logged_at: float  # time.monotonic() of the last line about it
    count: int = 1  # ticks failed this way
    unlogged: int = 0  # of them, since the last line


class Ticker(threading.Thread):
    def __init__(self, duties: Sequence[Duty]) -> None:
        super().__init__(name="ticker", daemon=True)
        self.duties = list(duties)
        self.next_at = [0.0] * len(self.duties)
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # the duty list is replaced on reload, from the main loop
        self._failing: set[str] = set()  # duties whose last tick found Redis away
        self._errors: dict[str, Failing] = {}  # duties whose last tick failed otherwise

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
        except Exception as exc:
            self._failed(duty.name, exc)
            return
        self._recovered(duty.name)
        if duty.name in self._failing:
            self._failing.discard(duty.name)
            if not self._failing:
                log.info("Redis reachable again; periodic duties resumed")

    def _failed(self, name: str, exc: Exception) -> None:
        """Log a duty's error with its traceback when it is new, else now and then."""
        error, now = f"{type(exc).__name__}: {exc}", time.monotonic()
        known = self._errors.get(name)
        if known is None or known.error != error:
            self._errors[name] = Failing(error, now)
            log.exception("%s failed; trying again on its next tick", name)
            return
        known.count, known.unlogged = known.count + 1, known.unlogged + 1
        if now - known.logged_at >= REPEAT_LOG_EVERY:
            log.error("%s still failing (%d more time(s), %d in all): %s",
                      name, known.unlogged, known.count, error)  # fmt: skip
            known.logged_at, known.unlogged = now, 0

    def _recovered(self, name: str) -> None:
        known = self._errors.pop(name, None)
        if known is not None:
            log.info("%s works again, after failing %d time(s)", name, known.count)
