"""Issue 36 follow-up (the group read's threat model, applied to retention): ``lua/trim.lua``
counted the stream's groups with ``XINFO STREAM``, which makes a Lua string of each field of
the stream's first and last entries. Anyone who can XADD writes an entry of 1 000 000 fields
``a=1`` (the stream's last until a daemon reads past it; its first while it runs, pending), and
every trim call of that queue (once a second, up to ``MAX_CALLS_PER_TICK`` a tick) held Redis
0.22 s in XINFO STREAM alone (twice that for an entry both first and last; 0.33 to 1.08 s
measured over scripts and XINFO here, an upper bound), for as long as the entry stayed there.

What should happen: one trim call holds Redis a bounded time whatever an entry holds (the group
reads' bound: 100 ms, measured over scripts, XINFO and XPENDING: ``support.group_read_usec``),
and still trims what it should: never the pending or undelivered entry, the acknowledged ones
around it down to ``maxlen``.

Fixed (lua/trim.lua): the groups are read with XINFO GROUPS (their count is its length), no
XINFO STREAM: no entry is copied to count them (a call: 40 to 90 µs).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from support import group_read_usec, queue_config

from jobd.config import load
from jobd.daemon.retention import BATCH
from jobd.store.store import Store

WITHIN_USEC = 100_000  # the group reads' bound (review 36k/36l), Redis's time a call
FIELDS = 1_000_000
MAXLEN = 5
SMALL = 20

# In scripts, so that the test's client never parses the hostile entry: deliver one entry; the
# stream's ids.
DELIVER = "redis.call('XREADGROUP', 'GROUP', 'jobd', 'c', 'COUNT', 1, 'STREAMS', KEYS[1], '>')"
IDS = """local ids = {}
for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do ids[#ids + 1] = e[1] end
return ids"""


def _hostile(r: redis.Redis) -> bytes:
    return r.execute_command("XADD", "jobd:q", "*", *(["a", "1"] * FIELDS))


def _small(r: redis.Redis) -> list[bytes]:
    pipe = r.pipeline()
    for i in range(SMALL):
        pipe.xadd("jobd:q", {"payload": f"p{i}"})
    return pipe.execute()


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_trim_call_copies_no_entry_of_many_fields(
    r: redis.Redis, write_config: Any, where: str
) -> None:
    """first: the hostile entry delivered and still pending (its job running), 20 finished
    jobs after it; last: 20 finished jobs, then the hostile entry not delivered yet."""
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    if where == "first":
        hostile = _hostile(r)
        r.eval(DELIVER, 1, "jobd:q")
        small = _small(r)
    else:
        small = _small(r)
    r.xreadgroup("jobd", "c", {"jobd:q": ">"}, count=SMALL)
    r.xack("jobd:q", "jobd", *small)
    if where == "last":
        hostile = _hostile(r)
    store = Store(r)
    store.trim(queue, 10**9, BATCH)  # the script loaded; nothing to trim (XLEN below)
    before = group_read_usec(r)
    removed, more = store.trim(queue, MAXLEN, BATCH)
    used = group_read_usec(r) - before
    assert used < WITHIN_USEC, (
        f"one trim call of a stream whose {where} entry holds {FIELDS} fields a=1 held Redis "
        f"{used / 1000:.0f} ms in scripts, XINFO and XPENDING (removed {removed}): XINFO "
        f"STREAM makes a Lua string of each field of the first and last entries"
    )
    assert (removed, more) == (SMALL + 1 - MAXLEN, False)
    kept = small[-(MAXLEN - 1) :]
    expected = [hostile, *kept] if where == "first" else [*kept, hostile]
    assert r.eval(IDS, 1, "jobd:q") == expected
