"""Review 34e: while the channel's thread judges again the messages that waited for a start
(``Channel.rejudge``), ``settled()`` can say True with one of them not queued yet.

``rejudge`` takes the ready messages out of ``unsure`` into a local list, then judges them one
by one (``take_one``), and each ``take_one`` sets ``holding = bool(batch)``: after a
stranger's message (nothing held), ``holding`` is False while the handler's message after it
is still in that list — in neither ``unsure``, ``in_hand`` nor ``holding``. ``sync()`` returns
at once when ``settled()`` is True: the loop, seeing its handler's exit then (a handler that
sent its result at once and exited), finishes it before its message is queued; the message
then reaches ``take`` with its handler gone: a stranger's, its result lost.

Deterministic: the look at ``settled()`` is made where the thread judges the handler's
message (the table's ``get``), as the loop's ``sync`` would make it meanwhile. A real channel
and its thread, real processes each leading a session of its own."""

from __future__ import annotations

import threading

from listening import Heard as Started
from support import close_channel, session_sender, wait_until

from jobd.daemon.channel import Channel


class Table(dict):
    """The loop's table; ``seen``: what ``settled()`` said when the thread looked the watched
    session up and found its handler (judging its message again)."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel, self.watch, self.seen = channel, -1, []

    def get(self, key, default=None):
        found = super().get(key, default)
        on_thread = threading.current_thread() is self.channel.thread
        if found is not None and key == self.watch and on_thread:
            self.seen.append(self.channel.settled())
        return found


def test_settled_is_false_while_a_message_judged_again_is_not_queued() -> None:
    channel = Channel()
    table = Table(channel)
    channel.start(table, None)
    children: list[int] = []
    try:
        channel.begin_start()
        name = "\0" + channel.address[1:]
        children.append(session_sender(name, [b"STATUS=a stranger's"]))
        children.append(session_sender(name, [b"X_JOBD_RESULT=42"]))  # the handler being started
        wait_until(lambda: channel.count == 2 and not channel.in_hand, what="both read")
        table.watch = children[-1]
        handler = table[children[-1]] = Started(children[-1])  # spawn returned
        channel.end_start()
        wait_until(lambda: table.seen, what="the handler's message judged again")
        wait_until(channel.settled, what="queued")
        channel.take(table)
        assert [s.result for s in handler.said] == [b"42"], channel.dropped
        assert table.seen == [False], "settled() said True with the message not queued"
    finally:
        close_channel(channel, children)
