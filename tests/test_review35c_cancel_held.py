"""Review of issue 35 (workflows), round 4 (review35c): `jobd cancel` of a held job (--after)
and the job id's cancellation mark. docs/workflows.md: "`jobd cancel` of a held job cancels it
where it waits: it is held no more, its history says `cancelled`"; jobd cancel --help: "a job
found running or waiting stays cancelled until it is settled", only a job found nowhere stays
cancelled if read within --unseen-for. cancel.lua marks every job id asked for ('job:ID'), and
the script that then finds the job removes that mark (cancel_delayed.lua does: "a removed
job's 'job:' mark goes too"); cancel_held.lua does not. Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, runs

Daemon = Callable[..., DaemonProcess]


def test_a_held_job_cancelled_leaves_no_mark_that_cancels_its_next_enqueue(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """h is held (--after x, never enqueued) and cancelled: "held (waiting for other jobs):
    cancelled unrun". The user enqueues h again, plainly, to run it now: it is acknowledged
    unrun as cancelled when read, by the 'job:h' mark cancel.lua set an hour long and
    cancel_held.lua left behind (for a delayed job cancelled the same way,
    cancel_delayed.lua removes it, and the job enqueued again runs)."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x").returncode == 0
    out = jobd_cli("cancel", "-c", c, "a", "h")
    assert out.returncode == 0, out.stderr
    assert b"held" in out.stdout, out.stdout
    assert jobd_cli("enqueue", "-c", c, "a", "again", "--job-id", "h").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "a", "other", "--job-id", "o").returncode == 0
    daemon(cfg)
    wait_until(lambda: "o" in runs(tmp_path), what="o run (h was read before it)")
    wait_until(lambda: "h" in runs(tmp_path), 5, what="h, enqueued again after its cancel, run")


def test_jobs_held_on_each_priority_level_are_cancelled_where_they_wait(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Held jobs enqueued on a level other than the default (`--priority high`, `mid`; the
    default is `low`) are found and cancelled by `jobd cancel` of the queue: held jobs are
    kept per queue ({S}:held, shared by its levels, store/keys.py), not per level. h1's
    waiter is told at once (the cancel moves the notices: dead-lettered `dependency`), and
    x's end releases nothing."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK),
                                    "    priorities: [high, mid, low]\n"))  # fmt: skip
    c = str(cfg)
    for job, level in (("h1", "high"), ("h2", "mid")):
        out = jobd_cli("enqueue", "-c", c, "a", job, "--job-id", job, "--after", "x",
                       "--priority", level)  # fmt: skip
        assert out.returncode == 0, out.stderr
    assert jobd_cli("enqueue", "-c", c, "a", "w", "--job-id", "w", "--after", "h1").returncode == 0
    out = jobd_cli("cancel", "-c", c, "a", "h1", "h2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(b"held (waiting for other jobs): cancelled unrun") == 2, out.stdout
    wait_until(lambda: r.xlen("{jobd:a}:dead") == 1, what="w dead-lettered dependency")
    assert r.xrange("{jobd:a}:dead")[0][1][b"jobd_job_id"] == b"w"
    assert r.hlen("{jobd:a}:held") == 0
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    wait_until(lambda: "x" in runs(tmp_path), what="x run")
    wait_until(lambda: r.xlen("{jobd:a}:outbox") == 0, what="x's notices moved")
    streams = ("jobd:a", "{jobd:a}:priority:high", "{jobd:a}:priority:mid")
    assert sum(r.xlen(s) for s in streams) == 1, "a cancelled held job released"
