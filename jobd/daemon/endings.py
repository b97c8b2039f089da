"""A handler's end: reaped, decided (``process.policy``), settled by the loop; its follow-ups
(the JOBD_ENQUEUE file, ``process.followups``) read and parsed on a thread of its own.

A file of 10 000 follow-ups costs a parse of a few hundred milliseconds (it cost a second), and
up to ``max_follow_ups`` lines of any length: paid on the loop, no queue would start or end a
job meanwhile. So the loop only asks whether a handler that succeeded left such a file (one
``lstat``: a handler that writes none costs that, where it cost one failed ``open``); when it
did, the handler's end waits (``pending``) while the thread reads and parses the file, and the
loop then decides and settles it as it would have at once: the same outcome, with its
follow-ups written with the acknowledgement in one step (``store.outcomes``), a refused file
dead-lettering the parent (``enqueue``, with why), a parent that failed reading none (its file
is removed on the loop, as before). Only the decision waits: the handler is out of the table,
its entry still held (renewed) until the recorder writes its outcome; its queue reads a job for
its slot once it is settled (the slot is counted free then, as for any end). The loop stops
only once none is pending (``Daemon.finished``). An error deciding an end (a bug) releases its
entry (``decide``): an end is never left pending, nor the ends parsed behind it. A thread that
cannot start (a task limit) is said, its end released (its file removed), never left asked; the
next file's end starts it again.
The thread rests now and then (``REST``), so that the loop is not slowed to a system call per
switch interval while it parses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections import deque
from collections.abc import Mapping

from jobd.config import QueueConfig
from jobd.daemon.admission import Admission
from jobd.daemon.handlers import Handlers
from jobd.daemon.poller import Poller, Wakeup
from jobd.outcome import FollowUp, Outcome, Verb
from jobd.process import chains, followups, policy
from jobd.process.exitstatus import ExitStatus
from jobd.process.handler import Handler
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.daemon")

# Every ``followups.PACE`` lines the thread sleeps this long, GIL let go: the loop runs meanwhile.
# A thread that never waits keeps the GIL but every 5 ms (``sys.getswitchinterval``), and the
# loop, which lets it go at each system call, waits that long for it again at each.
REST = 0.001


def pause() -> None:
    time.sleep(REST)


Found = tuple[tuple[FollowUp, ...], str | None]  # ``followups.collected``'s
Ending = tuple[Handler, ExitStatus, float, Mapping[str, QueueConfig]]


class Endings:
    """The loop's ``finish`` of a handler, and the thread that reads follow-up files for it."""

    def __init__(self, poller: Poller, running: Handlers, admission: Admission,
                 metrics: Metrics) -> None:  # fmt: skip
        # Each end settled by ``admission.ended`` (its span ended with it), however it ends.
        self.running, self.admission, self.metrics = running, admission, metrics
        self.wakeup = Wakeup()  # the thread's byte: a file parsed
        poller.register(self.wakeup.r, select.EPOLLIN, "endings")
        self.asked: queue.SimpleQueue[Ending] = queue.SimpleQueue()  # the loop's, to the thread
        self.parsed: deque[tuple[Ending, Found]] = deque()  # the thread's, to the loop
        self.pending = 0  # ends waiting for their file (the loop's)
        self.thread: threading.Thread | None = None  # started at the first file

    def finish(self, handler: Handler, queues: Mapping[str, QueueConfig]) -> None:
        """The handler's leader exited: reap it, decide, settle; ``queues``: the config's (its
        follow-ups go to its queues as the config it started under says: ``chains.targets``). An
        error doing so (a bug) releases its entry, its handler out of the table (and reaped) if
        it is not yet: one bad end never takes the others of its pass down (the loop finishes
        each in turn), nor stays in the table (a shutdown waits for an empty one)."""
        try:
            self.ended(handler, chains.targets(handler.started_under, queues))
        except Exception:
            self.running.discard(handler)
            self.release(handler, "finishing it")

    def ended(self, handler: Handler, queues: Mapping[str, QueueConfig]) -> None:
        self.running.remove(handler)
        try:
            status = handler.exited(handler.reap())
        except Exception:
            handler.log(logging.ERROR, "internal error after exit; releasing it")
            log.exception("while finishing pid %d", handler.pid)
            self.released(handler)
            return
        if handler.lapsed:  # never exec'd, past its start's deadline: handed back unstarted
            self.admission.lapsed(handler.queue, handler.job, handler.ending(), handler.span)
            return
        if handler.start_error is not None and handler.ending() is None:
            self.admission.cannot_start(handler.queue, handler.job, handler.start_error,
                                        handler.span)  # fmt: skip
            return
        # Its run: from its start to the pass that saw its exit, not to its leaving, which
        # waits for the channel's thread (``Handlers.exited``, up to LEAVE_WAIT).
        took = (handler.exit_seen or time.monotonic()) - handler.started
        if not policy.succeeded(handler, status) or handler.result_path is None:
            self.decide((handler, status, took, queues), None)  # its file removed, unread
        elif os.path.lexists(followups.path_of(handler.result_path)):
            if self.reader():
                self.pending += 1
                self.asked.put((handler, status, took, queues))
            else:  # never asked of a thread that is not: released, its file removed
                handler.log(logging.ERROR, "its follow-ups cannot be read; releasing it")
                with contextlib.suppress(OSError):
                    os.unlink(followups.path_of(handler.result_path))
                self.released(handler)
        else:
            self.decide((handler, status, took, queues), ((), None))  # no file: none

    def reader(self) -> bool:
        """Whether the thread runs: started at the first file; one that cannot start (a task
        limit: TasksMax, RLIMIT_NPROC) is said, and the next file's end tries again."""
        if self.thread is not None:
            return True
        thread = threading.Thread(target=self.read, name="jobd-follow-ups", daemon=True)
        try:
            thread.start()
        except Exception:
            log.exception("cannot start the thread that reads follow-up files")
            return False
        self.thread = thread  # only once started
        return True

    def take(self) -> None:
        """The ends whose file the thread has read: decided and settled (the loop's)."""
        self.wakeup.drain()  # before the deque: a byte written after this wakes the loop again
        while self.parsed:
            ending, found = self.parsed.popleft()
            self.pending -= 1
            self.decide(ending, found)

    def decide(self, ending: Ending, found: Found | None) -> None:
        """Its outcome decided and settled; an error doing so (a bug) releases its entry, as
        one in its reap does (``finish``): its end is never lost, its slot freed, the ends
        behind it in ``parsed`` decided in the same ``take``."""
        try:
            self.decided(ending, found)
        except Exception:
            self.release(ending[0], "deciding its outcome")

    def release(self, handler: Handler, doing: str) -> None:
        """An internal error ``doing`` something of ``handler``'s end (a bug, being handled):
        said, with its traceback, and its entry released to run again."""
        handler.log(logging.ERROR, "internal error %s; releasing it", doing)
        log.exception("while %s (pid %d)", doing, handler.pid)
        self.released(handler)

    def released(self, handler: Handler) -> None:
        """Its entry released to run again, its attempt's span ended (``Admission.ended``)."""
        outcome = Outcome(Verb.RELEASE, handler.queue, handler.job)
        self.admission.ended(outcome, handler.span, handler.exit_seen)

    def decided(self, ending: Ending, found: Found | None) -> None:
        handler, status, took, queues = ending
        outcome = policy.of_handler(handler, status, took, queues, found)
        self.metrics.of(handler.queue.name).duration.observe(took)
        level = logging.INFO if outcome.verb is Verb.ACK else logging.WARNING
        handler.log(level, "%s after %.3fs%s: %s", status.describe(), took, status.cost(),
                    outcome.describe(), outcome=outcome)  # fmt: skip
        self.admission.ended(outcome, handler.span, handler.exit_seen, took)

    def read(self) -> None:
        """The thread: each file read, removed and parsed, in the order the loop asked."""
        while True:
            ending = self.asked.get()
            handler, _, _, queues = ending
            try:
                found = followups.collected(handler.result_path, handler.job, handler.queue,
                                            queues, True, handler.uid, pause)  # fmt: skip
            except Exception as exc:  # a bug: the parent fails, its end is never lost
                log.exception("while reading the follow-ups of pid %d", handler.pid)
                found = (), f"JOBD_ENQUEUE: not read ({exc!r})"
            self.parsed.append((ending, found))
            self.wakeup.wake()
