"""Review of issue 35 (workflows), round 4 (review35c): keys of another type written by someone
else, where a workflow duty reads. docs/workflows.md: "A held job still waiting when its bound
passes is dead-lettered `dependency`", by "the same duty of every daemon of the queue, every 2
seconds"; that duty is also the fallback mover of the queue's outbox. Real daemon, the session's
private Redis."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml

from jobd.config import load

Daemon = Callable[..., DaemonProcess]


def test_a_wrong_type_key_of_another_queue_stops_every_held_job_of_this_one_expiring(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Queue b's running-job records key (``{jobd:b}:active``) is someone else's string. Job
    h1 of queue a waits for b:y with a 1 s bound, job h2 of queue a for a:z (nothing to do with
    b) with a 1 s bound. When the bounds pass, expire_held's caller (store/workflows.py
    ``_seen``) asks HEXISTS of b's active key to say "never seen" or "not ended": WRONGTYPE,
    raised out of the duty's tick, on every tick, before the tick moves the outbox
    (daemon/outbox.py). Neither held job is ever dead-lettered: one key of queue b freezes
    every bounded wait of queue a (and a's outbox fallback), though wait_on.lua reads keys of
    another type as empty."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    config = load(str(cfg))
    r.set(config.queues["b"].keys.active, "someone else's")
    dead_stream = config.queues["a"].dead_letter.stream
    for job, dep in (("h1", "b:y"), ("h2", "z")):
        out = jobd_cli("enqueue", "-c", str(cfg), "a", job, "--job-id", job, "--after", dep,
                       "--after-timeout", "1s")  # fmt: skip
        assert out.returncode == 0, out.stderr
    daemon(cfg)

    def dead() -> set[str]:
        rows = r.xrange(dead_stream) if r.exists(dead_stream) else []
        return {f[b"jobd_job_id"].decode() for _, f in rows}

    wait_until(lambda: "h2" in dead(), 20, what="h2 (after a:z, 1 s bound) dead-lettered")
    wait_until(lambda: dead() == {"h1", "h2"}, 10, what="h1 (after b:y, 1 s bound) too")
