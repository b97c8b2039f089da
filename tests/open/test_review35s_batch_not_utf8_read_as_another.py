"""Review 35s: `jobd job` reads, and reports on, a batch its record does not name.

A member's step records name its batch (lib/jobs.lua ``linked``, review 35q: reclaimed, lease
lost, requeue, promoted). ``linked`` keeps any jobd_batch of 1 to 800 bytes, UTF-8 or not
(someone's XADD: jobd never writes a batch id that is not UTF-8, workflow_input.check_batch_id
refuses one). The record's reader (store/records.py json_object) shows the byte 0xff as the
four characters ``\\xff``: then cli/workflow.py batch_now checks that text as a batch id and
reads the batch literally named ``\\xff`` (a legal id, someone else's), and batch_where tells
the user the record was a member of "an earlier batch of this id" (or points them at
`jobd batch \\xff`): a batch the job never was a member of.
"""

from __future__ import annotations

import redis
from support import jobd_cli

from jobd.config import load
from jobd.store.store import Store

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_a_record_naming_a_batch_not_utf8_is_not_related_to_another(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    # someone else's batch, legally named with the four characters \xff
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "theirs",
                   "--batch", "\\xff", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    q = load(c).queues["a"]
    dead = r.xadd(q.dead_letter.stream, {"payload": "x", "jobd_job_id": "rq",
                                         "jobd_error": "exit", "jobd_batch": b"\xff",
                                         "jobd_batch_incarnation": "5"})  # fmt: skip
    assert Store(r).requeue(q, [dead.decode()], "me@here").moved == [dead.decode()]
    shown = jobd_cli("job", "-c", c, "a", "rq")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode("utf-8", "replace")
    batch_line = [line for line in text.splitlines() if "batch:" in line]
    assert batch_line, text
    # the batch `\xff` (4 characters) is not the one its record names (the byte 0xff)
    assert "earlier batch of this id" not in text, text
    assert "(jobd batch \\xff)" not in text, text
