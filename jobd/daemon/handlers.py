"""The handlers one loop runs: found by pid or by entry, counted by queue, their descriptors in
the loop's poller, when the next one must act (its timeout, or SIGKILL after SIGTERM), which
have run long enough (ACTIVE_AFTER) for their jobs' active records (``long_running``), and the
processes that escaped their handler's group, ended once their job has (``process.reaper``);
and their channel, the one socket their NOTIFY_SOCKET names (``daemon.channel``).

Used by the loop's thread only; the metrics thread reads ``in_queue`` one key at a time (an
int the loop replaces whole), and the channel's thread looks a pid up in ``by_pid``, or a cgroup
up in ``in_cgroup`` (``CgroupFinder``: a ``dict.get`` or two, each whole under the GIL).
"""

from __future__ import annotations

import functools
import logging
import os
import select
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator

from jobd.config import QueueConfig
from jobd.daemon.channel import LEAVE_WAIT, Channel, Mark
from jobd.daemon.poller import Poller
from jobd.job import Job
from jobd.process import cgroup, containment, memory, reaper, results, where
from jobd.process.handler import Handler, StopReason
from jobd.process.procfs import Sessions
from jobd.store.leases import Lost
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.daemon")

EntryKey = tuple[str, str, str]  # (stream, group, message id)
# Seconds a handler runs before its job's active record is written (`jobd job`, the dashboard's
# running jobs): a job that ends sooner costs nothing for it, so short jobs run as fast.
ACTIVE_AFTER = 0.5


def entry_key(queue: QueueConfig, job: Job) -> EntryKey:
    return (queue.stream, queue.group, job.message_id)


def delivery(handler: Handler) -> reaper.Delivery:
    """A handler's delivery, as its environment says it (JOBD_QUEUE, JOBD_STREAM,
    JOBD_MESSAGE_ID): what its escaped processes are known by."""
    q = handler.queue
    return os.fsencode(q.name), os.fsencode(q.stream), handler.job.message_id.encode()


class Handlers:
    def __init__(self, poller: Poller, metrics: Metrics | None = None) -> None:
        self.poller = poller
        self.metrics = metrics
        self.channel = Channel(metrics)  # their NOTIFY_SOCKET (``daemon.channel``)
        poller.register(self.channel.wakeup.r, select.EPOLLIN, "channel")  # its thread's bytes
        self.in_cgroup = CgroupFinder()  # their cgroups, kept as they enter and leave
        self.by_pid: dict[int, Handler] = {}
        self.by_entry: dict[EntryKey, Handler] = {}
        self.in_queue: Counter[str] = Counter()
        self.next_due = float("inf")  # earliest time a handler must act
        self.started: deque[tuple[float, Handler]] = deque()  # by start: when ACTIVE_AFTER ends
        self.reaper = reaper.Reaper()
        self.next_sample = 0.0  # when resources.memory is next sampled (process.memory)
        self.tree: cgroup.Tree | None = None  # where handlers get a cgroup each, if anywhere
        self.scan = (-1.0, Sessions())  # ``sessions``: when read, and what
        # Exited, waiting for their channel (``exited``), by pid: with the mark they wait for.
        self.leaving: dict[int, tuple[Handler, Mark | None]] = {}

    def contain(self, queues: Iterable[QueueConfig], setting: str) -> bool:
        """Become the child subreaper (a handler's escaped processes become this process's:
        ``process.reaper``), take the cgroup ``setting`` gives (``process.cgroup``), and say which
        containment applies. False, said in the log, when a queue's resources cannot be
        enforced here. Once, by the daemon's process (an in-process test stays what it is)."""
        queues = list(queues)
        subreaper = self.reaper.enabled = reaper.become_subreaper()
        found = where.find(setting)
        if isinstance(found, where.Found):
            try:
                self.tree = cgroup.Tree.take(found)
                found = self.tree.found
            except OSError as exc:
                found = f"{found.root}: {exc.strerror or exc}"
        containment.ACTIVE = found
        if isinstance(found, str) and setting not in ("auto", "off"):
            log.error("cannot use cgroup: %s (%s); not starting", setting, found)
            return False
        for line in containment.describe(queues, subreaper, found):  # `jobd validate` says it too
            log.debug("%s", line)
        refused = containment.unenforced(queues, found)
        for line in refused:
            log.error("%s", line)
        return not refused

    def __len__(self) -> int:
        return len(self.by_pid)

    def __iter__(self) -> Iterator[Handler]:
        return iter(self.by_pid.values())

    def add(self, handler: Handler) -> None:
        handler.strays = functools.partial(self.reaper.of, delivery(handler))  # stopped with it
        self.by_pid[handler.pid] = handler
        self.in_cgroup.enter(handler)
        self.by_entry[entry_key(handler.queue, handler.job)] = handler
        self.in_queue[handler.queue.name] += 1
        self.poller.watch_handler(handler)
        self.next_due = min(self.next_due, handler.due)
        self.started.append((handler.started + ACTIVE_AFTER, handler))

    def listen(self) -> None:
        """Their channel's thread starts (``daemon.channel``), with the loop."""
        self.channel.start(self.by_pid, self.in_cgroup if self.tree is not None else None)

    def hear(self, now: float) -> None:
        """What their channel's thread read, each message to its sender's handler
        (``daemon.channel``); one may make its handler due sooner (its watchdog). A watchdog
        that waited for the channel is looked at again."""
        for handler in self.channel.take(self.by_pid):
            self.next_due = min(self.next_due, handler.due)
        if self.channel.awaited:
            self.channel.awaited = False
            self.next_due = min(self.next_due, now)

    def exited(self, handlers: list[Handler]) -> None:
        """Their leaders exited: each stays in the table, unreaped (a zombie is still its
        session's, and alive by its pidfd: its messages are its own), until the channel's
        thread has queued what it sent before (``Channel.mark``, one for a pass's; ``left``).
        Meanwhile it is not acted on (its timeout, its SIGKILL) nor stopped (but for a lost
        lease, noted): it ended by itself."""
        mark, now = self.channel.mark(), time.monotonic()
        for handler in handlers:
            handler.exit_seen = now  # its run's end (``Endings.finish``), not its leaving
            self.poller.unregister(handler.pidfd)  # its exit said once
            self.leaving[handler.pid] = (handler, mark)
        if mark is not None:
            self.next_due = min(self.next_due, mark[0] + LEAVE_WAIT)

    def left(self, now: float) -> list[Handler]:
        """The handlers that exited whose messages are all taken now, in the order they
        exited: for the loop to finish (reap, decide, settle), and ``remove``."""
        ready: list[Handler] = []
        last = None  # a pass's handlers share a mark
        for handler, mark in self.leaving.values():  # marks in order: past ones first
            if mark is not None and mark is not last and not self.channel.past(mark, now):
                break
            ready.append(handler)
            last = mark
        if ready:
            self.hear(now)  # after ``past``: what was queued before it said so
            for handler in ready:
                del self.leaving[handler.pid]
        return ready

    def remove(self, handler: Handler) -> None:
        """Its leader has exited: out of the table, and out of the channel's reach (``left``
        first)."""
        del self.by_pid[handler.pid]
        self.in_cgroup.leave(handler)
        if handler.stop_reason is StopReason.WATCHDOG and self.metrics is not None:
            self.metrics.of(handler.queue.name).watchdogged.inc()
        key = entry_key(handler.queue, handler.job)
        if self.by_entry.get(key) is handler:
            del self.by_entry[key]
        self.in_queue[handler.queue.name] -= 1
        if not self.in_queue[handler.queue.name]:  # a renamed queue's name is not kept
            del self.in_queue[handler.queue.name]
        self.poller.forget_handler(handler)

    def discard(self, handler: Handler) -> None:
        """An error finishing it (``Endings.finish``): out of the table if it is still there,
        and reaped if it was not (a zombie holds its pid, its group, its slot's processes)."""
        if self.by_pid.get(handler.pid) is handler:
            try:
                self.remove(handler)
            except Exception:
                log.exception("while removing pid %d", handler.pid)
                self.by_pid.pop(handler.pid, None)
        if self.by_entry.get(key := entry_key(handler.queue, handler.job)) is handler:
            del self.by_entry[key]
        if handler.usage is None:  # its reap's errors are ``finish``'s: it never got there
            try:
                handler.reap()
            except Exception:
                log.exception("while reaping pid %d", handler.pid)

    def long_running(self, now: float) -> list[Handler]:
        """The handlers still running that reached ACTIVE_AFTER since the last call."""
        found = []
        while self.started and self.started[0][0] <= now:
            handler = self.started.popleft()[1]
            if self.by_pid.get(handler.pid) is handler:
                found.append(handler)
        return found

    def sample_memory(self, now: float) -> None:
        """Stop the handlers whose tree is over their queue's resources.memory (sampled: see
        ``process.memory``); only handlers of queues that set it are looked at."""
        self.next_sample = now + memory.SAMPLE_EVERY
        capped = [(h.pid, h.queue.resources.memory, self.reaper.of(delivery(h))) for h in self
                  if h.queue.resources.memory is not None and h.stop_reason is None
                  and h.pid not in self.leaving
                  and not (h.placed and h.placed[1].caps_memory)]  # fmt: skip
        for pid, used in memory.over(capped):  # type: ignore[arg-type]
            handler = self.by_pid[pid]
            cap = handler.queue.resources.memory or 0
            handler.log(logging.WARNING, "its processes use %.1fMiB, over resources.memory "
                        "%.1fMiB; stopping it", used / 2**20, cap / 2**20)  # fmt: skip
            self.stop(handler, StopReason.MEMORY, now)

    def close(self) -> None:
        """The daemon stops: what escaped a handler's group, attributed or not, is ended (no
        job runs any more), so nothing a job started outlives the daemon; nor do the result
        files a process of a job made after its end."""
        self.reaper.sweep(0.0, set(self.by_pid), {delivery(h) for h in self}, final=True)
        results.FOLDERS.close()
        if self.tree is not None:
            self.tree.close()
        self.channel.close()

    def running_in(self, queue: str) -> int:
        return self.in_queue[queue]

    def on_io(self, fd: int, handler: Handler, direction: str) -> None:
        """``fd`` is ready: room in the stdin pipe ("in"), or output to read."""
        if direction == "in":
            if handler.write_input():
                self.poller.unregister(fd)  # before closing: see Handler.write_input
                handler.close_input()
        elif handler.read_output(fd):
            self.poller.unregister(fd)
            handler.close_output(fd)

    def running(self, queue: QueueConfig, job: Job) -> Handler | None:
        """The handler of an earlier delivery of this job's entry still running here, if any."""
        return self.by_entry.get(entry_key(queue, job))

    def delivered_again(self, earlier: Handler, now: float, metrics: Metrics) -> None:
        """The entry ``earlier`` runs was delivered to this daemon again (its lease lapsed and
        was claimed back, or its group was made anew): the earlier delivery is over in Redis,
        so its handler is stopped as for a lost lease, if it was not already."""
        if earlier.lease_lost:
            return
        metrics.of(earlier.queue.name).leases_lost.inc()
        earlier.log(logging.WARNING, "delivered again meanwhile: this delivery's lease is over; "
                    "stopping the handler")  # fmt: skip
        self.stop(earlier, StopReason.LEASE_LOST, now)

    def told(self, lost: Lost, now: float, metrics: Metrics) -> bool:
        """The lease renewal's report on one entry: its lease was lost (stop the handler and
        never settle the entry), or ``jobd cancel`` asks for it (stop the handler; the outcome
        is 'cancelled'). False when no handler runs the entry. A report about an earlier
        delivery of the entry (handed back, then claimed again here) is not this handler's: it
        is dropped."""
        handler = self.by_entry.get((*lost.key, lost.message_id))
        if handler is None:
            return False
        if not lost.about(handler.job):
            handler.log(logging.DEBUG, "a late report on an earlier delivery of it: ignored")
            return True
        if lost.cancelled:
            if not handler.cancelled:  # reported again at every renewal until it is settled
                handler.log(logging.WARNING, "cancelled (jobd cancel); stopping the handler")
            self.stop(handler, StopReason.CANCEL, now)
            return True
        to = f"consumer {lost.owner}" if lost.owner else "nobody (acked elsewhere, or trimmed)"
        metrics.of(handler.queue.name).leases_lost.inc()
        what = "lease lost: the entry now belongs to %s; stopping the handler"
        handler.log(logging.WARNING, what, to)
        self.stop(handler, StopReason.LEASE_LOST, now)
        return True

    def stop(self, handler: Handler, reason: StopReason, now: float) -> None:
        if handler.pid in self.leaving:  # it ended by itself: a lost lease is noted alone
            handler.lease_lost |= reason is StopReason.LEASE_LOST
            return
        handler.stop(reason, now, self.sessions(now))
        self.next_due = min(self.next_due, handler.due)

    def sessions(self, now: float) -> Sessions:
        """Which process is in which session, read (if at all) once for every handler stopped
        at ``now``: one pass of the loop (a shutdown, the lost leases of one renewal)."""
        if self.scan[0] != now:
            self.scan = (now, Sessions())
        return self.scan[1]

    def stop_all(self, reason: StopReason, now: float) -> None:
        for handler in self.by_pid.values():
            self.stop(handler, reason, now)

    def act(self, now: float) -> None:
        """Each handler whose time has come acts (``Handler.act``), once what the channel's
        thread queued is taken (``hear``: a request for more time read before its deadline
        counts, though the loop was busy when it was read; only what is queued already, at a
        fixed cost, so a flood cannot put a timeout off); processes that escaped a handler
        whose job has ended are ended (``Reaper.sweep``, a few times a second)."""
        if now >= self.reaper.next_sweep:
            self.reaper.sweep(now, set(self.by_pid), {delivery(h) for h in self})
            if self.tree is not None:
                self.tree.tidy()
        if now >= self.next_sample:
            self.sample_memory(now)
        if now >= self.next_due:
            self.hear(now)
            scan, heard = self.sessions(now), self.channel.drained
            acting = [h for h in self.by_pid.values() if h.pid not in self.leaving]
            waits = [m[0] + LEAVE_WAIT for _, m in self.leaving.values() if m is not None]
            self.next_due = min([*(h.act(now, scan, heard) for h in acting), *waits],
                                default=float("inf"))  # fmt: skip
            # A watchdog past due that its channel was not heard out after: read it out.
            if any(h.stop_reason is None and h.due <= now for h in acting):
                self.channel.ask()


class CgroupFinder:
    """``Channel.start``'s ``cgroup_of``: the running handler whose cgroup a process is in, or
    in a cgroup below it, by the whole path (``line``: its /proc/PID/cgroup's v2 line
    ``0::/path`` after the ``0::``, as ``receive`` read it, under the hierarchy's mount). Never
    by a cgroup's name alone: a job's is in its processes' /proc/PID/cgroup for anyone to read,
    and a user given a subtree of their own (a user's systemd instance) can make a cgroup of
    that name there.

    An index kept by the loop as handlers enter and leave the table (``enter``, ``leave``): a
    lookup, on the channel's thread for each stranger's message, costs the same whatever the
    number of running handlers: the sender's path cut at each depth a handler's cgroup has
    (one, as a rule: they are all children of the daemon's cgroup) and looked up in a dict.
    Thread-safe by the GIL: the loop sets and deletes keys of ``by_path`` (the thread's
    ``dict.get`` sees each whole) and replaces ``depths`` whole."""

    def __init__(self) -> None:
        self.mount = where.mount_point()
        self.by_path: dict[str, Handler] = {}  # a handler's cgroup, normalised: the handler
        self.counts: Counter[int] = Counter()  # the loop's: paths of ``by_path`` by depth
        self.depths: tuple[int, ...] = ()  # those depths, deepest first (the thread's copy)

    @staticmethod
    def path(handler: Handler) -> str | None:
        """Its cgroup, normalised; None when it has none."""
        return os.path.normpath(handler.placed[1].path) if handler.placed else None

    def enter(self, handler: Handler) -> None:
        if (path := self.path(handler)) is not None:
            self.by_path[path] = handler
            self.counts[path.count("/")] += 1
            self.depths = tuple(sorted(self.counts, reverse=True))

    def leave(self, handler: Handler) -> None:
        path = self.path(handler)
        if path is not None and self.by_path.get(path) is handler:
            del self.by_path[path]
            depth = path.count("/")
            self.counts[depth] -= 1
            if not self.counts[depth]:
                del self.counts[depth]
                self.depths = tuple(sorted(self.counts, reverse=True))

    def __call__(self, line: bytes) -> Handler | None:
        if self.mount is None or not line.startswith(b"/"):
            return None
        path = os.path.normpath(self.mount + os.fsdecode(line))
        parts = path.split("/")
        for depth in self.depths:
            if depth < len(parts):
                handler = self.by_path.get("/".join(parts[: depth + 1]))
                if handler is not None:
                    return handler
        return None
