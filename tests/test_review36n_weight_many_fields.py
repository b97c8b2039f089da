"""Review 36n of issue 36: ``lib/group.lua group_read`` weighs the stream by ``MEMORY USAGE …
SAMPLES 1`` (bytes Redis allocates) and then asks ``XINFO STREAM``, which converts the first and
last entries into Lua strings: one per field name and value. An entry of many small fields
weighs 2 bytes a name or value in a listpack (an integer value, a repeated name) but costs a
Lua string each (``lib/shown.lua FIELD_COST``: 64 bytes a field, the fixer's own measure). So an
entry of 1 000 000 fields ``a=1`` weighs 5 MiB (under the summary's 16 MiB ``LagBudget``) and
its XINFO STREAM held Redis 0.9 s in a script here (0.8 s sent alone); a stream of one entry
has it as first and last: copied twice, weighed once. Every summary (each 5 s of an open
overview), each daemon's status report and ``jobd status`` read the group the same way.

The weight bounds bytes, not what a reply costs: ``copied`` (entry_cost, with FIELD_COST)
is counted only after the copy. Anyone who can XADD to a queue's stream writes such an entry
(it is the stream's last entry until a daemon reads past it, and a queue with no daemon
running, or paused, keeps it; this one summary measured 620 ms in scripts here).

What should happen: one summary holds Redis a bounded time whatever an entry holds (the
group reads' bound: 100 ms), e.g. a weight that counts a field as FIELD_COST (an entry's
field count is in its node's header: not known without a walk, so a bound on the weight
per entry of ``stream-node-max-bytes``, or no XINFO STREAM at all).

Fixed (lib/group.lua, issue 36's threat model): a group read asks no XINFO STREAM (nor MEMORY
USAGE): the group's figures come from XINFO GROUPS and XPENDING, which copy no entry. Redis's
time is measured over every command a group read may use (scripts, XINFO, XPENDING, MEMORY,
``support.group_read_usec``), and the lag is read (2).
"""

from __future__ import annotations

from typing import Any

import redis
from support import group_read_usec

WITHIN_USEC = 100_000  # the group reads' bound (review 36k/36l), Redis's time a summary
FIELDS = 1_000_000


def test_an_entry_of_many_small_fields_holds_a_summary(r: redis.Redis, write_config: Any) -> None:
    from jobd.config import load
    from jobd.store import status

    config = load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")))  # fmt: skip
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "p", "job_id": "a"})
    status.gather(r, config)  # scripts loaded
    small = group_read_usec(r)
    status.gather(r, config)
    small = group_read_usec(r) - small
    r.execute_command("XADD", "jobd:q", "*", *(["a", "1"] * FIELDS))  # the last entry
    weight = r.memory_usage("jobd:q", samples=1)
    before = group_read_usec(r)
    queue = status.gather(r, config)["queues"]["q"]
    used = group_read_usec(r) - before
    assert used < WITHIN_USEC, (
        f"one summary of one queue whose last entry holds {FIELDS} fields a=1 (the stream "
        f"weighs {weight / 2**20:.1f} MiB, under the 16 MiB budget) held Redis "
        f"{used / 1000:.0f} ms in scripts, XINFO and XPENDING ({small / 1000:.1f} ms before "
        f"that entry; lag read: {queue.get('lag')}): XINFO STREAM makes a Lua string of each "
        f"field"
    )
    assert (queue["lag"], queue["pending"], queue["consumers_count"]) == (2, 0, 0), queue
