"""No escaped processes (issue 20, in part): jobd is a child subreaper, so a handler's descendant
that leaves its process group (setsid) or daemonizes by a double fork becomes jobd's child, and is
ended once its job has, never while it runs; another job's processes are untouched; adopted
processes that exit are reaped; a handler's own exit status is never taken by that reaping.
Real daemons, real processes; each process is found by a marker in its command line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
import redis
from support import DaemonProcess, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]

# Leaves its group twice over: a setsid'd sleep (re-parented to jobd when the handler exits) and
# a double fork in a new session (re-parented at once); then exits with its payload's code.
ESCAPES = (
    "[/bin/sh, -c, 'setsid sleep 300.$MARK >/dev/null 2>&1 & "
    'setsid sh -c "sleep 301.$MARK >/dev/null 2>&1 &"; sleep 0.2; exit $(cat)\']'
)


def alive(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = p.info["cmdline"] or []
        if marker in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def test_processes_that_leave_the_group_end_with_their_job_and_no_other(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(
        queue_config(ESCAPES, env="{MARK: '1'}")
        + "  other:\n    command: [/bin/sh, -c, 'setsid sleep 302.1 >/dev/null 2>&1 & exec sleep 60']\n"
    )
    d = daemon(config)
    r.xadd("jobd:other", {"payload": "x", "job_id": "long"})
    wait_until(lambda: alive("302.1"), what="the other job's escaped process")
    r.xadd("jobd:q", {"payload": "0", "job_id": "escaper"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "escaper"), what="the job done")
    wait_until(
        lambda: not alive("300.1") and not alive("301.1"), what="its escapees ended", timeout=5
    )
    assert alive("302.1"), "another job's process, its job still running, untouched"
    assert b'"exit_code":0' in r.hget("{jobd:q}:history", "escaper"), "its own exit status"
    d.wait_log("queue=q job=escaper attempt=1 exit 0 after")
    d.wait_log("left the handler's group outlived its job; killed")


def test_after_a_timeout_too(
    r: redis.Redis, write_config, daemon: Daemon, script, tmp_path: Path
) -> None:
    """Each escapee writes its pid before it sleeps: the test knows them without having to see
    them alive within the 1 s timeout (a scan of every process under load took longer)."""
    handler = script(
        "escapes.sh",
        f"""
        #!/bin/sh
        setsid sh -c 'sh -c "echo \\$\\$ > {tmp_path}/a; exec sleep 303.1" >/dev/null 2>&1 &'
        setsid sh -c 'echo $$ > {tmp_path}/b; exec sleep 304.1' >/dev/null 2>&1 &
        exec sleep 60
        """,
    )
    daemon(write_config(queue_config(f"[{handler}]", timeout="1s", retry="{max_attempts: 1}")))
    r.xadd("jobd:q", {"payload": "x", "job_id": "slow"})
    files = [tmp_path / "a", tmp_path / "b"]
    wait_until(lambda: all(f.exists() and f.read_text().strip() for f in files), what="pids")
    pids = [int(f.read_text()) for f in files]
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the timeout's dead letter")

    def running(pid: int) -> bool:
        try:
            p = psutil.Process(pid)
            return p.status() != psutil.STATUS_ZOMBIE and "sleep" in p.cmdline()
        except psutil.NoSuchProcess:
            return False

    wait_until(lambda: not any(map(running, pids)), what="escapees ended", timeout=5)


def test_adopted_processes_that_exit_are_reaped(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Short-lived escapees exit on their own while their job runs: no zombie stays."""
    command = "[/bin/sh, -c, 'for i in 1 2 3 4 5; do setsid sh -c \"sleep 0.1 &\"; done; sleep 2']"
    d = daemon(write_config(queue_config(command)))
    r.xadd("jobd:q", {"payload": "x", "job_id": "j"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "j"), what="the job done")

    def zombies() -> list[psutil.Process]:
        kids = psutil.Process(d.proc.pid).children()
        return [p for p in kids if p.status() == psutil.STATUS_ZOMBIE]

    wait_until(lambda: not zombies(), what="no zombie under the daemon", timeout=5)


def test_nothing_a_job_started_outlives_the_daemon(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """The last handler exits just before SIGTERM reaches the daemon (the sweep has not come
    round again): the daemon's close sweeps one last time, attributed or not. The handler
    waits until the test has seen its escapees (under load, a fixed 0.3 s could end the job,
    and its attributed escapee with it, before the test looked)."""
    go = tmp_path / "go"
    command = (
        "[/bin/sh, -c, 'setsid sleep 305.1 >/dev/null 2>&1 & "
        "env -i setsid sleep 306.1 >/dev/null 2>&1 & echo a; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; echo b; sleep 0.05']"
    )
    d = daemon(write_config(queue_config(command)))
    r.xadd("jobd:q", {"payload": "x", "job_id": "j"})
    wait_until(lambda: alive("305.1") and alive("306.1"), what="its escapees to start")
    go.touch()
    d.wait_log("stdout: b")
    d.stop()
    left = lambda: [(p.pid, p.ppid(), p.status()) for p in alive("305.1") + alive("306.1")]  # noqa: E731
    wait_until(lambda: not left(), what=f"none left (left at first: {left()})", timeout=10)


def test_an_escapee_that_cleared_its_environment_ends_once_no_job_runs(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Not attributed (`env -i`): it may be any running job's, so it is left while one runs,
    and ended once none does."""
    command = "[/bin/sh, -c, 'env -i setsid sleep 307.1 >/dev/null 2>&1 & sleep $(cat)']"
    daemon(write_config(queue_config(command, concurrency=2)))
    r.xadd("jobd:q", {"payload": "0", "job_id": "quick"})
    r.xadd("jobd:q", {"payload": "3", "job_id": "slow"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "quick"), what="the quick job done")
    assert alive("307.1"), "left alone while a job runs: it may be that job's"
    wait_until(lambda: r.hexists("{jobd:q}:history", "slow"), what="the slow job done")
    wait_until(lambda: not alive("307.1"), what="ended once no job runs", timeout=5)


def test_an_escapee_is_its_queues_not_another_queues_on_the_same_stream(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Two queues read one stream (two consumer groups): the same entry is a job of each. The
    escapee of one queue's job ends with that job, though the other queue's job of the same
    entry still runs (a delivery is queue, stream and entry, not stream and entry alone).
    Queue a's handler exits only once the test has seen both processes (a go file): a test
    starved of the CPU for the escapee's whole life would otherwise never see it."""
    go = tmp_path / "go"
    config = (
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a:\n    stream: shared\n    group: ga\n"
        "    command: [/bin/sh, -c, 'setsid sleep 340.1 >/dev/null 2>&1 & "
        f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0']\n"
        "  b:\n    stream: shared\n    group: gb\n    command: [/bin/sleep, '341.1']\n"
    )
    d = daemon(write_config(config))
    r.xadd("shared", {"payload": "x", "job_id": "both"})
    wait_until(lambda: alive("341.1") and alive("340.1"), what="b's job and a's escapee")
    go.touch()
    d.wait_log("queue=a job=both attempt=1 exit 0 after")
    wait_until(lambda: not alive("340.1"), what="queue a's escapee ended", timeout=5)
    assert alive("341.1"), "queue b's job of the same entry runs on"
