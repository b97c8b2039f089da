"""Leases: an entry stays this daemon's for as long as its handler runs, however long that is.

Redis counts a pending entry's idle time from its last delivery or claim, and other daemons take
over entries idle for ``lease.reclaim_after`` (see ``reader``). So "idle" must mean "its owner
stopped answering": every ``lease.renew_every`` this daemon renews every entry it holds, per queue,
in one script call (``Store.renew``, ``lua/renew.lua``): one round trip per queue per tick, whatever
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

import itertools
import logging
import os
import secrets
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace

from jobd.config import QueueConfig
from jobd.store.leases import LeaseKey, Lost, key
from jobd.store.store import Store

log = logging.getLogger("jobd.lease")


_process_tag = ""  # "-p2" in the second daemon of a supervisor's (``name_process``)


def name_process(index: int) -> None:
    """This process is daemon ``index`` of a supervisor's (``processes``): its consumer name
    ends in ``-pINDEX``, so one host's daemons read as such. Called once, before the daemon
    is made (``daemon.child``)."""
    global _process_tag
    _process_tag = f"-p{index}"


def consumer_name() -> str:
    """A daemon's name in every consumer group, unique per process, and readable: which host
    and pid holds a job (and which of the host's daemons it is: ``name_process``)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}{_process_tag}"


class Holdings:
    """The entries this daemon holds, by (stream, group): ``store.leases.key``; shared by
    readers, loop, recorder and ticker. Keyed by stream and group rather than queue name, so a
    queue whose stream changes on reload keeps renewing the entries it read from the old one
    until they are settled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[LeaseKey, dict[str, int]] = defaultdict(dict)  # id -> its delivery
        self._numbers = itertools.count(1)
        # Entries handed back whose hand-back Redis has not answered yet (kept while it is away):
        # a reclaim of one by this daemon is the hand-back's claim too (reclaim.lua).
        self._backs: dict[LeaseKey, set[str]] = defaultdict(set)

    def add(self, key: LeaseKey, ids: Iterable[str]) -> list[int]:
        """Hold ``ids`` from now on; each one's delivery number (``Job.delivery``)."""
        with self._lock:
            held = self._ids[key]
            numbers = []
            for mid in ids:
                held[mid] = number = next(self._numbers)
                numbers.append(number)
            return numbers

    def discard(self, key: LeaseKey, ids: Iterable[str], deliveries: Iterable[int]) -> None:
        """Forget ``ids``, each only while its delivery (a number each; 0: any) holds it: one
        this daemon has claimed again since is the new delivery's."""
        with self._lock:
            held = self._ids[key]
            for mid, number in zip(ids, deliveries, strict=True):
                if not number or held.get(mid) == number:
                    held.pop(mid, None)

    def handing_back(self, key: LeaseKey, message_id: str, delivery: int) -> None:
        """A hand-back of that delivery is sent: the entry is forgotten, and on its way back."""
        self.discard(key, [message_id], [delivery])
        with self._lock:
            self._backs[key].add(message_id)

    def handed_back(self, key: LeaseKey, ids: Iterable[str]) -> None:
        """Redis answered these hand-backs (applied, or left alone), or they were given up."""
        with self._lock:
            self._backs[key].difference_update(ids)

    def on_their_way_back(self, key: LeaseKey) -> list[str]:
        """The entries whose hand-back has not been answered yet, and not held again."""
        with self._lock:
            return sorted(self._backs[key] - self._ids[key].keys())

    def holds(self, key: LeaseKey, message_id: str) -> bool:
        with self._lock:
            return message_id in self._ids.get(key, ())

    def snapshot(self, key: LeaseKey) -> dict[str, int]:
        """The entries held, each with its delivery number."""
        with self._lock:
            return dict(self._ids[key])


class Renewal:
    """The duty that renews one queue's leases every ``lease.renew_every``, as the store's
    consumer (``Store.renew``: one script call for them all)."""

    def __init__(
        self,
        store: Store,
        queue: QueueConfig,
        holdings: Holdings,
        on_lost: Callable[[list[Lost]], None],
    ) -> None:
        self.name = f"lease renewal of {queue.stream} ({queue.group})"
        self.interval = queue.lease.renew_every
        self.store = store
        self.queue = queue
        self.holdings = holdings
        self.on_lost = on_lost

    def tick(self) -> None:
        held = self.holdings.snapshot(key(self.queue))
        if not held:
            return
        lost = self.store.renew(self.queue, list(held))
        if lost:  # a cancelled entry is still held: its outcome ('cancelled') is to be written
            # Each report names the delivery it is about: the entry may have been handed back
            # and claimed again by this daemon while the call was under way (read ahead).
            lost = [replace(x, delivery=held.get(x.message_id, 0)) for x in lost]
            gone = [x for x in lost if not x.cancelled]
            self.holdings.discard(key(self.queue), [x.message_id for x in gone],
                                  [x.delivery for x in gone])  # fmt: skip
            self.on_lost(lost)


def renewals(
    store: Store, queue: QueueConfig, holdings: Holdings, on_lost: Callable[[list[Lost]], None]
) -> dict[LeaseKey, Renewal]:
    """A queue's lease renewals, by where the leases live: one per stream."""
    return {key(q): Renewal(store, q, holdings, on_lost) for q in queue.all_levels()}
