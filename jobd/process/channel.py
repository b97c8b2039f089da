"""What a running handler tells jobd about itself, as jobd keeps it: the sd_notify messages of
its ``NOTIFY_SOCKET`` (``daemon.channel`` reads them and finds whose they are) and, where its
queue asks, the ``N%`` lines of its stdout.

A message is one datagram of newline-separated ``KEY=VALUE`` lines, as systemd's. Understood:

- ``STATUS=text``: the job's status line (its first ``STATUS_MAX`` bytes; bytes as sent, UTF-8
  or not: shown escaped);
- ``X_JOBD_PROGRESS=N``: percent done, 0 to 100, an integer or a decimal;
- ``EXTEND_TIMEOUT_USEC=N``: its deadline becomes now + N µs, as systemd's: never before its
  timeout (measured from its start), never past the queue's ``max_timeout`` (from its start; no
  ``max_timeout``: its timeout, so nothing is extended). The last one counts;
- ``WATCHDOG=1``: it is alive. With the queue's ``watchdog``, from the first one on, silence
  longer than ``watchdog`` stops it as a timeout does (``WATCHDOG=trigger``: at once, and for
  good: a ``WATCHDOG=1`` after it, in the same message or a later one, changes nothing);
- ``X_JOBD_RESULT=bytes``: its result (the results of issue 34 read ``Told.result``).

Any other key is ignored (``READY=1``, ``MAINPID=``… mean nothing here). Once its handler is
being stopped, ``EXTEND_TIMEOUT_USEC`` and ``WATCHDOG`` are too (the stop's SIGKILL comes when it
comes, and no other deadline is shown); its status, progress and result still count (one that
exits 0 at a graceful stop is done, with what it said). A message with a line that is not
``KEY=VALUE``, or a value of a key above that is not as said, is malformed: what it says well is
still taken, and it is counted.
A message of more than ``LINES_MAX`` lines is refused whole (malformed too): what one message
costs to read is bounded.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from jobd.process.output import Logs, Output

if TYPE_CHECKING:
    from jobd.config import QueueConfig

STATUS_MAX = 1024  # bytes of a status line kept
# Lines of one message, at most: one with more is refused whole (malformed). systemd takes a
# message of 4 KiB at most; `jobd notify` sends one line a field (a few).
LINES_MAX = 64
USEC_MAX = 2**64 - 1  # EXTEND_TIMEOUT_USEC at most (systemd's: a uint64_t), 584 542 years
USEC_DIGITS = len(str(USEC_MAX))
PROGRESS_LINE = re.compile(rb"\s*(\d{1,3}(?:\.\d+)?)\s*%\s*")  # progress_from_output's lines
PROGRESS_LINE_MAX = 32  # a longer line is no progress line: not looked at


@dataclass(slots=True)
class Said:
    """One message, parsed (``parse``): the last value of each key understood, as it is taken
    (``Told.take``). Parsed on the channel's thread, taken by the loop at a fixed cost."""

    well: bool = True  # False: malformed (a line not KEY=VALUE, a value not as its key takes)
    status: bytes | None = None  # its first STATUS_MAX bytes
    progress: float | None = None
    extend: int | None = None  # EXTEND_TIMEOUT_USEC, µs
    watchdog: bool | None = None  # True: WATCHDOG=1; False: WATCHDOG=trigger
    result: bytes | None = None
    # How many messages it stands for (``merge``), of which malformed, and asking for time.
    count: int = 1
    bad: int = 0
    extends: int = 0

    def merge(self, later: Said) -> None:
        """``later`` (a message of the same sender, read after) taken into this one: each key
        as the later says it where it says it, as taking both one after the other would."""
        self.well &= later.well
        self.count, self.bad = self.count + later.count, self.bad + later.bad
        self.extends += later.extends
        # each key by name, not by getattr in a loop: a flood merges thousands a second
        if later.status is not None:
            self.status = later.status
        if later.progress is not None:
            self.progress = later.progress
        if later.extend is not None:
            self.extend = later.extend
        if later.watchdog is not None and self.watchdog is not False:  # a trigger sticks
            self.watchdog = later.watchdog
        if later.result is not None:
            self.result = later.result


def parse(message: bytes) -> Said:
    """What one message says. One of more than LINES_MAX lines is refused whole (malformed):
    its cost to read is bounded (a flood of one-byte lines costs nothing more than a few)."""
    said = Said()
    if message.rstrip(b"\n").count(b"\n") >= LINES_MAX:  # LINES_MAX + 1 lines or more
        said.well, said.bad = False, 1
        return said
    for line in message.split(b"\n"):
        if not line:
            continue
        key, sep, value = line.partition(b"=")
        if not sep or not key:
            said.well = False
        elif key == b"STATUS":
            said.status = value[:STATUS_MAX]
        elif key == b"X_JOBD_PROGRESS":
            progress = percent(value)
            said.well &= progress is not None
            said.progress = said.progress if progress is None else progress
        elif key == b"EXTEND_TIMEOUT_USEC":
            usec = microseconds(value)
            said.well &= usec is not None
            said.extend = said.extend if usec is None else usec
        elif key == b"WATCHDOG":
            said.well &= value in (b"1", b"trigger")
            if value == b"trigger" or (value == b"1" and said.watchdog is not False):
                said.watchdog = value == b"1"  # a trigger sticks: a heartbeat after it is late
        elif key == b"X_JOBD_RESULT":
            said.result = value
    said.bad, said.extends = int(not said.well), int(said.extend is not None)
    return said


def microseconds(text: bytes) -> int | None:
    """``text`` as systemd reads a ``_USEC`` value: an unsigned 64-bit decimal; None when it is
    not (a longer run of digits is refused before it is converted: Python's ``int`` refuses
    more than 4300 digits, and a float of a 400-digit one overflows)."""
    if not text.isdigit() or len(text) > USEC_DIGITS or int(text) > USEC_MAX:
        return None
    return int(text)


def percent(text: bytes) -> float | None:
    """``text`` as a percentage, 0 to 100 (an integer or a decimal); None when it is not."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not 0 <= value <= 100 or not text.strip().replace(b".", b"", 1).isdigit():
        return None  # nan, inf, 1e2, -0: not what the key takes
    return value


@dataclass(slots=True)
class Told:
    """What a handler has told jobd of itself, typed: for its lease renewal and ``jobd job``
    (progress and status), for its end (its result), and for its deadlines."""

    progress: float | None = None  # percent, 0 to 100
    status: bytes | None = None  # at most STATUS_MAX bytes, as sent
    result: bytes | None = None  # X_JOBD_RESULT's value, as sent
    last_watchdog: float | None = None  # monotonic time of its last WATCHDOG=1
    extended_to: float | None = None  # monotonic: the deadline EXTEND_TIMEOUT_USEC asked for
    changed: float = 0.0  # monotonic time progress, status or extended_to last changed (0: never)
    messages: int = 0  # messages taken
    malformed: int = 0  # of which malformed

    def hear(self, message: bytes, now: float, ceiling: float) -> bool:
        """Take one message, read at ``now``; ``ceiling`` is the latest deadline it may ask
        for. False when it was malformed (what it said well is taken all the same)."""
        return self.take(parse(message), now, ceiling)

    def take(self, said: Said, now: float, ceiling: float) -> bool:
        """Take one message as ``parse`` read it (``now``: when it was read); ``ceiling`` is
        the latest deadline it may ask for. False when it was malformed."""
        self.messages += said.count
        self.malformed += said.bad
        if said.status is not None:
            self.status = said.status
            self.changed = now
        if said.progress is not None:
            self.progress = said.progress
            self.changed = now
        if said.extend is not None:
            self.extended_to = min(now + said.extend / 1e6, ceiling)
            self.changed = now  # shown with progress and status (``running.deadline``)
        if said.watchdog is not None and self.last_watchdog != -math.inf:  # triggered: for good
            self.last_watchdog = now if said.watchdog else -math.inf
        if said.result is not None:
            self.result = said.result
        return said.well

    def set_progress(self, text: bytes, now: float) -> bool:
        """``text`` as a percentage; False (and nothing changed) when it is none, or out of
        0 to 100."""
        value = percent(text)
        if value is None:
            return False
        self.progress = value
        self.changed = now
        return True

    def due(self, deadline: float, watchdog: float | None) -> float:
        """When its handler must be stopped, from its own ``deadline`` (start + timeout): later
        if it extended it, sooner if its watchdog lapses first."""
        if self.extended_to is not None:
            deadline = max(deadline, self.extended_to)
        if watchdog is not None and self.last_watchdog is not None:
            deadline = min(deadline, self.last_watchdog + watchdog)
        return deadline

    def describe(self) -> str:
        """For the log: what it said last (bytes that are not UTF-8 escaped) and how often."""
        shown = [f"{self.messages} message(s), {self.malformed} malformed"]
        if self.progress is not None:
            shown.append(f"progress {self.progress:g}%")
        for name, value in (("status", self.status), ("result", self.result)):
            if value is not None:
                text = value[:200].decode("utf-8", "backslashreplace")
                shown.append(f"{name} {text!r}" + ("…" if len(value) > 200 else ""))
        return ", ".join(shown)

    def watchdog_lapsed(self, now: float, watchdog: float | None) -> bool:
        return (
            watchdog is not None
            and self.last_watchdog is not None
            and self.last_watchdog + watchdog <= now
        )


def ceiling(queue: QueueConfig, started: float, timeout: float) -> float:
    """The latest an attempt that started at ``started`` (with its own ``timeout``) may run to,
    however it extends its deadline: its queue's ``max_timeout`` from its start, else its
    timeout."""
    return started + (timeout if queue.max_timeout is None else max(queue.max_timeout, timeout))


class Teller(Logs, Protocol):
    def said(self) -> Told: ...


class ProgressOutput(Output):
    """A handler's stdout whose lines that are just ``N%`` (spaces allowed around it) set its
    progress (``progress_from_output``); logged and kept as any other line."""

    def __init__(self, handler: Teller, name: str, keep: int) -> None:
        super().__init__(handler, name, keep)
        self.teller = handler
        self.line = b""  # the line being read, while it may still be a progress line

    def feed(self, data: bytes) -> None:
        super().feed(data)
        *ended, rest = (self.line + data).split(b"\n")
        for line in ended:
            self.take(line)
        self.line = rest if len(rest) <= PROGRESS_LINE_MAX else b"\0"  # \0: none, up to \n

    def close(self) -> None:
        self.take(self.line)  # a last line without its newline
        super().close()

    def take(self, line: bytes) -> None:
        if len(line) <= PROGRESS_LINE_MAX and (found := PROGRESS_LINE.fullmatch(line)):
            self.teller.said().set_progress(found.group(1), time.monotonic())


class Talking:
    """A handler's side of its channel (mixed into ``process.handler.Handler``): what it said,
    and its due time following what it said while it runs."""

    queue: QueueConfig
    started: float
    timeout: float
    due: float
    told: Told | None
    stop_reason: object  # None while it runs

    def said(self) -> Told:
        if self.told is None:
            self.told = Told()
        return self.told

    def hear(self, message: bytes, now: float) -> bool:
        """One message from its channel, read at ``now``: ``heard``."""
        return self.heard(parse(message), now)

    def heard(self, said: Said, now: float) -> bool:
        """One message from its channel (``daemon.channel``), read at ``now`` and parsed: kept;
        while it runs, its deadline follows what it said (extended, or its watchdog's). False
        when malformed."""
        told = self.said()
        if self.stop_reason is not None:  # stopping: ``due`` is when SIGKILL follows, and
            said = replace(said, extend=None, watchdog=None)  # no deadline of its is shown
        well = told.take(said, now, ceiling(self.queue, self.started, self.timeout))
        if self.stop_reason is None:
            self.due = told.due(self.started + self.timeout, self.queue.watchdog)
        return well

    @property
    def result(self) -> bytes | None:
        """Its X_JOBD_RESULT, if it sent one (the last): bytes as sent."""
        return None if self.told is None else self.told.result
