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
never touched. Once such a process is dead, and before it is reaped, its process group is
killed where it is provably its job's (``end_group``): a process that forks and exits to change
its pid, in a group of its own, is caught by the group it cannot leave. A process whose
environment cannot be read (another user's: ``run_as``) or holds no delivery (a descendant that
cleared its environment) is not attributed, and left alone while any job runs: a
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
import time

from jobd import hardening
from jobd.process import procfs, spawn

log = logging.getLogger("jobd.reaper")

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SWEEP_EVERY = 0.25  # seconds between two sweeps at most (the loop may wake later when idle)
FINAL_WAIT = 0.5  # seconds the last sweep waits for what it killed to be dead (``end_group``)

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
    """``pid`` is a child jobd reaps elsewhere (the embedded server): never reaped here. Called
    under ``spawn.LOCK``, with the start of the process, so that no sweep lists it unprotected."""
    _protected.add(pid)


def unprotect(pid: int) -> None:
    """``pid``, protected, was reaped where it is reaped: the number may be any process's now,
    an escaped one's too, which the sweep must see."""
    _protected.discard(pid)


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
    no handler starts while a sweep looks); it lists the children under ``spawn.LOCK``, so that
    the embedded server, started by a thread of its own under it, is ``protect``ed by then (an
    uncontended lock: 0.2 µs of a sweep's ~100 µs). Each adopted process's delivery is read
    once: its pid cannot be another process's until it is reaped, here."""

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
        ended, live, dying = 0, {}, []
        scan = procfs.Sessions()  # /proc read once, if anything is to be ended
        with spawn.LOCK:  # no thread starts a child of its own meanwhile (protect)
            listed, kept = children(), leaders | _protected
        for pid in listed:
            if pid in kept:
                continue
            state = exited(pid)
            if pid in self.adopted or state is not False:
                # Read once; a process that exited has no environment left: known if seen alive.
                delivery = self.adopted.get(pid)
            else:
                delivery = delivery_of(pid)
            # Not attributed: it may be a running job's, unless no job runs.
            end = delivery not in running if delivery is not None else not running or final
            if state is not False:  # exited (its group ended with it if its job has), or gone
                if state and end:
                    end_group(pid)
                reaped(pid)
                continue
            live[pid] = delivery
            if end:
                ended += _end(pid, delivery, scan)
                dying.append(pid)
        self.adopted = live
        if final:  # no next sweep: the groups of the processes just killed, once they are dead
            _end_groups(dying)
        return ended

    def of(self, delivery: Delivery) -> list[int]:
        """The adopted processes of a delivery, as the last sweep found them."""
        return [pid for pid, d in self.adopted.items() if d == delivery]


def exited(pid: int) -> bool | None:
    """Whether ``pid``, a child of this process, has exited (a zombie, not reaped: its pid,
    group and session are fixed, and their numbers held until it is reaped); None when it is
    no child (reaped already)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return None


def end_group(pid: int) -> None:
    """SIGKILL the process group of ``pid``, an exited child of this process not yet reaped
    (``exited``: the group it died in is the one read, and its number is no other group's
    until ``pid`` is reaped), where that group is provably its job's:

    - its group is numbered by its own pid: every process in it joined from its own tree;
    - or its session is not this process's own. A group cannot span sessions, and a session
      is made by ``setsid`` alone, its members all descendants of the process that made it.
      The adopted process descends from a child of this process, so the process that made its
      session (itself or an ancestor, below this process: one above would have made this
      process's session too) descends from that child. That child is a handler, which every
      descendant of a handler shares with its job, unless it is the embedded Redis (or, for
      the supervisor, a daemon or the fork server): those run in this process's session, and
      their descendants make no session of their own (Redis forks its children in its own
      session and group; a daemon's handlers, in a session of their own, are its job's).

    Never a group of this process's session that ``pid`` does not lead: it may be anyone's
    (the embedded Redis's, a supervisor's, an operator's shell), and a process may join any
    group of its session."""
    try:
        group, session = os.getpgid(pid), os.getsid(pid)
    except OSError:
        return
    if group == pid or session != os.getsid(0):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


def _end_groups(pids: list[int]) -> None:
    """Wait up to FINAL_WAIT for the processes just SIGKILLed to be dead, then kill each one's
    group where it is its job's (``end_group``) and reap it."""
    deadline = time.monotonic() + FINAL_WAIT
    while pids:
        left = []
        for pid in pids:
            state = exited(pid)
            if state:
                end_group(pid)
                reaped(pid)
            elif state is False:
                left.append(pid)
        pids = left
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.005)


def reaped(pid: int) -> bool:
    """Reap ``pid`` if it has exited; whether it is gone."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


def kill_tree(pid: int, scan: procfs.Sessions | None = None) -> set[int]:
    """SIGKILL an adopted process ``pid`` (a child of this process, unreaped: its pid is its
    own), its descendants (reaped later), its session where it leads it (the session's number
    is then its pid, which no other can take, and every process in it joined from its own
    tree), and, once it is dead, its process group where that is provably its job's
    (``end_group``; if it is not dead by the end of this call, the caller's next look at it
    does that before reaping it). Descendants and session members are as ``scan`` found them
    (one read of /proc for every stray a sweep ends), each signalled only while it is still
    the process found (``Sessions.send``). The pids signalled."""
    scan = scan or procfs.Sessions()
    try:
        os.kill(pid, signal.SIGKILL)
        session = os.getsid(pid)
    except OSError:
        return set()
    signalled = {pid}
    below = scan.descendants(pid)
    if session == pid:
        below += scan.of({session})
    for other in below:
        if other not in signalled and scan.send(other, signal.SIGKILL):
            signalled.add(other)
    if exited(pid):
        end_group(pid)
    return signalled


def _end(pid: int, delivery: Delivery | None, scan: procfs.Sessions) -> int:
    """An escaped process whose job ended, killed with its own (``kill_tree``), said in the
    log; how many processes."""
    count = len(kill_tree(pid, scan))
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
