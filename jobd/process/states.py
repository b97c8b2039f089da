"""A handler's states, why jobd stops one, and why one cannot start: the names the loop, the
policy and the recorder share (re-exported by ``process.handler``)."""

from __future__ import annotations

import enum

from jobd.config import QueueConfig


class State(enum.Enum):
    RUNNING = "running"
    TERMINATING = "terminating"  # SIGTERM sent to the group; SIGKILL follows after kill_grace
    EXITED = "exited"


class StopReason(enum.Enum):
    """Why jobd stopped a handler before it ended by itself (the policy reads it)."""

    TIMEOUT = "timed out"
    WATCHDOG = "silent past watchdog"  # a timeout too (jobd_error=timeout), its reason watchdog
    SHUTDOWN = "still running at the end of shutdown_grace"
    LEASE_LOST = "lease lost"
    CANCEL = "cancelled (jobd cancel)"
    MEMORY = "over resources.memory"


class SpawnError(Exception):
    """The handler could not be started (missing, not executable, bad interpreter line)."""

    @classmethod
    def of(cls, queue: QueueConfig, exc: OSError) -> SpawnError:
        return cls(f"cannot start {queue.command[0]!r}: {exc.strerror or exc}")
