"""Review 34d (issue 34, the handlers' channel): the bound on descriptors waiting in the daemon
is checked once a batch, and a batch takes up to 64 messages of 253 descriptors each.

docs/handlers-talking-back.md: "descriptors wait in the daemon (2048 at most, fewer when its
open-file limit is low); beyond that the channel reads messages without their descriptors";
``disposer._pending_max``: "descriptors waiting must never leave the daemon short of its own".
``Channel.read_out`` asks ``Disposer.room()`` once, before ``Receiver.batch``, and the C reader
then takes every message's descriptors for the whole batch: BATCH_MAX (64) x FDS_MAX (253) =
16 192 descriptors a call, eight times PENDING_MAX, sixteen times the bound under an open-file
limit of 4096 (a quarter of it: 1024). With such a limit the daemon's table fills (EMFILE): the
kernel drops what does not fit, and the daemon's own work (a handler's pipes, Redis) finds no
descriptor. A stranger's flood of messages of 253 pipe ends (the same ones each time) does it.
Real daemon, real handlers, a private Redis."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, descriptor_flooder, first_job_channel, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
LIMIT = 4096  # the daemon's open-file limit, soft and hard: pending at most LIMIT // 4
FLOODERS = 3
JOBS = 20
NOBODY = 65534


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def test_a_batch_takes_sixteen_times_the_descriptors_the_daemon_allows_itself(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected: under a stranger's flood of descriptor-laden messages, the daemon holds at most
    its own descriptors plus LIMIT // 4 waiting for the sink (plus one message's, the bound
    being checked before a message), and once the flood is over its jobs run. Observed: the
    daemon's table fills to its limit (4096 of 4096) within the first batches, and stays full
    for good: the disposer cannot start a sink (socketpair: EMFILE, "cannot start its sink"),
    so nothing that waits for one is ever closed; every job after the flood fails to spawn
    (EMFILE) at every attempt and is dead-lettered. The flooder needs no privilege (its
    descriptors in flight count against its own open-file limit, not the daemon's)."""
    address = tmp_path / "address"
    script("h.sh", f'#!/bin/sh\n[ "$JOBD_JOB_ID" = first ] && echo "$NOTIFY_SOCKET" > {address}\n'
           "exit 0\n")  # fmt: skip
    prefix = ("prlimit", f"--nofile={LIMIT}:{LIMIT}", "--")
    d = daemon(write_config(queue_config("[./h.sh]", concurrency=2)), prefix=prefix)
    name = first_job_channel(r, address)
    pid = d.proc.pid
    own = open_fds(pid)
    children = [descriptor_flooder(name, user=NOBODY) for _ in range(FLOODERS)]  # no privilege
    most = 0
    try:
        end = time.monotonic() + 4
        while time.monotonic() < end:
            most = max(most, open_fds(pid))
            time.sleep(0.005)
    finally:
        for child in children:
            os.kill(child, 9)
            os.waitpid(child, 0)
    for i in range(JOBS):  # the flood is over: the daemon's jobs run as before?
        r.xadd("jobd:q", {"payload": "", "job_id": f"j{i}"})
    first = [f"job=j{i} attempt=1 " for i in range(JOBS)]
    ended = lambda: all(f"{x}exit" in d.log() or f"{x}[Errno" in d.log() for x in first)  # noqa: E731
    wait_until(ended, timeout=60, what="each job's first attempt ended")
    log = d.log()
    failed = [f"j{i}" for i in range(JOBS) if f"job=j{i} attempt=1 exit 0" not in log]
    errors = sorted({line.split("attempt=1 ", 1)[1] for line in log.splitlines()
                     if "attempt=1 [Errno" in line})  # fmt: skip
    bound = own + LIMIT // 4 + 253
    assert most <= bound and not failed, (
        f"the daemon held {most} descriptors under the flood (its own {own}, at most "
        f"{LIMIT // 4} waiting for the sink), {open_fds(pid)} after it; of {JOBS} jobs "
        f"enqueued after the flood, {len(failed)} failed their first attempt: {errors}"
    )
