"""Review of issue 35 (workflows), round 35i: a held job that ends where it waits (cancelled,
or dead-lettered `dependency` once its bound passed) leaves its registration in the waiters
hash of every job it waited for that has not ended, with no bound: `{D}:waiters` is never
trimmed and never expires.

What is wrong: wait_on.lua registers the waiter with each job it waits for (`{D}:waiters`,
job id -> one JSON line per waiter); only the script that ends that job reads and deletes
the field (lib/workflows.lua ``ended``). A held job cancelled (cancel_held.lua: "its
registrations ... stay") or expired by its bound (expire_held.lua) is gone, but its line
stays for as long as the job it waited for never ends: a job id never enqueued (the very case
`--after-timeout` exists for: "never seen"), or one enqueued and lost. Each `jobd enqueue
--after never --after-timeout 1h` adds one line (~300 bytes) for ever; the hash has no TTL
(unlike `{T}:held:ended`, pruned, or the follow-up and callback marks, 7 days), and while it
exists every end of a job of that queue pays the waiters look (lib/workflows.lua
workflow_at's EXISTS is 1 for good, docs/workflows.md "Cost": "a queue no job waits on pays
nothing more"). Each further registration with that job id reads and rewrites the whole
value (wait_on.lua: HGET, string.find, HSET), so it also grows quadratic.

What should happen: the registrations of a held job that ended where it waits do not outlive
it for ever: removed when it ends (best effort: the keys are in another slot), or bounded in
time (an expiry, or pruned by the waiter's bound / history.max_age like `held:ended`).

Why it matters: memory in Redis grows without bound with an ordinary use of `--after` with a
bound, and no operator command or documented key lifetime ever reclaims it."""

from __future__ import annotations

import redis
from support import jobd_cli, waiter_lines

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_held_job_cancelled_leaves_no_registration_behind_for_ever(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    ids = [f"h{i}" for i in range(20)]
    for job_id in ids:
        out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", job_id, "--after", "never",
                       "--after-timeout", "1h")  # fmt: skip
        assert out.returncode == 0, out.stderr
    out = jobd_cli("cancel", "-c", c, "a", *ids)
    assert out.returncode == 0, out.stderr
    assert not r.hexists("{jobd:a}:held", "h0"), "cancelled where it waits"
    left = waiter_lines(r, "{jobd:a}:waiters", "never")
    ttl = r.pttl("{jobd:a}:waiters")
    assert not left or ttl > 0, (
        f"20 held jobs, all cancelled, leave {len(left)} registrations "
        f"({sum(map(len, left))} bytes) under job id 'never' in {{jobd:a}}:waiters, with no expiry "
        f"(PTTL {ttl})"
    )


def test_a_held_job_dead_lettered_takes_its_registrations_with_it(
    r: redis.Redis, write_config
) -> None:
    """The same for the two other ends where it waits: dead-lettered `dependency` as one job
    it waits for failed (its registration with the other goes), and past its bound (both go).
    No daemon: the outbox is moved as a daemon's duty moves it."""
    from support import wait_until

    from jobd.config import load
    from jobd.store.store import Store

    c = str(write_config(CONFIG))
    q = load(c).queues["a"]
    store = Store(r, "me")
    for args in (("y", "--delay", "1h"),
                 ("h1", "--job-id", "h1", "--after", "y", "--after", "never"),
                 ("h2", "--job-id", "h2", "--after", "never", "--after", "other",
                  "--after-timeout", "1ms")):  # fmt: skip
        extra = ["--job-id", "y"] if args[0] == "y" else []
        out = jobd_cli("enqueue", "-c", c, "a", *args, *extra)
        assert out.returncode == 0, out.stderr
    assert waiter_lines(r, "{jobd:a}:waiters", "never")
    assert waiter_lines(r, "{jobd:a}:waiters", "other")
    assert jobd_cli("cancel", "-c", c, "a", "y").returncode == 0  # h1 dead-lettered: dependency
    wait_until(lambda: store.expire_held(q)[0] == 1, what="h2 past its bound")
    store.move_follow_ups(q)
    store.move_follow_ups(q)  # the notices the first move's unblock wrote
    assert not r.hexists("{jobd:a}:held", "h1") and not r.hexists("{jobd:a}:held", "h2")
    assert r.hgetall("{jobd:a}:waiters") == {}
