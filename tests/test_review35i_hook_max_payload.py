"""Review of issue 35 (workflows), round 35i: an `on_dead_letter` job larger than its queue's
`max_payload` is enqueued anyway, and that queue then dead-letters it unrun (malformed).

What is wrong: a `then:` step (process/chains.py) and a `JOBD_ENQUEUE` line
(process/followups.py) are checked against the target queue's `max_payload` ("a step is never
enqueued with a payload cut short"; the parent dead-lettered `enqueue` instead). The
`on_dead_letter` job is not: its payload, the dead-letter record as JSON (each value up to 4
KiB, so a few KiB for a job with a payload and some stderr; far more for a job with many
fields), goes into the hook's queue whatever its `max_payload`, and the daemon reading it
there refuses it (process/policy.py: "payload of N bytes is above max_payload"): the hook's
job is dead-lettered as malformed without running. A failure that should page someone pages
no one; nothing says so where it happened (the first queue's record says its hook's job was
enqueued), and `jobd validate` takes the config.

What should happen: a hook's job is never enqueued only to be refused unrun: either its JSON
is cut to fit the hook queue's `max_payload` (the record stays whole in the dead-letter
stream; "clipped" says so, as for values over 4 KiB), or `jobd validate` refuses an
`on_dead_letter` queue whose `max_payload` is below what a record's JSON may take, or the
record says `jobd_on_dead_letter` (as when the hook's queue cannot be written).

Why it matters: alert queues are the ones people give a small `max_payload`; `on_dead_letter`
exists so that "failures can page someone" (issue 35)."""

from __future__ import annotations

from pathlib import Path

import redis
from support import jobd_cli, wait_until
from test_after_batches import RUNS, Daemon, runs

FAILS = "#!/bin/sh\ncat >/dev/null\necho 'it broke' >&2\nexit 1\n"


def test_a_dead_letter_hook_job_is_not_refused_unrun_by_its_queue(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{script('fails.sh', FAILS)}]\n    retry: {{max_attempts: 1}}\n"
        "    on_dead_letter: {queue: alerts}\n"
        f"  alerts:\n    command: [{script('runs.sh', RUNS)}]\n    max_payload: 2KiB\n"
        "    retry: {max_attempts: 1}\n"
    )
    checked = jobd_cli("validate", "-c", str(cfg))
    if checked.returncode != 0:  # refused where it is written: fine
        return
    daemon(cfg)
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "x" * 3000, "--job-id", "j")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: r.xlen("{jobd:a}:dead") == 1, what="j dead-lettered")
    wait_until(lambda: runs(tmp_path) or r.exists("{jobd:alerts}:dead"), what="the hook's job")
    dead = [f.get(b"jobd_stderr", b"")[-200:] for _, f in r.xrange("{jobd:alerts}:dead")]
    assert runs(tmp_path) == ["j.dead"], (
        f"the on_dead_letter job of j never ran; dead-lettered in alerts: {dead}"
    )
