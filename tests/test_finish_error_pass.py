"""Review 34m (issue 34, handlers that exited wait in ``Handlers.leaving``): an error finishing
one handler (a bug anywhere in ``Endings.finish`` outside its two guarded parts, the reap and
the decision: ``policy.succeeded``, ``admission.lapsed``, ``os.path.lexists``, ``remove``)
loses every other handler that left the table in the same pass, for good.

``Handlers.left`` deletes all of a pass's ready handlers from ``leaving`` before the loop
finishes them one by one (``Daemon.step``: ``for handler in self.running.left(...):
self.finish(handler)``), and ``Handlers.exited`` unregistered their pidfds already. An
exception in the first ``finish`` leaves ``step`` (``Daemon.run`` logs it and goes on): the
others are in neither ``leaving`` nor the poller, still in ``by_pid``; nothing finishes them
ever: unreaped zombies, their entries held and renewed for ever, their slots never freed,
``Handlers.act`` now acting on them (a SIGTERM at their timeout to a zombie's group, then
SIGKILL, never reaped), and a shutdown that never ends (``Daemon.finished`` waits for an empty
table). Before a3d4c2e each pass's exits came from the poller, whose pidfds stayed registered
(level-triggered) until ``remove``: the next pass finished the rest.

Fixed: each finish is guarded (``Endings.finish``); the handler whose finish raised leaves
the table if it is still there (``Handlers.discard``: reaped if it was not), its entry released.

In-process (a Daemon whose passes the test runs, a private Redis, real handlers): two
handlers exit before one pass sees both; a bug, once, in the first one's finish: after its
reap (``policy.succeeded``), or before it (``Handlers.remove``: it is still in the table)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from support import DEADLINE, pending_count
from test_endings_faults import opened, until  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd.daemon import lease
from jobd.process import policy


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@pytest.mark.parametrize("where", ["decision", "removal"])
def test_an_error_finishing_one_handler_loses_none_of_the_others_of_its_pass(
    where: str,
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    go = tmp_path / "go"
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 10s\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    concurrency: 2\n    timeout: 30s\n"
        f"    command: [/bin/sh, -c, 'while [ ! -e {go} ]; do sleep 0.01; done']\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    daemon = loop.daemon
    r.xadd(STREAM, {"payload": "", "job_id": "a"})
    r.xadd(STREAM, {"payload": "", "job_id": "b"})
    until(loop, lambda: len(daemon.running) == 2, "both handlers running")
    pids = [h.pid for h in daemon.running]
    entries = {h.job.job_id: h.job.message_id for h in daemon.running}
    go.touch()  # both exit; no pass runs until both are zombies: one pass sees both exits
    deadline = time.monotonic() + DEADLINE
    while not all(map(zombie, pids)):
        assert time.monotonic() < deadline, "the handlers did not exit"
        time.sleep(0.01)

    real, raised = policy.succeeded, []
    remove = daemon.running.remove

    def succeeded(handler, status):  # a bug, once, finishing the first of the pass
        if not raised:
            raised.append(handler.job.job_id)
            raise RuntimeError("a bug finishing it")
        return real(handler, status)

    def removing(handler):  # a bug, once, before its reap (the handler still in the table)
        if not raised:
            raised.append(handler.job.job_id)
            raise RuntimeError("a bug removing it")
        return remove(handler)

    if where == "decision":
        monkeypatch.setattr(policy, "succeeded", succeeded)
    else:
        monkeypatch.setattr(daemon.running, "remove", removing)
    errors = until(loop, lambda: raised, "the bug")
    other = ({"a", "b"} - set(raised)).pop()
    # The other handler's end is decided and settled (acked), its handler out of the table.
    deadline = time.monotonic() + 5
    while not any(o.job.job_id == other for o in loop.outcomes):
        if time.monotonic() > deadline:
            still = [(h.job.job_id, h.pid, h.pid in daemon.running.leaving) for h in daemon.running]
            for handler in list(daemon.running):  # so that the loop can stop (the fixture)
                daemon.finish(handler)
            pytest.fail(
                f"job {other} (exited with {raised[0]}, in one pass) never finished "
                f"after the bug finishing {raised[0]} ({errors}): the table holds "
                f"{still} (job, pid, in leaving), pending {pending_count(r, STREAM)}"
            )
        try:
            daemon.step()
        except Exception as exc:
            errors.append(repr(exc))
    assert all(h.job.job_id != other for h in daemon.running)
    # The one whose finish raised: out of the table, reaped, its entry released (its slot free).
    assert not len(daemon.running), [h.job.job_id for h in daemon.running]
    assert not any(map(zombie, pids))
    queue = daemon.config.queues["q"]
    held = daemon.holdings.snapshot(lease.key(queue))  # a release may be claimed back at once
    assert held.get(entries[raised[0]], 0) != 1, f"its delivery still held (renewed): {held}"
