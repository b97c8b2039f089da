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
import ctypes
import logging
import os
import signal

import psutil

log = logging.getLogger("jobd.reaper")

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SWEEP_EVERY = 0.25  # seconds between two sweeps at most (the loop may wake later when idle)

Delivery = tuple[bytes, bytes]  # (stream, message id), as in a handler's environment

_protected: set[int] = set()  # children jobd reaps elsewhere


def become_subreaper() -> bool:
    """Make this process a child subreaper; False (said once in the log) where Linux refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        return True
    log.warning("cannot become a child subreaper (%s): a handler's process that leaves its "
                "group may outlive its job", os.strerror(ctypes.get_errno()))  # fmt: skip
    return False


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
    """The delivery in a process's environment, or None (unreadable, or none there)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    found = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
    stream, mid = found.get(b"JOBD_STREAM"), found.get(b"JOBD_MESSAGE_ID")
    return (stream, mid) if stream is not None and mid is not None else None


class Reaper:
    """The sweep of adopted processes, run by the loop's thread (which starts every handler, so
    no handler starts while a sweep looks)."""

    def __init__(self) -> None:
        self.next_sweep = 0.0
        self.killed = 0  # escaped processes ended, in all
        self.enabled = False  # this process is the subreaper: its children are jobd's alone

    def sweep(self, now: float, leaders: set[int], running: set[Delivery]) -> int:
        """Once SWEEP_EVERY: reap adopted processes that exited, end those of jobs that ended
        (``running``: the deliveries of the handlers running now; ``leaders``: their pids).
        Returns how many were ended."""
        if now < self.next_sweep or not self.enabled:
            return 0
        self.next_sweep = now + SWEEP_EVERY
        ended = 0
        for pid in children():
            if pid in leaders or pid in _protected or _reaped(pid):
                continue
            delivery = delivery_of(pid)
            if delivery is not None and delivery not in running:
                ended += _kill_tree(pid, delivery)
        self.killed += ended
        return ended


def _reaped(pid: int) -> bool:
    """Reap ``pid`` if it has exited; whether it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


def _kill_tree(pid: int, delivery: Delivery) -> int:
    """SIGKILL a process and its descendants (reaped by later sweeps); how many."""
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    stream, mid = (x.decode(errors="backslashreplace") for x in delivery)
    log.warning("stream=%s entry=%s: %d process(es) that left the handler's group outlived "
                "its job; killed", stream, mid, len(tree))  # fmt: skip
    return len(tree)
