"""Starting handlers off the main loop, a few at a time.

``posix_spawn`` (like any vfork-based spawn) returns only once the child has called exec, and
on a small machine exec itself takes most of a millisecond. One thread spawning one handler
after another is bounded by that wait (about 850 ``/bin/true`` a second on the 2-core build
machine; two threads about 1500, more than ``xargs -P8``). So the main loop hands each start to
a small, fixed pool of threads (never a thread per job) and gets back the started handler with a
pidfd for its exit, which it watches in its selector: only the loop ever waits for a handler.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.handler import Handler
from jobd.job import Job

log = logging.getLogger("jobd.spawner")

THREADS = min(4, os.cpu_count() or 2)


@dataclass(slots=True)
class Started:
    queue: QueueConfig
    job: Job
    handler: Handler | None  # None when it could not start
    error: BaseException | None = None


class Spawner:
    def __init__(self, done: Callable[[Started], None], threads: int = THREADS) -> None:
        self.done = done  # called from a spawner thread; must be thread-safe and quick
        self.requests: queue.SimpleQueue[tuple[QueueConfig, Job] | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._work, name=f"spawner-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def submit(self, q: QueueConfig, job: Job) -> None:
        self.requests.put((q, job))

    def stop(self) -> None:
        for _ in self.threads:
            self.requests.put(None)
        for thread in self.threads:
            thread.join()

    def _work(self) -> None:
        while (request := self.requests.get()) is not None:
            q, job = request
            try:
                handler = Handler.spawn(job, q)
            except BaseException as exc:  # reported to the loop, which decides the outcome
                self.done(Started(q, job, None, exc))
            else:
                self.done(Started(q, job, handler))
