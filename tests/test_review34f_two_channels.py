"""Review 34f: ``_receive.receive`` keeps its batch in module statics (``messages``, ``busy``)
and refuses a second caller with RuntimeError("receive is not reentrant"); two channels in one
process (two ``Loop``s: the in-process tests' ``loop`` fixture opens as many as asked, a
program embedding jobd) read at the same moment, and one channel's thread gets it: nothing in
``read_out``/``listen`` catches it, the thread ends, and that daemon's channel is dead for good
(no message read again: ``jobd notify`` blocks, a handler's result is never heard, a watchdog
never fires since "drained" never comes, ``sync`` returns at once since the thread is gone),
with nothing but a thread traceback on stderr.

Two real channels, each with its thread, two real processes flooding each on its socket. The
race needs the two threads inside ``receive`` at once: under a flood it comes within
milliseconds (seen after 11 messages)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from jobd.daemon.channel import Channel


def flooder(address: str, seconds: float) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - a handler flooding its channel
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as s:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    try:
                        s.sendto(b"STATUS=x", "\0" + address[1:])
                    except BlockingIOError:
                        time.sleep(0.0005)
        finally:
            os._exit(0)
    return pid


def test_two_channels_in_one_process_both_keep_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    channels = [Channel(), Channel()]
    for channel in channels:
        channel.start({}, None)
    try:
        kids = [flooder(channel.address, 2.0) for channel in channels for _ in range(2)]
        for kid in kids:
            os.waitpid(kid, 0)
        assert died == [], f"a channel's thread died: {died!r}"
        assert all(channel.thread.is_alive() for channel in channels)
    finally:
        for channel in channels:
            channel.close()
