"""Review 34f: a sender's messages read in one batch are merged (``_receive.c``'s runs, then
``Channel.take_one``'s batch, both ``Said.merge``), and the merge loses what a message must
keep alone:

- ``WATCHDOG=trigger`` ("at once", docs/handlers-talking-back.md, as systemd's: the watchdog
  fires on it) followed in the same batch by a ``WATCHDOG=1`` (a heartbeat thread of the same
  handler, say) merges into ``watchdog=True``: the trigger is gone, the handler is not due;
- a merged item whose handler left the table before the loop took it is counted as ONE message
  dropped (``take``: ``self.drop("", "stranger")``), however many it stands for (9215cf4 says
  strangers are counted by run: here they are not).

A real channel and its thread reading the real socket; the messages are sent before the thread
starts, so they are read in one batch (deterministic); the handler a stand-in with the real
``Talking`` (what ``Handler`` hears with)."""

from __future__ import annotations

import math
import os
import socket
import time
from types import SimpleNamespace

from support import wait_until

from jobd.daemon.channel import Channel
from jobd.process.channel import Talking


class Running(Talking):
    def __init__(self, pid: int, watchdog: float) -> None:
        self.pid = pid
        self.queue = SimpleNamespace(name="q", watchdog=watchdog, max_timeout=None)
        self.started, self.timeout = time.monotonic(), 3600.0
        self.due = self.started + self.timeout
        self.told, self.stop_reason = None, None


def sent_then_read(messages: list[bytes], handlers: dict) -> Channel:
    channel = Channel()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for m in messages:
            s.sendto(m, "\0" + channel.address[1:])
    channel.start(handlers, None)
    # the thread reads all, queues what they say, then says it found the socket empty
    wait_until(lambda: channel.queue.qsize() >= 2, what="the batch queued")
    return channel


def test_a_watchdog_trigger_followed_by_a_heartbeat_in_the_same_batch_still_fires() -> None:
    me = os.getsid(0)
    handler = Running(me, watchdog=60.0)
    handlers = {me: handler}
    channel = sent_then_read([b"WATCHDOG=1", b"WATCHDOG=trigger", b"WATCHDOG=1"], handlers)
    try:
        assert channel.take(handlers) == [handler]
        # sent WATCHDOG=trigger: its watchdog fired, it is due at once (not in 60 s)
        assert handler.due <= time.monotonic(), (
            f"the trigger was merged away: due in {handler.due - time.monotonic():.0f}s, "
            f"last_watchdog {handler.told.last_watchdog}"
        )
        assert handler.told.last_watchdog == -math.inf
    finally:
        channel.close()


def test_a_merged_item_of_a_handler_gone_counts_every_message_dropped() -> None:
    me = os.getsid(0)
    handler = Running(me, watchdog=None)
    handlers = {me: handler}
    channel = sent_then_read([b"STATUS=%d" % i for i in range(5)], handlers)
    try:
        assert channel.take({}) == []  # it left the table before the loop took it
        assert channel.dropped == {("", "stranger"): 5}, channel.dropped
    finally:
        channel.close()
