"""Review 34h: ``jobd notify --extend DURATION`` accepts a duration whose microseconds do not fit
in the 64 bits EXTEND_TIMEOUT_USEC takes (``process.channel.microseconds``: at most 2**64-1,
about 213 503 982 days), sends it as is (``str(round(seconds * 1e6))``: "--extend 999999999d" is
86399999913600000000, "--extend 99999999999999999999h" a 30-digit number), and exits 0 once the
daemon has read it. The daemon finds the value malformed and ignores it: the handler that asked
for "as long as max_timeout allows" gets no time at all, and is stopped at its timeout, while
its `jobd notify` said all was well. Only `jobd_notify_dropped_total{reason="malformed"}` says
otherwise.

What should happen: `jobd notify` either refuses such a duration as a bad command line (exit 2,
as it refuses ``--progress 200``), or sends what the daemon takes (at most 2**64-1 µs: the
deadline then goes to max_timeout, which is what the handler asked for).

`jobd notify` as a handler runs it, against a datagram socket of the test's standing in for the
daemon's channel (it reads the message and closes the descriptor sent with it, as the daemon
does)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from jobd.daemon.sink import received
from jobd.process.channel import parse

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "jobd").is_dir():  # run from tests/open
    ROOT = ROOT.parent


def notify_once(args: list[str], name: str) -> tuple[int, bytes | None, str]:
    """``jobd notify ARGS`` as a handler runs it, against a datagram socket bound at ``name``
    (abstract) standing in for the daemon's channel: its exit status, what it sent (None:
    nothing), its stderr."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as channel:
        channel.bind("\0" + name)
        env = {**os.environ, "NOTIFY_SOCKET": "@" + name, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "notify", *args], env=env, stderr=subprocess.PIPE
        )
        channel.settimeout(10)
        try:
            data, ancillary, _, _ = channel.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
        except TimeoutError:
            data = None  # nothing sent: refused before
        else:
            for fd in received(ancillary):
                os.close(fd)  # read: jobd notify may go
        _, err = proc.communicate(timeout=10)  # closes its pipe too
    return proc.returncode, data, err.decode()


@pytest.mark.parametrize("duration", ["999999999d", "99999999999999999999h"])
def test_jobd_notify_never_sends_an_extension_the_daemon_refuses(duration: str) -> None:
    name = f"jobd-test/{os.getpid()}/{duration}"
    code, data, stderr = notify_once(["--extend", duration], name)
    if code == 2:
        assert data is None, "refused, yet sent"
        return
    assert data is not None, f"exit {code}, nothing sent: {stderr}"
    said = parse(data)
    assert said.well and said.extend is not None, (
        f"`jobd notify --extend {duration}` exited {code} (read), but sent {data!r}: the daemon "
        "finds it malformed and extends nothing"
    )
