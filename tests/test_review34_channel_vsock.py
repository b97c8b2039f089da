"""Review 34 (issue 34, the channel's Closer): a descriptor of an AF_VSOCK socket sent on the
channel ends the channel's thread. ``Closer.discard`` sets SO_LINGER on every socket a message
brings with ``sock.setsockopt(SOL_SOCKET, SO_LINGER, <bytes>)``; for an AF_VSOCK socket
CPython's setsockopt takes only an int and raises TypeError, which ``except OSError`` does not
catch: it leaves ``read_out`` and ends the thread. From then on no message of any job is
read (status, progress, EXTEND_TIMEOUT_USEC, WATCHDOG=1, X_JOBD_RESULT), and `jobd notify`
exits 1 after its 5 s. The sender needs no job: the channel's abstract address is readable in
/proc/net/unix, and any local user may make an AF_VSOCK socket where the kernel has vsock
(here: `su nobody -c "python3 -c 'socket.socket(socket.AF_VSOCK)'"` works). Real daemon."""

from __future__ import annotations

import json
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, acked_all, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
ROOT = Path(__file__).resolve().parent.parent
JOBD = f"{sys.executable} -m jobd"
ENV = json.dumps({"PYTHONPATH": str(ROOT)})


def _vsock() -> socket.socket:
    try:
        return socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except (AttributeError, OSError) as exc:
        pytest.skip(f"no AF_VSOCK here: {exc}")


def test_a_vsock_descriptor_from_a_stranger_ends_the_channel(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    vsock = _vsock()
    script(
        "h.sh",
        f"""
        #!/bin/sh
        read name
        echo "$NOTIFY_SOCKET" > {tmp_path}/address
        {JOBD} notify --status "said by $name"
        echo $? > {tmp_path}/rc.$name
        """,
    )
    config = queue_config("[./h.sh]", env=ENV, retry="{max_attempts: 1}")
    d = daemon(write_config(config))
    r.xadd("jobd:q", {"payload": "first", "job_id": "first"})
    wait_until(lambda: (tmp_path / "rc.first").exists(), what="the first job's notify")
    assert (tmp_path / "rc.first").read_text().strip() == "0"
    # A process of no job sends one message carrying an AF_VSOCK socket.
    address = "\0" + (tmp_path / "address").read_text().strip()[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        rights = struct.pack("i", vsock.fileno())
        s.sendmsg([b"STATUS=x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, address)
    vsock.close()
    # A job after it says its status with `jobd notify`: read at once, as the first's was.
    r.xadd("jobd:q", {"payload": "second", "job_id": "second"})
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="the second job settled")
    rc = (tmp_path / "rc.second").read_text().strip()
    assert rc == "0", f"jobd notify of the second job exited {rc}:\n{d.log()[-2500:]}"
    d.wait_log("job=second attempt=1 told jobd: ")
