"""Retention: streams stay near ``retention.maxlen`` without ever dropping work.

A periodic duty runs ``lua/trim.lua`` (``Store.trim``) on each queue with a ``retention.maxlen``: it
removes the oldest entries that every consumer group on the stream has received and acknowledged —
never one that is pending or not yet delivered — and, behind long-running pending jobs,
acknowledged entries one by one. That second step walks the stream from a cursor kept in Redis
(``{S}:trim``), so however many pending entries come first, each call gets further; it reads no
pending entry and only the entries it deletes (READ_BYTES a call). Any number of daemons may run it
at once (they share the cursor). Each call removes at most ``BATCH`` entries and passes at most
``BATCH``, so Redis is never blocked long. The script reads only the groups it is given, by name:
the config's (the daemon's loop sets ``Store.stream_groups``) and, when it finds others on the
stream (another application reading it with a group of its own), those the trimmer then reads
itself (``Store.guest_groups``, XINFO GROUPS from the client) and passes on: the stream is trimmed
as far as every group has read, nothing any group has pending. Not when they are more than
MAX_GUESTS or one's name is longer than ``GUEST_NAME_BYTES`` (anyone's, hostile: then the stream is
not trimmed, and said so in the log once), nor in a tick where a group came between the read and
the script (the script finds one more: the next tick reads again).

Every queue's history (``jobd job``) is trimmed by its caps as each outcome is written; a queue
that no longer settles anything has it trimmed here (``Store.forget``) once a minute, or twice a
``history.max_age`` when that is shorter, so its records still age out.
"""

from __future__ import annotations

import logging
import time

from jobd.config import QueueConfig
from jobd.store.store import Store
from jobd.store.upkeep import GUEST_NAME_BYTES

log = logging.getLogger("jobd.retention")

TRIM_EVERY = 1.0
FORGET_EVERY = 60.0  # seconds between two trims of a queue's history (half max_age if less)
BATCH = 1000
READ_BYTES = 4 << 20  # bytes of entries a trim call's step 2 reads, one entry at least (trim.lua)
MAX_CALLS_PER_TICK = 10
MAX_GUESTS = 16  # groups the config does not name that a stream may have and still be trimmed
REREAD_REFUSED = 60.0  # seconds before groups refused (a name too long) are read again


class Trimmer:
    """The duty that keeps one queue's stream near its retention.maxlen."""

    def __init__(self, store: Store, queue: QueueConfig, maxlen: int) -> None:
        self.name = f"retention of queue {queue.name}"
        self.interval = TRIM_EVERY
        self.store, self.queue, self.maxlen = store, queue, maxlen
        self.guests: list[bytes] = []  # the groups the config does not name, as last read
        self.said = ""  # why the stream is not trimmed, as last warned ('' trimmed)
        self.refused = -REREAD_REFUSED  # when a read found a name too long (time.monotonic)

    def tick(self) -> None:
        """Calls (``Store.trim_call``) while they remove entries and stop at their budget: a
        walk over pending entries alone goes one call further each tick. When the stream has
        groups neither the config nor ``guests`` name, they are read once (``_read_guests``)
        and the call made again; found again (one came since), nothing more this tick."""
        read = False
        for _ in range(MAX_CALLS_PER_TICK):
            removed, more, foreign = self.store.trim_call(
                self.queue, self.maxlen, BATCH, self.guests
            )
            if foreign:
                if read or not self._read_guests(foreign):
                    return
                read = True
                continue
            self._say("", removed)
            if not (more and removed):
                return

    def _read_guests(self, foreign: int) -> bool:
        """Read the groups the config does not name into ``guests``; True when the call is
        worth making again with them. ``foreign`` more than ``guests`` are on the stream."""
        if len(self.guests) + foreign > MAX_GUESTS:
            if self.guests:  # perhaps gone: the next call, given none, counts them all
                self.guests = []
                return True
            self._say(f"more than {MAX_GUESTS} consumer groups the config does not name")
            return False
        if time.monotonic() < self.refused + REREAD_REFUSED:
            return False
        guests = self.store.guest_groups(self.queue)
        if guests is None:
            self.guests, self.refused = [], time.monotonic()
            self._say(
                f"a consumer group the config does not name whose name is longer than "
                f"{GUEST_NAME_BYTES} bytes"
            )
            return False
        if len(guests) > MAX_GUESTS:
            self.guests = []
            self._say(f"more than {MAX_GUESTS} consumer groups the config does not name")
            return False
        if guests and set(guests) != set(self.guests):
            log.info(
                "queue %s: stream %s has %d consumer group(s) the config does not name: trimmed "
                "as far as they have read, never what they have pending",
                self.queue.name, self.queue.stream, len(guests),
            )  # fmt: skip
        self.guests = guests
        return True

    def _say(self, why: str, removed: int = 0) -> None:
        """A warning when the stream comes not to be trimmed (``why``), and a line when it is
        trimmed again (a call with nothing to trim says neither)."""
        if why and why != self.said:
            log.warning(
                "queue %s: stream %s has %s: not trimmed to retention.maxlen %d (their needs "
                "cannot be read within a bound)",
                self.queue.name, self.queue.stream, why, self.maxlen,
            )  # fmt: skip
        elif self.said and removed:
            log.info("queue %s: stream %s trimmed again", self.queue.name, self.queue.stream)
        if why or removed:
            self.said = why


class Forgetter:
    """The duty that ages out one queue's history when nothing is written to it."""

    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.name = f"history of queue {queue.name}"
        self.interval = min(FORGET_EVERY, max(queue.history.max_age / 2, 1.0))
        self.store, self.queue = store, queue

    def tick(self) -> None:
        self.store.forget(self.queue)


def duties(store: Store, queue: QueueConfig) -> list[Trimmer | Forgetter]:
    """A queue's trimmers, when it keeps a retention.maxlen: one per stream; and its history's."""
    trimmers: list[Trimmer | Forgetter] = [
        Trimmer(store, q, q.retention_maxlen)
        for q in queue.all_levels()
        if q.retention_maxlen is not None
    ]
    return [*trimmers, Forgetter(store, queue)]
