"""Review of issue 35 (workflows): defects it confirmed, each reproduced through real daemons on
the session's private Redis (failed before their fix)."""

from __future__ import annotations

from pathlib import Path

import redis
from support import jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, cli, events, records, runs

from jobd.config import load


def test_a_garbage_outbox_entry_wedges_every_notice_behind_it(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """One outbox entry with kind=release and no dep (someone else's XADD, a half-written
    entry): move_notices raises KeyError before its try, so the whole round fails, nothing is
    XDELed, and every later notice of the queue (dependencies, batch counts) waits for ever."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    a = load(str(cfg)).queues["a"].keys
    r.xadd(a.outbox, {"kind": "release", "junk": "\xff"})  # garbage at the head
    daemon(cfg)
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x")
    cli(cfg, "enqueue", "a", "x", "--job-id", "x")
    wait_until(lambda: "x" in runs(tmp_path), what="x ran")
    # Expected: w released and run once x is done (the garbage entry skipped or set aside).
    wait_until(
        lambda: "done" in events(records(r, "jobd:a", "w")),
        15,
        what="w released past a garbage outbox entry",
    )


def test_a_job_after_itself_is_refused(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """`--after` its own job id: hold.lua writes its record 'waiting' first, so wait_on.lua finds
    it not ended and registers it with itself; it can never run, yet jobd enqueue exits 0
    (jobd.workflows.dependencies checks the queue and the id, not the job itself)."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--job-id", "w", "--after", "w")
    held = r.hexists("{jobd:a}:held", "w")
    waits_on_itself = b'"job":"w"' in (r.hget("{jobd:a}:waiters", "w") or b"")
    # Expected: a usage error (exit 2), nothing held.
    assert out.returncode == 2 and not held, (out.returncode, held, waits_on_itself)
