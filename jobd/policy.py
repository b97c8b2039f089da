"""From how a handler ended to what happens to its entry: the outcome policy, in one place.

Now: exit 0 acks the entry. Any other end (a non-zero exit, a signal, a timeout, a handler that
could not be started) leaves the entry pending in Redis, to be taken over once its lease lapses.
A handler stopped because the daemon is shutting down is not a failure: its entry is handed
back at once, so another consumer can start it without waiting. A handler whose lease was lost
(another consumer took the entry over) is stopped, and nothing is recorded for it: the entry
is the new owner's to settle.
"""

from __future__ import annotations

import enum

from jobd.handler import ExitStatus


class Action(enum.Enum):
    ACK = "ack"
    LEAVE_PENDING = "leave pending"
    HAND_BACK = "hand back"
    ABANDON = "abandon: lease lost"


def decide(
    status: ExitStatus | None, stopped_for_shutdown: bool = False, lease_lost: bool = False
) -> Action:
    """``status`` is None when the handler could not be started."""
    if lease_lost:
        return Action.ABANDON
    if status is not None and status.ok:
        return Action.ACK
    if stopped_for_shutdown:
        return Action.HAND_BACK
    return Action.LEAVE_PENDING
