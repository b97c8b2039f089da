"""Review 34e: ``Channel.unsure`` (messages of an unknown session read while a start is under
way) holds UNSURE_MAX (256) messages of *anyone's*, and any local process can send on the
channel (an abstract socket: no permission to write it). A stranger that floods while the loop
starts a handler fills it, and then:

- the handler's first message, read before it is in the table, is dropped as a stranger's
  (the loss begin_start/end_start was made to prevent: a result, a first status);
- the handler's later message, read once it is in the table but before the start ended, no
  longer waits behind its first (``waits`` is False when ``unsure`` is full): it is taken
  first, and the older one, judged again at the start's end, overrides it (a progress going
  back: what 53c3992 fixed).

A real channel and its thread, real processes (each leading a session of its own, as a
handler does) sending on the real socket; the handler in the table a stand-in, added as
``Admission.start`` adds it between ``begin_start`` and ``end_start``."""

from __future__ import annotations

import os

import pytest
from listening import Heard as Started
from support import close_channel, session_sender, wait_until

from jobd.daemon import receive
from jobd.daemon.channel import UNSURE_MAX, Channel


@pytest.fixture(autouse=True)
def one_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python reader: an item a message (the extension gives a sender's messages in a row
    as one item, and a flood of one stranger's would fill ``unsure`` by runs, not messages)."""
    monkeypatch.setattr(receive, "_native", None)


def flooded(channel: Channel, count: int) -> int:
    """A stranger's ``count`` messages read while a start is under way (kept in ``unsure``)."""
    stranger = session_sender("\0" + channel.address[1:], [b"STATUS=flood"] * count)
    wait_until(lambda: len(channel.unsure) == count, what="the flood kept")
    return stranger


def test_a_strangers_flood_during_a_start_does_not_drop_the_handlers_first_message() -> None:
    channel = Channel()
    handlers: dict[int, Started] = {}
    channel.start(handlers, None)
    children: list[int] = []
    try:
        channel.begin_start()
        children.append(flooded(channel, UNSURE_MAX))
        children.append(session_sender("\0" + channel.address[1:], [b"X_JOBD_RESULT=early"]))
        # read, and waiting (``unsure`` full) for the start's end: in hand meanwhile
        wait_until(lambda: channel.count == UNSURE_MAX + 1, what="read")
        handler = handlers[children[-1]] = Started(children[-1])
        channel.end_start()
        wait_until(lambda: channel.settled(), what="judged again")
        channel.take(handlers)
        assert [s.result for s in handler.said] == [b"early"], channel.dropped
    finally:
        close_channel(channel, children)


def test_a_strangers_flood_during_a_start_does_not_reorder_the_handlers_messages() -> None:
    channel = Channel()
    handlers: dict[int, Started] = {}
    channel.start(handlers, None)
    children: list[int] = []
    go_r, go_w = os.pipe()
    try:
        channel.begin_start()
        children.append(flooded(channel, UNSURE_MAX - 1))
        messages = [b"X_JOBD_PROGRESS=10", b"X_JOBD_PROGRESS=90"]
        children.append(session_sender("\0" + channel.address[1:], messages, go=go_r))
        wait_until(lambda: channel.count == UNSURE_MAX and not channel.in_hand, what="read")
        handler = handlers[children[-1]] = Started(children[-1])  # in the table, not ended
        os.write(go_w, b"x")  # its second message: waits, its first kept (``unsure`` full)
        wait_until(lambda: channel.count == UNSURE_MAX + 1, what="read")
        channel.end_start()
        wait_until(lambda: channel.settled(), what="judged again")
        channel.take(handlers)
        progress = [s.progress for s in handler.said]
        assert progress and progress[-1] == 90, progress  # the later one last
    finally:
        close_channel(channel, children, (go_r, go_w))
