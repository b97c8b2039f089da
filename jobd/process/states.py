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


def unstarted(queue: QueueConfig, exc: Exception, span: object) -> Exception:
    """What a start that raised ``exc`` raises: a SpawnError for an OSError, else ``exc``
    itself (``deadline.Lapsed``; a bug); carrying ``span``, jobd's span of the attempt
    (``jobd.tracing``), started already, to end with the attempt's outcome (``span_of``)."""
    failed = SpawnError.of(queue, exc) if isinstance(exc, OSError) else exc
    failed.span = span  # type: ignore[attr-defined]
    return failed


def span_of(exc: BaseException) -> object:
    """The span a failed start's error carries (``unstarted``); None: none was started."""
    return getattr(exc, "span", None)
