"""Review 34g: "a read that raises is logged and retried, never the thread's end" (ef4d93b,
``Channel.listen``; its comment names the case: "the sink not started, say") hides a failure it
does not recover from. The disposer's thread starts with the first descriptors a message brings
(``Disposer.give``: ``started = True``, then ``thread.start()``). If that start fails once (no
task free: a handler's fork bomb at the service's TasksMax / pids.max, which handlers share
with the daemon, or RLIMIT_NPROC, or memory for its stack), ``give`` raises, ``listen`` logs it
and reads on, and the disposer is ``started`` with no thread for good: every descriptor any
later message brings (each ``jobd notify``'s pipe, ``systemd-notify``'s barrier) is kept in the
daemon and never closed, so every ``jobd notify`` waits out READ_WITHIN and fails, and once
``most`` are held the channel reads without room (pidfds cut: senders judged by pid alone) for
the daemon's lifetime. Also lost at that raise: the batch's merged items and the descriptors of
the rest of the batch (never closed).

Real channel, real socket, a real message with a pipe's end, as ``jobd notify`` sends, in a
child process that plays the daemon and the handler (its own session's leader). The failed start
is the thread's ``start`` raising once what CPython raises when no thread can be made
(RuntimeError "can't start new thread"). (The review made it a real one, RLIMIT_AS leaving no
room for a stack: that holds only in a process that never ended a thread, glibc reusing the
stacks of ended ones; a pytest worker's fork has ended many.)"""

from __future__ import annotations

import array
import logging
import os
import select
import socket

from listening import Heard as Running
from support import wait_until

from jobd.daemon.channel import Channel


def _send_with_pipe(channel: Channel, text: bytes) -> int:
    """As ``jobd notify`` does: a message with a pipe's write end; the read end, whose end of
    file says the daemon closed its copy."""
    r, w = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [w]).tobytes())]
        s.sendmsg([text], rights, 0, "\0" + channel.address[1:])
    os.close(w)
    return r


def _closed_within(r: int, seconds: float) -> bool:
    return bool(select.select([r], [], [], seconds)[0]) and os.read(r, 1) == b""


def _daemon_and_handler(report: int) -> int:  # pragma: no cover - in the child
    os.setsid()
    me = os.getpid()
    failed: list[logging.LogRecord] = []
    catch = logging.Handler()
    said = ("a read failed", "no thread to close descriptors")  # before the fix; after it
    catch.emit = lambda r: failed.append(r) if any(s in r.getMessage() for s in said) else None
    logging.getLogger("jobd").addHandler(catch)
    channel = Channel()
    handlers = {me: Running(me)}
    channel.start(handlers, None)
    wait_until(lambda: channel.thread.is_alive(), what="the channel's thread")
    start, starts = channel.disposer.thread.start, []

    def once_failing() -> None:  # the first start finds no task free (a fork bomb, say)
        starts.append(1)
        if len(starts) == 1:
            raise RuntimeError("can't start new thread")
        start()

    channel.disposer.thread.start = once_failing  # type: ignore[method-assign]
    first = _send_with_pipe(channel, b"STATUS=one")
    wait_until(lambda: failed, what="the disposer's start failed, logged")
    started = channel.disposer.thread.is_alive()
    second = _send_with_pipe(channel, b"STATUS=two")
    closed = _closed_within(second, 5.0)
    os.write(report, f"thread started: {started}; second closed: {closed}; ".encode())
    os.write(report, f"first closed: {_closed_within(first, 0.1)}".encode())
    return 0 if closed else 1


def test_a_failed_start_of_the_disposer_is_not_its_end():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 2
        try:
            os.close(r)
            code = _daemon_and_handler(w)
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    said = b""
    while chunk := os.read(r, 4096):
        said += chunk
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0, (
        "after one failed start of the disposer's thread, a later message's descriptor is "
        f"never closed (jobd notify waits out its 5 s, descriptors pile up): {said.decode()}"
    )
