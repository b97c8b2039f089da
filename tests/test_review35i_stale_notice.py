"""Review of issue 35 (workflows), round 35i: a release notice still in an outbox is applied to
a later hold of the same job id, which waits for a later run of the same dependency.

What is wrong: a notice of a dependency's end names the waiter by its job id only
(store/workflows.py waiter_line: queue, job, stream, …; no mark of which hold), and
unblock.lua applies it to whatever hold of that job id is there now, if that hold waits for
a job of the same name. A notice waits in the dependency's queue outbox until a daemon of
that queue moves it (the daemon that ended the job died first, or Redis was away: the duty
moves it later). Meanwhile the hold it was written for may end and the job id be held anew
(`jobd cancel` of a held job frees its job id: docs/workflows.md), waiting for a new run of
the same dependency (enqueued again with `--unique`, or requeued: "the end that counts is
that of the run under way, not the one before it"). When the old notice is moved, the new
hold takes the old run's end for the new run's: here it is dead-lettered `dependency b X
cancelled` while X's new run is queued and not ended (with a `done` notice it would be
released before X's new run ran).

What should happen: a notice is applied only to the hold it was written for: the waiter line
names its hold (e.g. the held job's delayed member id, random per hold, already in `{T}:held`),
and unblock.lua answers 'gone' when the hold there now is another one.

Why it matters: `--after` promises that a job runs only after the run it waits for is done;
a stale notice breaks that in exactly the crash window the outbox exists to cover. No
daemon: the end of X is written through the store as a daemon would (a cancel of a delayed
job, its notice not moved: the daemon died), and its outbox moved later as a daemon's duty
does."""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load
from jobd.store.store import Store

CONFIG = """\
redis: {url: '{redis}'}
queues:
  a:
    command: [/bin/true]
  b:
    command: [/bin/true]
"""


def ok(*args: str) -> None:
    out = jobd_cli(*args)
    assert out.returncode == 0, out.stderr


def test_an_old_notice_is_not_applied_to_a_new_hold_of_the_same_job_id(
    r: redis.Redis, write_config
) -> None:
    cfg = write_config(CONFIG)
    c = str(cfg)
    config = load(c)
    b = config.queues["b"]
    store = Store(r, "me")
    ok("enqueue", "-c", c, "b", "x1", "--job-id", "X", "--delay", "1h")
    ok("enqueue", "-c", c, "a", "h1", "--job-id", "H", "--after", "b:X")
    # X ends (cancelled where it is delayed); its notice to H stays in b's outbox (the process
    # that ended X died before moving it).
    assert [f.where for f in store.cancel_delayed(b, ["X"], "test")] == ["delayed"]
    assert r.xlen("{jobd:b}:outbox") == 1
    # Meanwhile: H cancelled where it waits (its job id free), X enqueued again (--unique: a
    # run under way, waited for), and H held anew after that run.
    ok("cancel", "-c", c, "a", "H")
    assert not r.hexists("{jobd:a}:held", "H")
    ok("enqueue", "-c", c, "b", "x2", "--job-id", "X", "--unique")
    ok("enqueue", "-c", c, "a", "h2", "--job-id", "H", "--after", "b:X")
    assert r.hexists("{jobd:a}:held", "H"), "the new hold waits for X's new run"
    # A daemon of b comes back and moves b's outbox.
    store.move_follow_ups(b)
    dead = {f[b"jobd_job_id"]: f for _, f in r.xrange("{jobd:a}:dead")}
    assert r.hexists("{jobd:a}:held", "H") and b"H" not in dead, (
        "the new hold of H, waiting for X's run now queued, took the notice of X's earlier "
        f"end: {dead.get(b'H', {}).get(b'jobd_stderr')!r}"
    )
