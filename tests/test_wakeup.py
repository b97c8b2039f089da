"""The loop's ``Wakeup`` (jobd/daemon/poller.py): a wake writes a byte only when none is waiting
(``pending``), and no wake is ever lost: whatever was queued before a wake is taken by a
reader that polls, drains and then takes, however the two threads interleave. Real threads, a
real pipe: many rounds, each of which would hang for good on a lost wake (found so: a drain
that cleared ``pending`` before it read left it set with no byte after it read one written
meanwhile, and the channel's thread then never woke the loop again under a flood)."""

from __future__ import annotations

import collections
import select
import threading

import pytest

from jobd.daemon import poller
from jobd.daemon.poller import Wakeup

ITEMS = 50_000


def test_no_wake_is_lost_and_an_undrained_wake_writes_no_byte_more() -> None:
    w = Wakeup()
    queued: collections.deque[int] = collections.deque()
    done = threading.Event()

    def produce() -> None:
        for i in range(ITEMS):
            queued.append(i)
            w.wake()
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    poll = select.poll()
    poll.register(w.r, select.POLLIN)
    taken = 0
    try:
        while taken < ITEMS:
            # a lost wake: items queued, no byte, the reader asleep for good (here: 5 s)
            assert poll.poll(5000), f"a wake was lost: {len(queued)} items queued, no byte"
            w.drain()
            while queued:
                queued.popleft()
                taken += 1
    finally:
        producer.join()
    assert done.is_set() and taken == ITEMS
    w.wake()
    w.wake()  # not drained: no byte more
    assert len(w.drain()) == 1


def test_a_wake_between_the_drains_first_step_and_its_read_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interleaving that lost wakes, made to happen: another thread's wake (its byte
    written) while the reader drains, before its read. After the drain, a wake must write a
    byte again (the item it is for would wait for ever otherwise)."""
    w = Wakeup()
    read = poller.drain

    def drain_with_a_wake_inside(fd: int) -> bytes:
        w.wake()  # another thread's, just before the read: its byte is read with the rest
        return read(fd)

    monkeypatch.setattr(poller, "drain", drain_with_a_wake_inside)
    w.drain()
    monkeypatch.setattr(poller, "drain", read)
    w.wake()  # an item queued after the drain: its byte must be written
    poll = select.poll()
    poll.register(w.r, select.POLLIN)
    assert poll.poll(0), "the wake after the drain wrote no byte: the reader sleeps on"
