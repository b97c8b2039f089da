"""Review 34h: the reader's spare descriptor (``receive.Receiver.spare``, 3b0cd90) frees ONE
slot around each batch, and a message of `jobd notify` needs two: the pipe end it carries
(SCM_RIGHTS, how it learns that jobd read it) and the pidfd the kernel adds after it
(SCM_PIDFD). The kernel installs the message's descriptors first (``scm_detach_fds``), in the
slot the spare gave up, then makes the pidfd: -EMFILE, "not alive" (``_receive.c``: any
negative pidfd), and the message of a live handler is dropped as a stranger's. Its result,
status or EXTEND_TIMEOUT_USEC is lost, counted as ``stranger``; and `jobd notify` still exits 0
("read"), since its pipe end is closed all the same. 3b0cd90's promise, "a daemon out of
descriptors still gets pidfds" (CHANGELOG, review 34g), holds only for messages that bring
no descriptor: not for `jobd notify`'s nor systemd-notify's ``BARRIER=1``, the two ways the
docs say are "always heard".

What should happen: a live handler's message read while the daemon is at its open-file limit
is its handler's (as test_review34f_pidfd_emfile's message without a descriptor is now): the
reader keeps room for a message's pidfd whatever descriptors come before it (say, a spare for
the pidfd and one for a message's descriptors, or the pidfd asked for on its own).

Real channel and thread, a real handler-like process leading its own session that sends what
`jobd notify` sends (its message and a pipe's write end), while the test's process (the
daemon here) has no descriptor free but the reader's spare."""

from __future__ import annotations

import os

from listening import Heard as Running
from support import close_channel, gated_sender, no_descriptor_free, wait_until

from jobd.daemon.channel import Channel


def test_a_jobd_notify_message_read_at_the_open_file_limit_is_its_handlers():
    channel = Channel()
    go_r, go_w = os.pipe()
    sent_r, sent_w = os.pipe()
    pid = _notify_like(channel, [b"X_JOBD_RESULT=done"], go_r, sent_w)  # the handler
    handlers = {pid: Running(pid)}
    channel.start(handlers, None)
    try:
        with no_descriptor_free():  # (the reader's spare, opened before, stays its own)
            os.write(go_w, b"x")
            assert os.read(sent_r, 1) == b"x"
            wait_until(lambda: channel.queue.qsize() or channel.dropped, what="judged")
        channel.take(handlers)
        assert channel.dropped == {}, (
            f"a live handler's message was a stranger's: {channel.dropped}"
        )
        assert [s.result for s in handlers[pid].said] == [b"done"]
    finally:
        close_channel(channel, [pid], (go_r, go_w, sent_r, sent_w))


def _notify_like(channel: Channel, messages: list[bytes], go_r: int, sent_w: int) -> int:
    """A process leading its own session that sends ``messages`` as `jobd notify` does (each
    with a pipe's write end) once a byte comes on ``go_r``, says so on ``sent_w``, and waits."""
    return gated_sender("\0" + channel.address[1:], messages, go_r, sent_w, pipe_ends=True)


def test_later_messages_of_the_same_read_at_the_open_file_limit_are_their_handlers_too(
    monkeypatch,
) -> None:
    """Eight such messages waiting when the thread reads: each one's pipe end holds a slot
    until the disposer has sent it on to its sink (started before), so the reader reads the
    next only while a descriptor and pidfds have room, and when its spares are short waits
    for the disposer to give some back. Each is the handler's; the Python reader's too."""
    for native in (True, False):
        if not native:
            monkeypatch.setattr("jobd.daemon.receive._native", None)
        channel = Channel()
        go_r, go_w = os.pipe()
        sent_r, sent_w = os.pipe()
        said = [b"STATUS=%d" % i for i in range(8)]
        pid = _notify_like(channel, said, go_r, sent_w)
        handlers = {pid: Running(pid)}
        channel.disposer.give([os.dup(0)])  # its sink started, as by an earlier message
        wait_until(lambda c=channel: c.disposer.pending == 0, what="the sink started")
        try:
            with no_descriptor_free():
                os.write(go_w, b"x")
                assert os.read(sent_r, 1) == b"x"
                channel.start(handlers, None)
                wait_until(lambda c=channel: c.count == 8 and c.settled(), what="all read")
            channel.take(handlers)
            assert channel.dropped == {}, f"native={native}: {channel.dropped}"
            heard = handlers[pid].said  # (what a batch read of one handler: merged)
            assert sum(s.count for s in heard) == 8 and heard[-1].status == b"7", heard
        finally:
            close_channel(channel, [pid], (go_r, go_w, sent_r, sent_w))
