"""What a dead daemon leaves behind: its handlers, which the supervisor ends before it starts
the daemon again.

A handler runs in a session of its own, and a daemon is a child subreaper for its
handlers' processes (``process.reaper``). When a daemon dies (SIGKILL, a crash), its handlers
would be re-parented to init and run on, and after ``reclaim_after`` a sibling would run the
same jobs again beside them. With one daemon, systemd kills its cgroup; under a supervisor,
nobody would. So the supervisor is a child subreaper too: a dead daemon's children are
re-parented to it (the kernel does so before the daemon's exit is reported), and it ends them.

Which of the supervisor's children are a dead daemon's: every child that is not one of its own
(a daemon it started, the embedded Redis). The supervisor starts nothing else, and a live
daemon, as a subreaper, adopts whatever its own handlers leave, so nothing of a live daemon's
ever reaches the supervisor. Each such orphan is SIGKILLed with its descendants (handlers have
children; those, re-parented in turn, are found by the next pass), and with its process group
and session where it leads them, and once dead (not yet reaped: the group's number cannot be
taken meanwhile) with its group where that is provably its job's (``reaper.end_group``: led by
it, or of a session not the supervisor's; never a group of the supervisor's session it merely
joined, which may be the supervisor's own), and reaped by its pid alone
(``waitpid(pid, WNOHANG)``), never "any child": a daemon's and the embedded server's exit
statuses belong to their own Popen. ``reap`` also collects any adopted process that exits
later: the supervisor may be PID 1 in a container, where every orphan comes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from jobd.process import procfs, reaper, spawn

log = logging.getLogger("jobd.supervisor")

END_WITHIN = 2.0  # seconds ``end`` waits for the orphans it killed to be reaped
PASS_EVERY = 0.01


class Orphans:
    """The supervisor's adopted processes. ``kept`` gives the pids of its own children (the
    live daemons, the embedded server): never signalled nor reaped here."""

    def __init__(self, kept: Callable[[], set[int]]) -> None:
        self.kept = kept
        self.enabled = False

    def adopt(self) -> None:
        """Become the child subreaper (before any daemon starts)."""
        self.enabled = reaper.become_subreaper()

    def adopted(self) -> list[int]:
        """The children that are not the supervisor's own. Listed while no thread starts one of
        its own: the embedded server is (re)started under ``spawn.LOCK``, and its pid known by
        the time the lock is let go."""
        with spawn.LOCK:
            kept = self.kept()
            return [pid for pid in reaper.children() if pid not in kept]

    def end(self, index: int) -> int:
        """SIGKILL every adopted process (the dead daemon ``pINDEX``'s handlers and their
        descendants) and reap them, waiting up to END_WITHIN; how many were killed."""
        if not self.enabled:
            return 0
        killed: set[int] = set()
        deadline = time.monotonic() + END_WITHIN
        while True:
            left, scan = [], procfs.Sessions()  # /proc read once a pass, if at all
            for pid in self.adopted():
                state = reaper.exited(pid)
                if state is not False:  # dead: its group ended with it, where it is the job's
                    if state:
                        reaper.end_group(pid)
                    reaper.reaped(pid)
                    continue
                left.append(pid)
                if pid not in killed:
                    killed |= reaper.kill_tree(pid, scan)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(PASS_EVERY)
        if killed:
            log.warning("process p%d left %d process(es) running (its handlers and theirs): "
                        "killed, before it starts again", index, len(killed))  # fmt: skip
        return len(killed)

    def reap(self) -> None:
        """Reap every adopted process that has exited."""
        if self.enabled:
            for pid in self.adopted():
                reaper.reaped(pid)
