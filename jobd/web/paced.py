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
request (an action's effect is seen at the next refresh). A render that fails (Redis away: a
socket timeout of 10 s) fails every request that waited for it, at once, as an answer would
serve them; the next request renders again. A request waits behind a render of its own key
only: the pace is waited for by the render to be made, holding no lock a kept copy needs.
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


class _Made(Generic[T]):
    """A render made: when it began and ended, and its answer or the error it raised."""

    def __init__(self, began: float, ended: float, answer: T | None, error: BaseException | None):
        self.began, self.ended, self.answer, self.error = began, ended, answer, error

    def serves(self, asked: float, keep: float) -> bool:
        """Whether it answers a request made at ``asked``: an answer, one made up to ``keep``
        seconds after it began (keep 0: one made before, that waited for it); an error, one
        made before it ended (it waited for this render), never the next."""
        return asked < self.ended if self.error is not None else asked < self.began + keep

    def result(self) -> T:
        if self.error is not None:
            raise self.error  # the same error to each (as concurrent.futures does)
        return self.answer  # type: ignore[return-value]


class Paced(Generic[T]):
    """Renders of one kind (a path's answer), one at a time, taking at most ``share`` of a
    CPU, each serving the requests that arrive up to ``keep`` seconds after it began (or, when
    it fails, those that waited for it). A request for a key whose render is under way waits
    for that render alone (``changed``), never behind another key's pace or render: a render
    waits for its turn (``turn``) holding nothing a kept copy's reader needs."""

    def __init__(
        self, keep: float = 0.0, share: float = SHARE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.keep, self.rest, self.clock = keep, 1 / share - 1, clock
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # a render ended: its waiters look again
        self.turn = threading.Lock()  # held by the render made (and its wait for the pace)
        self.kept: dict[Hashable, _Made[T]] = {}  # by key: its last render
        self.making: set[Hashable] = set()  # the keys whose render is under way
        self.next = 0.0  # the clock's time before which no render begins

    def get(self, key: Hashable, render: Callable[[], T]) -> T:
        """``render()``'s answer for ``key``: one begun less than ``keep`` seconds before
        this call, or after it (shared), else a new one, begun once the pace allows. A render
        that raises raises in every request that waited for it; the next one renders again."""
        asked = self.clock()
        with self.lock:
            while True:
                kept = self.kept.get(key)
                if kept is not None and kept.serves(asked, self.keep):
                    return kept.result()
                if key not in self.making:
                    break
                self.changed.wait()
            self.making.add(key)
        made: _Made[T] | None = None
        try:
            made = self._render(render)
        finally:
            with self.lock:
                self.making.discard(key)
                if made is not None:
                    self.kept.pop(key, None)
                    if len(self.kept) >= KINDS:
                        del self.kept[next(iter(self.kept))]  # the one kept longest
                    self.kept[key] = made
                self.changed.notify_all()
        assert made is not None  # else its exception went on
        return made.result()

    def _render(self, render: Callable[[], T]) -> _Made[T]:
        """One render, in its turn: once the last one's CPU time times ``rest`` has passed."""
        with self.turn:
            time.sleep(max(0.0, self.next - self.clock()))  # the other keys' renders wait
            began, cpu = self.clock(), time.thread_time()
            answer: T | None = None
            error: Exception | None = None
            try:
                answer = render()
            except Exception as exc:  # shared with the requests that waited for it
                error = exc
            self.next = self.clock() + (time.thread_time() - cpu) * self.rest
            return _Made(began, self.clock(), answer, error)


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
