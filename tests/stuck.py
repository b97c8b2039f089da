"""What the review-34c tests of the handlers' channel share (tests/test_review34c_*.py): a
process stuck in a write whose source page faults for ever, holding the lock of what it writes
to (a userfaultfd page nobody serves; an unprivileged user gets the same from a file on their
own FUSE mount), and a daemon whose healthy handler says "all fine" with `jobd notify`, the
channel's address at hand for a stranger to send on."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, acked_all, queue_config, wait_until

ROOT = Path(__file__).resolve().parent.parent
JOBD = f"{sys.executable} -m jobd"
ENV = json.dumps({"PYTHONPATH": str(ROOT)})
NR_USERFAULTFD = 323  # x86_64
UFFDIO_API, UFFDIO_REGISTER, UFFD_API = 0xC018AA3F, 0xC020AA00, 0xAA
PAGE = 4096
SYSCALLS = {"write": "1", "send": "44"}  # x86_64: write, and sendto (what libc's send calls)


def in_syscall(pid: int, number: str) -> bool:
    """Whether ``pid`` waits in the system call ``number`` (/proc/PID/syscall)."""
    with open(f"/proc/{pid}/syscall") as f:
        return f.read().split()[0] == number


@contextlib.contextmanager
def stuck_writing(fd: int, call: str, closed_in_child: int = -1) -> Iterator[None]:
    """A child blocked in libc's ``call`` (write or send) of a page to ``fd``, the lock of what
    ``fd`` is held, until this ends (the child is killed: its fault ends, the lock is let go).
    The child closes ``closed_in_child`` first (the parent's end of a pipe, say)."""
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            if closed_in_child >= 0:
                os.close(closed_in_child)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            uffd = libc.syscall(NR_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK)
            fcntl.ioctl(uffd, UFFDIO_API, bytearray(struct.pack("QQQ", UFFD_API, 0, 0)))
            addr = libc.mmap(None, ctypes.c_size_t(PAGE), 3, 0x22, -1, ctypes.c_long(0))
            fcntl.ioctl(uffd, UFFDIO_REGISTER, bytearray(struct.pack("QQQQ", addr, PAGE, 1, 0)))
            os.write(ready_w, b"x")
            args = (fd, ctypes.c_void_p(addr), ctypes.c_size_t(PAGE))
            getattr(libc, call)(*args, *((0,) if call == "send" else ()))
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        if os.read(ready_r, 1) != b"x":
            pytest.skip("no userfaultfd here")
        wait_until(lambda: in_syscall(child, SYSCALLS[call]), what=f"the child blocked in {call}")
        yield
    finally:
        os.close(ready_r)
        os.kill(child, signal.SIGKILL)  # its fault ends: the lock is released
        os.waitpid(child, 0)


def notifying_daemon(
    r: redis.Redis, write_config, script, daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> tuple[DaemonProcess, str]:
    """A daemon whose handler, from its second job on, says "all fine" with `jobd notify` (one
    attempt: a notify that fails fails the job); its first job done, and the channel's address
    (abstract, as sendto takes it)."""
    address = tmp_path / "address"
    script(
        "h.sh",
        f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\n'
        f'[ "$JOBD_JOB_ID" = first ] && exit 0\n'
        f"exec {JOBD} notify --status 'all fine'\n",
    )
    d = daemon(write_config(queue_config("[./h.sh]", env=ENV, retry="{max_attempts: 1}")))
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    return d, "\0" + address.read_text().strip()[1:]


def second_job_done_well(r: redis.Redis, d: DaemonProcess, timeout: float) -> None:
    """A second job added: its `jobd notify` was heard (it exited 0), nothing dead-lettered."""
    r.xadd("jobd:q", {"payload": "", "job_id": "second"})
    marker = "job=second attempt=1 exit"
    d.wait_log(marker, timeout=timeout)
    line = next(x for x in d.log().splitlines() if marker in x)
    assert "exit 0" in line, line
    assert not r.exists("{jobd:q}:dead") or r.xlen("{jobd:q}:dead") == 0
