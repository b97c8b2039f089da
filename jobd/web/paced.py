"""Renders the web server's workers make in a daemon's process, shared and spaced so that a
client asking again and again takes a bounded share of the process's time from its main loop
(which starts, reaps and settles every job, and needs the GIL to do it).

``Paced.get`` makes one render at a time; a request that arrives while one is made, or waits
to be, shares the next one, and the next render begins only once the last one's CPU time
(the rendering thread's, ``time.thread_time``: not what it spent waiting for Redis) times
``1 / SHARE - 1`` has passed: renders take at most SHARE of a CPU whatever is asked, and
everyone waiting is answered by the same one. A render's answer serves every request that
arrives up to ``keep`` seconds after it began: ``METRICS_KEEP`` for /metrics (Prometheus
scrapes 15 s apart); 0 for the dashboard's summaries, whose answer is never older than the
request (an action's effect is seen at the next refresh).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

SHARE = 0.25  # of a CPU the renders of one kind may take, however many ask at once
METRICS_KEEP = 1.0  # seconds a rendered /metrics serves every request for
KINDS = 4  # answers kept at once (/metrics: one per format asked, text or OpenMetrics, gzip)
# /metrics answers a second at most, however many ask: each is ~270 KiB for 50 queues, sent by
# the server's one loop thread in the daemon's process (a Prometheus scrapes once in 15 s).
METRICS_RATE = 20

T = TypeVar("T")


class Paced(Generic[T]):
    """Renders of one kind (a path's answer), one at a time, taking at most ``share`` of a
    CPU, each serving the requests that arrive up to ``keep`` seconds after it began."""

    def __init__(
        self, keep: float = 0.0, share: float = SHARE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.keep, self.rest, self.clock = keep, 1 / share - 1, clock
        self.lock = threading.Lock()
        self.kept: dict[Hashable, tuple[float, T]] = {}  # by key: when its render began, it
        self.next = 0.0  # the clock's time before which no render begins

    def get(self, key: Hashable, render: Callable[[], T]) -> T:
        """``render()``'s answer for ``key``: one begun less than ``keep`` seconds before
        this call, or after it (shared), else a new one, begun once the pace allows."""
        asked = self.clock()
        with self.lock:
            kept = self.kept.get(key)
            if kept is not None and kept[0] > asked - self.keep:
                return kept[1]
            time.sleep(max(0.0, self.next - self.clock()))  # the others wait their turn
            began, cpu = self.clock(), time.thread_time()
            try:
                answer = render()
            finally:
                self.next = self.clock() + (time.thread_time() - cpu) * self.rest
            self.kept.pop(key, None)
            if len(self.kept) >= KINDS:
                del self.kept[next(iter(self.kept))]  # the one kept longest
            self.kept[key] = (began, answer)
            return answer


class Spaced:
    """Answers of one path, ``rate`` a second at most: each waits for its turn, its worker
    sleeping (holding no GIL), so clients asking again and again on any number of connections
    cost the server a bounded number of answers to make and send; the requests past the
    workers wait in their queue, shed at the connection cap (``server._WSGIServer._victim``)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.gap, self.clock = 1 / rate, clock
        self.lock = threading.Lock()
        self.turn = 0.0  # the clock's time of the next answer's turn

    def wait(self) -> float:
        """Sleep until this answer's turn (at once when none was given for 1 / rate s);
        returns the seconds slept."""
        with self.lock:
            now = self.clock()
            turn = max(now, self.turn)
            self.turn = turn + self.gap
        time.sleep(turn - now)
        return turn - now
