"""Reading ahead (a queue's ``prefetch``): how many entries its reader may read beyond the free
slots (``Pace``), and the entries that wait in the loop for a slot meanwhile (``Waiting``).

Why: a slot freed by a short handler otherwise stays empty for the reader's XREADGROUP round
trip (on the 2-core build machine, with 8 slots, 6.3 busy on average). An entry read ahead is
started by the loop the moment a slot frees. It is held like a running one: in the lease ledger
from its read (renewed), bound to a cluster-wide slot by ``limits`` like any entry read, and
counted in the queue's ``Slots``: a daemon never has more than ``concurrency + prefetch``
entries of a queue in hand.

The rule. ``prefetch: N`` reads up to N ahead; ``0``, none; ``auto`` (the default) up to the
queue's ``concurrency``, but only while the queue's handlers on this daemon are short: while the
moving average of their run times (EWMA, weight ``ALPHA``: about the last five count) is under
``SHORT``, 50 ms, and not before one has ended. Why 50 ms: the round trip read ahead hides is
about 0.5 ms on a busy host, 1 % of a 50 ms job; past that reading ahead buys little, and holds
jobs another daemon could start now. Either way, an entry not started within ``START_BOUND`` of
its delivery is handed back (any daemon's reclaim takes it at once), and the queue reads ahead no
more until one of its handlers here ends: no slot freed for that long, so no job should wait
here for one. Under ``auto`` the average is raised to that wait too, so it takes about a dozen
short runs to read ahead again. Why 0.5 s: ten times the longest "short" handler, so an entry
read ahead behind short handlers is never handed back for nothing; hundreds of round trips, so
the hand-back and the other daemon's claim cost little beside it; and well under a second, the
reclaim pass of an idle daemon, so a job behind a long one starts elsewhere within about 1.5 s.

Used by the loop's thread only (``admission``); the reader learns the allowance through its
``Slots``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from jobd.config import QueueConfig
from jobd.daemon.handlers import EntryKey, entry_key
from jobd.daemon.inbox import Delivery
from jobd.store.leases import Lost

SHORT = 0.05  # seconds: under ``auto``, handlers shorter than this on average read ahead
ALPHA = 0.2  # the weight of each run in that average
START_BOUND = 0.5  # seconds an entry may wait unstarted before it is handed back


class Pace:
    """How far one queue may read ahead now, from its setting and its handlers' run times."""

    def __init__(self, queue: QueueConfig) -> None:
        self.setting: int | None = queue.prefetch  # None: auto
        self.concurrency = queue.concurrency
        self.average: float | None = None  # the handlers' run time, seconds (EWMA)
        self.held_back = False  # an entry waited START_BOUND: none until a handler ends
        self.published = -1  # the allowance the queue's Slots last got

    def configure(self, queue: QueueConfig) -> None:
        """A reload: the queue's setting and concurrency now; what was learned stays."""
        self.setting, self.concurrency = queue.prefetch, queue.concurrency

    def ended(self, took: float) -> None:
        """One of the queue's handlers ended after ``took`` seconds: a slot freed."""
        self.held_back = False
        last = took if self.average is None else self.average
        self.average = last + ALPHA * (took - last)

    def overdue(self, waited: float) -> None:
        """An entry read ahead waited ``waited`` seconds without a slot freeing."""
        self.held_back = True
        self.average = max(self.average or 0.0, waited)

    def allowed(self) -> int:
        """How many entries the reader may read beyond the free slots now."""
        if self.held_back or self.setting == 0:
            return 0
        if self.setting is not None:
            return self.setting
        short = self.average is not None and self.average < SHORT
        return self.concurrency if short else 0


class Waiting:
    """Entries delivered to the loop and not started, by queue name; each queue's in order of
    its priority levels, then of delivery."""

    def __init__(self) -> None:
        self._queues: dict[str, dict[str | None, deque[Delivery]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, delivery: Delivery) -> None:
        queue = delivery[0]
        levels = self._queues.setdefault(queue.name, {})
        levels.setdefault(queue.priority, deque()).append(delivery)
        self._count += 1

    def names(self) -> list[str]:
        """The queues with entries waiting."""
        return [name for name, levels in self._queues.items() if any(levels.values())]

    def has(self, name: str) -> bool:
        return any(self._queues.get(name, {}).values())

    def forget(self, name: str) -> None:
        """A removed queue with nothing waiting: its name is not kept."""
        if not self.has(name):
            self._queues.pop(name, None)

    def pop(self, name: str, order: Iterable[str | None]) -> Delivery | None:
        """The next entry of queue ``name`` to start: of the first level in ``order`` (the
        levels in force, highest first) that has one, else of any."""
        levels = self._queues.get(name, {})
        for level in (*order, *levels):
            if levels.get(level):
                self._count -= 1
                return levels[level].popleft()
        return None

    def remove(self, key: EntryKey, lost: Lost) -> Delivery | None:
        """The waiting delivery of entry ``key`` (stream, group, message id) that ``lost`` is
        about, taken out."""
        for levels in self._queues.values():
            for entries in levels.values():
                for delivery in entries:
                    if entry_key(delivery[0], delivery[1]) == key and lost.about(delivery[1]):
                        entries.remove(delivery)
                        self._count -= 1
                        return delivery
        return None

    def take(self, name: str | None = None) -> list[Delivery]:
        """Every entry waiting (of queue ``name`` only, when given), taken out."""
        found = []
        for queue, levels in self._queues.items():
            if name is None or queue == name:
                for entries in levels.values():
                    found += entries
                    entries.clear()
        self._count -= len(found)
        return found

    def overdue(self, now: float) -> list[Delivery]:
        """The entries delivered START_BOUND or longer before ``now``, taken out."""
        found = []
        for levels in self._queues.values():
            for entries in levels.values():
                while entries and entries[0][2] + START_BOUND <= now:
                    found.append(entries.popleft())
        self._count -= len(found)
        return found

    def next_due(self) -> float:
        """When the next entry becomes overdue (monotonic); infinity when none waits."""
        firsts = [e[0][2] for levels in self._queues.values() for e in levels.values() if e]
        return min(firsts, default=float("inf")) + START_BOUND
