"""A queue's free handler slots: the loop gives one back when a handler ends, the queue's
reader takes every free one before it reads, and reads no more entries than it took."""

from __future__ import annotations

import threading


class Slots:
    """A queue's free handler slots, shared by its reader and the main loop."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = total
        self._cond = threading.Condition()

    def resize(self, total: int) -> None:
        """A reload changed the concurrency. Free slots may go below zero for a while: handlers
        already running finish, and only then is a new one started."""
        with self._cond:
            self._free += total - self.total
            self.total = total
            self._cond.notify()

    def take_all(self, timeout: float) -> int:
        """Wait up to ``timeout`` for a free slot; take every free slot and return how many."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free > 0, timeout):
                return 0
            taken, self._free = self._free, 0
            return taken

    def give(self, n: int = 1) -> None:
        if n:
            with self._cond:
                self._free += n
                self._cond.notify()
