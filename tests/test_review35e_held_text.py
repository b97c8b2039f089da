"""Review of issue 35 (workflows), round 6 (review35e): `jobd job` of a held job says "waiting
for N of M: …" (issue 35: "waiting for 2 of 3: a, b"); cli/history.py held_text takes the names
from the job's latest `waiting` record but M from its first. A job id held, cancelled where it
waits (its job id free again: docs/workflows.md) and held anew after other jobs (or held anew
after the held:ended window) keeps both records, and `jobd job` mixes the two holds: "waiting
for 1 of 2: a z" for a job that waits for one job in all. No daemon: nothing is released."""

from __future__ import annotations

import redis
from support import jobd_cli


def test_jobd_job_counts_the_jobs_the_current_hold_waits_for(r: redis.Redis, write_config) -> None:
    cfg = write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n")
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x", "--after", "y")
    assert out.returncode == 0, out.stderr
    assert jobd_cli("cancel", "-c", c, "a", "h").returncode == 0
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "z")
    assert out.returncode == 0, out.stderr
    assert r.hexists("{jobd:a}:held", "h")
    shown = jobd_cli("job", "-c", c, "a", "h")
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.decode().splitlines()[0]
    assert "held: waiting for 1 of 1: a z" in first, first
