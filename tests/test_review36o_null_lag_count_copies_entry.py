"""Review 36o of issue 36: a summary still copies a producer's entry whole, whenever Redis
says the queue's lag is null: ``status._with_group`` then counts it with ``count_after.lua``,
whose ``XRANGE … COUNT 1`` makes a Lua string of each field of the first waiting entry (its
``LagBudget`` is spent only after the copy, and "one entry is still read" once it is spent).
d53cf0b says "no status read copies an entry" (docs/security.md, docs/operations/dashboard.md,
docs/operations/redis.md, CHANGELOG "no entry is ever copied") and removed XINFO STREAM for
exactly this cost: an entry of 1 000 000 fields ``a=1`` held Redis 0.9 s.

Redis says null without anyone's ``XDEL`` by hand: jobd's own retention does it. A long job
holds the stream's first entry (pending), a later one is done; ``trim.lua``'s step 2 XDELs the
done one, the group's last delivered entry. From then on, as soon as any entry is added after
it, Redis's lag is null (a tombstone at the last delivered id, past the stream's first
entry: no counter, no estimate) until the group reads past it. A producer (``XADD`` only, the
documented producer-only user) then adds one entry of 1 000 000 small fields; a queue whose
slot is busy with the long job (or paused) keeps it waiting, and every summary (each 5 s of an
open overview, /metrics, each daemon's status report, ``jobd status``) copies it: measured
here 330 ms of Redis a summary (scripts, XINFO, XPENDING: ``support.group_read_usec``), against
0.1 ms before that entry. The shared ``LagBudget`` does not help: it is spent after the copy,
and once spent each further queue still reads one entry (50 queues, 50 such entries). The
count also ends "at least 1" where exactly 1 waits (the budget overrun by that one entry).

What should happen: one summary holds Redis a bounded time whatever an entry holds (the group
reads' bound: 100 ms), as the docs now promise ("no status read copies an entry"). Suggested
fix: never copy an entry to count a null lag: with no bounded count (nothing weighs an entry's
fields without copying them), leave such a lag not counted (null: "backlog unknown", the
overview's ``unknown``) rather than read the entry; or, if the cost is accepted, say so in
docs/security.md and dashboard.md instead of "no entry copied".

Fixed (review 36o, part A): retention no longer XDELs a group's last delivered entry
(test_review36o_trim_keeps_last_delivered.py), so here an operator's ``XDEL`` of it makes the
null; and a null lag is never counted (``count_after.lua`` is gone): the lag is not known
(None: "backlog unknown", the overview's ``unknown``), with an upper bound read without any
entry (``lag_at_most``: the stream's length, or entries-added less the group's entries-read).
"""

from __future__ import annotations

from typing import Any

import redis
from support import group_read_usec, queue_config

WITHIN_USEC = 100_000  # the group reads' bound (review 36k/36l/36n), Redis's time a summary
FIELDS = 1_000_000


def test_a_null_lag_count_copies_a_producers_entry(r: redis.Redis, write_config: Any) -> None:
    from jobd.config import load
    from jobd.store import status

    config = load(str(write_config(queue_config("[/bin/true]"))))
    q = config.queues["q"]
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    r.xadd(q.stream, {"payload": "p", "job_id": "long"})  # runs for hours
    done = r.xadd(q.stream, {"payload": "p", "job_id": "quick"})
    r.xreadgroup(q.group, "host-1-abcdabcdabcdabcd", {q.stream: ">"}, count=2)
    r.xack(q.stream, q.group, done)
    r.xdel(q.stream, done)  # an operator's (retention keeps the group's last delivered entry)
    status.gather(r, config)  # scripts loaded
    small = group_read_usec(r)
    status.gather(r, config)
    small = group_read_usec(r) - small
    r.execute_command("XADD", q.stream, "*", *(["a", "1"] * FIELDS))  # a producer's
    assert r.xinfo_groups(q.stream)[0]["lag"] is None, "Redis says null: counted"
    before = group_read_usec(r)
    queue = status.gather(r, config)["queues"]["q"]
    used = group_read_usec(r) - before
    assert used < WITHIN_USEC, (
        f"one summary of one queue whose lag Redis says null (an operator XDELed a done entry "
        f"behind a long job) and whose first waiting entry holds {FIELDS} fields a=1 held "
        f"Redis {used / 1000:.0f} ms in scripts, XINFO and XPENDING ({small / 1000:.1f} ms "
        f"before that entry; lag {queue['lag']}, at most: {queue['lag_at_most']}): "
        f"count_after.lua's XRANGE copies the entry whole"
    )
    assert queue["lag"] is None and queue["lag_at_most"] == 2, queue  # not counted: at most XLEN
