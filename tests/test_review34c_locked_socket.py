"""Review 34c (issue 34, the handlers' channel): a descriptor whose *setsockopt* blocks.

``Closer`` (jobd/daemon/closer.py) closes a socket of any family but AF_UNIX at once on the
channel's thread, after setting its SO_LINGER to none, so that no close lingers. But that
setsockopt takes the socket's lock, and any process holding a copy of the socket can hold that
lock as long as it likes: a send from a page the kernel cannot fault in (here a userfaultfd
page nobody serves; an unprivileged user gets the same from a file on their own FUSE mount)
copies from user memory with the socket locked. CPython's ``socket.setsockopt`` keeps the GIL:
the channel's thread blocks in the kernel holding it, and every thread of the daemon stops,
its main loop included. Real daemon, a private Redis.

Fixed: the channel's thread makes no system call on a received descriptor; the daemon sends
them on to a sink process and closes its copies, never the last (``daemon.disposer``)."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from stuck import stuck_writing
from support import DaemonProcess, acked_all, first_job_channel, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]


@contextlib.contextmanager
def locked_tcp_socket() -> Iterator[socket.socket]:
    """A loopback TCP socket whose lock a child process holds until this ends: the child sends
    from a page a userfaultfd registered and never serves (the kernel's copy of it faults, and
    waits, inside tcp_sendmsg, under lock_sock)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sock = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    try:
        with stuck_writing(sock.fileno(), "send"):
            yield sock
    finally:
        for s in (sock, peer, listener):
            s.close()


def test_one_tcp_socket_sent_on_the_channel_freezes_the_whole_daemon(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected (docs/handlers-talking-back.md, "How the channel is protected"): "nothing sent
    on the channel can stall the loop: a descriptor whose close blocks ... stalls only the
    channel, and jobs go on starting and ending meanwhile"; a socket of any family but AF_UNIX
    is closed "at once, its SO_LINGER set to none first"; and a local user must make 8 + 64
    closes that never return to stall even the channel. Before the fix: one message from a
    process of no job, carrying one TCP socket whose lock its sender holds, blocked the
    channel's thread in setsockopt(SO_LINGER) with the GIL held: no job started or ended until
    the sender let go (here: 10 s and more, the second job was never run)."""
    address = tmp_path / "address"
    script("h.sh", f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\n')
    d = daemon(write_config(queue_config("[./h.sh]")))
    name = first_job_channel(r, address)
    with locked_tcp_socket() as sock:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", sock.fileno()))]
            s.sendmsg([b"STATUS=x"], rights, 0, name)
        r.xadd("jobd:q", {"payload": "", "job_id": "second"})
        wait_until(lambda: acked_all(r, "jobd:q", 2), timeout=10, what="the second job done")
    assert "job=second attempt=1" in d.log()
