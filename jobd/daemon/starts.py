"""The handlers' channel while the loop starts a handler (``daemon.channel``'s part of the start
race): a handler's first message may be read before the loop has put it in its table, so a
message of a session no running handler leads, read while a start is under way, is kept
(``Channel.unsure``) and judged again once that start has ended (``rejudge``), a later one of its
session behind it.

Judged again by its session's id, looked up when it was read: the sender may have exited since,
its session with it, and the handler whose start was under way may have got that id as its pid
(a stranger's message then taken for that job: a forged result, a ``WATCHDOG=trigger``). So a
message of a session unknown when it was read brings a pidfd of that session's leader, taken
while its sender was in it (``receive.leader_of``): the message is a handler's only while that
leader lives, which makes it the handler of that pid (``vouched``); a session that had no leader
then is never a handler's.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from jobd.daemon.poller import Wakeup
from jobd.daemon.receive import NO_LEADER, Message, count_of, lives
from jobd.process.channel import Said
from jobd.process.handler import Handler

if TYPE_CHECKING:
    from collections.abc import Callable

Batch = dict[int, tuple[Handler, Said, float]]


class Starts:
    """``Channel``'s side of the loop's starts (a mixin: the channel's state, its ``take_one``)."""

    starting: int
    started: int
    ended: threading.Event
    closing: bool
    in_hand: int
    unsure: list[tuple[Message, int, bool]]
    asked: Wakeup
    take_one: Callable[..., int]

    def begin_start(self) -> None:
        """The loop is about to start a handler (it is in ``handlers`` once ``end_start``)."""
        self.starting += 1

    def end_start(self) -> None:
        """The handler the loop started is in ``handlers`` (or failed to start): a message
        read meanwhile from a session not known then is judged again (the thread is asked)."""
        self.starting -= 1
        self.started += 1
        self.ended.set()
        if self.unsure:
            self.asked.wake()

    def rejudge(self, batch: Batch) -> int:
        """The ``unsure`` messages whose start has ended since they were read, judged again:
        their sender's now, or a stranger's for good; the items queued."""
        ready: list[Message] = []
        kept: list[tuple[Message, int, bool]] = []
        waiting: set[int] = set()  # sessions with a message kept: their later ones wait too
        for message, at, follows in self.unsure:
            if message[1] not in waiting and (follows or self.started > at):
                ready.append(message)
            else:
                kept.append((message, at, follows))
                waiting.add(message[1])
        self.in_hand += sum(map(count_of, ready))  # out of ``unsure``, not queued yet: held
        self.unsure = kept
        queued = 0
        for message in ready:
            queued += self.take_one(message, batch, again=True)
            self.in_hand -= count_of(message)
        return queued

    def await_start(self, batch: Batch) -> int:
        """``unsure`` is full (a stranger's flood while a start is under way, say): wait for
        that start's end (the socket holds what comes meanwhile: its senders wait), then judge
        again what ``unsure`` holds; the items queued. Dropped, a handler's first message was
        lost; taken, a later one went before it."""
        at = self.started
        while self.started == at and self.starting and not self.closing:
            self.ended.wait(0.1)
            self.ended.clear()
        return self.rejudge(batch)

    def forget(self) -> None:
        """What ``unsure`` holds, let go (the channel closed): its leaders' pidfds closed."""
        for message, _, _ in self.unsure:
            if message[8] >= 0:
                os.close(message[8])
        self.unsure = []


def vouched(message: Message) -> bool:
    """Whether ``message``'s session, when found in the table by its id, is the one it was
    sent from: known when it was read (-1), or its leader then alive still (so the handler of
    that pid is that leader: while it lives, no other process has its pid)."""
    leader = message[8]
    return leader == -1 or (leader != NO_LEADER and leader >= 0 and lives(leader))
