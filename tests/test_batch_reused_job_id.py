"""Review 35q: `jobd job` of a job id that was a member of two batches points its records of
the first (expired) batch at `jobd batch ID` again.

Review 35o (cli/workflow.py batch_now) reads which batch of the id there is now for the batch
its records name *last* only; batch_where then answers "(jobd batch ID)" for every record
naming another batch, unchecked. A job id may be enqueued again once its job ended (no dedupe
window here), into another batch: its records of the first batch, which expired, still say
"(jobd batch A)", what review 35o set out to stop (docs/workflows.md: "when the batch expired,
`jobd job` says `(its batch expired: no batch of this id now)`")."""

from __future__ import annotations

import json

import redis
from support import jobd_cli

from jobd.config import load

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_records_of_an_earlier_batch_of_a_reused_job_id(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    for batch in ("A", "C"):
        out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "late", "--delay", "1h",
                       "--batch", batch, "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert jobd_cli("cancel", "-c", c, "a", "late").returncode == 0
        if batch == "A":  # batch A expires (its keys gone, as the history bounds do)
            r.delete("{jobd:batch:A}", "{jobd:batch:A}:members", "{jobd:batch:A}:adders")
    text = jobd_cli("job", "-c", c, "a", "late").stdout.decode()
    pointed = [line.strip() for line in text.splitlines() if "batch:" in line]
    assert "batch: A (jobd batch A)" not in pointed, pointed
    assert "batch: A (its batch expired: no batch of this id now)" in pointed, pointed
    assert "batch: C (jobd batch C)" in pointed, pointed


def test_the_batches_its_records_name_are_checked_up_to_a_bound(
    r: redis.Redis, write_config
) -> None:
    """`jobd job` reads which batch there is now for the 8 latest distinct batches its records
    name (one read each), and says of the records of any other that it did not check it."""
    c = str(write_config(CONFIG))
    q = load(c).queues["a"]
    lines = [
        json.dumps({"at": 1000 + i, "event": "cancelled", "batch": f"B{i}",
                    "batch_incarnation": "7"})
        for i in range(10) for _ in range(2)
    ]  # fmt: skip
    r.hset(q.keys.history, "many", "\n".join(lines))
    r.zadd(q.keys.history_at, {"many": 1019})
    text = jobd_cli("job", "-c", c, "a", "many").stdout.decode()
    pointed = [line.strip() for line in text.splitlines() if "batch:" in line]
    unchecked = [line for line in pointed if "not checked" in line]
    assert unchecked == [
        f"batch: B{i} (jobd batch B{i}: not checked, its records name over 8 batches)"
        for i in (0, 0, 1, 1)
    ], pointed
    assert pointed[4:] == [
        f"batch: B{i} (its batch expired: no batch of this id now)"
        for i in range(2, 10) for _ in range(2)
    ], pointed  # fmt: skip
