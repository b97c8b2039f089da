"""Review of issue 35 (workflows), round 35i: someone else's key of another type at a queue's
`{S}:waiters` makes settle.lua fail half-way, after it acknowledged the job.

What is wrong: lib/workflows.lua ``workflow_at`` takes the waiters key as "watched" when it
EXISTS, whatever its type, and ``ended`` then runs ``redis.call('HGET', waiters, job)``. In
settle.lua that call comes after the XACK, the history record and the event (and in
dead_letter.lua after the record, the XACK and the history): a string (or any non-hash) there
raises WRONGTYPE in the middle of the script, and Redis does not roll a script back. So every
job of the queue is acknowledged and recorded `done`, but its job id's mark is never set
(`dedupe.window`: the next copy runs again; `--unique`: the mark stays `queued`, the job id
refused for 7 days) and the `done` counter never counts, while the daemon logs a failed write.
Every other key jobd shares its name space with is checked first ("a key of another type
there (someone else's) is neither read nor written", lib/workflows.lua hold_ended; batch.lua's
``ours``; settle.lua's own ``can_add`` of follow-ups' streams) so that a script fails before
it writes, or not at all.

What should happen: a waiters key of another type is read as no waiters (as wait_on.lua's
comment says it reads "keys of another type than jobd's ... as holding nothing"), or the
script refuses before its first write; never a half-applied acknowledgement.

Why it matters: the one-step acknowledgement (the ack, its mark, its counters, its follow-ups
and notices together) is what the issue's "exactly once" rests on."""

from __future__ import annotations

from pathlib import Path

import redis
from support import jobd_cli, wait_until
from test_after_batches import RUNS, Daemon, runs


def idle(r: redis.Redis) -> bool:
    return all(g["pending"] == 0 and g["lag"] == 0 for g in r.xinfo_groups("jobd:a"))


def test_a_waiters_key_of_another_type_never_half_applies_an_ack(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{script('runs.sh', RUNS)}]\n    dedupe: {{window: 1h}}\n"
    )
    r.set("{jobd:a}:waiters", "someone else's")
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--job-id", "x").returncode == 0
    wait_until(lambda: "x" in runs(tmp_path) and idle(r), what="x run and acknowledged")
    mark = r.get(b"{jobd:a}:job:x")
    assert mark == b"done", (
        f"x acknowledged, but its dedupe mark is {mark!r}: settle.lua stopped after the XACK"
    )
    # The mark not set, a copy sent again within the window runs a second time.
    assert jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--job-id", "x").returncode == 0
    wait_until(lambda: r.xlen("jobd:a") == 2 and idle(r), what="the copy read")
    assert runs(tmp_path).count("x") == 1, runs(tmp_path)


def test_an_outbox_of_another_type_never_half_applies_a_batch_members_ack(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The same for the outbox: ``ended`` XADDs a member's notice there after the XACK (only
    the follow-ups' path, on a cluster, looks at its type first)."""
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{script('runs.sh', RUNS)}]\n    dedupe: {{window: 1h}}\n"
    )
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--job-id", "x", "--batch", "B")
    assert out.returncode == 0, out.stderr
    r.set("{jobd:a}:outbox", "someone else's")  # once the enqueue's seal was applied
    daemon(cfg)
    wait_until(lambda: "x" in runs(tmp_path) and idle(r), what="x run and acknowledged")
    mark = r.get(b"{jobd:a}:job:x")
    assert mark == b"done", (
        f"x acknowledged, but its dedupe mark is {mark!r}: settle.lua stopped after the XACK"
    )
