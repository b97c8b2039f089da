"""Review of issue 35 (workflows), round 35n: a member of a batch that expired, ending after a
batch of the same id was made again, is counted in the new batch, which then calls back before
its own members have run.

A batch's keys expire `history.max_age` after its latest change (docs/workflows.md, "Expiry");
a member may well outlive it without any daemon being down: a `--delay` longer than the
history's max_age, a held (`--after`) member waiting longer, a backlog. The docs say "A batch
made under an id whose batch expired is a new batch, with a callback of its own" and name one
exception only: "A notice of the batch before, still in an outbox when the new one is made
(every daemon of its queue down for longer than history.max_age), is counted in the new one".
But a member's end names the batch by its id alone (lib/workflows.lua ended: 'batch', batch;
the job's field jobd_batch), and batch.lua's 'count' takes any notice of that id: the old
member that ends later, its daemons up throughout, is counted in the new batch too. Here the
new batch's one member still runs, yet the batch is complete (done 1 of total 1, the old
member's) and its callback is enqueued: "the callback, which comes after the work of every
member is over" does not hold.

What should happen: an end is counted only in the batch (the incarnation) its job was added
to: e.g. the member's jobd_batch (or its notice) names the incarnation its enqueue's open
answered, and batch.lua's count of another incarnation counts nothing.

Fixed so: the member's field jobd_batch_incarnation (set once its enqueue opened the batch:
jobd.batches Member.grow), read wherever its end is told (lib/workflows.lua batch_of, batch_in,
held_at; dedupe.lua's arguments), named by its notice, and batch.lua's count of another
incarnation answers {} and writes nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, jobd_cli, wait_until
from test_after_batches import CALLBACK, runs

from jobd.config import load
from jobd.job import BATCH, BATCH_INCARNATION, Job

Daemon = Callable[..., DaemonProcess]

BLOCKING = """\
#!/bin/sh
p=$(cat)
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
while [ "$p" = block ] && [ ! -e "$(dirname "$0")/go" ]; do sleep 0.1; done
"""


def test_a_late_member_of_an_expired_batch_does_not_complete_the_new_one(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    sh, cb = script("runs.sh", BLOCKING), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{sh}]\n    history: {{max_age: 2s}}\n"
        f"  b:\n    command: [{sh}]\n    history: {{max_age: 1h}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    c, config = str(cfg), load(str(cfg))
    daemon(cfg)
    try:
        out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "old", "--delay", "8s",
                       "--batch", "B", "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
        # Batch B (its ttl queue a's 2 s) expires while its member waits for its time.
        wait_until(lambda: not r.exists("{jobd:batch:B}"), 10, what="batch B expired")
        out = jobd_cli("enqueue", "-c", c, "b", "block", "--job-id", "new", "--batch", "B",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "old" not in runs(tmp_path), "the delayed member ran before the new batch"
        wait_until(lambda: runs(tmp_path).count("old") == 1 and "new" in runs(tmp_path),
                   20, what="the old member run, the new one running")  # fmt: skip
        a = config.queues["a"]  # the old member acknowledged (its end's notice written in
        # that step), and its notice moved
        wait_until(lambda: acked_all(r, a.stream, 1) and r.xlen(a.keys.outbox) == 0,
                   10, what="the old member's end moved")  # fmt: skip
        shown = jobd_cli("batch", "-c", c, "B", "--json").stdout.decode().strip()
        added = r.xlen(config.queues["cb"].stream) if r.exists(config.queues["cb"].stream) else 0
        assert added == 0, f"the new batch B called back while its one member still runs: {shown}"
    finally:
        (tmp_path / "go").touch()


def test_held_and_delayed_members_of_an_expired_batch_cancelled_later_count_nothing(
    r: redis.Redis, write_config, script
) -> None:
    """The same through the ends told without a run: a held member (``--after``; its end told
    from its held fields, lib/workflows.lua held_at) and a delayed one (cancel_delayed.lua,
    batch_in), cancelled after the batch of their id expired and was made again: the new batch
    counts neither (it stays at its one member, pending), and calls nothing back."""
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a:\n    command: [/bin/true]\n    history: {max_age: 2s}\n"
        "  b:\n    command: [/bin/true]\n    history: {max_age: 1h}\n"
        "  cb:\n    command: [/bin/true]\n"
    )
    c, config = str(cfg), load(str(cfg))
    for extra in (("--job-id", "held", "--after", "never"), ("--job-id", "late", "--delay", "1h")):
        out = jobd_cli("enqueue", "-c", c, "a", "x", *extra, "--batch", "B", "--on-complete", "cb")
        assert out.returncode == 0, out.stderr
    wait_until(lambda: not r.exists("{jobd:batch:B}"), 10, what="batch B expired")
    out = jobd_cli("enqueue", "-c", c, "b", "y", "--job-id", "new", "--batch", "B",
                   "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    out = jobd_cli("cancel", "-c", c, "a", "held", "late")
    assert out.returncode == 0, out.stderr
    a = config.queues["a"]
    wait_until(lambda: r.xlen(a.keys.outbox) == 0, 10, what="the cancelled members' ends moved")
    shown = json.loads(jobd_cli("batch", "-c", c, "B", "--json").stdout)
    assert (shown["total"], shown["done"], shown["failed"], shown["state"]) == (
        1,
        0,
        0,
        "sealed",
    ), shown
    assert not r.exists(config.queues["cb"].stream), "the new batch B called back"


def test_a_retry_carries_the_incarnation_of_its_batch() -> None:
    """A retried member's end is its batch's, of the incarnation it was added to: the retry's
    fields keep jobd_batch_incarnation beside jobd_batch."""
    fields = {b"payload": b"x", BATCH: b"B", BATCH_INCARNATION: b"1765000000123456"}
    again = Job.from_entry("a", b"1-1", fields).next_attempt_fields()
    assert (again[BATCH], again[BATCH_INCARNATION]) == (b"B", b"1765000000123456")
