"""Review of issue 35 (workflows), round 35j: a held job that ends while its enqueue is still
registering it (cancelled, dead-lettered by a dependency's end, past its bound) keeps a
registration made after its end in the waiters hash of a job it waited for, for as long as
that job never ends: the leak review 35i fixed, back through a race.

What is wrong: jobd.workflows.hold holds the job (hold.lua), then registers it with each job
it waits for, one wait_on.lua call each, in turn. A hold that ends meanwhile (here: `jobd
cancel` of it between the first registration and the second) writes an `unwait` notice per
job it waits for (lib/workflows.lua unregister), moved on by a daemon's outbox duty; the one
for a registration not made yet finds nothing (unwait.lua returns 0) and is gone. The enqueue
then goes on and registers the hold that no longer exists: its line stays in
`{D}:waiters` until D ends, for ever when D never does (a job id never enqueued: the case
`--after-timeout` is for), each end of a job of D's queue paying the waiters look, each later
registration with D rewriting the whole value. The same with a daemon that dead-letters the
hold (a dependency failing, its bound passing) in that window.

What should happen: no registration outlives its hold, whatever the order (e.g. wait_on
refuses or the enqueue takes back a registration whose hold is gone: it can check the hold
after registering, or the unwait notice can stay until the registration it names is seen
gone).

Why it matters: Redis memory grows without bound, and the 35i fix's promise ("so that no
registration outlives its hold", lib/workflows.lua) is broken by an ordinary concurrency:
an operator's cancel, or a daemon's end of the hold, during an enqueue with several --after.

The race is forced here by doing the cancel and the daemon's outbox move from inside the
enqueue's second wait_on call (the store method wrapped; Redis is real)."""

from __future__ import annotations

import redis
from support import jobd_cli, waiter_lines

from jobd.config import load
from jobd.newjob import NewJob
from jobd.producer import enqueue_job
from jobd.store.store import Store
from jobd.store.workflows import WorkflowOps

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_registration_made_after_its_hold_ended_does_not_stay(
    r: redis.Redis, write_config, monkeypatch
) -> None:
    c = str(write_config(CONFIG))
    config = load(c)
    q = config.queues["a"]
    daemon = Store(r, "daemon")
    real = WorkflowOps.wait_on
    calls: list[str] = []

    def wait_on(self, dep, job_id, waiter):  # the enqueue's registrations, in turn
        calls.append(job_id)
        if job_id == "never2":  # between two registrations: x cancelled, the outbox moved
            out = jobd_cli("cancel", "-c", c, "a", "x")
            assert out.returncode == 0, out.stderr
            assert not r.hexists("{jobd:a}:held", "x"), "x cancelled where it waits"
            daemon.move_follow_ups(q)  # its unwait notices, as a daemon's duty moves them
            assert not waiter_lines(r, "{jobd:a}:waiters", "never1"), "unwait took never1's off"
        return real(self, dep, job_id, waiter)

    monkeypatch.setattr(WorkflowOps, "wait_on", wait_on)
    job = NewJob(b"p", "x", after=("never1", "never2"), after_timeout=3600)
    enqueue_job(config, "a", job, client=r)
    assert calls == ["never1", "never2"]
    daemon.move_follow_ups(q)
    assert not r.hexists("{jobd:a}:held", "x")
    left = waiter_lines(r, "{jobd:a}:waiters", "never2")
    assert not left, (
        f"x's hold was cancelled, yet its registration with never2 stays: {left!r} (it stays "
        "until never2 ends, for ever if it never does)"
    )
