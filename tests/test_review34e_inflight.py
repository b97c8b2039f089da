"""Review 34e: the disposer spins on a core for as long as a handler of the daemon's user keeps
its descriptors in flight.

The kernel refuses to pass descriptors on (ETOOMANYREFS) once the sending *user* has more in
flight (sent on AF_UNIX sockets, not yet received) than its RLIMIT_NOFILE, unless it has
CAP_SYS_RESOURCE. A handler running as the daemon's user (the usual deployment: no run_as)
can get there alone: 80 messages of 253 copies of one pipe end, sent into a socketpair of its
own that it never reads. ``Sink.send`` then takes ETOOMANYREFS as "a full queue" and
``Disposer.hand_over`` waits for the sink's queue to have room (``Sink.wait``) — it has, the
sink has read everything — and sends again at once: a busy loop, the GIL taken and let go
thousands of times a second (the loop's throughput with it), a core burnt, and every
descriptor given meanwhile left open in the daemon (its sender, ``jobd notify``, waits).

A real Disposer and its sink, run as an unprivileged user (nobody) in a process of its own,
beside the hostile descriptors in flight; its CPU time over two seconds is measured, and the
pipe end given must be closed meanwhile (by the disposer itself: the kernel will not pass it on).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import jobd

SCRIPT = r"""
import array, errno, os, select, socket, sys, time
from jobd.daemon.disposer import Disposer
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)  # the handler's, never read
a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
a.setblocking(False)
r, w = os.pipe()
rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r] * 253).tobytes())]
while True:
    try:
        a.sendmsg([b"x"], rights)
    except OSError as exc:  # ETOOMANYREFS: the user's descriptors in flight pass its limit
        if exc.errno != errno.ETOOMANYREFS:
            print("no-limit", exc)
            sys.exit(0)
        break
d = Disposer()
x, y = os.pipe()  # as jobd notify's pipe: the read end sent on the channel
t0 = os.times()
d.give([x])
poll = select.poll()
poll.register(y, 0)  # POLLERR: its read end closed, as jobd notify waits for
closed = bool(poll.poll(2000))
time.sleep(max(0.0, 2 - (os.times().elapsed - t0.elapsed)))
t1 = os.times()
print("closed" if closed else "open", round(t1.user + t1.system - t0.user - t0.system, 2))
"""


def _python() -> str | None:
    """An interpreter of this version that the unprivileged user can run (the venv's may
    resolve into root's home)."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{name}", f"/usr/local/bin/{name}"):
        probe = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", candidate,
                 "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', ''])"]  # fmt: skip
        if os.path.exists(candidate) and subprocess.run(probe, capture_output=True).returncode == 0:
            return candidate
    return None


def test_descriptors_refused_for_too_many_in_flight_do_not_spin_the_disposer() -> None:
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to run the disposer as an unprivileged user")
    python = _python()
    if python is None:
        pytest.skip("no interpreter the unprivileged user can run")
    root = str(Path(jobd.__file__).resolve().parent.parent)
    path = os.pathsep.join([root, sysconfig.get_paths()["purelib"]])
    got = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", SCRIPT],
        env={"PYTHONPATH": path, "PATH": os.environ.get("PATH", "")}, cwd="/",
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    if got.stdout.startswith("no-limit"):
        pytest.skip(f"this kernel never refused the descriptors in flight: {got.stdout}")
    state, cpu = got.stdout.split()[-2], float(got.stdout.split()[-1])
    assert cpu < 0.5, f"the disposer took {cpu}s of CPU in 2s, refused: it spins"
    assert state == "closed", "the descriptor refused was never closed (jobd notify waits)"
