"""Review 34b (issue 34, the handlers' channel): a stranger's message taken for a job whose
process got the stranger's pid after it exited.

docs/handlers-talking-back.md, "How the channel is protected": "Any other message — from
another job, from no job … — is dropped and counted … So a handler cannot speak for another job,
and a process outside every job cannot speak for any"; the channel's docstring: a message from
"one gone before its message was read" is a stranger's. The kernel's SCM_CREDENTIALS gives the
sender's pid as a number when the message is read; ``_whose`` asks ``os.getsid`` of that number
then. A sender gone meanwhile has left the number free: if a process of another job has it by
then, the message is that job's. Messages wait unread whenever the channel is behind (a flood:
"Messages wait in the socket while the channel is stalled or flooded"), and pid_max is 32768 on
many systems (here too): a stranger sends from a child, lets it exit, and forks through the pid
space until a job's process holds the number. The test holds the daemon (SIGSTOP) for the
channel being behind, and steers the pid the job's process gets (ns_last_pid, the test is root)
for the stranger's pid cycling: both only make it deterministic. Real daemon, a private Redis."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, jobd_cli, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]

VICTIM = """\
#!{python}
# An honest job: it says nothing on its channel; one child of it holds a pid (steered to be
# the one the test names: the stand-in for a stranger cycling through pids until it is so).
import os, sys, time
here = sys.argv[1]
open(os.path.join(here, "address"), "w").write(os.environ["NOTIFY_SOCKET"])
if os.environ["JOBD_JOB_ID"] == "first":
    sys.exit(0)
for round in range(5):  # a round a target: another process of the machine may hold one first
    target_file = os.path.join(here, "target.%d" % round)
    while not os.path.exists(target_file):
        time.sleep(0.01)
    target = int(open(target_file).read())
    for _ in range(200):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(target - 1))
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        if child == target:
            break
        os.kill(child, 9)
        os.waitpid(child, 0)
    forked = os.path.join(here, "forked.%d" % round)
    open(forked + ".new", "w").write(str(child))
    os.replace(forked + ".new", forked)  # whole, or not there: read as soon as it is
    if child == target:
        break
while not os.path.exists(os.path.join(here, "release")):
    time.sleep(0.01)
os.kill(child, 9)
os.waitpid(child, 0)
"""


def test_a_gone_strangers_message_is_taken_for_the_job_that_got_its_pid(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Expected: a message from a process of no job is dropped (``stranger``), whoever has its
    pid number when it is read; the job, which said nothing, has no result. Observed: the
    stranger's X_JOBD_RESULT becomes the job's result (and any key the same: a WATCHDOG=trigger
    stops it, an EXTEND_TIMEOUT_USEC moves its deadline)."""
    victim = tmp_path / "victim.py"
    victim.write_text(VICTIM.format(python=sys.executable))
    victim.chmod(0o755)
    config = write_config(queue_config(f"[{victim}, {tmp_path}]", timeout="1m"))
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "first"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first job done")
    name = "\0" + (tmp_path / "address").read_text().strip()[1:]
    r.xadd("jobd:q", {"payload": "", "job_id": "victim"})
    wait_until(lambda: "job=victim attempt=1 started" in d.log(), what="the victim started")
    os.kill(d.proc.pid, signal.SIGSTOP)  # the channel is behind (a flood, in real life)
    try:
        for round in range(5):  # another process of the machine may take the pid first
            stranger = os.fork()
            if stranger == 0:  # pragma: no cover - a process of no job, gone at once
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.sendto(b"X_JOBD_RESULT=forged by a stranger\nSTATUS=forged", name)
                os._exit(0)
            os.waitpid(stranger, 0)
            # whole, or not there: the victim reads it as soon as it is there
            (tmp_path / "target.new").write_text(str(stranger))
            os.replace(tmp_path / "target.new", tmp_path / f"target.{round}")
            forked = tmp_path / f"forked.{round}"
            wait_until(forked.exists, what="the victim's child forked")
            if int(forked.read_text()) == stranger:
                break
        else:
            raise AssertionError("pid not steered in five rounds: run again")
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    wait_until(lambda: d.proc.poll() is None)
    (tmp_path / "release").touch()
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="the victim done")
    wait_until(lambda: "job=victim attempt=1 exit 0" in d.log(), what="the victim's end logged")
    shown = json.loads(jobd_cli("job", "-c", str(config), "--json", "q", "victim").stdout)
    assert "forged" not in json.dumps(shown), f"the stranger's result is the job's: {shown}"
    told = [line for line in d.log().splitlines() if "job=victim attempt=1 told jobd" in line]
    assert not told, f"a stranger's message was taken for the victim: {told}"
