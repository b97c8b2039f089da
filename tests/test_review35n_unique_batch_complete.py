"""Review of issue 35 (workflows), round 35n: a `--unique` enqueue into a batch, sent again
once its batch is complete, is refused as a usage error (exit 2, "batch 'B' is complete: it
takes no more jobs") instead of answering as a `--unique` duplicate.

What the docs say: docs/reference/cli.md: `--unique`: "only if the --job-id is not already
queued, running or done (exit 3 otherwise)"; docs/producing.md (`--ndjson`): "Exit status: 0
every line enqueued (or there already, with --unique) ... with job ids and --unique the file
can simply be sent again"; docs/workflows.md: "An enqueue whose jobs were sent but none added
(... a --unique duplicate: exit 3 ...)" and "`--batch` goes with `--unique`: a duplicate is not
added, so not counted". For `--unique --after`, workflows.md says "the job id's mark answers
first" and jobd/workflows.py sent_before reads the mark before the batch opens ("one complete
since would refuse it"); a plain `--unique` job has no such read.

What happens: the batch is opened (jobd/workflows.py Member.grow -> _open, batch.lua 'open':
"batch complete") before the job's mark is looked at (enqueue_unique.lua): the re-send of the
same command, or of the same `--ndjson --unique` file, whose every job is there already and
done, fails with exit 2 and a usage message. A producer that re-sends on any doubt (the point
of `--unique`) takes its own idempotent re-send for a bad command line.

What should happen: the mark answers first, as for `--unique --after`: exit 3 for the one job
(it is done), exit 0 for the `--ndjson` file whose lines are all "already there"; the batch is
left as it was (no callback again).

A job id is "done" for `--unique` within the queue's dedupe window only (docs/concepts/
scheduling.md: without one, its mark goes with its ack and the id is free again): the queue
here has one. Where the id is free again, the re-send is a new job, and a complete batch takes
none: exit 2, as before (the second test). Fixed by reading the job id's mark when the batch
refuses the job (jobd.batches BatchComplete): the refusal and the read are one after the other,
so a batch that completes in between, or a first send whose reply was lost, still answers by
the mark (producer._enqueue, _duplicates)."""

from __future__ import annotations

import json

import redis
from support import jobd_cli, wait_until

from jobd.config import load

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
    "    dedupe: {window: 1h}\n  cb:\n    command: [/bin/true]\n"
)


def complete(c: str) -> bool:
    out = jobd_cli("batch", "-c", c, "B", "--json")
    return out.returncode == 0 and json.loads(out.stdout)["state"] == "complete"


def test_a_unique_resend_into_its_complete_batch_is_a_duplicate(
    r: redis.Redis, write_config, daemon
) -> None:
    cfg = write_config(CONFIG)
    c = str(cfg)
    one = ("enqueue", "-c", c, "a", "p", "--job-id", "u", "--unique", "--batch", "B",
           "--on-complete", "cb")  # fmt: skip
    out = jobd_cli(*one)
    assert out.returncode == 0, out.stderr
    daemon(cfg)
    wait_until(lambda: complete(c), what="batch B complete (its one member done)")
    again = jobd_cli(*one)  # the same command sent again (its reply was in doubt)
    line = json.dumps({"payload": "p", "job_id": "u", "unique": True}).encode() + b"\n"
    bulk = jobd_cli("enqueue", "-c", c, "a", "--ndjson", "-", "--batch", "B",
                    "--on-complete", "cb", stdin=line)  # fmt: skip
    assert (again.returncode, bulk.returncode) == (3, 0), (
        f"--unique re-send exited {again.returncode} ({again.stderr.decode().strip()!r}), "
        f"--ndjson re-send exited {bulk.returncode} ({bulk.stderr.decode().strip()!r}); "
        "the docs say 3 (a --unique duplicate) and 0 (every line there already)"
    )
    assert b"already done" in bulk.stderr, bulk.stderr  # the line named: a duplicate
    state = json.loads(jobd_cli("batch", "-c", c, "B", "--json").stdout)
    assert (state["total"], state["done"]) == (1, 1), state  # left as it was
    queues = load(c).queues
    assert r.xlen(queues["cb"].stream) == 1, "called back once only"
    # A new job (or a file with one among duplicates) is refused: the batch is complete.
    new = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "v", "--unique", "--batch", "B")
    mixed = line + json.dumps({"payload": "p", "job_id": "v", "unique": True}).encode() + b"\n"
    bulk = jobd_cli("enqueue", "-c", c, "a", "--ndjson", "-", "--batch", "B", stdin=mixed)
    assert (new.returncode, bulk.returncode) == (2, 2), (new.stderr, bulk.stderr)
    assert b"complete" in new.stderr and b"complete" in bulk.stderr
    a = queues["a"]
    assert not r.exists(a.keys.job_mark("v")) and r.xlen(a.stream) == 1, "nothing of v added"


def test_a_free_job_id_sent_again_into_its_complete_batch_is_refused(
    r: redis.Redis, write_config, daemon
) -> None:
    """No dedupe window: the job id's mark goes with its ack, the id is free again, and the
    re-send is a new job, which a complete batch refuses (exit 2), as without --unique."""
    cfg = write_config(CONFIG.replace("    dedupe: {window: 1h}\n", ""))
    c = str(cfg)
    one = ("enqueue", "-c", c, "a", "p", "--job-id", "u", "--unique", "--batch", "B")
    assert jobd_cli(*one).returncode == 0
    daemon(cfg)
    wait_until(lambda: complete(c), what="batch B complete (its one member done)")
    again = jobd_cli(*one)
    assert again.returncode == 2 and b"is complete" in again.stderr, again.stderr
