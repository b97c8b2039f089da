"""Review of issue 35 (workflows), round 4 (review35c): `jobd enqueue --unique --after`. The CLI
takes the two together (only --batch is refused with --unique), but a held job never goes
through the unique check: producer.enqueue holds it (jobd/workflows.py hold) and returns
before store.enqueue, and hold.lua looks only at the held hash. docs: --unique "added only if
that job id is not queued, running, or done within the dedupe window" (exit 3 otherwise).
Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, runs

Daemon = Callable[..., DaemonProcess]


def test_a_unique_job_after_others_is_refused_while_its_job_id_is_queued(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """h is queued (--unique, no daemon yet). `jobd enqueue a h --job-id h --unique --after x`
    should say h is queued already (exit 3) and add nothing: it exits 0, holds a second h, and
    once x is done that h is released and runs too: h runs twice."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--unique").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    again = jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--unique", "--after", "x")
    daemon(cfg)
    wait_until(lambda: runs(tmp_path).count("h") >= 1 and "x" in runs(tmp_path), what="h, x run")
    wait_until(lambda: not r.hlen("{jobd:a}:held"), what="nothing held")
    wait_until(
        lambda: all(g["pending"] == 0 and g["lag"] == 0 for g in r.xinfo_groups("jobd:a")),
        what="every entry of a acknowledged",
    )
    assert runs(tmp_path).count("h") == 1, (runs(tmp_path), again.returncode, again.stderr)
    assert again.returncode == 3, again.stderr


def test_a_unique_held_job_that_ends_unrun_frees_its_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The hold takes the --unique mark (fix35c); a held job cancelled (h) or dead-lettered
    `dependency` (k) gives it back, as dead_letter.lua does: the job id can be enqueued
    --unique again at once, not refused as "queued" for a week."""
    from jobd.config import load

    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    c = str(cfg)
    dead = load(c).queues["a"].dead_letter.stream
    for job, dep in (("h", "x"), ("k", "y")):
        out = jobd_cli("enqueue", "-c", c, "a", job, "--job-id", job, "--unique", "--after", dep)
        assert out.returncode == 0, out.stderr
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--unique").returncode == 3
    assert b"held" in jobd_cli("cancel", "-c", c, "a", "h").stdout
    again = jobd_cli("enqueue", "-c", c, "a", "h2", "--job-id", "h", "--unique")
    assert again.returncode == 0, again.stderr
    assert jobd_cli("enqueue", "-c", c, "a", "fail", "--job-id", "y").returncode == 0
    daemon(cfg)
    wait_until(lambda: r.exists(dead) and r.xlen(dead) == 2, 20, what="y and k dead-lettered")
    again = jobd_cli("enqueue", "-c", c, "a", "k2", "--job-id", "k", "--unique")
    assert again.returncode == 0, again.stderr
    wait_until(lambda: runs(tmp_path).count("k") == 1 and runs(tmp_path).count("h") == 1,
               what="h and k, enqueued again, run")  # fmt: skip
