"""A start's deadline: the last moment its job's lease is known to hold, past which its handler
must not exec (another daemon may have taken the job over and run it: ``Admission.lease_held``).

It is a time on CLOCK_BOOTTIME, in nanoseconds (``lease.lease_clock``'s clock), checked as late
as each way of starting allows (``spawn``). The clone's child reads that clock itself as its
last step before execve (a raw system call) and does not exec past it: it reports ``LAPSED`` on
its report pipe, told as ``Lapsed`` by ``spawn.start_error``; what is left unseen is the execve
alone. The other ways cannot run a check in the child: they ``check`` in Python as their last
statement before the fork (after the spawn lock and the OOM score), and what is left is the
instructions from there to the vfork (from then on the caller waits for the exec, running no
Python) and the child's own steps to its exec (its session, descriptors and signal actions; for
``subprocess.Popen``, also Popen's own Python up to its fork, and a change of folder and
identity). docs/guarantees.md says the window of each.
"""

from __future__ import annotations

import time

# What a child reports, in place of an errno, when it reached its exec past its start's deadline
# and did not exec: no errno can be this (the kernel's are below 4096). _clonexec.c's LAPSED.
LAPSED = 0x10000
NO_DEADLINE = 2**63 - 1  # _clonexec.c's: a start that never lapses


class Lapsed(Exception):
    """The start's deadline had passed when the handler was about to exec: it did not exec."""

    def __str__(self) -> str:
        return "lease lapsed before exec"


def check(deadline: int | None) -> None:
    """Raise ``Lapsed`` if ``deadline`` (None: none) has passed: the last statement before a
    fork whose child cannot check it."""
    if deadline is not None and time.clock_gettime_ns(time.CLOCK_BOOTTIME) >= deadline:
        raise Lapsed
