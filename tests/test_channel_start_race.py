"""The handlers' channel and a handler being started (review 34d): a message its first process
sends before the loop has put it in the table is judged once its start has ended, not dropped
as a stranger's. A real channel and its thread, a real process in a session of its own sending
on the real socket; the handler in the table is a stand-in (the loop's ``Handler`` needs a
spawned job), as ``Admission.start`` would add it, between ``begin_start`` and ``end_start``."""

from __future__ import annotations

import os

from listening import Heard as Started
from support import close_channel, session_sender, wait_until

from jobd.daemon.channel import Channel

# What the handler's first process sends: one message, and a second once the test says go.
EARLY, LATER = b"X_JOBD_RESULT=early", b"X_JOBD_RESULT=later"


def test_a_message_read_while_its_handler_starts_is_its_handlers() -> None:
    channel = Channel()
    handlers: dict[int, Started] = {}
    channel.start(handlers, None)
    child = -1
    try:
        channel.begin_start()  # the loop spawns: the handler is not in the table yet
        child = session_sender("\0" + channel.address[1:], [EARLY])
        wait_until(lambda: channel.count == 1 and not channel.in_hand, what="it was judged")
        handler = handlers[child] = Started(child)  # spawn returned: in the table
        channel.end_start()
        wait_until(lambda: channel.settled(), what="the thread judged it again")
        heard = channel.take(handlers)
        assert heard == [handler] and handler.said[0].result == b"early", channel.dropped
        assert not channel.dropped, channel.dropped
    finally:
        close_channel(channel, [child])


def test_a_strangers_message_read_while_a_handler_starts_is_still_a_strangers() -> None:
    channel = Channel()
    handlers: dict[int, Started] = {}
    channel.start(handlers, None)
    child = -1
    try:
        channel.begin_start()
        child = session_sender("\0" + channel.address[1:], [EARLY])
        wait_until(lambda: channel.count == 1 and not channel.in_hand, what="it was judged")
        channel.end_start()  # the start ended with another handler (or none): not the sender's
        wait_until(lambda: channel.settled() and not channel.unsure, what="judged again")
        assert channel.take(handlers) == []
        assert channel.dropped == {("", "stranger"): 1}, channel.dropped
    finally:
        close_channel(channel, [child])


def test_messages_read_while_their_handler_starts_are_taken_in_the_order_sent() -> None:
    """Two messages of one session read while its handler starts: the first waits for the
    start to end; the second, read once the handler is in the table, waits behind it (taken
    first it would be overridden by the older one: a progress going back)."""
    channel = Channel()
    handlers: dict[int, Started] = {}
    channel.start(handlers, None)
    child = -1
    try:
        channel.begin_start()
        go_r, go_w = os.pipe()
        child = session_sender("\0" + channel.address[1:], [EARLY, LATER], go=go_r)
        wait_until(lambda: channel.count == 1 and not channel.in_hand, what="it was judged")
        handler = handlers[child] = Started(child)  # in the table, the start not ended yet
        os.write(go_w, b"x")  # its second message
        os.close(go_w)
        os.close(go_r)
        wait_until(lambda: channel.count == 2 and not channel.in_hand, what="both judged")
        channel.end_start()
        wait_until(lambda: channel.settled(), what="judged again")
        channel.take(handlers)
        results = [said.result for said in handler.said]
        assert results == [b"later"], results  # both in one take, merged: the later one last
    finally:
        close_channel(channel, [child])
