"""Leases: an entry stays this daemon's for as long as its handler runs, however long that is.

Redis counts a pending entry's idle time from its last delivery or claim, and other daemons
take over entries idle for ``lease.reclaim_after`` (see ``reader``). So "idle" must mean "its
owner stopped answering": every ``lease.renew_every`` this daemon renews every entry it holds,
per queue, in one script call (``lua/renew.lua``): one round trip per queue per tick, whatever
the number in flight, and no change to the delivery count.

An entry is *held* from the moment a reader receives it until its outcome is written (or until
the daemon gives it up). An entry the renewal reports lost — acknowledged elsewhere, owned by
another consumer, its data trimmed — is reported to the main loop, which stops its handler and
records nothing for it. A renewal that fails because Redis is away is not a loss: the next tick
tries again, and the margin between ``renew_every`` and ``reclaim_after`` is what it may use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from jobd import janitor, redisconn
from jobd.config import Config, QueueConfig
from jobd.scripts import Scripts

log = logging.getLogger("jobd.lease")


@dataclass(frozen=True, slots=True)
class Lost:
    queue: str
    message_id: str
    owner: str  # the consumer holding it now; '' when none (acknowledged, or data trimmed)


class Holdings:
    """The entries this daemon holds, per queue; shared by readers, loop, recorder and keeper."""

    def __init__(self, queues: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, set[str]] = {q: set() for q in queues}

    def add(self, queue: str, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids[queue].update(ids)

    def discard(self, queue: str, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids[queue].difference_update(ids)

    def snapshot(self, queue: str) -> list[str]:
        with self._lock:
            return list(self._ids[queue])

    def count(self, queue: str) -> int:
        with self._lock:
            return len(self._ids[queue])


def renew(scripts: Scripts, queue: QueueConfig, consumer: str, ids: list[str]) -> list[Lost]:
    """Renew ``ids`` in one script call; returns the ones this consumer no longer holds."""
    try:
        reply = scripts.renew(keys=[queue.stream], args=[queue.group, consumer, *ids])
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        return [Lost(queue.name, mid, "") for mid in ids]  # the group or stream was deleted
    return [
        Lost(queue.name, reply[i].decode(), reply[i + 1].decode()) for i in range(0, len(reply), 2)
    ]


class LeaseKeeper(threading.Thread):
    """Renews every held entry on time, and sweeps away consumers of dead daemons."""

    def __init__(
        self,
        config: Config,
        consumer: str,
        holdings: Holdings,
        on_lost: Callable[[list[Lost]], None],
    ) -> None:
        super().__init__(name="lease-keeper", daemon=True)
        self.config = config
        self.consumer = consumer
        self.holdings = holdings
        self.on_lost = on_lost
        self.client = redisconn.client(config.redis, "jobd-lease")
        self.scripts = Scripts(self.client)
        self.stopping = threading.Event()
        now = time.monotonic()
        self.next_renewal = {name: now for name in config.queues}
        self.next_sweep = now + janitor.first_sweep_delay(config)
        self._outage = False

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.tick(time.monotonic())
                self.stopping.wait(max(0.0, self.next_due() - time.monotonic()))
        finally:
            self.client.close()

    def next_due(self) -> float:
        return min(*self.next_renewal.values(), self.next_sweep)

    def tick(self, now: float) -> None:
        for name, due in self.next_renewal.items():
            if now >= due:
                queue = self.config.queues[name]
                self.next_renewal[name] = now + queue.lease.renew_every
                self._guarded(lambda q=queue: self.renew_queue(q))
        if now >= self.next_sweep:
            self.next_sweep = now + janitor.sweep_interval(self.config)
            for queue in self.config.queues.values():
                self._guarded(
                    lambda q=queue: janitor.sweep(self.client, self.scripts, q, self.consumer)
                )

    def renew_queue(self, queue: QueueConfig) -> None:
        ids = self.holdings.snapshot(queue.name)
        if not ids:
            return
        lost = renew(self.scripts, queue, self.consumer, ids)
        if lost:
            self.holdings.discard(queue.name, [x.message_id for x in lost])
            self.on_lost(lost)

    def _guarded(self, duty: Callable[[], None]) -> None:
        try:
            duty()
        except redisconn.UNAVAILABLE as exc:
            if not self._outage:
                log.warning("Redis unreachable (%s); leases are renewed when it is back", exc)
                self._outage = True
            return
        except Exception:
            log.exception("lease keeper duty failed; trying again on the next tick")
            return
        if self._outage:
            log.info("Redis reachable again; leases renewed")
            self._outage = False
