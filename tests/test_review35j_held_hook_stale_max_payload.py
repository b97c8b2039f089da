"""Review of issue 35 (workflows), round 35j: a held job dead-lettered `dependency` sends its
`on_dead_letter` record cut to the hook queue's `max_payload` of the day it was enqueued (kept
in its waiter line), not of the config in force: once that limit was lowered (or for a line
written before lines carried it), the hook's job is larger than its queue takes, and its
daemons dead-letter it unrun as malformed: the failure pages no one.

What is wrong: store/chains.py held_hook puts the hook queue's max_payload into the waiter
line (store/workflows.py waiter_line) when the job is held; unblock.lua cuts the record's
JSON to that number (lib/chains.lua held_hook_blocked), whatever the config says when the
dependency ends, days later maybe. A line of a jobd before review 35i has no max_payload at
all ('' : no cut). Yet the same queue's failed jobs (store/chains.py hook_args) and held jobs
past their bound (Store.expire_held: chains.held_hook(q)) are cut to the config in force: the
three ends of one queue disagree.

What should happen: the record's JSON fits the hook queue's max_payload in force when the
record is written (the mover has the config: it can send it, as expire_held does), as
docs/workflows.md says ("The JSON also fits the hook queue's max_payload").

Why it matters: lowering an alerts queue's max_payload (or upgrading while jobs are held) makes
every held job's dependency failure page no one, silently: the hook's job is itself a dead
letter, `malformed`, in the alerts queue."""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load
from jobd.store.store import Store


def text(most: str) -> str:
    return (
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a:\n    command: [/bin/true]\n    on_dead_letter: {queue: alerts}\n"
        f"  alerts:\n    command: [/bin/true]\n    max_payload: {most}\n"
    )


def test_a_held_jobs_hook_fits_the_max_payload_in_force(r: redis.Redis, write_config) -> None:
    before = str(write_config(text("64KiB")))
    for args in (("y", "--job-id", "y", "--delay", "1h"),
                 ("x" * 3000, "--job-id", "h", "--after", "y")):  # fmt: skip
        out = jobd_cli("enqueue", "-c", before, "a", *args)
        assert out.returncode == 0, out.stderr
    now = write_config(text("2KiB"), "now.yaml")  # the operator lowers alerts' max_payload
    assert jobd_cli("validate", "-c", str(now)).returncode == 0
    q = load(str(now)).queues["a"]
    assert jobd_cli("cancel", "-c", str(now), "a", "y").returncode == 0  # h: dependency
    store = Store(r, "daemon")
    store.move_follow_ups(q)  # the release notice (unblock.lua: h dead-lettered)
    store.move_follow_ups(q)  # the hook's job, as a daemon moves it (on a cluster)
    assert not r.hexists("{jobd:a}:held", "h")
    entries = r.xrange("{jobd:alerts}") or r.xrange("jobd:alerts")
    assert entries, f"no hook job in alerts: {r.keys('*')}"
    payload = entries[-1][1][b"payload"]
    assert len(payload) <= 2048, (
        f"the hook's job has a payload of {len(payload)} bytes, above alerts' max_payload "
        "(2048) in force: its daemon dead-letters it unrun, as malformed"
    )
