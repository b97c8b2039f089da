"""Review 34f: the reader takes any negative SCM_PIDFD for "the sender was reaped"
(``_receive.c``: ``alive = pidfd_came ? 0 : -1``; ``receive._receive_py``: ``pidfd >= 0 and
...``), but the kernel puts there whatever error making the pidfd met (``scm_pidfd_recv``:
``pidfd_prepare``'s), and with a descriptor table full that is -EMFILE (or -ENFILE, -ENOMEM):
the sender is alive, jobd just could not open a descriptor. Every message read while the
daemon is at its open-file limit (many handlers' pipes, a burst of descriptors sent on the
channel and held for the disposer) is then judged a stranger's and dropped: a handler's result
and status lost, counted as ``stranger``, nothing in the log saying why.

A real channel and its thread, a real handler-like process (leading its own session) sending
on the real socket while the test's process has no descriptor free (RLIMIT_NOFILE lowered to
what it has open, for the moment of the read)."""

from __future__ import annotations

import os

from listening import Heard as Running
from support import close_channel, gated_sender, no_descriptor_free, wait_until

from jobd.daemon.channel import Channel


def test_a_handlers_message_read_while_the_daemon_has_no_descriptor_free_is_not_a_strangers():
    channel = Channel()
    go_r, go_w = os.pipe()
    sent_r, sent_w = os.pipe()
    pid = gated_sender("\0" + channel.address[1:], [b"X_JOBD_RESULT=done"], go_r, sent_w)
    handlers = {pid: Running(pid)}
    channel.start(handlers, None)
    with no_descriptor_free():
        os.write(go_w, b"x")
        assert os.read(sent_r, 1) == b"x"
        wait_until(lambda: channel.queue.qsize() or channel.dropped, what="the message judged")
    try:
        channel.take(handlers)
        assert channel.dropped == {}, f"its message was a stranger's: {channel.dropped}"
        assert [s.result for s in handlers[pid].said] == [b"done"]
    finally:
        close_channel(channel, [pid], (go_r, go_w, sent_r, sent_w))
