"""How a handler's process is started: in the daemon's folder as its user by ``spawn`` (cloned,
the daemon not waiting for its exec), or by subprocess where it needs another folder or user;
with its queue's OOM score and, where there is a cgroup tree, in a cgroup of its own, both from
its first instruction."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import select
import subprocess
import time
from collections.abc import Callable, Iterable

from jobd.config import QueueConfig
from jobd.process import reaper, spawn
from jobd.process.cgroup import Cgroup, Tree
from jobd.process.deadline import check

log = logging.getLogger("jobd.handler")

# What ``start`` returns: the pid, where a failure to start is told, where it was placed, its uid.
Started = tuple[int, int | None, tuple[Tree, Cgroup] | None, int]


def piped(
    queue: QueueConfig, here: str, job_env: dict[str, str], payload: bytes, pipes: list[int],
    tree: Tree | None, deadline: int | None = None, hear: Callable[[int], object] | None = None,
) -> tuple[Started, tuple[int, int, int | None]]:  # fmt: skip
    """``start`` with ``pipes`` (read end, write end: stdout's, stderr's, and stdin's for a
    ``payload``, which is written ahead when the empty pipe surely takes it); what it returns,
    and our ends: stdout's, stderr's, stdin's while the payload is left to write. The handler's
    ends are closed here, and ours too should this raise."""
    out_r, out_w, err_r, err_w, *stdin = pipes
    in_r, in_w = stdin or (None, None)
    try:
        if in_w is not None and len(payload) <= select.PIPE_BUF:
            os.write(in_w, payload)  # a pipe holds at least PIPE_BUF bytes
            in_w, written = None, in_w
            os.close(written)
        started = start(queue, here, job_env, in_r, out_w, err_w, tree, deadline, hear)
    except BaseException:
        close((out_r, err_r, in_w))
        raise
    finally:
        close((out_w, err_w, in_r))
    return started, (out_r, err_r, in_w)


def abandon(started: Started, ours: Iterable[int | None]) -> None:
    """A process ``start`` started whose handler could not be made (its pidfd refused at the
    daemon's descriptor limit): it must not run on untracked while its job is settled as not
    started, nor stay a zombie. SIGKILLed with its tree, as the sweep ends an escaped process
    (``reaper.kill_tree``: the leader, its descendants, its session once it made one, its group
    once it is dead) and its cgroup, then reaped, waiting up to ``reaper.FINAL_WAIT`` (one not
    dead by then, in an uninterruptible sleep, is left to the sweep, said); our ends closed."""
    pid, report, placed, _ = started
    close((*ours, report))
    reaper.kill_tree(pid)
    if placed is not None:
        placed[0].kill(placed[1])
    until = time.monotonic() + reaper.FINAL_WAIT
    while reaper.exited(pid) is False and time.monotonic() < until:
        time.sleep(0.001)
    if reaper.exited(pid) is False:
        log.error("pid %d, started for a handler that could not be made, killed, is not dead "
                  "after %gs: left to the sweep", pid, reaper.FINAL_WAIT)  # fmt: skip
    else:
        reaper.end_group(pid)
        reaper.reaped(pid)
    if placed is not None:
        placed[0].end(placed[1])  # removed once empty


def close(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def start(
    queue: QueueConfig, here: str, job_env: dict[str, str], stdin: int | None, stdout: int,
    stderr: int, tree: Tree | None, deadline: int | None = None,
    hear: Callable[[int], object] | None = None,
) -> Started:  # fmt: skip
    """``_start`` with the handler's OOM score, and its cgroup when there is a ``tree``, from
    its first instruction (``spawn.OomScore``, ``cgroup.Tree.spawning``); its pid, where a
    failure to start it is told (``spawn.spawn``), where it was placed, and the uid it runs as
    (looked up now: what its files are judged by, ``process.results``). Past ``deadline``
    (CLOCK_BOOTTIME nanoseconds) it does not exec: ``deadline.Lapsed``, raised or told.
    ``hear``: told the uid a handler of another user is switched to, before it is exec'd (the
    channel's stranger filter: ``Channel.speaking``)."""
    with spawn.LOCK:
        spawn.OOM.take(queue.resources.oom_score_adj)  # given back by the loop (OomScore)
        if tree is None:
            pid, report, uid = _start(queue, here, job_env, stdin, stdout, stderr, False,
                                      deadline, hear)  # fmt: skip
            return pid, report, None, uid
        # A memory limit is written once the handler has exec'd (``spawn``'s docstring).
        capped = queue.resources.memory is not None
        with tree.spawning(queue.resources) as cgroup:
            pid, report, uid = _start(queue, here, job_env, stdin, stdout, stderr, capped,
                                      deadline, hear)  # fmt: skip
        return pid, report, (tree, cgroup), uid


def _start(
    queue: QueueConfig, here: str, job_env: dict[str, str], stdin: int | None, stdout: int,
    stderr: int, wait: bool = False, deadline: int | None = None,
    hear: Callable[[int], object] | None = None,
) -> tuple[int, int | None, int]:  # fmt: skip
    """Start the process in a session of its own with these descriptors as 0, 1, 2, and the
    queue's environment plus ``job_env``; its pid, where a failure to start it is told, and the
    uid it runs as (the daemon's, or the one its ``run_as`` user has now). With
    ``wait``, once it has exec'd (``spawn.spawn``). Popen runs no check in its child: the
    deadline is checked just before it, and what is left is Popen's own Python up to its fork
    and the child's steps to its exec (its folder and identity too)."""
    if queue.cwd == here and not (queue.run_as_user or queue.run_as_group):
        return *spawn.spawn(queue.argv, queue.env, job_env, stdin, stdout, stderr, wait=wait,
                            deadline=deadline), os.geteuid()  # fmt: skip
    env, switch = {**queue.env, **job_env}, identity(queue)
    if hear is not None and "user" in switch:  # the uid looked up now, not at the config's read
        hear(switch["user"])  # type: ignore[arg-type]
    check(deadline)
    popen = subprocess.Popen(
        queue.argv,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        cwd=queue.cwd,
        env=env,
        start_new_session=True,  # as ``spawn`` (its docstring)
        **switch,
    )
    popen.returncode = 0  # reaped by the daemon's loop, not by this object
    return popen.pid, None, switch.get("user", os.geteuid())  # type: ignore[return-value]


def identity(queue: QueueConfig) -> dict[str, object]:
    """Popen arguments that switch user and group (this turns off the vfork fast path, so only
    for queues that ask): the user's primary group unless one is given, and the user's own
    supplementary groups instead of the daemon's."""
    if not (queue.run_as_user or queue.run_as_group):
        return {}
    args: dict[str, object] = {}
    gid = grp.getgrnam(queue.run_as_group).gr_gid if queue.run_as_group else None
    if queue.run_as_user:
        account = pwd.getpwnam(queue.run_as_user)
        gid = account.pw_gid if gid is None else gid
        args["user"] = account.pw_uid
        args["extra_groups"] = os.getgrouplist(account.pw_name, gid)
    else:
        args["extra_groups"] = []
    args["group"] = gid
    return args
