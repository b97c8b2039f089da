"""Review 34e: the C reader and the Python fallback say different things of one sender.

``_receive.c``'s ``read_cgroup`` reads the first CGROUP_MAX + 256 (4352) bytes of
/proc/PID/cgroup and looks for the ``0::`` line there; ``receive._cgroup`` (the fallback)
reads the whole file. On a hybrid host (cgroup v1 hierarchies and the v2 one, as this one:
the ``0::`` line comes last) a process whose v1 lines are long (each can be up to PATH_MAX)
has its ``0::`` line past that: the C reader says "no cgroup" (its message is a stranger's,
dropped), the fallback gives its v2 path (its job's, where it is in the job's cgroup). A
process of a job moved into deep v1 cgroups (a container runtime run by a job, say) is heard
or not depending on whether the extension was built.

Real sockets, a real process in real (v1 and v2) cgroups made for the test; no Redis."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest

from jobd.daemon import receive

V1 = ["/sys/fs/cgroup/systemd", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/pids"]
TOP = f"jobd-r34e-{os.getpid()}"


def _deep(base: str) -> list[tuple[int, str]]:
    """A chain of cgroups under ``base`` whose path is over 4000 bytes: (parent fd, name)s,
    the deepest last (its own fd opened last)."""
    parent = os.open(base, os.O_RDONLY)
    chain, name = [], TOP
    for n in range(17):
        os.mkdir(name, dir_fd=parent)
        chain.append((parent, name))
        parent = os.open(name, os.O_RDONLY, dir_fd=parent)
        name = f"d{n:03d}" + "x" * 240
    chain.append((parent, ""))
    return chain


@pytest.fixture
def deep() -> Iterator[list[int]]:
    if not all(os.access(f"{b}/cgroup.procs", os.W_OK) for b in V1):
        pytest.skip("no writable cgroup v1 hierarchies here (not a hybrid host, or not root)")
    chains = [_deep(b) for b in V1]
    yield [c[-1][0] for c in chains]  # the deepest of each, to move a process into
    for chain in chains:
        for parent, name in reversed(chain):
            if name:
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=parent)
            os.close(parent)


def test_the_c_reader_and_the_fallback_give_one_cgroup_for_one_sender(deep, monkeypatch) -> None:
    if receive._native is None:
        pytest.skip("jobd.daemon._receive is not built")
    socks = []
    for kind in ("native", "python"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        s.bind(f"\0jobd-r34e-cgroup/{os.getpid()}/{kind}")
        socks.append(s)
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - a process of a job, in deep v1 cgroups
        try:
            os.setsid()  # not a leader's session: its cgroup is read
            for fd in deep:
                procs = os.open("cgroup.procs", os.O_WRONLY, dir_fd=fd)
                os.write(procs, b"0")
                os.close(procs)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                for target in socks:
                    s.sendto(b"STATUS=hello", target.getsockname())
            os.write(done_w, b"x")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(done_r, 1) == b"x"
        with open(f"/proc/{child}/cgroup", "rb") as f:
            text = f.read()
        own = text.split(b"0::", 1)[1].split(b"\n", 1)[0]
        assert len(text) > 4352 and own, "the sender's 0:: line is past 4352 bytes"
        ((_, _, native_cgroup, *_),) = receive.Receiver(socks[0], cgroups=True).batch([])
        monkeypatch.setattr(receive, "_native", None)
        ((_, _, python_cgroup, *_),) = receive.Receiver(socks[1], cgroups=True).batch([])
        assert python_cgroup == own
        assert native_cgroup == python_cgroup, (native_cgroup, python_cgroup)
    finally:
        os.write(go_w, b"x")
        os.waitpid(child, 0)
        for fd in (go_r, go_w, done_r, done_w):
            os.close(fd)
        for s in socks:
            s.close()
