"""Review 35t of issue 35: 8855d5b made a member's own dead letter keep jobd_batch (and
jobd_batch_incarnation) "each when no longer than jobd writes it", so that `jobd dlq requeue`
names the batch the job leaves. dead_letter.lua applies that length rule to *each* occurrence
of the name (an entry may repeat a name: someone's XADD), while the daemon reads a repeated
name as its last value (jobd.job; lib/jobs.lua ``sized`` keeps "the last of each" too). An
entry ``jobd_batch R, jobd_batch <801 bytes>`` is no member of any batch for the daemon (the
last value is too long: store/notes.py ``_batch`` links none, its end is counted in no batch),
but its dead letter keeps the first value, ``R``, alone (the long one is dropped): requeue.lua
(``batch_in``) then names batch R in the job's ``requeued`` record and ``requeue`` event,
`jobd job --json` says ``batch: R`` / ``batch_left: true`` (the dashboard "left: requeued"):
a batch the job never was a member of — someone else's, here one that really exists.

Reproduce: a real batch R (one member, done, called back); someone XADDs a failing job with
``jobd_batch R`` then ``jobd_batch`` of 801 bytes into the same queue; a daemon dead-letters
it (R's counts stay 1 done: it was no member); `jobd dlq requeue` its dead letter.

What should happen: the dead letter keeps the batch the daemon read (the last value of the
name, and only when it passes the rule), so the requeue names no batch here, as the job's own
records (its dead-lettered one) named none.

Fixed (dead_letter.lua): jobd_batch and jobd_batch_incarnation are decided by their last
occurrence, as jobd.job and ``sized`` read them, and only that one is copied: an earlier value
never reaches the dead letter, so the requeue names no batch here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, callbacks, cli, queues_yaml, records

Daemon = Callable[..., DaemonProcess]


def test_a_dead_letter_names_no_batch_the_job_was_no_member_of(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "a", "ok", "--job-id", "m", "--batch", "R", "--on-complete", "cb")
    wait_until(lambda: callbacks(tmp_path), what="R's callback")
    # someone's entry: the name repeated, its last value longer than any batch id
    r.execute_command("XADD", "jobd:a", "*", "payload", "fail", "job_id", "d",
                      "jobd_batch", "R", "jobd_batch", "L" * 801)  # fmt: skip
    wait_until(lambda: r.xlen("{jobd:a}:dead") == 1, what="d dead-lettered")
    assert ["batch" in x for x in records(r, "jobd:a", "d")] == [False], "d linked a batch"
    shown = json.loads(cli(cfg, "batch", "R", "--json"))
    assert (shown["total"], shown["done"], shown["failed"]) == (1, 1, 0), "d counted in R"
    [(dead, letter)] = r.xrange("{jobd:a}:dead")
    cli(cfg, "dlq", "a", "requeue", dead.decode())
    requeued = [x for x in records(r, "jobd:a", "d") if x["event"] == "requeued"]
    assert len(requeued) == 1
    # it fails here: the dead letter kept the first jobd_batch, R, the requeue names it
    assert requeued[0].get("batch") is None, (requeued[0], letter)
    [event] = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"requeue"]
    assert b"batch" not in event, event
    out = jobd_cli("job", "-c", str(cfg), "a", "d", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["batch"] is None
