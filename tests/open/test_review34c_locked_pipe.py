"""Review 34c (issue 34, the handlers' channel): a pipe whose close blocks.

``Closer`` (jobd/daemon/closer.py) closes a pipe sent on the channel at once, on the channel's
thread, because "its close never blocks". It does when the pipe's last reader goes while a
writer holds the pipe's lock: the kernel's ``pipe_release`` takes the pipe's mutex, and
``pipe_write`` holds it while it copies from the writer's memory, which a writer can make
fault and wait as long as it likes (a userfaultfd page nobody serves here; an unprivileged
user gets the same from a file on their own FUSE mount). One message carrying the read end of
such a pipe stalls every job's channel. Real daemon, real handlers, a private Redis."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, acked_all, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
JOBD = f"{sys.executable} -m jobd"
ENV = json.dumps({"PYTHONPATH": str(ROOT)})
NR_USERFAULTFD = 323  # x86_64
UFFDIO_API, UFFDIO_REGISTER, UFFD_API = 0xC018AA3F, 0xC020AA00, 0xAA
PAGE = 4096


def in_syscall(pid: int, number: str) -> bool:
    """Whether ``pid`` waits in the system call ``number`` (/proc/PID/syscall)."""
    with open(f"/proc/{pid}/syscall") as f:
        return f.read().split()[0] == number


@contextlib.contextmanager
def locked_pipe() -> Iterator[int]:
    """The read end of a pipe (the caller's only copy) whose lock a child holds until this
    ends: the child writes from a page a userfaultfd registered and never serves (the
    kernel's copy of it faults, and waits, inside pipe_write, the pipe's mutex held)."""
    read_end, write_end = os.pipe()
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            uffd = libc.syscall(NR_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK)
            fcntl.ioctl(uffd, UFFDIO_API, bytearray(struct.pack("QQQ", UFFD_API, 0, 0)))
            addr = libc.mmap(None, ctypes.c_size_t(PAGE), 3, 0x22, -1, ctypes.c_long(0))
            fcntl.ioctl(uffd, UFFDIO_REGISTER, bytearray(struct.pack("QQQQ", addr, PAGE, 1, 0)))
            os.write(ready_w, b"x")
            libc.write(write_end, ctypes.c_void_p(addr), ctypes.c_size_t(PAGE))
        finally:
            os._exit(0)
    os.close(write_end)
    os.close(ready_w)
    try:
        if os.read(ready_r, 1) != b"x":
            pytest.skip("no userfaultfd here")
        wait_until(lambda: in_syscall(child, "1"), what="the child blocked in its write")
        yield read_end
    finally:
        os.close(ready_r)
        os.kill(child, signal.SIGKILL)  # its fault ends: the pipe's lock is released
        os.waitpid(child, 0)


def test_one_pipe_sent_on_the_channel_stalls_every_jobs_channel(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected (docs/handlers-talking-back.md, "How the channel is protected"): a pipe sent
    on the channel is closed "at once" (Closer: "its close never blocks"), and only "a local
    user who can make closes that never return (8 of them at once, and 64 more waiting) stalls
    the channel". Observed: one message from a process of no job, carrying the read end of a
    pipe whose writer holds its lock, blocks the channel's thread in that close: a healthy
    job's `jobd notify --status` is never read, exits 1 after 5 s, and the job fails."""
    address = tmp_path / "address"
    script(
        "h.sh",
        f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\n'
        f'[ "$JOBD_JOB_ID" = first ] && exit 0\n'
        f"exec {JOBD} notify --status 'all fine'\n",
    )
    config = queue_config("[./h.sh]", env=ENV, retry="{max_attempts: 1}")
    d = daemon(write_config(config))
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    name = "\0" + address.read_text().strip()[1:]
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
        r.xadd("jobd:q", {"payload": "", "job_id": "second"})
        marker = "job=second attempt=1 exit"
        d.wait_log(marker, timeout=15)
        line = next(x for x in d.log().splitlines() if marker in x)
    assert "exit 0" in line, line
    assert not r.exists("{jobd:q}:dead") or r.xlen("{jobd:q}:dead") == 0
