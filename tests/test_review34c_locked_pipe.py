"""Review 34c (issue 34, the handlers' channel): a pipe whose close blocks.

``Closer`` (jobd/daemon/closer.py) closes a pipe sent on the channel at once, on the channel's
thread, because "its close never blocks". It does when the pipe's last reader goes while a
writer holds the pipe's lock: the kernel's ``pipe_release`` takes the pipe's mutex, and
``pipe_write`` holds it while it copies from the writer's memory, which a writer can make
fault and wait as long as it likes (a userfaultfd page nobody serves here; an unprivileged
user gets the same from a file on their own FUSE mount). One message carrying the read end of
such a pipe stalled every job's channel. Real daemon, real handlers, a private Redis.

Fixed: the daemon sends what a message brought on to a sink process and closes its copies,
never the last: the pipe's release blocks a thread of the sink (``daemon.disposer``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from stuck import notifying_daemon, second_job_done_well, stuck_writing
from support import DaemonProcess

Daemon = Callable[..., DaemonProcess]


@contextlib.contextmanager
def locked_pipe() -> Iterator[int]:
    """The read end of a pipe (the caller's only copy) whose lock a child holds until this
    ends: it writes a page that faults for ever (``stuck.stuck_writing``), inside pipe_write,
    the pipe's mutex held."""
    read_end, write_end = os.pipe()
    with stuck_writing(write_end, "write", closed_in_child=read_end):
        os.close(write_end)
        yield read_end


def test_one_pipe_sent_on_the_channel_stalls_every_jobs_channel(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected (docs/handlers-talking-back.md, "How the channel is protected"): a pipe sent
    on the channel is closed "at once" (Closer: "its close never blocks"), and only "a local
    user who can make closes that never return (8 of them at once, and 64 more waiting) stalls
    the channel". Before the fix: one message from a process of no job, carrying the read end
    of a pipe whose writer holds its lock, blocked the channel's thread in that close: a
    healthy job's `jobd notify --status` was never read, exited 1 after 5 s, the job failed."""
    d, name = notifying_daemon(r, write_config, script, daemon, tmp_path)
    with locked_pipe() as read_end:
        # The daemon's copy must be the last (its close then releases the pipe): it is held
        # for a moment so that this test never loses that race (a real sender tries again).
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", read_end))]
                s.sendmsg([b"STATUS=x"], rights, 0, name)
            os.close(read_end)
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        second_job_done_well(r, d, timeout=15)
