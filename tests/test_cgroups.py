"""cgroup v2 containment (issue 20): each handler in a cgroup of its own from its first
instruction, every process in it ended with its job (cgroup.kill) whatever its environment says,
its CPU counted whole (cpu.stat), the cgroup removed afterwards, the cgroups of a daemon that died
ended by the next; the limits where this host's cgroup offers their controllers (skipped with the
reason where it does not), and a daemon that refuses to start where it cannot enforce one.

Real daemons on this machine's writable cgroup v2 hierarchy (found in /proc/self/mountinfo); each
test has a cgroup of its own under it, given to jobd as ``cgroup: PATH`` (or delegated, as
systemd marks it, for ``cgroup: auto``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_until

from jobd.config import Resources, load
from jobd.job import Job
from jobd.outcome import Verb
from jobd.process import cgroup, policy, where
from jobd.process.handler import Handler

Daemon = Callable[..., DaemonProcess]


def alive(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def handler_cgroups(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and p.name.startswith("jobd-")
            and p.name != where.DAEMON_LEAF]  # fmt: skip


def offers(root: Path, controller: str) -> bool:
    return controller in (root / "cgroup.controllers").read_text().split()


@pytest.fixture
def root() -> Iterator[Path]:
    """A cgroup of this test's own under the cgroup v2 mount; removed with whatever is in it."""
    mount = where.mount_point()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this machine")
    path = Path(mount) / f"jobd-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup under {mount}: {exc}")
    yield path
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        remove(sub)
    remove(path)


def remove(group: Path) -> None:
    """A cgroup's processes killed, itself removed (a daemon may be removing it meanwhile: a
    file of a cgroup removed under the reader reads ENODEV)."""
    with contextlib.suppress(FileNotFoundError):
        (group / "cgroup.kill").write_text("1")
        wait_until(lambda: _empty(group), what=f"{group} emptied")
        group.rmdir()


def _empty(group: Path) -> bool:
    try:
        return not (group / "cgroup.procs").read_text()
    except OSError as exc:  # gone meanwhile (ENODEV: removed while open; ENOENT)
        if exc.errno in (errno.ENODEV, errno.ENOENT):
            raise FileNotFoundError(exc.errno, str(group)) from exc
        raise


def record(r: redis.Redis, job_id: str) -> dict:
    """The job's latest history record."""
    return json.loads(r.hget("{jobd:q}:history", job_id).splitlines()[-1])


def test_each_handler_runs_in_a_cgroup_of_its_own_from_its_first_instruction(
    root: Path, r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """The handler's first child reads its cgroup: the handler's own, every time (and its OOM
    score: the queue's); each cgroup is removed once its job has ended."""
    command = "[/bin/sh, -c, 'cat /proc/self/cgroup; echo oom $(cat /proc/self/oom_score_adj); sleep 0.3']"
    d = daemon(write_config(f"cgroup: {root}\n" + queue_config(command, concurrency=4)))
    d.wait_log(f"in a cgroup of its own under {root}")
    for i in range(12):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    wait_until(lambda: handler_cgroups(root), what="a handler's cgroup")
    wait_until(lambda: r.hlen("{jobd:q}:history") == 12, what="every job done")
    seen = set()
    for i in range(12):
        line = next(x for x in record(r, f"j{i}")["stdout"].splitlines() if x.startswith("0::"))
        parent, _, name = line[3:].rpartition("/")
        assert parent.endswith(f"/{root.name}") and name.startswith(f"jobd-{d.proc.pid}-")
        seen.add(name)
        assert "oom 500" in record(r, f"j{i}")["stdout"], "resources.oom_score_adj, cgroup or not"
    assert len(seen) == 12, "a cgroup for each handler"
    wait_until(lambda: not handler_cgroups(root), what="every handler's cgroup removed")


def test_every_process_in_it_ends_with_its_job_whatever_its_environment(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Escapees that cleared their environment cannot be attributed by it, and the subreaper
    leaves them alone while any job runs (another queue's here): the cgroup ends them with their
    own job, at its exit and at its timeout; the other job's escapee lives on. The handler
    exits once the test has seen its escapees (a go file), not after a fixed 0.3 s."""
    go = tmp_path / "go"
    escape = (
        "[/bin/sh, -c, 'env -i setsid sleep 310.1 >/dev/null 2>&1 & "
        'env -i setsid sh -c "sleep 311.1 >/dev/null 2>&1 &"; '
        f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0']"
    )
    config = (
        f"cgroup: {root}\n"
        + queue_config(escape)
        + "  slow:\n    command: [/bin/sh, -c, 'env -i setsid sleep 313.1 >/dev/null 2>&1 & "
        "exec sleep 60']\n    timeout: 1s\n    retry: {max_attempts: 1}\n"
        + "  other:\n    command: [/bin/sh, -c, 'env -i setsid sleep 312.1 >/dev/null 2>&1 & "
        "exec sleep 60']\n"
    )
    daemon(write_config(config))
    r.xadd("jobd:other", {"payload": "x", "job_id": "long"})
    wait_until(lambda: alive("312.1"), what="the other job's escapee")
    r.xadd("jobd:q", {"payload": "x", "job_id": "escaper"})
    wait_until(lambda: alive("310.1") and alive("311.1"), what="its escapees started")
    go.touch()
    wait_until(lambda: r.hexists("{jobd:q}:history", "escaper"), what="the job done")
    wait_until(lambda: not alive("310.1") and not alive("311.1"), what="its escapees ended")
    assert record(r, "escaper")["exit_code"] == 0
    r.xadd("jobd:slow", {"payload": "x", "job_id": "slow"})
    wait_until(lambda: alive("313.1"), what="the slow job's escapee")
    wait_until(lambda: r.xlen("{jobd:slow}:dead") == 1, what="the timeout's dead letter")
    wait_until(lambda: not alive("313.1"), what="the timed-out job's escapee ended")
    assert alive("312.1"), "another job's escapee, its job still running, untouched"
    wait_until(lambda: len(handler_cgroups(root)) == 1, what="only the running job's cgroup")


def test_cpu_is_counted_for_the_whole_cgroup(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """A detached grandchild burns CPU while the handler sleeps: wait4's rusage never sees it
    (it is not the handler's to wait for), the cgroup's cpu.stat does. It burns half a second
    of CPU, however long a loaded machine takes to give it that, then says so; the handler
    ends after (a fixed wall time gave it 0.28 s of CPU under load)."""
    burned = tmp_path / "burned"
    burner = (f"import time; t = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
              f"open({str(burned)!r}, 'w').close()\nwhile True: pass")  # fmt: skip
    (tmp_path / "burn.py").write_text(burner)
    burn = (f"'env -i setsid {sys.executable} {tmp_path}/burn.py & "
            f"while [ ! -e {burned} ]; do sleep 0.05; done; exit 0'")  # fmt: skip
    daemon(write_config(f"cgroup: {root}\n" + queue_config(f"[/bin/sh, -c, {burn}]")))
    r.xadd("jobd:q", {"payload": "x", "job_id": "burner"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "burner"), what="the job done")
    assert record(r, "burner")["cpu_seconds"] >= 0.3, record(r, "burner")


def test_the_cgroups_of_a_daemon_that_died_are_ended_by_the_next(
    root: Path, r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(f"cgroup: {root}\n" + queue_config("[/bin/sleep, '320.1']"))
    first = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "orphan"})
    wait_until(lambda: alive("320.1"), what="the handler")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    assert alive("320.1") and handler_cgroups(root), "the handler outlives its daemon"
    second = daemon(config)
    wait_until(lambda: not alive("320.1"), what="the orphan ended")
    wait_until(lambda: all(p.name.startswith(f"jobd-{second.proc.pid}-")
                           for p in handler_cgroups(root)), what="the dead daemon's cgroup removed")  # fmt: skip
    second.wait_log("of a daemon that is gone: ending what is in it")


def test_a_delegated_cgroup_is_found_and_the_daemon_leaves_it_for_a_leaf(
    root: Path, r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """``cgroup: auto`` under systemd's Delegate=yes: the daemon starts in a cgroup marked
    delegated (trusted.delegate), moves itself into ``jobd-daemon`` (a cgroup with processes
    cannot give its children controllers) and places handlers beside it."""
    try:
        os.setxattr(root, "trusted.delegate", b"1")
    except OSError as exc:
        pytest.skip(f"cannot mark a cgroup delegated here: {exc}")
    own = Path(where.own_cgroup(where.mount_point()))
    (root / "cgroup.procs").write_text("0")  # the daemon is born where this process is
    try:
        d = daemon(write_config(queue_config("[/bin/sh, -c, 'cat /proc/self/cgroup']")))
    finally:
        (own / "cgroup.procs").write_text("0")
    d.wait_log("delegated by systemd")
    assert str(d.proc.pid) in (root / where.DAEMON_LEAF / "cgroup.procs").read_text().split()
    r.xadd("jobd:q", {"payload": "x", "job_id": "j"})
    wait_until(lambda: r.hexists("{jobd:q}:history", "j"), what="the job done")
    assert f"/{root.name}/jobd-{d.proc.pid}-" in record(r, "j")["stdout"]
    assert d.stop() == 0
    assert not handler_cgroups(root)


@pytest.fixture
def needs(root: Path) -> Callable[[str], None]:
    def check(controller: str) -> None:
        if not offers(root.parent, controller):
            pytest.skip(f"this host's cgroup v2 has no {controller} controller (hybrid mode: it "
                        "is mounted on a cgroup v1 hierarchy)")  # fmt: skip
        with contextlib.suppress(OSError):
            (root.parent / "cgroup.subtree_control").write_text(f"+{controller}")
        if not offers(root, controller):
            pytest.skip(f"the {controller} controller cannot be enabled for {root}")

    return check


def test_memory_max_kills_the_handler_with_outcome_memory(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, needs
) -> None:
    needs("memory")
    hog = "[python3, -c, 'x = bytearray(300 * 2**20); import time; time.sleep(5)']"
    config = f"cgroup: {root}\n" + queue_config(
        hog, resources="{memory: 64MiB}", retry="{max_attempts: 1}"
    )
    d = daemon(write_config(config))
    r.xadd("jobd:q", {"payload": "x", "job_id": "hog"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the dead letter")
    dead = r.xrange("{jobd:q}:dead")[0][1]
    assert dead[b"jobd_error"] == b"memory"
    d.wait_log("OOM-killed in its cgroup")


def test_pids_max_holds_the_tree(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, needs
) -> None:
    needs("pids")
    forks = "[/bin/sh, -c, 'for i in $(seq 20); do sleep 5 & done 2>/dev/null; wait; exit 3']"
    config = f"cgroup: {root}\n" + queue_config(forks, resources="{pids: 5}")
    daemon(write_config(config))
    r.xadd("jobd:q", {"payload": "x", "job_id": "forker"})
    wait_until(lambda: handler_cgroups(root), what="its cgroup")
    group = handler_cgroups(root)[0]
    assert (group / "pids.max").read_text().strip() == "5"


def test_cpu_max_caps_the_tree(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, needs
) -> None:
    needs("cpu")
    config = f"cgroup: {root}\n" + queue_config("[/bin/sleep, '5']", resources="{cpu: 0.5}")
    daemon(write_config(config))
    r.xadd("jobd:q", {"payload": "x", "job_id": "j"})
    wait_until(lambda: handler_cgroups(root), what="its cgroup")
    assert (handler_cgroups(root)[0] / "cpu.max").read_text().split() == ["50000", "100000"]


@pytest.mark.parametrize("key, value", [("pids", "10"), ("cpu", "0.5")])
def test_a_daemon_refuses_to_start_where_a_resource_cannot_be_enforced(
    root: Path, write_config, daemon: Daemon, key: str, value: str
) -> None:
    if offers(root, key):
        pytest.skip(f"this host's cgroup offers the {key} controller")
    config = f"cgroup: {root}\n" + queue_config("[/bin/true]", resources=f"{{{key}: {value}}}")
    d = daemon(write_config(config), ready=False)
    assert d.proc.wait(30) != 0
    assert f"queue q: resources.{key} needs a cgroup v2 with the {key} controller" in d.log()


# -- what is written and read where this host has no such controller ------------------------------
# The kernel's own files are tested above where this host offers the controllers; here, the values
# jobd writes and the figures it reads, in a folder shaped like a cgroup.


def test_the_limits_written_and_the_usage_read(tmp_path: Path) -> None:
    for name in ("memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "cpu.max"):
        (tmp_path / name).write_text("max\n")
    group = cgroup.Cgroup(str(tmp_path))
    group.limit(Resources(memory=64 << 20, pids=5, cpu=1.5), frozenset({"memory", "pids", "cpu"}))
    assert [
        (tmp_path / n).read_text()
        for n in ("memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "cpu.max")
    ] == [
        str(64 << 20),
        "0",
        "1",
        "5",
        "150000 100000",
    ]
    assert group.caps_memory
    (tmp_path / "cpu.stat").write_text(
        "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n"
    )
    (tmp_path / "memory.peak").write_text("12345\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    assert group.usage() == cgroup.Usage(1.5, 12345, True)
    group.cpu_before = 500000  # the daemon's own, while it was in there for the spawn
    assert group.usage().cpu_seconds == 1.0


def test_an_oom_kill_in_its_cgroup_is_outcome_memory(tmp_path: Path) -> None:
    """Even when the handler exits 0 (a child was killed, and it carried on)."""
    path = tmp_path / "c.yaml"
    path.write_text("queues:\n  q:\n    command: [/bin/true]\n    retry: {max_attempts: 1}\n")
    queue = load(str(path)).queues["q"]
    job = Job("q", "1-0", {b"payload": b"x"}, "job-1", 1)
    handler = Handler.spawn(job, queue, os.getcwd())
    os.waitid(os.P_PID, handler.pid, os.WEXITED | os.WNOWAIT)
    wait_status = handler.reap()
    handler.cgroup_usage = cgroup.Usage(0.25, 1 << 20, oom_killed=True)
    status = handler.exited(wait_status)
    assert status.code == 0 and status.cpu_seconds == 0.25 and status.max_rss_bytes == 1 << 20
    outcome = policy.decide(queue, job, status, handler.ending())
    assert outcome.verb is Verb.DEAD_LETTER and outcome.error == "memory"


# -- from the review of the cgroup path -----------------------------------------------------------


def born_in(group: Path, start: Callable[[], DaemonProcess]) -> DaemonProcess:
    """A daemon started in ``group``: this process steps in for the instant of the start."""
    own = Path(where.own_cgroup(where.mount_point()))
    (group / "cgroup.procs").write_text("0")
    try:
        return start()
    finally:
        (own / "cgroup.procs").write_text("0")


def cgroup_of(pid: int) -> str:
    return next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x[:3] == "0::")


def test_a_daemon_whose_cgroup_is_removed_while_it_spawns_makes_it_again(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """The daemon's own cgroup is empty while the daemon is in a handler's for a spawn: whoever
    may write there may remove it then. The daemon makes it again and goes back; no job is
    blamed, and the daemon never kills the cgroup it is in (it stops with 0)."""
    jobs, home = root / "jobs", root / "home"
    jobs.mkdir()
    home.mkdir()
    config = f"cgroup: {jobs}\n" + queue_config("[/bin/true]", concurrency=4)
    d = born_in(home, lambda: daemon(write_config(config)))
    removed = tmp_path / "removed"
    racer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\nend = time.time() + 30\nwhile time.time() < end:\n"
        f"    try:\n        os.rmdir({str(home)!r})\n        open(sys.argv[1], 'w').close()\n"
        "        break\n    except OSError:\n        pass\n"
    ), str(removed)])  # fmt: skip
    added = 0
    try:
        for batch in range(40):
            pipe = r.pipeline(transaction=False)
            for i in range(50):
                pipe.xadd("jobd:q", {"payload": "x", "job_id": f"j{batch}-{i}"})
            pipe.execute()
            added += 50
            if removed.exists():
                break
        wait_until(removed.exists, what="the racer to remove the daemon's cgroup once")
    finally:
        racer.kill()
        racer.wait()
    d.wait_log("had gone (")
    # (Not the stream's length: the default retention trims it to its last 1000 entries.)
    wait_until(lambda: r.hlen("{jobd:q}:history") == added, what="every job done")
    assert r.xlen("{jobd:q}:dead") == 0, r.xrange("{jobd:q}:dead", count=1)
    assert cgroup_of(d.proc.pid).endswith(f"/{root.name}/home")
    assert d.stop() == 0


def test_a_cgroup_a_handler_made_inside_its_own_is_removed_with_it(
    root: Path, r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Container runtimes make cgroups below their own: the job's cgroup is removed all the
    same, what ran in the one below killed with it. (The handler ends once the test has seen
    that process: a scan of every process can take longer than a fixed sleep, under load.)"""
    go = tmp_path / "go"
    command = (
        "[/bin/sh, -c, 'cg=" + where.mount_point() + '$(sed -n "s/^0:://p" /proc/self/cgroup); '
        'mkdir $cg/sub && (sh -c "echo \\$\\$ > $cg/sub/cgroup.procs; exec sleep 360.1" &); '
        f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0']"
    )
    daemon(write_config(f"cgroup: {root}\n" + queue_config(command)))
    r.xadd("jobd:q", {"payload": "x", "job_id": "nested"})
    wait_until(lambda: alive("360.1"), what="the process in the cgroup below")
    go.touch()
    wait_until(lambda: r.hexists("{jobd:q}:history", "nested"), what="the job done")
    wait_until(lambda: not alive("360.1"), what="it killed")
    wait_until(lambda: not handler_cgroups(root), what="the job's cgroup and the one below gone")


def test_a_reload_cannot_bring_a_resource_this_host_cannot_enforce_nor_change_cgroup(
    root: Path, r: redis.Redis, write_config, daemon: Daemon
) -> None:
    if offers(root, "pids"):
        pytest.skip("this host's cgroup offers the pids controller")
    d = daemon(write_config(f"cgroup: {root}\n" + queue_config("[/bin/true]")))
    write_config(f"cgroup: {root}\n" + queue_config("[/bin/true]", resources="{pids: 5}"))
    d.signal(signal.SIGHUP)
    d.wait_log("reload refused: queue q: resources.pids needs a cgroup v2 with the pids")
    write_config("cgroup: off\n" + queue_config("[/bin/true]"))
    d.signal(signal.SIGHUP)
    d.wait_log("reload refused: changing cgroup needs a restart")


def test_a_cgroup_that_cannot_be_used_is_refused(write_config, daemon: Daemon, root: Path) -> None:
    """The hierarchy's root (every process on the host is in it), a file, a path outside the
    mount: `validate` says so, a daemon does not start uncontained."""
    for path, why in (
        (where.mount_point(), "is not a cgroup below the cgroup v2 mount"),
        (f"{root}/cgroup.procs", "is not a cgroup v2 directory"),
        ("/tmp/elsewhere", "is not a cgroup below the cgroup v2 mount"),
    ):
        config = write_config(f"cgroup: {path}\n" + queue_config("[/bin/true]"))
        out = jobd_cli("validate", str(config))
        assert why in out.stdout.decode(), out
        d = daemon(config, ready=False)
        assert d.proc.wait(30) != 0
        assert f"cannot use cgroup: {path} (" in d.log() and why in d.log()


def test_a_cgroup_named_in_the_config_that_holds_the_daemon_takes_it_alone(
    root: Path, r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Not delegated: other processes in it are not jobd's to move."""
    decoy = subprocess.Popen(["sleep", "370.1"])
    try:
        (root / "cgroup.procs").write_text(str(decoy.pid))
        config = f"cgroup: {root}\n" + queue_config("[/bin/sh, -c, 'cat /proc/self/cgroup']")
        d = born_in(root, lambda: daemon(write_config(config)))
        assert cgroup_of(d.proc.pid).endswith(f"/{root.name}/{where.DAEMON_LEAF}")
        assert cgroup_of(decoy.pid).endswith(f"/{root.name}"), "the decoy stays"
        r.xadd("jobd:q", {"payload": "x", "job_id": "j"})
        wait_until(lambda: r.hexists("{jobd:q}:history", "j"), what="the job done")
        assert f"/{root.name}/jobd-{d.proc.pid}-" in record(r, "j")["stdout"]
    finally:
        decoy.kill()
        decoy.wait()


def test_two_daemons_of_one_pid_keep_to_their_own_cgroups(root: Path) -> None:
    """Daemons in two pid namespaces may have one pid: a token drawn at start keeps their
    handlers' cgroups apart, and one's stop ends only its own."""
    found = where.find(str(root))
    assert isinstance(found, where.Found), found
    trees = [cgroup.Tree.take(found), cgroup.Tree.take(found)]
    sleepers = []
    for tree in trees:
        with tree.spawning(Resources()):
            sleepers.append(subprocess.Popen(["sleep", "380.1"]))
    assert trees[0].prefix != trees[1].prefix and len(handler_cgroups(root)) == 2
    trees[0].close()
    sleepers[0].wait(10)
    assert sleepers[1].poll() is None, "the other daemon's handler runs on"
    trees[1].close()
    sleepers[1].wait(10)
    wait_until(lambda: [t.tidy() for t in trees] and not handler_cgroups(root), what="removed")
    for tree in trees:
        os.close(tree.home_procs)


def test_cpu_below_a_hundredth_of_a_core_is_refused(write_config) -> None:
    out = jobd_cli("validate", str(write_config(queue_config("[/bin/true]",
                                                             resources="{cpu: 0.001}"))))  # fmt: skip
    assert out.returncode != 0 and b"resources.cpu" in out.stdout + out.stderr, out
