"""One daemon as its supervisor sees it (``daemon.supervisor``): its process, its state, and
what its exit means — start it again after a backoff, or stop the supervisor.

    STARTING   started, not ready yet                       → READY, EXITED
    READY      it said READY=1                              → RELOADING, STOPPING, EXITED
    RELOADING  SIGHUP passed on, or it said RELOADING=1     → READY, EXITED
    STOPPING   asked to stop, or it said STOPPING=1         → EXITED
    EXITED     reaped: to be started again, or done         → STARTING

A daemon that exited unasked is started again after a backoff (0.5 s, doubling up to 8 s, back
to 0.5 s once it ran 30 s), unless its exit says starting it again cannot help (``fatal``),
which only a daemon never ready under this supervisor can say: it refuses the config (exit 78),
it refuses to start here (exit 69: a ``resources`` limit or a ``cgroup:`` this host cannot
give, no embedded server), or it ended GIVE_UP_AFTER times in a row without being ready. Once a
daemon has been ready, it is started again whatever its exits say, and the host's /healthz
says unhealthy meanwhile: its siblings run on, and the config it gets is the one in force
(``handover``), which loaded before.

Its prometheus files are named ``pINDEX``, not by pid (``metrics_identifier``): a daemon
started again carries on the counts of the one before, and a host's directory holds one set of
files per daemon however often they are restarted.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
from dataclasses import dataclass

from jobd import exitcodes

BACKOFF_FIRST = 0.5  # seconds before a daemon that died is started again
BACKOFF_MAX = 8.0
STEADY_AFTER = 30.0  # a daemon that ran this long starts again after BACKOFF_FIRST
GIVE_UP_AFTER = 5  # starts in a row that ended before the daemon was ever ready
CLEAN = (0, -signal.SIGTERM, -signal.SIGINT)  # how a daemon asked to stop may end


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RELOADING = "reloading"
    STOPPING = "stopping"
    EXITED = "exited"


def metrics_identifier(index: int) -> str:
    """The name of daemon ``index``'s prometheus files (prometheus_client's "pid")."""
    return f"p{index}"


@dataclass
class Child:
    """One daemon: its process, and every OS call made on it (start, signal, reap)."""

    index: int
    state: State = State.EXITED
    pid: int = 0
    pidfd: int = -1
    started: float = 0.0
    seen: float = 0.0  # when it last said anything (its watchdog: every second)
    status: str = "starting"
    backoff: float = BACKOFF_FIRST
    restart_at: float = float("inf")
    reload_owed: bool = False  # SIGHUP came while it was starting: pass it on once ready
    code: int | None = None  # how it ended, last time
    said_stuck: bool = False  # "stuck" logged, not heard from since
    failures: int = 0  # starts in a row that ended before READY=1
    secrets_owed: bool = False  # this start of it has not fetched its secrets (handover)
    ever_ready: bool = False  # one of its starts under this supervisor said READY=1

    def start(self, pid: int) -> None:
        """Watch ``pid``, the daemon just started (``zygote``), a child of this process: one
        that cannot be watched (no pidfd) is killed and reaped; a pid that is not this
        process's child is refused, and left alone."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # out of descriptors: a daemon not watched would be a second one
            with contextlib.suppress(ChildProcessError):  # not ours: left alone
                if os.waitpid(pid, os.WNOHANG)[0] == 0:  # ours, running: its pid is still it
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            raise
        try:  # its exit status is this process's to take (WNOWAIT: left for ``reap``)
            os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # not ours: never signalled (the supervisor is a subreaper)
            os.close(pidfd)
            raise OSError(f"pid {pid} is not this process's child") from None
        self.pid, self.pidfd = pid, pidfd
        self.state, self.status, self.code = State.STARTING, "starting", None
        self.started = self.seen = time.monotonic()
        self.restart_at, self.reload_owed = float("inf"), False  # it gets the config in force
        self.secrets_owed = True

    def signal(self, signum: int) -> None:
        if self.pidfd >= 0:  # not reaped: its pidfd names it, whatever its pid becomes
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signum)

    def abandon(self) -> None:
        """Kill and reap it: a start that did not go through."""
        self.signal(signal.SIGKILL)
        self.reap()

    def reap(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        self.code = os.waitstatus_to_exitcode(status)  # as Popen's: -N for signal N
        os.close(self.pidfd)
        self.pidfd, self.state = -1, State.EXITED
        return self.code

    def ready(self) -> None:
        self.state, self.ever_ready, self.failures = State.READY, True, 0

    def fetches(self, pid: int) -> bool:
        """Whether ``pid`` is this start of it, owed its secrets (``handover``); now it is not."""
        owed = self.secrets_owed and self.alive() and self.pid == pid
        self.secrets_owed &= not owed
        return owed

    def alive(self) -> bool:
        return self.state is not State.EXITED

    def stuck(self, now: float, after: float) -> bool:
        """Its loop has not turned (no word from it) for ``after`` seconds."""
        return self.alive() and now - self.seen > after

    def fatal(self, code: int) -> int | None:
        """The exit status the supervisor ends with, when this unasked exit (``code``) says that
        starting the daemon again cannot help; None: start it again."""
        if self.ever_ready:
            return None
        if code == exitcodes.CONFIG:
            return exitcodes.CONFIG
        if code == exitcodes.UNAVAILABLE:
            return exitcodes.UNAVAILABLE
        self.failures += 1
        if self.failures >= GIVE_UP_AFTER:
            return code if code > 0 else exitcodes.FAILURE
        return None

    def why_fatal(self, code: int) -> str:
        if code == exitcodes.CONFIG:
            return "refuses the config"
        if code == exitcodes.UNAVAILABLE:
            return "cannot run here"
        return f"ended {self.failures} times in a row before it was ready"

    def retry_later(self, now: float, ran: bool = True) -> float:
        """Set when it starts again (its backoff, doubled for the next time); the delay. One
        that ``ran`` STEADY_AFTER since its start is started again after BACKOFF_FIRST."""
        if ran and now - self.started >= STEADY_AFTER:
            self.backoff = BACKOFF_FIRST
        delay = self.backoff
        self.restart_at = now + delay
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        return delay


def describe(code: int) -> str:
    """How a process ended, from its Popen returncode."""
    if code >= 0:
        return f"exit {code}"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    return f"killed by {name}"
