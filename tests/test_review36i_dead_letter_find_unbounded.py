"""Review 36i of issue 36: looking for a job id's dead letter holds Redis for as long as it
takes to copy 500 whole records, whatever their size.

Review 36h moved the search of ``jobd dlq show JOB_ID`` and ``jobd dlq requeue JOB_ID`` into
Redis (``lua/dead_letter_find.lua``): each call walks ``FIND_CHUNK`` (500) records newest first,
reading each whole (``XREVRANGE … COUNT 1``: payload and all) to compare its ``jobd_job_id``. A
requeue, changed in the same review, stops a call once its records hold ``REQUEUE_BYTES`` (64
MiB) "each call holds Redis while it copies them, whatever their size"; the search has no such
bound. With the defaults (``max_payload`` 16 MiB, ``dead_letter.maxlen`` 10 000) one call may copy
8 GiB; here 48 records of 8 MiB (384 MiB) held Redis for about 1.1 s in one script, and 500
records of 4 MiB would pass Redis's 5 s script limit: meanwhile every daemon's lease renewal,
read and ack waits (or gets BUSY), and a call past the clients' 10 s socket timeout has every
daemon take Redis for away. An operator looking up one failed job during an incident makes it.

What should happen: one call of the search copies a bounded number of bytes (the requeue's 64
MiB, say), going on in further calls as the requeue does; so no call holds Redis much longer
than a requeue's. Measured with Redis's own SLOWLOG (time inside the command, not the network).
"""

from __future__ import annotations

from typing import Any

import redis
from support import counted_scripts, jobd_cli, queue_config

from jobd import config as jobd_config
from jobd.store.admin import FIND_BYTES

RECORDS = 48
SIZE = 8 << 20  # bytes of each record's payload


def test_looking_for_a_job_ids_dead_letter_holds_redis_a_bounded_time(
    r: redis.Redis, write_config: Any
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    q = jobd_config.load(str(config)).queues["q"]
    payload = b"x" * SIZE
    for i in range(RECORDS):
        r.xadd(q.dead_letter.stream, {"jobd_job_id": f"job-{i}", "jobd_error": "exit",
                                      "payload": payload})  # fmt: skip
    # job-0, the oldest: all walked (the slow log keeps calls of 100 ms and more)
    calls, shown = counted_scripts(
        r, lambda: jobd_cli("dlq", "-c", str(config), "q", "show", "job-0"), 100_000
    )
    assert shown.returncode == 0, shown.stderr
    # What bounds a call is the bytes it reads (FIND_BYTES): as many calls as that takes, each
    # holding Redis for what reading FIND_BYTES costs. Counted, not timed: a loaded machine
    # slows every call alike (the slow log's longest is printed for the record).
    assert calls >= RECORDS * SIZE // FIND_BYTES, (
        f"{calls} dead_letter_find.lua call(s) read {RECORDS} dead letters of {SIZE >> 20} MiB: "
        f"more than {FIND_BYTES >> 20} MiB a call (no byte bound: 500 records a call)"
    )
