"""A queue's free handler slots, and how far its reader may read beyond them (``prefetch``):
the loop gives a slot back when an entry it held is settled (its handler ended, or it was handed
back, cancelled or lost unstarted), the queue's reader takes every free one before it reads,
and reads no more entries than it took. So the entries a daemon has in hand for a queue (read
and not settled: running, or waiting in the loop for a slot) never outnumber ``concurrency``
plus the read-ahead allowed when they were read (``daemon.prefetch``)."""

from __future__ import annotations

import threading


class Slots:
    """A queue's free handler slots, shared by its reader and the main loop."""

    def __init__(self, total: int) -> None:
        self.total = total
        # Slots minus the entries in hand; below zero while entries read ahead wait for a slot
        # (or for a while after a reload lowered the concurrency).
        self._free = total
        self._ahead = 0  # entries the reader may read beyond the slots now (the loop sets it)
        self._cond = threading.Condition()
        # Whether the queue is paused, as its reader last learned (``jobd pause``): the loop
        # starts none of its entries then, and hands back those waiting.
        self.paused = False

    def resize(self, total: int) -> None:
        """A reload changed the concurrency. Free slots may go below zero for a while: handlers
        already running finish, and only then is a new one started."""
        with self._cond:
            self._free += total - self.total
            self.total = total
            self._cond.notify()

    def read_ahead(self, ahead: int) -> None:
        """From now on the reader may read up to ``ahead`` entries beyond the free slots."""
        with self._cond:
            self._ahead = ahead
            self._cond.notify()

    def take_all(self, timeout: float) -> int:
        """Wait up to ``timeout`` for room (a free slot, or read-ahead not used); take it all
        and return how much."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free + self._ahead > 0, timeout):
                return 0
            taken = self._free + self._ahead
            self._free -= taken
            return taken

    def give(self, n: int = 1) -> None:
        if n:
            with self._cond:
                self._free += n
                self._cond.notify()
