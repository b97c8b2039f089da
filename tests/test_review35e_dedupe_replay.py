"""Review of issue 35 (workflows), round 6 (review35e): dedupe.lua, which since review 35d
tells a deduped job's batch and waiters (lib/workflows.lua ``ended``), tells them for every
entry handed to it whose mark says done, whether or not its XACK acknowledged anything: it
checks neither that this consumer still holds the entry (settle.lua and cancelled.lua do:
XPENDING owner) nor XACK's reply (settle.lua: ``acked == 1``). A reader that read an entry
and stalled (SIGSTOP, a long GC, a slow link) past lease.reclaim_after before its dedupe call
ran finds the entry deduped by the daemon that took it over; its own call then writes a second
batch notice (a new outbox entry id: a new member for batch.lua's members set) and the batch
counts the member twice: it completes, and calls back, while a member still runs, with counts
that are wrong (done 3 of 3 with one running). The stalled reader's late call is made here
through the store, as its reader makes it (Store.dedupe with the Job it read). Real daemon."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, callbacks, runs

from jobd.config import load
from jobd.job import Job
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]

# Appends its job id to "runs"; payload "block" waits for the file "go" beside it.
BLOCKING = """\
#!/bin/sh
p=$(cat)
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
while [ "$p" = block ] && [ ! -e "$(dirname "$0")/go" ]; do sleep 0.1; done
"""


def test_a_late_dedupe_of_an_entry_deduped_already_counts_nothing_more(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    sh, cb = script("runs.sh", BLOCKING), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{sh}]\n    concurrency: 4\n    dedupe: {{window: 1h}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    c = str(cfg)
    daemon(cfg)

    def batch() -> dict:
        out = jobd_cli("batch", "-c", c, "B", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def enqueue(payload: str, job_id: str) -> None:
        out = jobd_cli("enqueue", "-c", c, "a", payload, "--job-id", job_id, "--batch", "B",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr

    def counts(b: dict) -> tuple:
        return b["state"], b["total"], b["done"], b["failed"], b["pending"]

    try:
        enqueue("block", "k")  # a member that runs until the test lets it end
        wait_until(lambda: runs(tmp_path) == ["k"], what="k running")
        enqueue("x", "j")
        wait_until(lambda: batch()["done"] == 1, what="j done")
        enqueue("x", "j")  # sent again (idempotent re-send): deduped, counted done
        wait_until(lambda: batch()["done"] == 2 and r.xlen("{jobd:a}:outbox") == 0,
                   what="the second j deduped and counted")  # fmt: skip
        assert runs(tmp_path) == ["k", "j"]
        assert counts(batch()) == ("sealed", 3, 2, 0, 1)
        # The reader that had read that second j and stalled runs its dedupe call now.
        config = load(c)
        q = config.queues["a"]
        entry_id, fields = r.xrange("jobd:a")[-1]
        store = Store(r)
        store.dedupe(q, [Job.from_entry("a", entry_id, fields)])
        store.move_follow_ups(q)
        assert counts(batch()) == ("sealed", 3, 2, 0, 1)
        assert callbacks(tmp_path) == []
    finally:
        (tmp_path / "go").touch()
