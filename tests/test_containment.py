"""Stopping a handler reaches its whole tree and nothing else (issue 32, points 7 and 8, and the
mutation probe's ``Handler.reap`` without its SIGKILL).

- A handler runs in a session of its own: none of its processes can join a group of the daemon's
  session (setpgid across sessions is refused), so a leader that tries to move into its session
  leader's group stays where jobd signals it, and its timeout and a shutdown stop it.
- A stop's SIGTERM reaches a process that escaped by ``setsid`` and a double fork: through its
  cgroup where there is one, through the subreaper's attribution where there is none — at the
  stop, not only once the leader has been SIGKILLed and reaped.
- The subreaper never signals a group it cannot prove is the job's: an escaped process's group
  is killed only when that process leads it.
- Once a handler's leader is reaped, what is left in its group is SIGKILLed then, even a process
  the subreaper cannot attribute (it cleared its environment) while another job runs; and, when
  jobd stopped it, its whole session (a leader that died of the SIGTERM leaves nothing behind).
- A process of a session or cgroup is signalled by a pidfd, only while it is still there: a pid
  freed during the stop's read of /proc and taken by another process is never signalled.
- A stray's group is killed once the stray is dead, where it is its job's (led by it, or of a
  session not the daemon's): a fork-and-exit chain in a group of its own ends with its job.
- A sweep reads /proc once, however many strays it ends; a stop's SIGTERM reaches the cgroups
  below the handler's; a ``run_as`` handler cannot hold its daemon's owner lock (0700).

Real daemons, each started in a session of its own (``setsid``): were a handler to reach the
daemon's session, it is the daemon's, not the test runner's. Processes are found by a marker in
their command line.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_until
from test_cgroups import root  # noqa: F401 - a fixture: a cgroup v2 of the test's own

from jobd.process import reaper, where

Daemon = Callable[..., DaemonProcess]
OWN_SESSION = ("setsid",)  # the daemon leads a session (and group) of its own


def alive(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def handler(script: Callable[[str, str], Path], name: str, body: str) -> Path:
    return script(name, f"#!{sys.executable}\n" + body)


# The leader tries to move into its session leader's group (the daemon's, when it shared the
# daemon's session), says how that went, and sleeps.
JOINS_SESSION_LEADERS_GROUP = """
import os, sys, time
try:
    os.setpgid(0, os.getsid(0))
    said = "moved"
except OSError as exc:
    said = f"refused {exc.errno}"
print(said, flush=True)
os.execv("/bin/sleep", ["/bin/sleep", "700.%s" % os.environ["JOBD_JOB_ID"]])
"""


@pytest.mark.parametrize("where", ["no cgroup", "cgroup"])
def test_a_handler_that_joins_its_session_leaders_group_is_stopped_at_its_timeout(
    r: redis.Redis, write_config, script, daemon: Daemon, where: str, request: pytest.FixtureRequest
) -> None:
    """From the review: the leader called setpgid into the daemon's group; jobd signalled only
    the group numbered by the leader's pid, which was empty: its timeout never stopped it."""
    handler(script, "h.py", JOINS_SESSION_LEADERS_GROUP)
    top = f"cgroup: {request.getfixturevalue('root')}\n" if where == "cgroup" else ""
    config = top + queue_config(
        "[./h.py]", timeout="1s", kill_grace="1s", retry="{max_attempts: 1}"
    )
    daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "71"})
    wait_until(lambda: alive("700.71"), what="the handler running")
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, 15, "its timeout's dead letter")
    wait_until(lambda: not alive("700.71"), 5, "the handler stopped")


def test_a_handler_that_joins_its_session_leaders_group_is_stopped_at_shutdown(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """The same leader, at the end of shutdown_grace, and at a second SIGTERM: the daemon
    stopped it and exited (it waited for it for ever)."""
    handler(script, "h.py", JOINS_SESSION_LEADERS_GROUP)
    config = "shutdown_grace: 60s\n" + queue_config("[./h.py]", timeout="300s", kill_grace="1s")
    d = daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "72"})
    wait_until(lambda: alive("700.72"), what="the handler running")
    d.signal(signal.SIGTERM)
    d.wait_log("stopping; 1 handler(s) running")
    d.signal(signal.SIGTERM)  # the rest of shutdown_grace skipped
    assert d.proc.wait(15) == 0
    assert not alive("700.72"), "the handler stopped before the daemon exited"


# The leader ignores SIGTERM (and so does its sleep); a process it starts leaves its session by
# setsid and a double fork, and writes MARK when it gets SIGTERM.
ESCAPEE_TOLD = """
import os, signal, sys, time
mark = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, lambda *_: (open(mark, "w").write("term"), os._exit(0)))
        open(mark + ".ready", "w").write("ready")
        while True:
            time.sleep(1)
    os._exit(0)
os.wait()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.execv("/bin/sleep", ["/bin/sleep", "701.%s" % os.environ["JOBD_JOB_ID"]])
"""


@pytest.mark.parametrize("where", ["no cgroup", "cgroup"])
def test_a_stops_sigterm_reaches_a_process_that_left_the_session(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path, where: str,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """From the review: a stop signalled the leader's group alone; a process that left it by
    setsid and a double fork got nothing until the leader was SIGKILLed (``kill_grace``, 60 s
    here) and reaped. Its SIGTERM now comes with the stop's: through its cgroup, or through the
    subreaper that adopted it."""
    handler(script, "h.py", ESCAPEE_TOLD)
    mark = tmp_path / "escapee"
    top = f"cgroup: {request.getfixturevalue('root')}\n" if where == "cgroup" else ""
    config = top + queue_config(
        f"[./h.py, {mark}]", timeout="2s", kill_grace="60s", retry="{max_attempts: 1}"
    )
    daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "73"})
    wait_until(lambda: alive("701.73"), what="the handler running")
    wait_until(lambda: Path(f"{mark}.ready").exists(), what="the escapee running")
    wait_until(lambda: mark.exists(), 10, "the escapee told SIGTERM by the timeout's stop")
    assert mark.read_text() == "term"
    assert alive("701.73"), "its leader still running (it ignores SIGTERM): the grace goes on"


def test_a_stray_is_killed_without_the_group_it_joined(tmp_path: Path) -> None:
    """From the review (``kill_tree``): a stray process was killed with its current process
    group whoever led it — the embedded Redis's, a supervisor's, an operator's shell. A process
    may join any group of its session: only a group the stray leads is killed with it."""
    bystander = subprocess.Popen(["sleep", "703.1"], process_group=0)  # a group of its own
    joiner = (
        "import os, sys, time\n"
        f"os.setpgid(0, {bystander.pid})\n"
        "print('joined', flush=True)\n"
        "time.sleep(60)\n"
    )
    stray = subprocess.Popen([sys.executable, "-c", joiner], stdout=subprocess.PIPE)
    try:
        assert stray.stdout is not None and stray.stdout.readline() == b"joined\n"
        assert os.getpgid(stray.pid) == bystander.pid
        assert stray.pid in reaper.kill_tree(stray.pid)
        assert stray.wait(5) == -signal.SIGKILL
        assert bystander.poll() is None, "the group's leader, not the job's, is left alone"
    finally:
        for p in (stray, bystander):
            p.kill()
            p.wait()
        stray.stdout.close()  # type: ignore[union-attr]


# A handler's child tries to move into the session leader's group (the supervisor's, when the
# handler shared its session), says how that went and sleeps; the handler exits meanwhile, so
# its child is adopted by its daemon, the subreaper, and ended as its job has.
CHILD_JOINS_SESSION_LEADERS_GROUP = """
import os, sys, time
r, w = os.pipe()
child = os.fork()
if child == 0:
    try:
        os.setpgid(0, os.getsid(0))
        said = b"moved"
    except OSError:
        said = b"refused"
    os.write(w, said)
    os.execv("/bin/sleep", ["/bin/sleep", "704.%s" % os.environ["JOBD_JOB_ID"]])
print(os.read(r, 16).decode(), os.getsid(0), os.getpgrp(), os.getppid(), flush=True)
while b"704." not in open(f"/proc/{child}/cmdline", "rb").read():  # until it has exec'd
    time.sleep(0.01)
"""


def test_a_stray_in_the_supervisors_group_never_takes_the_supervisor_down(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """From the review: a handler's process that joined the supervisor's group (its session
    leader's) made its daemon SIGKILL that group once the job had ended: the supervisor, so
    the whole service. A handler now has a session of its own (the move is refused), and the
    subreaper kills no group its stray does not lead."""
    handler(script, "h.py", CHILD_JOINS_SESSION_LEADERS_GROUP)
    config = write_config("""\
        redis: {url: '{redis}'}
        processes: 2
        queues:
          q: {command: [./h.py], concurrency: 1}
        """)  # fmt: skip
    d = daemon(config, ready=False, prefix=OWN_SESSION)
    d.wait_log("ready: 2 daemon processes")
    r.xadd("jobd:q", {"payload": "x", "job_id": "74"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "74"), what="the job done")
    wait_until(lambda: not alive("704.74"), 5, "its stray ended with it")
    assert d.proc.poll() is None, "the supervisor still runs"
    r.xadd("jobd:q", {"payload": "x", "job_id": "75"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "75"), what="the service still runs jobs")


# The leader exits at once, leaving a child in its group that the subreaper cannot attribute
# (it cleared its environment): only the SIGKILL to the group when the leader is reaped ends it
# while another job runs.
LEAVES_A_CHILD = "[/bin/sh, -c, 'env -i sleep 705.1 >/dev/null 2>&1 & echo started; exit 0']"


def test_what_a_handler_leaves_in_its_group_is_killed_once_its_leader_is_reaped(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """From the mutation probe: ``Handler.reap`` without its SIGKILL to the group passed every
    test (the subreaper ended what the leader left, having attributed it)."""
    config = (
        "cgroup: off\n"
        + queue_config(LEAVES_A_CHILD)
        + "  other:\n    command: [/bin/sh, -c, 'exec sleep 705.2']\n"
    )
    daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:other", {"payload": "x", "job_id": "long"})
    wait_until(lambda: alive("705.2"), what="another job running")
    r.xadd("jobd:q", {"payload": "x", "job_id": "76"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "76"), what="the job done")
    wait_until(lambda: not alive("705.1"), 5, "what it left in its group killed")
    assert alive("705.2"), "the other job runs on"


def cgroup_with(under: Path, name: str, marker: str) -> subprocess.Popen[bytes]:
    """A cgroup ``name`` ``under`` a cgroup, holding a sleep with ``marker`` in its command
    line."""
    (under / name).mkdir()
    sleeper = subprocess.Popen(["sleep", marker])
    (under / name / "cgroup.procs").write_text(str(sleeper.pid))
    return sleeper


def a_dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    assert not psutil.pid_exists(child.pid)
    return child.pid


def test_a_live_daemons_cgroups_are_not_taken_for_a_dead_ones_by_their_pid(
    r: redis.Redis, write_config, daemon: Daemon, request: pytest.FixtureRequest
) -> None:
    """From the review (by reading), confirmed: the next daemon judged a cgroup
    ``jobd-<pid>-…`` by its pid alone, so a live daemon whose pid it could not see (another pid
    namespace, sharing the cgroup parent) was taken for dead, its handlers killed. Its owner
    cgroup, locked (here by this test) while it lives, says it lives."""
    top: Path = request.getfixturevalue("root")
    pid = a_dead_pid()
    sleeper = cgroup_with(top, f"jobd-{pid}-0badcafe-0", "321.1")
    (top / f"jobd.{pid}-0badcafe").mkdir()
    owner = os.open(top / f"jobd.{pid}-0badcafe", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(owner, fcntl.LOCK_EX)  # the live daemon's
        d = daemon(write_config(f"cgroup: {top}\n" + queue_config("[/bin/true]")))
        r.xadd("jobd:q", {"payload": "x", "job_id": "77"})
        wait_until(lambda: r.hexists("{jobd:q}:history", "77"), what="a job run meanwhile")
        assert "of a daemon that is gone" not in d.log()
        assert sleeper.poll() is None, "the live daemon's handler runs on"
    finally:
        os.close(owner)
        sleeper.kill()
        sleeper.wait()


def test_a_dead_daemons_cgroups_are_ended_though_its_pid_is_another_process_now(
    r: redis.Redis, write_config, daemon: Daemon, request: pytest.FixtureRequest
) -> None:
    """The other way round: a dead daemon whose pid another process has now (reused, or seen
    in another namespace) was taken for alive, and its handlers ran on for ever. Its owner
    cgroup is not locked: it is gone."""
    top: Path = request.getfixturevalue("root")
    pid = os.getpid()  # alive: the pid "reused"
    sleeper = cgroup_with(top, f"jobd-{pid}-0badcafe-0", "322.1")
    (top / f"jobd.{pid}-0badcafe").mkdir()  # nobody holds it: its daemon died
    try:
        d = daemon(write_config(f"cgroup: {top}\n" + queue_config("[/bin/true]")))
        assert sleeper.wait(10) == -signal.SIGKILL, "the dead daemon's handler ended"
        d.wait_log("of a daemon that is gone: ending what is in it")
        wait_until(lambda: not (top / f"jobd-{pid}-0badcafe-0").exists(), what="its cgroup gone")
        wait_until(lambda: not (top / f"jobd.{pid}-0badcafe").exists(), what="its owner gone")
    finally:
        sleeper.kill()
        sleeper.wait()


# A daemon's sweep, in a process of its own (a subreaper, as the daemon): a handler A in a session
# of its own leaves X, its stray (its job's delivery in its environment), in a group of that
# session X does not lead, whose other member C cleared its environment (not attributed, so
# left alone while another job runs: only X's group reaches it). A exits: both are adopted.
SWEEPS_A_STRAY_IN_A_GROUP_IT_JOINED = """
import os, signal, sys, time
from jobd.process import reaper
reaper.become_subreaper()
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    b = os.fork()
    if b == 0:
        os.setpgid(0, 0)
        c = os.fork()
        if c == 0:
            os.execve("/bin/sleep", ["/bin/sleep", "706.1"], {})
        while b"706.1" not in open(f"/proc/{c}/cmdline", "rb").read():  # until it has exec'd
            time.sleep(0.001)
        os._exit(0)
    os.waitpid(b, 0)
    if os.fork() == 0:
        os.setpgid(0, b)  # the group lives on in C
        os.write(w, b"%d %d" % (os.getpid(), b))
        signal.pause()
    os._exit(0)
x, group = map(int, os.read(r, 64).split())
while x not in reaper.children():  # until A's exit gave it to us
    time.sleep(0.01)
print(group, flush=True)
sweeps = reaper.Reaper()
sweeps.enabled = True
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    sweeps.sweep(time.monotonic(), set(), {(b"other", b"jobd:other", b"2-0")})
    time.sleep(0.02)
"""


def test_a_strays_group_in_a_session_of_its_jobs_is_killed_once_it_is_dead() -> None:
    """From the review: a process that forks and exits every millisecond in a group of its own
    (not the stray's) outlived its stop and the sweep, which killed a stray's group only when
    the stray led it. A group cannot span sessions, and a session other than the daemon's that
    holds an adopted process is its job's: that group is killed too, once the stray is dead
    (not yet reaped, its group's number cannot be another's). Deterministic: the group's other
    member is no descendant of the stray, and not attributed."""
    env = dict(os.environ, JOBD_QUEUE="q", JOBD_STREAM="jobd:q", JOBD_MESSAGE_ID="1-0")
    sweeper = subprocess.Popen(
        [sys.executable, "-c", SWEEPS_A_STRAY_IN_A_GROUP_IT_JOINED, "10"],
        stdout=subprocess.PIPE, start_new_session=True, env=env,
    )  # fmt: skip
    assert sweeper.stdout is not None
    try:
        group = int(sweeper.stdout.readline())
        wait_until(lambda: not alive("706.1"), 5, "the stray's group killed with it")
    finally:
        for p in alive("706.1"):
            p.kill()
        sweeper.kill()
        sweeper.wait()
        sweeper.stdout.close()
    assert group


# From a second review (issue 32, containment): its reproductions, and the attacks that held.
# Handlers that must run as another user (``run_as: nobody``) live in a world-readable folder
# under /tmp/review-proc, as the test's own folder is root's alone.
SHARED = Path("/tmp/review-proc/ro")  # handlers another user runs: a folder anyone may enter
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ns_last_pid, run_as)")


def shared_script(body: str) -> Path:
    """An executable handler in a folder of its own that any user may enter and write in."""
    SHARED.mkdir(parents=True, exist_ok=True)
    for p in (SHARED.parent, SHARED):
        p.chmod(0o755 if p == SHARED.parent else 0o777)
    folder = SHARED / uuid.uuid4().hex[:8]
    folder.mkdir()
    folder.chmod(0o777)
    path = folder / "h.py"
    path.write_text(body)
    path.chmod(0o755)
    return path


# The leader leaves a child in its session but in a group of its own, its environment cleared,
# ignoring SIGTERM; the leader itself dies of the stop's SIGTERM.
SESSION_MEMBER_IN_OWN_GROUP = f"""#!{sys.executable}
import os, signal, sys, time
job = os.environ["JOBD_JOB_ID"]
if os.fork() == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.execve("/bin/sleep", ["/bin/sleep", "801." + job], {{}})
time.sleep(1000)
"""


def test_a_stopped_handlers_session_is_killed_though_its_leader_died_of_the_sigterm(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """From the review: README "SIGTERM (SIGKILL after kill_grace) goes to … every process of its
    session". The SIGKILL came only while the leader lived: once it was reaped, only its group
    was killed (``reap``: ``kill(whole=False)``), and the subreaper leaves an unattributed
    process alone while any job runs: the session member lived on. A stopped handler is now
    killed whole when its leader is reaped. (Stopped by `jobd cancel` once the member runs: a
    1 s timeout, as before, could end a handler slow to start before it had forked.)"""
    script("h.py", SESSION_MEMBER_IN_OWN_GROUP)
    config = write_config(
        "cgroup: off\n"
        + queue_config("[./h.py]", kill_grace="1s", retry="{max_attempts: 1}")
        + "  other:\n    command: [/bin/sh, -c, 'exec sleep 802.1']\n"
    )
    daemon(config, prefix=OWN_SESSION)
    r.xadd("jobd:other", {"payload": "x", "job_id": "long"})
    wait_until(lambda: alive("802.1"), what="another job running")
    r.xadd("jobd:q", {"payload": "x", "job_id": "81"})
    wait_until(lambda: alive("801.81"), what="the handler's session member running")
    out = jobd_cli("cancel", "-c", str(config), "q", "81")
    assert out.returncode == 0, out
    wait_until(lambda: not alive("801.81"), 6, "its session member killed (kill_grace 1s)")


# Leader L and M (its first child, in its session) ignore SIGTERM; N sleepers (in its session,
# higher pids) make the daemon's read of every /proc/PID/stat long. At the stop's first SIGTERM
# (it comes up to three times), L waits 30 ms (the scan has read M by then), SIGKILLs and reaps
# M, and says M's pid; never again (M's pid may be the victim's by then).
PID_REUSE = f"""#!{sys.executable}
import os, signal, sys, time
freed, ready, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
m = os.fork()
if m == 0:
    while True:
        signal.pause()
for i in range(n):
    if os.fork() == 0:
        while True:
            signal.pause()
def on_term(*_):
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        return  # once: the stop's SIGTERM comes by pidfd, group and session (its own runs late)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(0.03)
    os.kill(m, signal.SIGKILL)
    os.waitpid(m, 0)
    open(freed + ".tmp", "w").write(str(m))
    os.rename(freed + ".tmp", freed)
signal.signal(signal.SIGTERM, on_term)
open(ready, "w").write("ready")
while True:
    signal.pause()
"""


@NEEDS_ROOT
def test_a_pid_freed_during_a_stops_scan_and_reused_is_not_signalled(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """From the review: a session member was signalled by its pid as the scan of /proc found it
    (``os.kill``, no pidfd, no second look): a member that exits meanwhile leaves its pid to
    whoever gets it next. Now by a pidfd, once it is seen still in the session. The handler
    makes the scan as long as it likes (its process count) and chooses when its member exits;
    the pid's reuse is forced here with ns_last_pid (an attacker wraps pid_max, 32768 here, by
    forking). The victim: a process of the test's, not
    the job's. The stop is a `jobd cancel` (the same SIGTERM to the tree, by the same scan, as
    a timeout's), sent once the processes are up: the 25 s timeout is not waited out."""
    script("h.py", PID_REUSE)
    freed, ready = tmp_path / "freed", tmp_path / "ready"
    config = write_config(
        "cgroup: off\n"
        + queue_config(
            f"[./h.py, {freed}, {ready}, '6000']",
            timeout="25s",
            kill_grace="5s",
            retry="{max_attempts: 1}",
        )
        + "  other:\n    command: [/bin/true]\n"
    )
    daemon(config, prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "82"})
    wait_until(ready.exists, 30, "the handler's processes all started")
    out = jobd_cli("cancel", "-c", str(config), "q", "82")
    assert out.returncode == 0, out
    deadline = time.monotonic() + 40
    while not freed.exists():  # no sleep: the race is the daemon's scan
        assert time.monotonic() < deadline
    pid = int(freed.read_text())
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    victim = subprocess.Popen(["sleep", "803.1"])
    try:
        if victim.pid != pid:
            pytest.skip("inconclusive: another process took the pid first")
        # A job of another queue done: the loop has passed the stop (its scan and its kills).
        r.xadd("jobd:other", {"payload": "x", "job_id": "after"})
        wait_until(lambda: r.hexists("{jobd:other}:history", "after"), 30, "the loop on")
        assert victim.poll() is None, f"jobd signalled the test's process: {victim.poll()}"
    finally:
        victim.kill()
        victim.wait()


# A process of the handler's session, in a group of its own and in a cgroup the handler made
# below its own, says when it gets SIGTERM; the leader ignores SIGTERM.
NESTED = f"""#!{sys.executable}
import os, signal, sys, time
mark, mount = sys.argv[1], sys.argv[2]
cg = mount + open("/proc/self/cgroup").read().strip().split("::", 1)[1]
os.mkdir(cg + "/inner")
if os.fork() == 0:
    os.setpgid(0, 0)
    open(cg + "/inner/cgroup.procs", "w").write("0")
    signal.signal(signal.SIGTERM, lambda *_: (open(mark, "w").write("term"), os._exit(0)))
    open(mark + ".ready", "w").write("ready")
    while True:
        time.sleep(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.execv("/bin/sleep", ["/bin/sleep", "804." + os.environ["JOBD_JOB_ID"]])
"""


def test_a_stops_sigterm_reaches_a_process_in_a_cgroup_below_the_handlers(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """From the review (minor): README "A stop's SIGTERM goes to every process in the handler's
    cgroup": ``Cgroup.send`` read its ``cgroup.procs`` alone, which lists no process of a
    cgroup below (container runtimes make them), and in cgroup mode the session is not looked
    at: only ``cgroup.kill`` (recursive) reached it, ``kill_grace`` later."""
    top = request.getfixturevalue("root")
    script("h.py", NESTED)
    mark = tmp_path / "inner"
    config = f"cgroup: {top}\n" + queue_config(
        f"[./h.py, {mark}, {where.mount_point()}]",
        timeout="2s",
        kill_grace="60s",
        retry="{max_attempts: 1}",
    )
    daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "84"})
    wait_until(lambda: alive("804.84"), what="the handler running")
    wait_until(lambda: Path(f"{mark}.ready").exists(), what="the inner process running")
    wait_until(mark.exists, 10, "the inner process told SIGTERM by the timeout's stop")


# The handler leaves K processes, each leading a session of its own (setsid), its environment
# intact (attributed to its job), and exits: all are adopted by the daemon at once.
MANY_STRAYS = f"""#!{sys.executable}
import os, signal, sys, time
k = int(sys.argv[1])
for i in range(k):
    if os.fork() == 0:
        os.setsid()
        while True:
            signal.pause()
time.sleep(0.5)
"""


def test_a_handlers_strays_do_not_stall_the_loop(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """From the review: the sweep ended each stray with ``kill_tree``, which read every
    process's /proc/PID/stat twice (psutil's ``children(recursive=True)``, and ``in_sessions``
    for a stray that leads its session): K strays cost 2·K full scans in the loop's thread.
    1000 strays: the job's record came 42 s after its exit, no outcome, no start, no watchdog
    ping meanwhile (the units' WatchdogSec is 30 s). Now one scan a sweep."""
    script("h.py", MANY_STRAYS)
    config = (
        "cgroup: off\n"
        + queue_config("[./h.py, '1000']", retry="{max_attempts: 1}")
        + "  other:\n    command: [/bin/true]\n"
    )
    daemon(write_config(config), prefix=OWN_SESSION)
    start = time.monotonic()
    r.xadd("jobd:q", {"payload": "x", "job_id": "85"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "85"), 120, "the job's record")
    r.xadd("jobd:other", {"payload": "x", "job_id": "next"})  # the loop must have come back
    wait_until(lambda: r.hexists("{jobd:other}:history", "next"), 120, "the next job's record")
    took = time.monotonic() - start
    assert took < 15, f"one job's strays held the daemon's loop: {took:.1f}s"


# A run_as handler (nobody) finds its daemon's owner cgroup (jobd.<pid>-<token>, beside its own
# jobd-<pid>-<token>-<n>) and keeps trying to lock it; once its daemon dies, it holds it.
HOLDS_OWNER = """#!/usr/bin/python3
import fcntl, os, sys, time
mount = sys.argv[1]
mine = open("/proc/self/cgroup").read().strip().split("::", 1)[1]
parent, name = os.path.split(mine)
owner = mount + parent + "/jobd." + name[len("jobd-"):].rsplit("-", 1)[0]
try:
    fd = os.open(owner, os.O_RDONLY | os.O_DIRECTORY)
except PermissionError:
    print("refused", owner, flush=True)
    os.execv("/bin/sleep", ["/bin/sleep", "807." + os.environ["JOBD_JOB_ID"]])
os.set_inheritable(fd, True)
print("holding", owner, flush=True)
while True:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        break
    except OSError:
        time.sleep(0.005)
os.execv("/bin/sleep", ["/bin/sleep", "807." + os.environ["JOBD_JOB_ID"]])
"""


@NEEDS_ROOT
def test_a_run_as_handler_cannot_keep_its_dead_daemons_cgroup_alive(
    r: redis.Redis, write_config, daemon: Daemon, request: pytest.FixtureRequest
) -> None:
    """From the review (low): the owner cgroup was made 0755 (0700 only under the units'
    UMask), so any user could open it and take ``flock``: a handler of another user held it
    once its daemon died, and the next daemon took that daemon for alive and left its handlers
    running. It is 0700 now: the handler's open is refused, and the next daemon ends it."""
    top = request.getfixturevalue("root")
    h = shared_script(HOLDS_OWNER)
    config = write_config(f"cgroup: {top}\n" + queue_config(
        f"[{h}, {where.mount_point()}]", run_as="{user: nobody}", cwd=str(h.parent),
        timeout="1h",
    ))  # fmt: skip
    first = daemon(config, prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "87"})
    said = lambda: "holding" in first.log() or "refused" in first.log()  # noqa: E731
    wait_until(said, what="the handler trying for its daemon's owner lock")
    first.proc.kill()  # the daemon alone dies (a crash); its handler is left
    first.proc.wait()
    wait_until(lambda: alive("807.87"), 10, "the handler holding its dead daemon's lock, or not")
    second = daemon(config, prefix=OWN_SESSION)
    second.wait_log("ready: Redis answers")
    try:
        wait_until(lambda: not alive("807.87"), 5, "the dead daemon's handler ended by the next")
    finally:
        for p in alive("807.87"):
            p.kill()


@NEEDS_ROOT
def test_a_normal_jobs_end_reads_no_other_process_in_proc(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Held in the review: 40 jobs that end by themselves cost no read of another process's
    /proc entry (only /proc/self and the subreaper's /proc/self/task/*/children); their end
    signals the leader's pidfd and its group, two system calls."""
    trace = tmp_path / "trace"
    config = "cgroup: off\n" + queue_config("[/bin/sh, -c, 'sleep 0.01']", concurrency=4)
    prefix = ("strace", "-f", "-qq", "-e", "trace=openat,kill,pidfd_send_signal", "-o",
              str(trace), "setsid")  # fmt: skip
    daemon(write_config(config), prefix=prefix)
    for i in range(40):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"n{i}"})
    wait_until(lambda: r.hlen("{jobd:q}:history") == 40, 60, "all done")
    text = trace.read_text()
    assert not re.findall(r'openat\(AT_FDCWD, "/proc/\d+/', text)
    assert len(re.findall(r"pidfd_send_signal\(\d+, SIGKILL", text)) == 40


RUN_AS_MEMBER = """#!/usr/bin/python3
import os, signal, sys, time
mark = sys.argv[1]
if os.fork() == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, lambda *_: (open(mark, "w").write("term"), os._exit(0)))
    open(mark + ".ready", "w").write("ready")
    while True:
        time.sleep(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.execv("/bin/sleep", ["/bin/sleep", "806." + os.environ["JOBD_JOB_ID"]])
"""
# As the run-as unit runs jobd: root without CAP_SYS_PTRACE (its CapabilityBoundingSet), /proc
# mounted hidepid=invisible (ProtectProc=invisible).
AS_RUN_AS_UNIT = (
    "unshare", "-m", "--propagation", "private", "sh", "-c",
    "mount -t proc -o hidepid=invisible proc /proc && exec setsid setpriv "
    '--bounding-set -sys_ptrace "$@"', "sh",
)  # fmt: skip


@NEEDS_ROOT
@pytest.mark.parametrize("unit", [False, True])
def test_a_run_as_handlers_session_member_gets_the_stops_sigterm(
    r: redis.Redis, write_config, daemon: Daemon, unit: bool
) -> None:
    """Held in the review: the root daemon sees a run_as handler's processes in /proc even as
    the run-as unit runs it (hidepid=invisible spares gid 0), and its stop reaches a session
    member."""
    h = shared_script(RUN_AS_MEMBER)
    mark = h.parent / "mark"
    config = "cgroup: off\n" + queue_config(
        f"[{h}, {mark}]",
        timeout="2s",
        kill_grace="30s",
        retry="{max_attempts: 1}",
        run_as="{user: nobody}",
        cwd=str(h.parent),
    )
    daemon(write_config(config), prefix=AS_RUN_AS_UNIT if unit else OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "86"})
    wait_until(lambda: Path(f"{mark}.ready").exists(), what="the member running")
    wait_until(mark.exists, 10, "the member told SIGTERM by the timeout's stop")


def test_a_stray_leading_a_group_of_another_session_takes_nothing_else(tmp_path: Path) -> None:
    """Held in the review: a stray can join no group of another session, so ``kill_tree``'s
    group kill stays in its own session (the kernel refuses setpgid across sessions)."""
    bystander = subprocess.Popen(["sleep", "808.1"], start_new_session=True)
    joiner = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.setpgid(0, {bystander.pid})"],
        stderr=subprocess.PIPE,
    )
    try:
        _, err = joiner.communicate(10)
        assert b"PermissionError" in err
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


# A child of the leader leads a group of its own, then forks and exits every millisecond: each
# process of the chain lives a millisecond, the group (numbered by the first, long gone) stays.
# Nothing ignores SIGTERM, the environment is intact.
FORK_CHAIN = f"""#!{sys.executable}
import os, sys, time
group_file = sys.argv[1]
if os.fork() == 0:
    os.setpgid(0, 0)
    open(group_file, "w").write(str(os.getpid()))
    while True:
        time.sleep(0.001)
        if os.fork():
            os._exit(0)
time.sleep(1000)
"""


def test_a_fork_chain_in_a_group_of_its_own_ends_with_its_stop(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """From the review (a regression of 36d3d4e): the stop signals the session's members by pid
    as one read of /proc found them, and the sweep's ``kill_tree`` killed a stray's group only
    when the stray led it. A process that forks and exits every millisecond is never where
    either looks (it survived 20 s in 2 of 3 runs). Its group lives in the handler's session (a
    group cannot span sessions): it is killed once a stray of it is dead, before it is reaped
    (deterministically: ``test_a_strays_group_in_a_session_of_its_jobs_is_killed_…``)."""
    script("h.py", FORK_CHAIN)
    group_file = tmp_path / "group"
    config = "cgroup: off\n" + queue_config(
        f"[./h.py, {group_file}]", timeout="1s", kill_grace="1s", retry="{max_attempts: 1}"
    )
    daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "89"})
    # The file exists before its number is written in it: wait for the number.
    wait_until(lambda: group_file.exists() and group_file.read_text(), what="the chain started")
    group = int(group_file.read_text())

    def chain_alive() -> bool:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True

    try:
        wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, 15, "its timeout's dead letter")
        wait_until(lambda: not chain_alive(), 20, "the chain ended with its job")
    finally:
        if chain_alive():
            os.killpg(group, signal.SIGKILL)


def test_a_fork_chain_in_a_group_of_its_own_ends_with_the_daemon(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The same chain at shutdown: the daemon's last sweep kills what is adopted, and waits
    for it to be dead to kill its group (there is no next sweep to do it)."""
    script("h.py", FORK_CHAIN)
    group_file = tmp_path / "group"
    config = "shutdown_grace: 60s\n" + queue_config(
        f"[./h.py, {group_file}]", timeout="300s", kill_grace="1s"
    )
    d = daemon(write_config(config), prefix=OWN_SESSION)
    r.xadd("jobd:q", {"payload": "x", "job_id": "90"})
    # The file exists before its number is written in it: wait for the number.
    wait_until(lambda: group_file.exists() and group_file.read_text(), what="the chain started")
    group = int(group_file.read_text())

    def chain_alive() -> bool:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True

    try:
        d.signal(signal.SIGTERM)
        d.wait_log("stopping; 1 handler(s) running")
        d.signal(signal.SIGTERM)  # the rest of shutdown_grace skipped
        assert d.proc.wait(15) == 0
        wait_until(lambda: not chain_alive(), 2, "the chain ended with the daemon")
    finally:
        if chain_alive():
            os.killpg(group, signal.SIGKILL)
