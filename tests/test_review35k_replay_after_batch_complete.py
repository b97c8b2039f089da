"""Review of issue 35 (workflows), round 35k: `jobd enqueue --job-id x --after d --batch B` run
again (its reply lost) once `x`'s hold ended exits 2 ("batch 'B' is complete: it takes no
more jobs") when `x` was the batch's last member, though docs/workflows.md promises that such
an enqueue again "holds nothing, adds nothing, counts nothing, and exits 0 printing the job
id, as the first one would have".

What is wrong: the producer opens the batch (jobd.workflows `Member._open`, batch.lua 'open')
before it holds the job (`workflows.hold`, hold.lua, which would answer -1: its hold ended
within the queue's history.max_age, nothing to do). A batch whose members all ended is
complete and refuses the open, so the enqueue fails on the batch before it can learn that it
is the same job, already counted there. The replay guarantee of `--after` (review 35c) thus
holds for every job but the last of a batch: the very one whose end completes it.

What should happen: the enqueue run again finds its job's hold ended (or held) and exits 0
with the job id, changing nothing (the batch counts a job held already as no new member, the
docs say); a complete batch refuses only jobs that would be new members.

Why it matters: the point of `--after`'s idempotent enqueue is a script that runs the command
again after a lost reply or a timeout; here it is told "exit 2" (a usage error) for a job that
was added, ran and was counted, and a pipeline driver stops on a failure that is none."""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load
from jobd.store.store import Store

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_an_after_enqueue_run_again_after_its_batch_completed_exits_0(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    q = load(c).queues["a"]
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "d", "--delay", "1h")
    assert out.returncode == 0, out.stderr
    command = ("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d", "--batch", "B")
    out = jobd_cli(*command)
    assert out.returncode == 0, out.stderr
    assert jobd_cli("cancel", "-c", c, "a", "d").returncode == 0  # x: dead-lettered dependency
    store = Store(r, "daemon")
    while store.move_follow_ups(q):  # as the daemons' duty moves the notices
        pass
    assert not r.hexists("{jobd:a}:held", "x"), "x's hold ended (dead-lettered `dependency`)"
    shown = jobd_cli("batch", "-c", c, "B", "--json")
    assert b'"complete"' in shown.stdout, shown.stdout
    again = jobd_cli(*command)  # the same command again: its first reply was lost
    assert again.returncode == 0, (
        f"exit {again.returncode} for the enqueue of x run again: {again.stderr.strip().decode()}"
    )
    assert again.stdout.strip() == b"x", again.stdout
