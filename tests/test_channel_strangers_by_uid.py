"""The handlers' channel under a flood of another user's (review 34m: anyone can find the
channel's abstract name in /proc/net/unix). A message whose sender's uid (SCM_CREDENTIALS, the
kernel's word) is no user a handler runs as is a stranger's with no system call more: no
session, no pidfd check, no leader's pidfd, no cgroup read; a run of them, whoever sent each, is
judged once; and it is never kept while a start is under way (it can be no handler's), where
each was kept in ``unsure`` and judged again (its session's first until that start's end, with
its leader's pidfd held). Only where no handler runs as root (``Channel.speak_as``;
``receive.speakers``).

A real channel and its thread, real processes of their own sessions and users (root: setuid)
sending on the real socket; the handler in the table is a stand-in (``listening.Heard``)."""

from __future__ import annotations

import os
import socket
import time

import pytest
import redis
from listening import Heard
from support import close_channel, wait_until
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd.daemon import receive
from jobd.daemon.channel import UNSURE_MAX, Channel

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="senders of other users: root")

HANDLERS, STRANGER = 65534, 64000  # the handlers' user (nobody), another


def sender(name: str, uid: int, messages: list[bytes], go: int = -1, wait: bool = False) -> int:
    """A forked process leading a session of its own, as user ``uid``, that sends ``messages``
    on the socket ``name`` once a byte comes on ``go`` (at once without), and lives on;
    returned once it sent them with ``wait``."""
    sent_r, sent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - a handler, or a stranger
        try:
            os.setsid()
            os.setgid(uid)
            os.setuid(uid)
            if go >= 0:
                os.read(go, 1)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                for m in messages:
                    s.sendto(m, name)
            os.write(sent_w, b"x")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(sent_w)
    if wait:
        assert os.read(sent_r, 1) == b"x"
    os.close(sent_r)
    return pid


def test_another_users_flood_while_a_start_is_under_way_holds_no_handlers_message() -> None:
    """The flood is dropped as it is read, none kept for the start's end, and a running
    handler's message sent after it is heard."""
    channel = Channel()
    channel.speak_as({HANDLERS})
    handlers: dict[int, Heard] = {}
    channel.start(handlers, None)
    name, children = "\0" + channel.address[1:], []
    go_r, go_w = os.pipe()
    try:
        handler_pid = sender(name, HANDLERS, [b"X_JOBD_RESULT=mine"], go=go_r)
        children.append(handler_pid)
        handler = handlers[handler_pid] = Heard(handler_pid)  # running
        channel.begin_start()  # another handler being started, for the whole test
        flood = 2 * UNSURE_MAX
        children.append(sender(name, STRANGER, [b"STATUS=not yours"] * flood))
        wait_until(lambda: channel.count >= flood, what=f"the flood read ({channel.count})")
        os.write(go_w, b"x")  # the handler speaks, after the flood
        wait_until(lambda: channel.take(handlers) or handler.said, what="the handler heard")
        assert [said.result for said in handler.said] == [b"mine"]
        assert not channel.unsure, len(channel.unsure)
        assert channel.dropped == {("", "stranger"): flood}, channel.dropped
    finally:
        channel.end_start()
        os.close(go_w)
        os.close(go_r)
        close_channel(channel, children)


@pytest.mark.skipif(receive._native is None, reason="the C reader is not built")
def test_a_run_of_strangers_messages_is_one_item_with_nothing_looked_up() -> None:
    """Three strangers of another user, three messages each (the socket's queue holds ten by
    the kernel's default), and a handler's: the strangers' are one item (sid -1, not alive, no
    leader), the handler's is judged by its session."""
    channel = Channel()  # its thread not started: the test reads
    channel.speak_as({HANDLERS})
    name = "\0" + channel.address[1:]
    children = [sender(name, STRANGER, [b"STATUS=x"] * 3, wait=True) for _ in range(3)]
    try:
        children.append(mine := sender(name, HANDLERS, [b"STATUS=mine"], wait=True))
        items = channel.receiver.batch([], keep=True)
        assert [receive.count_of(m) for m in items] == [9, 1], items
        stranger, handler = items
        assert stranger[1:4] == (-1, None, False) and stranger[8] == -1, stranger
        assert (handler[0], handler[1], handler[3]) == (mine, mine, True), handler
        if handler[8] >= 0:
            os.close(handler[8])
    finally:
        close_channel(channel, children)


def test_no_user_is_filtered_once_a_handler_runs_as_root() -> None:
    channel = Channel()
    try:
        channel.speak_as({HANDLERS})
        assert channel.receiver.uids
        channel.speak_as({0})  # a reload: a queue as root (the earlier users stay)
        assert channel.uids == {0, HANDLERS} and channel.receiver.uids == b""
    finally:
        channel.close()


def test_the_daemon_knows_the_users_its_handlers_run_as(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  q: {{stream: {STREAM}, command: [/bin/true], run_as: {{user: nobody}}}}\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    channel = loop.daemon.running.channel
    assert channel.uids == {HANDLERS} and channel.receiver.uids == receive.speakers({HANDLERS})
