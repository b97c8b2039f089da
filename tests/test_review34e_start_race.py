"""Review 34e: ``Channel.judge`` looks a message's session up in the table, and only then asks
whether a start is under way (``self.starting``), and reads ``self.started`` later still. The
loop's ``Admission.start`` adds the handler and calls ``end_start`` on another thread: when
it does so between the thread's lookup (no handler yet) and its look at ``starting`` (0
now), the handler's first message is dropped as a stranger's — the race begin_start/end_start
was meant to close, with a window of a few bytecodes instead of the whole spawn. (Read between
``starting`` and ``started``, the message is kept with the new ``started`` and waits for the
*next* start's end: with no other start, never judged again; and its handler's later
messages wait behind it: the second test.)

The interleaving is made deterministic: the table's ``get`` is where the thread is preempted,
and the loop's side (table add, ``end_start``) runs there, as the loop would meanwhile. A real
channel, its thread, and a real process leading its own session sending on the socket."""

from __future__ import annotations

import os
import threading

from listening import Heard as Started
from support import close_channel, session_sender, wait_until

from jobd.daemon.channel import Channel


class Table(dict):
    """The loop's table; the loop ends the start just after the thread's lookup missed."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel, self.pending = channel, None

    def get(self, key, default=None):
        found = super().get(key, default)
        if found is None and self.pending is not None and key == self.pending.pid:
            self[key], self.pending = self.pending, None  # spawn returned: in the table
            self.channel.end_start()  # ...and the start ended, before the thread goes on
        return found


def test_a_handlers_first_message_read_as_its_start_ends_is_not_a_strangers() -> None:
    channel = Channel()
    table = Table(channel)
    channel.start(table, None)
    child = -1
    go_r, go_w = os.pipe()
    try:
        channel.begin_start()  # the loop spawns the handler
        child = session_sender("\0" + channel.address[1:], [b"X_JOBD_RESULT=early"], go=go_r)
        handler = table.pending = Started(child)
        os.write(go_w, b"x")
        wait_until(lambda: channel.count == 1 and not channel.in_hand, what="it was read")
        wait_until(lambda: table.pending is None, what="the start ended")
        wait_until(channel.settled, what="the thread is done with it")
        channel.take(table)
        assert [s.result for s in handler.said] == [b"early"], channel.dropped
        assert not channel.dropped, channel.dropped
    finally:
        close_channel(channel, [child], (go_r, go_w))


class Unsure(list):
    """``Channel.unsure``, whose length the thread asks right after it saw a start under way
    (``self.starting``) and before it reads ``self.started``: the loop ends the start then."""

    def __init__(self, channel: Channel, table: Table2) -> None:
        super().__init__()
        self.channel, self.table = channel, table

    def __len__(self) -> int:
        if threading.current_thread() is self.channel.thread and self.table.armed:
            self.table.armed = False
            self.table[self.table.pending.pid] = self.table.pending  # spawn returned
            self.channel.end_start()
        return super().__len__()


class Table2(dict):
    """The loop's table; a lookup of the handler's session that misses arms ``Unsure``."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel, self.pending, self.armed = channel, None, False

    def get(self, key, default=None):
        found = super().get(key, default)
        on_thread = threading.current_thread() is self.channel.thread
        if found is None and on_thread and self.pending is not None and key == self.pending.pid:
            self.armed = key not in self
        return found


def test_a_message_kept_as_its_start_ends_is_not_kept_until_the_next_start() -> None:
    """The other side of the same window: the start ends between the thread's look at
    ``starting`` and its read of ``started``: the message is kept with the new ``started``
    and waits for a start that has not begun (the daemon idle: for ever; its handler's
    later messages wait behind it, its exit finds them unheard)."""
    channel = Channel()
    table = Table2(channel)
    channel.unsure = Unsure(channel, table)
    channel.start(table, None)
    child = -1
    go_r, go_w = os.pipe()
    try:
        channel.begin_start()
        child = session_sender("\0" + channel.address[1:], [b"X_JOBD_RESULT=early"], go=go_r)
        handler = table.pending = Started(child)
        os.write(go_w, b"x")
        wait_until(lambda: channel.count == 1 and not channel.in_hand, what="it was read")
        wait_until(lambda: child in table, what="the start ended")

        def heard() -> bool:
            channel.take(table)
            return bool(handler.said)

        wait_until(heard, timeout=5, what="its message heard (it waits in unsure for ever)")
    finally:
        close_channel(channel, [child], (go_r, go_w))
