"""Review 34g: "a negative SCM_PIDFD other than -EINVAL/-ESRCH is not known: the pid alone"
(ef4d93b, ``_receive.c`` and ``receive.py``) reopens the pid-reuse attack the pidfd closed.

On this kernel (>= 6.16) SCM_PIDFD is a pidfd even for a sender reaped already (a stale one:
``pidfd_prepare(..., PIDFD_STALE)``), so the reader's ``pidfd_send_signal`` finds it gone
(alive False) and its message is a stranger's: the control test below. The descriptor the
kernel makes for it needs a free slot, though, and with the daemon's table full the kernel puts
-EMFILE there *whatever the sender's state*: ef4d93b then takes the pid alone, ``getsid(pid)``
names whoever has that pid now, and a message of a process that is long gone is taken for the
job whose process got its pid (a forged result, a ``WATCHDOG=trigger``). Before ef4d93b this
was a stranger's (fail closed). -EMFILE says nothing of the sender: the pid alone is not "as
before 6.5" here, it is trusting a pid the kernel already knew to be stale. Not in the docs
(docs/handlers-talking-back.md names only the no-room case as "pid alone").

Real socket, real processes: the sender sends and is reaped, its pid is given (ns_last_pid) to
a new session's leader (the victim job's handler), then the channel reads with no descriptor
free."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
from listening import Heard as Running
from support import (
    NS_LAST_PID,
    close_channel,
    no_descriptor_free,
    session_leader_with_pid,
    wait_until,
)

from jobd.daemon.channel import Channel


def _gone_sender(channel: Channel) -> int:
    """A process that sends a forged message and exits; reaped: its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the hostile sender
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(b"X_JOBD_RESULT=forged\nWATCHDOG=trigger", "\0" + channel.address[1:])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.mark.parametrize("full", [False, True], ids=["control", "emfile"])
def test_a_reaped_senders_message_is_never_taken_for_the_job_that_got_its_pid(full):
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("needs ns_last_pid")
    channel = Channel()
    victim = 0
    try:
        gone = _gone_sender(channel)
        victim = session_leader_with_pid(gone, "the victim's session")  # a job's handler
        handlers = {victim: Running(victim)}
        with no_descriptor_free() if full else contextlib.nullcontext():
            channel.start(handlers, None)
            wait_until(lambda: channel.queue.qsize() or channel.dropped, what="judged")
        channel.take(handlers)
        assert handlers[victim].said == [], (
            f"a reaped sender's message taken for the job that got its pid: "
            f"{[(s.result, s.watchdog) for s in handlers[victim].said]}"
        )
        assert channel.dropped == {("", "stranger"): 1}
    finally:
        close_channel(channel, [victim])
