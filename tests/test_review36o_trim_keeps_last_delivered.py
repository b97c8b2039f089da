"""Review 36o of issue 36: jobd's own retention made Redis answer a queue's lag as null.
``trim.lua``'s step 2 (acknowledged entries behind a long-pending one) XDELed entries up to the
group's last-delivered id, that one included. Redis 7.0 keeps the largest id XDEL removed
(``max-deleted-entry-id``) and, while it is at or after a group's last-delivered id
(``streamRangeHasTombstones``), answers that group's lag as null (XINFO GROUPS) until the group
reads past it: every summary then had to count the lag by reading the entries a producer wrote
(``count_after.lua``: test_review36o_null_lag_count_copies_entry.py).

Reproduced: a long job holds the stream's first entry, two later ones are done (the last of
them the group's last delivered entry); retention (maxlen 1) runs, then a job is enqueued.

Fixed (review 36o, part A): step 2 deletes only entries below every group's last-delivered id,
never the entry at it: Redis's lag stays a count (1 here); the entry goes once the group has
read past it.
"""

from __future__ import annotations

from typing import Any

import redis
from support import queue_config


def test_retention_never_deletes_the_groups_last_delivered_entry(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.config import load
    from jobd.store.store import Store

    q = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    consumer = "host-1-abcdabcdabcdabcd"
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    r.xadd(q.stream, {"payload": "p", "job_id": "long"})  # runs for hours
    quick = r.xadd(q.stream, {"payload": "p", "job_id": "quick"})
    last = r.xadd(q.stream, {"payload": "p", "job_id": "last"})
    r.xreadgroup(q.group, consumer, {q.stream: ">"}, count=3)
    r.xack(q.stream, q.group, quick, last)
    removed, _ = Store(r).trim(q, 1, 100)  # retention: maxlen 1
    assert removed == 1, "the done entry below the last delivered one goes"
    assert not r.xrange(q.stream, quick, quick)
    assert r.xrange(q.stream, last, last), "the group's last delivered entry is kept"
    r.xadd(q.stream, {"payload": "p", "job_id": "waiting"})
    assert r.xinfo_groups(q.stream)[0]["lag"] == 1, (
        f"retention XDELed the group's last delivered entry: Redis's lag is "
        f"{r.xinfo_groups(q.stream)[0]['lag']} with one job waiting"
    )
    r.xreadgroup(q.group, consumer, {q.stream: ">"})  # read past it: it may go now
    removed, _ = Store(r).trim(q, 1, 100)
    assert removed == 1 and not r.xrange(q.stream, last, last)
    assert r.xinfo_groups(q.stream)[0]["lag"] == 0
