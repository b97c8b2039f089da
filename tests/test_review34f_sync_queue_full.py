"""Review 34f: ``Channel.sync`` (now ``mark``/``past``) cannot get an exiting handler's last message queued while the
thread's queue to the loop is full, and the loop's ``take`` after it takes QUEUED_MAX items at
most: a message behind a backlog of more than QUEUED_MAX items is not heard before its handler
leaves the table (``Loop.step``: ``sync``, then ``finish`` removes it; the item, taken later,
is dropped as a stranger's). Its result, its last status: lost.

How the queue fills: a message that brings a descriptor is never merged, and is queued at once
(its sender learns it was read when the descriptor is closed), an item of its own; another
handler flooding such datagrams (a hostile one, or a bug) puts one item per datagram, and the
thread, blocked in ``put`` once 1024 wait, could not queue the exiting handler's message however
long ``sync`` waited (it gave up after 50 ms, and then was skipped for a second). (The review
flooded cut datagrams, an item each then; a cut one is now counted on the thread, no item.)

A real channel and its thread, real processes each leading its session (as handlers do) sending
on the real socket; the handlers in the table stand-ins, and the test plays the loop: it exits
its pass's handler only after ``sync`` and ``take`` (``Handlers.sync``), as ``Loop.step``."""

from __future__ import annotations

import array
import os
import select
import signal
import socket
import time

from listening import Heard as Running
from support import wait_until

from jobd.daemon.channel import QUEUED_MAX, Channel


def child(name: str, messages: list[bytes], go: int = -1, rights: bool = False) -> int:
    """A process leading its own session; sends ``messages`` (after a byte on ``go``, if
    given; each with a descriptor, with ``rights``), then exits."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - a handler
        try:
            os.setsid()
            if go >= 0:
                os.read(go, 1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0]).tobytes())]
                for m in messages:
                    s.sendmsg([m], fds if rights else [], 0, name)
        finally:
            os._exit(0)
    return pid


def test_a_handlers_last_message_behind_a_flood_of_cut_ones_is_heard_before_it_leaves() -> None:
    channel = Channel()
    name = "\0" + channel.address[1:]
    go_r, go_w = os.pipe()
    # more than the queue holds: once it is full the thread waits in ``put`` and the flooder
    # in its send (its send buffer holds ~3 in flight: room for the exiting one's, behind)
    # large ones (the socket's bytes run out before its count: the exiting handler's small
    # message still gets in behind them), each with a descriptor: an item each
    flooder = child(name, [b"STATUS=" + b"x" * 60_000] * (2 * QUEUED_MAX), rights=True)
    exiting = child(name, [b"X_JOBD_RESULT=final"], go_r)
    handlers = {flooder: Running(flooder), exiting: Running(exiting)}
    channel.start(handlers, None)
    try:
        wait_until(channel.queue.full, what="the thread's queue full")
        os.write(go_w, b"e")
        # exited, not reaped (the loop syncs before it reaps a leader: a zombie is still its
        # session's, and alive by its pidfd)
        wait_until(lambda: _exited(exiting), what="the exiting handler sent its result and exited")
        # the loop's passes after its exit: a mark, takes until the thread is past it
        # (Handlers.exited, left), then it leaves the table
        mark = channel.mark()
        while mark is not None and not channel.past(mark, time.monotonic()):
            channel.take(handlers)
            select.select([channel.wakeup.r], [], [], 0.01)  # the loop woken
        channel.take(handlers)
        results = [s.result for s in handlers[exiting].said if s.result is not None]
        assert results == [b"final"], "its result was not heard before it left the table"
    finally:
        channel.close()
        for pid in (flooder, exiting):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(go_r)
        os.close(go_w)


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
