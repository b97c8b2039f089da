"""Review 34h: a message kept in ``Channel.unsure`` (read while a start is under way, from a
session no running handler leads) is judged again once the start ended (``rejudge``) by the
session id looked up when it was read, without asking again whether its sender lives. The
sender's liveness (its pidfd, ``receive``) is checked at read time only; by the time of the
``rejudge`` it may have exited and left its pid (its session's id) free, and the handler whose
start was under way may have got it: the stranger's message is then taken for that job. A
forged ``X_JOBD_RESULT`` becomes the job's result, a ``WATCHDOG=trigger`` stops it.

That is the pid-reuse attack the pidfd closed (review 34b; "a message is its sender's only if
the sender still lives once its pid has been looked up", docs/handlers-talking-back.md),
reopened for the whole length of a spawn: here the lookup that matters (the table's, by
session id) comes after the liveness check, with the sender gone in between. What should
happen: a kept message's sender is known alive when it is judged again (its pidfd kept with it
and asked again, say), or a session that did not exist when the message was read is never its
sender's; either way the message above is a stranger's.

Real channel and thread, real processes: the stranger leads its own session, sends while the
test (the loop here) has a start under way, and exits once its message is read and kept; its
pid is then given (ns_last_pid) to the new handler's leader, which enters the table before the
start ends."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from listening import Heard as Running
from support import NS_LAST_PID, close_channel, session_leader_with_pid, wait_until

from jobd.daemon.channel import Channel


def test_a_kept_strangers_message_is_not_taken_for_the_handler_that_got_its_pid() -> None:
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("needs ns_last_pid")
    channel = Channel()
    handlers: dict[int, Running] = {}
    channel.start(handlers, None)
    victim = 0
    go_r, go_w = os.pipe()
    try:
        channel.begin_start()  # the loop is starting a handler
        stranger = os.fork()
        if stranger == 0:  # pragma: no cover - a process of no job, its own session's leader
            try:
                os.setsid()
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.sendto(b"X_JOBD_RESULT=forged\nWATCHDOG=trigger", "\0" + channel.address[1:])
                os.read(go_r, 1)  # alive until its message is read
            finally:
                os._exit(0)
        wait_until(lambda: channel.unsure, what="the stranger's message read and kept")
        assert channel.dropped == {}
        os.write(go_w, b"x")
        os.waitpid(stranger, 0)  # gone: its pid is free
        # the spawn under way gets it
        victim = session_leader_with_pid(stranger, "the handler's session")
        handlers[victim] = Running(victim)
        channel.end_start()

        def judged() -> object:
            channel.take(handlers)  # (the socket found empty is queued too: "drained")
            return channel.dropped or handlers[victim].said

        wait_until(judged, what="judged again")
        assert handlers[victim].said == [], (
            "a stranger's message, kept while a start was under way, taken for the handler "
            f"that got its pid: {[(s.result, s.watchdog) for s in handlers[victim].said]}"
        )
        assert channel.dropped == {("", "stranger"): 1}
    finally:
        close_channel(channel, [victim], (go_r, go_w))


def test_a_message_kept_during_its_handlers_start_is_its_handlers_though_its_sender_left():
    """The other side: a handler's first message read while its start is under way, from a
    process of its session that exits at once (a one-line helper of the handler): judged
    again once the start ended, it is the handler's (its session's leader, the handler, lives),
    though its sender is gone."""
    channel = Channel()
    handlers: dict[int, Running] = {}
    channel.start(handlers, None)
    leader = 0
    done_r, done_w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        channel.begin_start()
        leader = os.fork()
        if leader == 0:  # pragma: no cover - the handler: its helper sends and exits
            try:
                os.setsid()
                helper = os.fork()
                if helper == 0:  # alive until its message is read (a gone sender's is not)
                    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                        s.sendto(b"X_JOBD_RESULT=early", "\0" + channel.address[1:])
                    os.read(go_r, 1)
                    os._exit(0)
                os.waitpid(helper, 0)
                os.write(done_w, b"x")
                signal.pause()
            finally:
                os._exit(0)
        wait_until(lambda: channel.unsure, what="its message read and kept")
        os.write(go_w, b"x")
        assert os.read(done_r, 1) == b"x"  # its sender gone
        handlers[leader] = Running(leader)
        channel.end_start()
        wait_until(lambda: channel.take(handlers) or channel.dropped, what="judged again")
        assert channel.dropped == {}
        assert [s.result for s in handlers[leader].said] == [b"early"]
    finally:
        close_channel(channel, [leader], (done_r, done_w, go_r, go_w))
