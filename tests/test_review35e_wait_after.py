"""Review of issue 35 (workflows), round 6 (review35e): `jobd enqueue --after X --wait` (and
Python's `producer.submit` of a NewJob with `after`, which docs/workflows.md names as a way to
add one) never sees the held job's end. `submit` waits for the end whose origin is the entry
its enqueue added, or a token for a timed job; a held job has neither (`_enqueue` returns no
entry id, and no ORIGIN field is written), so `Pending.origin` is '' and no end ever matches
(`waiting.Pending._ends`): the job runs and is done, the waiter times out (exit 124), or,
without --wait-timeout, waits for ever. Real daemon and handler."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, queues_yaml, runs

from jobd import producer
from jobd.config import load
from jobd.newjob import NewJob

Daemon = Callable[..., DaemonProcess]


def test_enqueue_after_with_wait_returns_once_the_held_job_is_done(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    runs_sh = script("runs.sh", RUNS)
    cfg = write_config(f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{runs_sh}]\n")
    c = str(cfg)
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    wait_until(lambda: runs(tmp_path) == ["x"], what="x done")
    out = jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x", "--wait",
                   "--wait-timeout", "15s")  # fmt: skip
    assert "h" in runs(tmp_path)  # released at once (x was done) and run
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)


def test_submit_after_sees_the_held_job_dead_lettered_or_cancelled_where_it_waits(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """Its ends where it waits name its token too (lib/workflows.lua held_dead, cancel_held.lua):
    a dependency that fails ends the wait dead-lettered `dependency`; a cancel, cancelled."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    config = load(str(cfg))
    cancelled = producer.submit(config, "a", NewJob(b"", "c", after="never"))
    assert jobd_cli("cancel", "-c", str(cfg), "a", "c").returncode == 0
    ended = cancelled.outcome(15)
    assert (ended.event, ended.job_id) == ("cancelled", "c"), ended
    daemon(cfg)
    dead = producer.submit(config, "a", NewJob(b"", "w", after=("bad",)))
    assert jobd_cli("enqueue", "-c", str(cfg), "a", "fail", "--job-id", "bad").returncode == 0
    ended = dead.outcome(15)
    assert (ended.event, ended.fields.get("error")) == ("dead-lettered", "dependency"), ended
