"""Review 34c (issue 34, the handlers' channel): descriptors closed "at once" that take seconds.

``Closer`` (jobd/daemon/closer.py) closes a socket of any family but AF_UNIX at once, on the
channel's thread (its SO_LINGER set to none first), as one whose close cannot block. An
AF_PACKET socket's close waits for an RCU grace period (``packet_release`` calls
``synchronize_net``): about 13 ms each here, 3.3 s for the 253 one message may carry. Any
local user gets such sockets: a user namespace of its own (unprivileged here) has a network
namespace of its own in which it may open them, and a descriptor opened there can be sent to
the daemon on a Unix socket made before. A few messages hold the channel for as long as the
sender likes: every job's `jobd notify` failed. Real daemon, real handlers, a private Redis.

Fixed: those releases happen in a sink process (``daemon.disposer``), never on the channel's
thread."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import redis
from stuck import notifying_daemon, second_job_done_well
from support import DaemonProcess

Daemon = Callable[..., DaemonProcess]
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
NOBODY = 65534
MESSAGES, FDS = 8, 253  # 253: SCM_MAX_FD; 8 of them: fewer than the socket holds (11)


def send_packet_sockets(name: str) -> int:
    """A child, as nobody, in a user and network namespace of its own, sends MESSAGES
    messages of FDS AF_PACKET sockets each on the channel ``name`` (its Unix socket made
    before it left the daemon's network namespace), closing its own copies. Its exit status:
    0 when all were sent."""
    libc = ctypes.CDLL(None, use_errno=True)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            for _ in range(MESSAGES):
                packets = [socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) for _ in range(FDS)]
                fds = struct.pack(f"{FDS}i", *(p.fileno() for p in packets))
                out.sendmsg([b"STATUS=x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], 0, name)
                for p in packets:
                    p.close()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])


def test_a_strangers_packet_sockets_stall_every_jobs_channel(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected (docs/handlers-talking-back.md, "How the channel is protected"): sockets of a
    family other than AF_UNIX are closed "at once" and only "a local user who can make closes
    that never return (8 of them at once, and 64 more waiting) stalls the channel"; a stranger's
    message is dropped and costs nothing. Before the fix: an unprivileged process of no job
    sent eight messages carrying AF_PACKET sockets of its own network namespace; the channel's
    thread spent seconds closing them one by one (13 ms each here), a healthy job's `jobd
    notify --status` was not read within its 5 s and exited 1, and the job failed."""
    d, name = notifying_daemon(r, write_config, script, daemon, tmp_path)
    # Each message's sockets are the daemon's alone once read (its close is the last): the
    # daemon is held while they are sent, so that this test never loses that race (a real
    # sender just sends more).
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        assert send_packet_sockets(name) == 0, "the stranger could not send its sockets"
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    second_job_done_well(r, d, timeout=20)
