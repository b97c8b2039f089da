"""Closing the descriptors a message on the handlers' channel brought (``daemon.channel``): any
local process may send some, of any kind, and the close of some blocks for as long as their
sender likes (a TCP socket's SO_LINGER, a FUSE file's flush). None may block the channel's
thread.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import struct
import threading

CLOSERS_MAX = 8  # threads that close descriptors messages brought (``Closer``)
CLOSING_MAX = 64  # descriptors waiting for a blocked closer, at most; beyond, closed at once
NO_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, for 0 s: a close never waits


class Closer:
    """Closes the descriptors messages bring, so that no close blocks the channel's thread.
    What one is, is read from its /proc/self/fd link (an fstat would ask a FUSE file's server,
    which may never answer). A pipe's (how ``jobd notify`` and ``BARRIER=1`` learn their
    message was read) at once: its close never blocks. A socket of any family but AF_UNIX at
    once too, its linger first set to none (a TCP socket's close waits out SO_LINGER, and its
    sender chose that). Any other (an AF_UNIX socket, whose close is the last of the messages
    waiting in it and of the descriptors they carry, a lingering socket among them; a file
    whose close flushes: FUSE, NFS, a tty draining) on a thread of the closer's: up to
    CLOSERS_MAX of them, one more started while all are in a close. While all are blocked
    and CLOSING_MAX more wait, at once again: rather a stalled channel than a daemon out of
    descriptors (docs/handlers-talking-back.md)."""

    def __init__(self) -> None:
        self.waiting: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.threads = 0
        self.busy = 0  # threads in a close
        self.lock = threading.Lock()

    def discard(self, fd: int) -> None:
        if _closes_at_once(fd):
            with contextlib.suppress(OSError):
                os.close(fd)
            return
        with self.lock:
            idle = self.threads - self.busy
            if idle <= self.waiting.qsize() and self.threads < CLOSERS_MAX:
                self.threads += 1
                threading.Thread(target=self.run, name="jobd-closer", daemon=True).start()
            elif idle <= 0 and self.waiting.qsize() >= CLOSING_MAX:
                fd, blocked = -1, fd
        if fd < 0:  # every thread blocked, and a backlog: closed here, whatever it costs
            with contextlib.suppress(OSError):
                os.close(blocked)
            return
        self.waiting.put(fd)

    def run(self) -> None:
        while True:
            fd = self.waiting.get()
            with self.lock:
                self.busy += 1
            with contextlib.suppress(OSError):
                os.close(fd)
            with self.lock:
                self.busy -= 1


def _closes_at_once(fd: int) -> bool:
    """Whether closing ``fd`` cannot block: a pipe, or a socket of another family than
    AF_UNIX once its linger is set to none."""
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    if link.startswith("pipe:"):
        return True
    if not link.startswith("socket:"):
        return False
    try:  # taken as a Unix socket whatever its family: SO_DOMAIN and SO_LINGER are the
        # kernel's for any socket, and Python checks an option's form by the family it is told
        # (an AF_VSOCK socket's setsockopt takes no bytes: TypeError)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd) as sock:
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) == socket.AF_UNIX:
                    return False
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, NO_LINGER)
            finally:
                sock.detach()
    except (OSError, TypeError, ValueError):
        return False
    return True
