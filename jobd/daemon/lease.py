"""Leases: an entry stays this daemon's for as long as its handler runs, however long that is.

Redis counts a pending entry's idle time from its last delivery or claim, and other daemons
take over entries idle for ``lease.reclaim_after`` (see ``reader``). So "idle" must mean "its
owner stopped answering": every ``lease.renew_every`` this daemon renews every entry it holds,
per queue, in one script call (``lua/renew.lua``): one round trip per queue per tick, whatever
the number in flight, and no change to the delivery count.

An entry is *held* from the moment a reader receives it until its outcome is written (or until
the daemon gives it up). An entry the renewal reports lost — acknowledged elsewhere, owned by
another consumer, its data trimmed, or handed back by this daemon's recorder while the tick
was under way (a renewal never takes a hand-back back) — is reported to the main loop, which
stops its handler and records nothing for it. A renewal that fails because Redis is away is
not a loss: the next tick tries again, and the margin between ``renew_every`` and
``reclaim_after`` is what it may use. Slots' expiries are counted on Redis's clock (see
``limits``): the renewal passes the lease's length, not a time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from jobd.config import QueueConfig
from jobd.daemon import limits
from jobd.store.scripts import Scripts

log = logging.getLogger("jobd.lease")


LeaseKey = tuple[str, str]  # (stream, group): where an entry's lease lives


def key(queue: QueueConfig) -> LeaseKey:
    return (queue.stream, queue.group)


@dataclass(frozen=True, slots=True)
class Lost:
    key: LeaseKey
    message_id: str
    owner: str  # the consumer holding it now; '' when none (acknowledged, trimmed, handed back)


class Holdings:
    """The entries this daemon holds, by (stream, group); shared by readers, loop, recorder and
    ticker. Keyed by stream and group rather than queue name, so a queue whose stream changes
    on reload keeps renewing the entries it read from the old one until they are settled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[LeaseKey, set[str]] = defaultdict(set)

    def add(self, key: LeaseKey, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids[key].update(ids)

    def discard(self, key: LeaseKey, ids: Iterable[str]) -> None:
        with self._lock:
            self._ids[key].difference_update(ids)

    def snapshot(self, key: LeaseKey) -> list[str]:
        with self._lock:
            return list(self._ids[key])


def renew(scripts: Scripts, queue: QueueConfig, consumer: str, ids: list[str]) -> list[Lost]:
    """Renew ``ids`` in one script call, with their cluster-wide slots when the queue has a
    limit; returns the ones this consumer no longer holds."""
    keys = [queue.stream, queue.keys.running] if queue.slots else [queue.stream]
    lease_ms = limits.slot_lease_ms(queue)
    try:
        reply = scripts.renew(keys=keys, args=[queue.group, consumer, lease_ms, *ids])
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        return [Lost(key(queue), mid, "") for mid in ids]  # the group or stream was deleted
    return [
        Lost(key(queue), reply[i].decode(), os.fsdecode(reply[i + 1]))  # owner: any bytes
        for i in range(0, len(reply), 2)
    ]


class Renewal:
    """The duty that renews one queue's leases every ``lease.renew_every``."""

    def __init__(
        self,
        scripts: Scripts,
        queue: QueueConfig,
        consumer: str,
        holdings: Holdings,
        on_lost: Callable[[list[Lost]], None],
    ) -> None:
        self.name = f"lease renewal of {queue.stream} ({queue.group})"
        self.interval = queue.lease.renew_every
        self.scripts = scripts
        self.queue = queue
        self.consumer = consumer
        self.holdings = holdings
        self.on_lost = on_lost

    def tick(self) -> None:
        ids = self.holdings.snapshot(key(self.queue))
        if not ids:
            return
        lost = renew(self.scripts, self.queue, self.consumer, ids)
        if lost:
            self.holdings.discard(key(self.queue), [x.message_id for x in lost])
            self.on_lost(lost)
