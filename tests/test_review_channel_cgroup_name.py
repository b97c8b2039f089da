"""Review 32 (issue 32, the handlers' channel in cgroup mode): a process of no job, in a cgroup
of its own elsewhere in the hierarchy that only bears the name of a job's cgroup, speaks for
that job. (A user's systemd instance delegates a subtree to the user, who may name cgroups
there as they like; a job's cgroup's name is in /proc/PID/cgroup of its handler, readable by
anyone.)"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, queue_config, wait_until
from test_cgroups import record, remove, root  # noqa: F401 - the fixture

from jobd.process import where

Daemon = Callable[..., DaemonProcess]


def test_a_stranger_in_a_cgroup_named_like_a_jobs_speaks_for_that_job(
    root: Path,  # noqa: F811
    r: redis.Redis,
    write_config,
    script,
    daemon: Daemon,
    tmp_path: Path,
) -> None:
    """Expected: the stranger's message is dropped (`stranger`), the job's record has no status
    or result of its. Observed: jobd takes the stranger's status and result as the job's
    (``daemon.channel.cgroup_finder`` matches a handler's cgroup's name against every part of
    the sender's cgroup path, wherever it is)."""
    address, pid = tmp_path / "address", tmp_path / "pid"
    script(
        "h.sh",
        f'#!/bin/sh\necho "$NOTIFY_SOCKET" > {address}\necho $$ > {pid}.tmp\n'
        f"mv {pid}.tmp {pid}\n"
        f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n",
    )
    d = daemon(write_config(f"cgroup: {root}\n" + queue_config("[./h.sh]")))
    r.xadd("jobd:q", {"payload": "", "job_id": "victim"})
    wait_until(pid.exists, what="the handler running")
    line = Path(f"/proc/{pid.read_text().strip()}/cgroup").read_text().splitlines()
    name = next(x for x in line if x.startswith("0::")).rpartition("/")[2]
    assert name.startswith("jobd-"), line
    elsewhere = Path(where.mount_point()) / f"review32-{uuid.uuid4().hex[:8]}"  # type: ignore[arg-type]
    (elsewhere / name).mkdir(parents=True)
    try:
        child = os.fork()
        if child == 0:  # no job's process: another session, another cgroup
            os.setsid()
            (elsewhere / name / "cgroup.procs").write_text(str(os.getpid()))
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(
                    b"STATUS=forged\nX_JOBD_RESULT=forged",
                    "\0" + address.read_text().strip()[1:],
                )
            os._exit(0)
        os.waitpid(child, 0)
        (tmp_path / "go").touch()
        wait_until(lambda: r.hexists("{jobd:q}:history", "victim"), what="the job's record")
    finally:
        remove(elsewhere / name)
        remove(elsewhere)
    kept = record(r, "victim")
    assert "forged" not in str(kept), f"a stranger spoke for the job: its record: {kept}"
    assert "forged" not in d.log() and "told jobd" not in d.log()


def test_a_process_that_left_the_jobs_session_but_not_its_cgroup_is_heard(
    root: Path,  # noqa: F811
    r: redis.Redis,
    write_config,
    script,
    daemon: Daemon,
    tmp_path: Path,
) -> None:
    """The other side: in cgroup mode a process of the job that left its session (setsid, a
    double fork) is still the job's, by its cgroup's whole path: its status is the job's."""
    script(
        "h.sh",
        "#!/bin/sh\n"
        f"setsid sh -c 'jobd notify --status from-outside-the-session; touch {tmp_path}/said' &\n"
        f"while [ ! -e {tmp_path}/said ]; do sleep 0.05; done\n",
    )
    config = write_config(f"cgroup: {root}\n" + queue_config("[./h.sh]"))
    d = daemon(config, env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    r.xadd("jobd:q", {"payload": "", "job_id": "mine"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "mine"), what="the job's record")
    assert record(r, "mine").get("status") == "from-outside-the-session", d.log()
