"""Review 34c (issue 34, the handlers' channel): a stranger's flood of messages that each carry
as many descriptors as the kernel allows (253 ends of pipes, the same ones each time: nothing to
make, nothing for the sender to pay). Each costs the channel's thread a few milliseconds (253
descriptors installed, looked at and closed), so ``Channel.sync``'s wait for the
max_dgram_qlen + 1 messages the socket may hold before a handler's last one can outlast its 50
ms; once a wait gave up, none is made again until the socket has been found empty, which a
flood never lets happen. Real daemon, real handlers, a private Redis.

Fixed: the channel's thread only hands the descriptors' numbers to the disposer (about 0.1 ms a
message of 253 where it spent 1.4; under a flood it outruns the sink, the kernel drops the rest
inside recvmsg, and that is cheaper still)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, first_job_channel, jobs_under_descriptor_flood, queue_config

Daemon = Callable[..., DaemonProcess]
JOBS = 40
HANDLER = """#!{python}
import os, socket
address = os.environ["NOTIFY_SOCKET"]
if os.environ["JOBD_JOB_ID"] == "first":
    with open({path!r}, "w") as f:
        f.write(address)
else:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"X_JOBD_RESULT=42", "\\0" + address[1:])
"""


def test_a_descriptor_flood_makes_handlers_last_messages_unheard(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected (docs/handlers-talking-back.md): "A handler that sends and exits is heard"
    (before the daemon takes the handlers that exited out of its table it waits until the
    channel's thread has read everything the socket held, "which under a flood takes a
    fraction of a millisecond"); "a flood of messages from a process of no job ... costs the
    loop nothing". Before the fix: under a stranger's flood of descriptor-laden messages,
    Python handlers that send X_JOBD_RESULT on a raw socket (the page's own example) and exit
    were done without their result, counted as a stranger's: here 23-35 of 40, after
    one or two of sync's waits gave up (the socket, never empty again, turned every later sync
    into none). No privilege, no special descriptor: the sender's cost is one sendmsg a
    message, the same 253 pipe ends each time."""
    address = tmp_path / "address"
    script("h.py", HANDLER.format(python=sys.executable, path=str(address)))
    d = daemon(write_config(queue_config("[./h.py]", concurrency=4)))
    name = first_job_channel(r, address)
    jobs_under_descriptor_flood(r, name, JOBS, timeout=60)
    log = d.log()
    unheard = [f"j{i}" for i in range(JOBS) if f"job=j{i} attempt=1 told jobd: " not in log]
    gave_up = log.count("a wait for the thread gave up")
    assert not unheard, (
        f"{len(unheard)} of {JOBS} done without their result ({gave_up} syncs gave up): {unheard}"
    )
