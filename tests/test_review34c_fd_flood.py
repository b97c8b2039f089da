"""Review 34c (issue 34, the handlers' channel): a stranger's flood of messages that each carry
as many descriptors as the kernel allows (253 ends of pipes, the same ones each time: nothing to
make, nothing for the sender to pay). Each costs the channel's thread a few milliseconds (253
descriptors installed, looked at and closed), so ``Channel.sync``'s wait for the
max_dgram_qlen + 1 messages the socket may hold before a handler's last one can outlast its 50
ms; once a wait gave up, none is made again until the socket has been found empty, which a
flood never lets happen. Real daemon, real handlers, a private Redis.

Fixed here: what `jobd notify` sent is queued for the loop before its pipe is closed; and
a raw socket's last message under this flood (test_review34c_fd_flood_raw.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, first_job_channel, jobs_under_descriptor_flood, queue_config

Daemon = Callable[..., DaemonProcess]


def test_a_descriptor_flood_makes_jobd_notify_results_unheard(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected (docs/handlers-talking-back.md): "`jobd notify` and `systemd-notify` wait until
    their message is read, so theirs never do" come too late, even while sync's waits are off.
    Observed: `jobd notify` returns once the channel's thread has closed its pipe, but the
    message then waits in the thread's batch (flushed every 32 messages, 100 ms and more under
    this flood); with sync's waits off, the handler that exits right after is out of the table
    first: done without its result (4-12 of 20 here, every `jobd notify` exit 0)."""
    address = tmp_path / "address"
    script(
        "h.sh",
        f'#!/bin/sh\n[ "$JOBD_JOB_ID" = first ] && echo "$NOTIFY_SOCKET" > {address} && exit 0\n'
        f"exec {sys.executable} -m jobd notify --result 42\n",
    )
    env = json.dumps({"PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    d = daemon(write_config(queue_config("[./h.sh]", concurrency=4, env=env)))
    name = first_job_channel(r, address)
    jobs = 20
    jobs_under_descriptor_flood(r, name, jobs, timeout=90)
    log = d.log()
    failed = [f"j{i}" for i in range(jobs) if f"job=j{i} attempt=1 exit 0" not in log]
    unheard = [f"j{i}" for i in range(jobs) if f"job=j{i} attempt=1 told jobd: " not in log]
    gave_up = log.count("a wait for the thread gave up")
    assert not unheard, (
        f"{len(unheard)} of {jobs} unheard ({gave_up} syncs gave up; jobd notify failed in "
        f"{failed}): {unheard}"
    )
