"""Review of issue 35 (workflows), round 35j: an enqueue of a held job id run again with
another `--after` registers the hold with a job it does not wait for; that registration is
never taken off (not by the hold's end, not by the job's), against review 35i's "no
registration outlives its hold".

What is wrong: hold.lua answers {0, token} for a job id held already ("this enqueue sent
before"), and jobd.workflows.hold then registers the hold's waiter line with every job the
*second* command names (wait_on.lua), here `d2`, though the hold's after hash still names
`d1` only. When the hold ends where it waits (cancelled here; dead-lettered the same),
lib/workflows.lua unregister writes unwait notices for the jobs its after hash names: `d1`,
never `d2`. The line stays in `{jobd:a}:waiters` under `d2` until `d2` ends, for ever if it
never does. (The second command also exits 0 although the job does not wait for `d2`: it
may run before `d2` is done.)

What should happen: an enqueue that finds its job id held already registers nothing the
hold does not wait for (it registers the hold's own dependencies, from its after hash, or
refuses when the dependencies differ); no registration outlives its hold.

Why it matters: a leak in Redis with no bound nor expiry, each end of a job of `d2`'s queue
paying the waiters look; and an operator correcting a job's `--after` by enqueueing it again
is told it worked."""

from __future__ import annotations

import redis
from support import jobd_cli, waiter_lines

from jobd.config import load
from jobd.store.store import Store

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_second_enqueue_with_another_after_leaves_no_registration(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    q = load(c).queues["a"]
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d1")
    assert out.returncode == 0, out.stderr
    # Fixed (F35c): the second enqueue registers only what the hold waits for (d1) and says
    # the job does not wait for d2 (a usage error, exit 2); this test first asserted the
    # defect here (exit 0, x registered with d2), then its leak.
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d2")
    assert out.returncode == 2, out.stderr
    assert b"held already, waiting for a d1" in out.stderr, out.stderr
    assert r.hexists("{jobd:a}:held", "x")
    assert waiter_lines(r, "{jobd:a}:waiters", "d1")
    # the same command again (its reply lost) is still that job: exit 0
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--after", "d1")
    assert out.returncode == 0, out.stderr
    out = jobd_cli("cancel", "-c", c, "a", "x")
    assert out.returncode == 0, out.stderr
    store = Store(r, "daemon")
    while store.move_follow_ups(q):  # the unwait notices, as a daemon's duty moves them
        pass
    assert not r.hexists("{jobd:a}:held", "x")
    assert not waiter_lines(r, "{jobd:a}:waiters", "d1"), "x's registration with d1 went"
    left = waiter_lines(r, "{jobd:a}:waiters", "d2")
    assert not left, (
        f"x's hold was cancelled, yet its registration with d2 (made by the second enqueue, "
        f"which x does not wait for) stays for as long as d2 never ends: {left!r}"
    )
