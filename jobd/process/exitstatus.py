"""How a handler ended, and what it cost: its exit status, CPU time and peak memory.

The figures come from wait4's rusage (the leader and the descendants it waited for), or from
its cgroup where it has one (``cgroup.Usage``, the whole tree). A peak that cannot be told is
said to be unknown (None), never guessed: see ``peak``.
"""

from __future__ import annotations

import resource
import signal
from dataclasses import dataclass

from jobd.process.procfs import own_status


@dataclass(frozen=True, slots=True)
class ExitStatus:
    code: int | None  # the exit code, or None when a signal killed it
    signal: int | None
    timed_out: bool
    # What it cost, from wait4's rusage: the leader and the descendants it waited for.
    cpu_seconds: float | None = None  # user + system
    max_rss_bytes: int | None = None  # the largest resident set of any one of them
    watchdog: bool = False  # timed out: its watchdog (``process.channel``) lapsed

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out

    def describe(self) -> str:
        what = f"exit {self.code}" if self.code is not None else f"signal {_signame(self.signal)}"
        if not self.timed_out:
            return what
        return f"timed out by its watchdog ({what})" if self.watchdog else f"timed out ({what})"

    def cost(self) -> str:
        """For the log line that ends a job: ' (cpu 0.012s, max rss 93.1MiB)', or ''; a peak
        that is not known says so (``peak``)."""
        if self.cpu_seconds is None:
            return ""
        rss = (
            ", max rss unknown"
            if self.max_rss_bytes is None
            else f", max rss {self.max_rss_bytes / 2**20:.1f}MiB"
        )
        return f" (cpu {self.cpu_seconds:.3f}s{rss})"


_own_peak = 0  # the daemon's peak resident memory (KiB) when last read: it only grows


def peak(usage: resource.struct_rusage | None) -> int | None:
    """A reaped handler's peak resident memory, in bytes, when it is known: until its exec a
    handler shares the daemon's memory (vfork, or spawn's clone), and the kernel counts that in
    its peak, so a peak no larger than the daemon's own says nothing of the handler (None). The
    daemon's own is read again only when a handler's is above it as last read."""
    global _own_peak
    if usage is None or usage.ru_maxrss <= _own_peak:
        return None
    _own_peak = _memory_peak()
    if usage.ru_maxrss <= _own_peak:
        return None
    return usage.ru_maxrss * 1024  # KiB on Linux


def _memory_peak() -> int:
    """The peak of the daemon's own memory, KiB (VmHWM): what a vfork child shares. Not
    getrusage's, which also holds the peak of whatever process exec'd the daemon (exec keeps
    it): started by a large process, the daemon took every handler smaller than that for the
    share, and reported none's peak."""
    peak = own_status(b"VmHWM:")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if peak is None else peak


def _signame(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name  # type: ignore[arg-type]
    except ValueError:
        return str(signum)
