"""Review 34f: while too many descriptors wait for the disposer (``Disposer.room()`` below
FDS_MAX: a process sending descriptors whose close blocks, say), the channel reads every
message with room for the sender's credentials alone (``receive.NO_ROOM``). The kernel then
cannot put the SCM_PIDFD it adds to *every* message (SO_PASSPIDFD) and sets MSG_CTRUNC on each,
descriptors or none. The channel takes MSG_CTRUNC for "its descriptors were dropped":

- each message counts in ``jobd_notify_dropped_total{reason="descriptors"}`` though it carried
  none and nothing of it was dropped (it is taken: the count says messages were lost);
- each is a run of its own (``_receive.c``'s ``same_run``: a message with MSG_CTRUNC is
  "dirty"), and ``take_one`` flushes the batch at each (``flags & MSG_CTRUNC``): one item
  for the loop per message, the merging 9215cf4 brought for a flood undone exactly while the
  channel is under attack (and the thread's queue, 1024 items, fills a message at a time).

A real channel, its thread and socket; the disposer's state stood in by its ``room`` (0: what
it says while descriptors wait); the messages sent before the thread starts (one batch)."""

from __future__ import annotations

import os
import socket

import pytest
from listening import Heard as Running
from support import wait_until

from jobd.daemon.channel import Channel


def test_messages_without_descriptors_read_without_room_are_neither_dropped_nor_unmerged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    channel = Channel()
    monkeypatch.setattr(channel.disposer, "room", lambda: 0)  # descriptors wait for a sink
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for i in range(5):
            s.sendto(b"STATUS=%d" % i, "\0" + channel.address[1:])
    me = os.getsid(0)
    handlers = {me: Running(me)}
    channel.start(handlers, None)
    try:
        wait_until(lambda: channel.emptied > float("-inf"), what="the socket read out")
        items = channel.queue.qsize()
        channel.take(handlers)
        assert [s.status for s in handlers[me].said][-1:] == [b"4"]
        assert ("", "descriptors") not in channel.dropped, (
            f"messages that carried no descriptor counted as dropped: {channel.dropped}"
        )
        assert items == 2, f"5 messages of one sender in a batch: {items - 1} items, not 1"
    finally:
        channel.close()
