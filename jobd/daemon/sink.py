"""The sink: a process of its own that closes the descriptors messages on the handlers' channel
brought (``daemon.disposer`` sends them here), so that the daemon never holds the last copy of
one. Whoever holds the last copy of a file does its release, and a release can wait as long as
the file's sender likes (a pipe's mutex, a TCP socket's lock or linger, an AF_PACKET socket's
RCU grace period, a FUSE server). Here it waits in this process, on one of its threads.

Run as ``python -I -S sink.py FD PARENT`` (imports nothing of jobd, nor of site): FD its end of
a SOCK_SEQPACKET pair, PARENT the daemon's pid. It makes itself non-dumpable (its descriptors
are not to be taken from /proc/PID/fd), dies with the daemon (PR_SET_PDEATHSIG, and end of file
on FD), runs at a lower priority (NICE), ignores SIGINT and SIGHUP (Ctrl-C is the daemon's to
handle: it drains), and reads a message only while one of its closer threads is idle, starting
one (THREADS_MAX at most) when none is: a close that blocks holds one thread, and a pipe sent
after (`jobd notify` waits for its close) is closed by another at once. When every thread is
blocked it reads no more, and the daemon (seeing it leave a message unread) starts another sink,
takes back what this one left unread, and kills it (it exits once its closes let it: what it
holds is released then, in its context).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from collections import deque

THREADS_MAX = 8  # threads in a close at once, at most
FDS_MAX = 253  # descriptors one message carries, at most (the kernel's SCM_MAX_FD)
PR_SET_PDEATHSIG, PR_SET_NAME, PR_SET_DUMPABLE = 1, 15, 4
NICE = 10  # its work yields to the daemon's (under a flood it would take a core from it)


def close_all(fds: list[int]) -> None:
    """Close ``fds`` (this process's own, each open), a run of consecutive numbers in one
    system call (close_range: a message's descriptors are one run, as a rule), the others one
    by one."""
    fds = sorted(fds)
    if fds and fds[-1] - fds[0] == len(fds) - 1:  # one run: no loop
        os.closerange(fds[0], fds[-1] + 1)
        return
    start = 0
    for i in range(1, len(fds) + 1):
        if i == len(fds) or fds[i] != fds[i - 1] + 1:
            if i - start > 1:
                os.closerange(fds[start], fds[i - 1] + 1)  # never fails
            else:
                with contextlib.suppress(OSError):
                    os.close(fds[start])
            start = i


def received(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors a message's ancillary data brought."""
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def become(parent: int) -> None:
    """Dies with ``parent`` (already gone: now), non-dumpable, named, niced, deaf to the
    terminal."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_NAME, b"jobd-sink", 0, 0, 0)
    os.nice(NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def main(fd: int, parent: int) -> None:
    become(parent)
    sock = socket.socket(fileno=fd)
    work: deque[list[int]] = deque()
    ready = threading.Condition()
    idle = threading.Semaphore(0)  # threads waiting for work

    def closer() -> None:
        while True:
            with ready:
                while not work:
                    ready.wait()
                fds = work.popleft()
            close_all(fds)
            idle.release()

    threads = 0
    space = socket.CMSG_SPACE(FDS_MAX * 4)
    while True:
        if not idle.acquire(blocking=False):
            if threads < THREADS_MAX:
                threads += 1
                threading.Thread(target=closer, daemon=True).start()
            else:
                idle.acquire()  # every thread in a close: read nothing meanwhile
        data, ancillary, _, _ = sock.recvmsg(1, space, socket.MSG_CMSG_CLOEXEC)
        if not data and not ancillary:  # end of file: the daemon is gone
            os._exit(0)
        with ready:
            work.append(received(ancillary))
            ready.notify()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
