"""Processes that escape their handler: jobd is a child subreaper, and ends them once their job has.

A handler is a process group, stopped and cleaned up as one (``handler.Handler``). A descendant
that leaves the group (``setsid``, a daemonizing double fork) would outlive its job, re-parented
to init. With ``PR_SET_CHILD_SUBREAPER`` it is re-parented to jobd instead, as soon as the
process between it and jobd ends: escaped processes are jobd's children.

Each one is attributed to its job by the delivery in its environment (``JOBD_STREAM`` and
``JOBD_MESSAGE_ID``, which every handler gets and its descendants inherit). A sweep every
``SWEEP_EVERY`` (the loop calls ``sweep``) ends, with SIGKILL to it and every descendant, each
adopted process whose delivery no handler of this daemon runs any more — its job ended: exit,
timeout, cancel, lost lease, shutdown — and leaves the others alone: another job's processes are
never touched. A process whose environment cannot be read (another user's: ``run_as``) or holds
no delivery (a descendant that cleared its environment) is not attributed, and left alone: a
cgroup (issue 20) is what contains those. The sweep also reaps every adopted process that has
exited, by its own pid (``waitpid(pid, WNOHANG)``), never "any child": a handler's exit status is
collected by its own pidfd and ``wait4`` alone, and the pids jobd reaps elsewhere (handler
leaders, the embedded server: ``protect``) are never waited for here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import psutil

from jobd import hardening

log = logging.getLogger("jobd.reaper")

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SWEEP_EVERY = 0.25  # seconds between two sweeps at most (the loop may wake later when idle)

Delivery = tuple[bytes, bytes, bytes]  # (queue, stream, message id), in a handler's environment
WANTED = (b"JOBD_QUEUE", b"JOBD_STREAM", b"JOBD_MESSAGE_ID")
ENVIRON_BYTES = 1 << 20  # of a process's environment read at most

_protected: set[int] = set()  # children jobd reaps elsewhere


def become_subreaper() -> bool:
    """Make this process a child subreaper; False (said once in the log) where Linux refuses."""
    try:
        hardening.prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as exc:
        log.warning("cannot become a child subreaper (%s): a handler's process that leaves its "
                    "group may outlive its job", exc.strerror)  # fmt: skip
        return False
    return True


def protect(pid: int) -> None:
    """``pid`` is a child jobd reaps elsewhere (the embedded server): never reaped here."""
    _protected.add(pid)


def children() -> list[int]:
    """This process's children, adopted ones included (each thread has its own list)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children") as f:
                found += map(int, f.read().split())
    return found


def delivery_of(pid: int) -> Delivery | None:
    """The delivery in a process's environment, or None (unreadable, or none there). At most
    ENVIRON_BYTES are read: a process's environment is anyone's size."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read(ENVIRON_BYTES)
    except OSError:
        return None
    found: dict[bytes, bytes] = {}
    for item in environ.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq and name in WANTED:
            found[name] = value
            if len(found) == len(WANTED):
                return found[b"JOBD_QUEUE"], found[b"JOBD_STREAM"], found[b"JOBD_MESSAGE_ID"]
    return None


class Reaper:
    """The sweep of adopted processes, run by the loop's thread (which starts every handler, so
    no handler starts while a sweep looks). Each adopted process's delivery is read once: its
    pid cannot be another process's until it is reaped, here."""

    def __init__(self) -> None:
        self.next_sweep = 0.0
        self.enabled = False  # this process is the subreaper: its children are jobd's alone
        self.adopted: dict[int, Delivery | None] = {}  # live adopted pid -> its delivery

    def sweep(
        self, now: float, leaders: set[int], running: set[Delivery], final: bool = False
    ) -> int:
        """Once SWEEP_EVERY: reap adopted processes that exited, end those of jobs that ended
        (``running``: the deliveries of the handlers running now; ``leaders``: their pids).
        One not attributed is ended only when no handler runs (then it can be no running
        job's), or ``final``ly, when the daemon stops. Returns how many were ended."""
        if (now < self.next_sweep and not final) or not self.enabled:
            return 0
        self.next_sweep = now + SWEEP_EVERY
        ended, live = 0, {}
        for pid in children():
            if pid in leaders or pid in _protected or reaped(pid):
                continue
            delivery = live[pid] = self.adopted[pid] if pid in self.adopted else delivery_of(pid)
            if delivery is None and (running and not final):
                continue  # not attributed: it may be a running job's
            if delivery is None or delivery not in running:
                ended += _end(pid, delivery, leaders)
        self.adopted = live
        return ended

    def of(self, delivery: Delivery) -> list[int]:
        """The adopted processes of a delivery, as the last sweep found them."""
        return [pid for pid, d in self.adopted.items() if d == delivery]


def reaped(pid: int) -> bool:
    """Reap ``pid`` if it has exited; whether it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


def kill_tree(pid: int, groups_kept: set[int]) -> set[int]:
    """SIGKILL a process, its process group when that is none of ``groups_kept`` nor this
    process's (the kernel signals a group whole, so a process that forks and exits to change its
    pid is caught with its children), and its descendants (reaped later); the pids signalled."""
    try:
        top = psutil.Process(pid)
        tree = [top, *top.children(recursive=True)]
        group = os.getpgid(pid)
    except (psutil.Error, OSError):
        return set()
    if group not in groups_kept and group != os.getpgrp():
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    return {p.pid for p in tree}


def _end(pid: int, delivery: Delivery | None, leaders: set[int]) -> int:
    """An escaped process whose job ended, killed with its own (``kill_tree``: a handler's group
    is kept), said in the log; how many processes."""
    count = len(kill_tree(pid, leaders))
    if not count:
        return 0
    if delivery is None:
        log.warning("%d process(es) that left a handler's group outlived it; killed (not "
                    "attributed: no job of this daemon runs)", count)  # fmt: skip
    else:
        queue, stream, mid = (x.decode(errors="backslashreplace") for x in delivery)
        log.warning("queue=%s stream=%s entry=%s: %d process(es) that left the handler's group "
                    "outlived its job; killed", queue, stream, mid, count)  # fmt: skip
    return count
