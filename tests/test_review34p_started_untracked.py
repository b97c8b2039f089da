"""Review 34p of issue 34: a start that raises once its handler is started leaves the handler
running, untracked, while its job is settled as a start that failed (and retried).

``Handler.spawn`` goes on after ``launch.start`` has started the process: ``Handler(...)``
opens its pidfd (``os.pidfd_open``: EMFILE at a daemon's descriptor limit), builds its outputs,
writes the payload. An exception there reaches ``Admission.start``'s ``except Exception``
("the daemon never dies of a job"), which since 8fd0b8c settles it as any start that raised
(``cannot_start``: retried or dead-lettered, its span ended): but the handler was started and
runs on. It is in no table: never given its timeout, never stopped at a shutdown or a lease
lost, never reaped (a zombie for the daemon's life once it exits), its pipes' read ends
(stdout, stderr, the report of the clone path) leaked; and its job, retried, runs a second
time alongside it (at most once per lease is what jobd promises).

Reproduced with a daemon in this process (``test_loop.Loop``): ``os.pidfd_open`` in
``jobd.process.handler`` fails with EMFILE once, the first start's pid noted (``launch.start``
wrapped); the handler sleeps 30 s.

Should: a start that fails after its process was started stops and reaps that process (or
tracks it as a handler) before the job is settled; here: the process gone (reaped) soon after
the attempt's outcome. Suggested fix: in ``Handler.spawn``, once ``launch.start`` returned,
a failure kills the process group (SIGKILL), reaps it, closes our ends, then raises (its span
attached, ``states.unstarted``); or open the pidfd first and build the rest where it cannot
fail.

Fixed (jobd/process/handler.py, launch.py): ``Handler._made`` builds the handler of a started
process; should that fail, ``launch.abandon`` SIGKILLs the process with its tree (leader,
descendants, session, group once dead: ``reaper.kill_tree``; its cgroup), reaps it (waiting up
to ``reaper.FINAL_WAIT``), ends its cgroup and closes our ends, and the error goes on with its
span attached, settled as any start that failed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from typing import Any

import pytest
import redis
from support import wait_group
from test_cgroups import handler_cgroups, root  # noqa: F401  (a fixture)
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd.process import handler as handler_module
from jobd.process import launch

DEADLINE = 5.0


class Os:
    """``os`` for ``jobd.process.handler``: its first ``pidfd_open`` fails with EMFILE."""

    def __init__(self) -> None:
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def pidfd_open(self, pid: int, flags: int = 0) -> int:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return os.pidfd_open(pid, flags)


def reaped(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


@pytest.mark.parametrize(
    ("extra", "placed"), [("", False), (", cwd: /", False), ("", True)],
    ids=["clone", "popen", "cgroup"],
)  # fmt: skip
def test_a_start_that_fails_after_the_spawn_leaves_no_handler_running(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    extra: str,
    placed: bool,
) -> None:
    """By both start paths: the clone (not waiting for the exec), and Popen (a ``cwd``); and in
    a cgroup of its own (ended: removed once empty)."""
    group = request.getfixturevalue("root") if placed else None  # skipped where none is made
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\n"
        + (f"cgroup: {group}\n" if group else "")
        + "queues:\n"
        f"  q: {{stream: {STREAM}, command: [/bin/sleep, '30'], retry: {{max_attempts: 1}}"
        f"{extra}}}\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    wait_group(r, STREAM)
    pids: list[int] = []
    real = launch.start

    def start(*args: Any, **kwargs: Any) -> Any:
        started = real(*args, **kwargs)
        pids.append(started[0])
        return started

    monkeypatch.setattr(launch, "start", start)
    fake = Os()
    monkeypatch.setattr(handler_module, "os", fake)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1"})
    outcome = loop.outcome()
    assert fake.failed and pids, "inconclusive: the fault was not injected"
    pid = pids[0]
    try:
        deadline = time.monotonic() + DEADLINE
        while not reaped(pid) and time.monotonic() < deadline:
            loop.daemon.step()
        assert reaped(pid), (
            f"the job was settled ({outcome.verb.name}: {outcome.error}) as a start that failed,"
            f" and its handler (pid {pid}) still runs, in no table"
        )
        if group is not None:
            while handler_cgroups(group) and time.monotonic() < deadline:
                loop.daemon.step()
            assert not handler_cgroups(group), "its cgroup, ended, is removed"
    finally:  # the test's own child (the daemon runs in this process): not left behind
        if not reaped(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
