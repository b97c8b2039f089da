"""Review 5 of issue 36: a daemons listing loads every listed entry's whole name into Redis's Lua.

``lua/daemons_listed.lua`` says "Whatever someone else wrote in the registry (… a name of any
length, thousands of entries …), a listing moves a bounded number of bytes": of a record's
fields it reads LISTING_READ (768 KiB) in all, and each name is returned cut to TEXT_SHOWN.
But the names themselves are read whole, and counted against nothing: ``ZRANGE … LIMIT 0
LISTED WITHSCORES`` builds a Lua table of the 1 000 newest members, whatever their length (a
sorted set's member may be 512 MB), then cuts each. Every listing (``/api/daemons``, each
queue page, ``jobd status``, the overview every 5 s) makes Redis copy them all, in its script
(the server blocked meanwhile) and in the Lua heap.

40 entries beating now with names of 1 MiB (anyone who can write to Redis can ZADD them); one
listing. Measured: the Lua heap Redis reports (``used_memory_lua``) right after the call.
"""

from __future__ import annotations

import redis

from jobd.store import registry
from jobd.store.keys import DAEMONS

ENTRIES = 40
NAME = 1 << 20


def test_a_listing_reads_every_listed_name_whole(r: redis.Redis) -> None:
    seconds, _ = r.time()
    now_ms = int(seconds) * 1000
    for i in range(ENTRIES):
        r.zadd(DAEMONS, {f"{i:04d}".encode() + b"n" * NAME: now_ms})
    registry.listing(r)  # the script loaded, the heap settled
    r.script_flush()  # a fresh Lua VM: its heap is what the next call leaves
    before = int(r.info("memory")["used_memory_lua"])
    listed = registry.listing(r)
    after = int(r.info("memory")["used_memory_lua"])
    assert len(listed["daemons"]) <= ENTRIES
    # Expected: a listing moves about LISTING_READ bytes of the registry (plus cut names).
    assert after - before <= 2 * registry.LISTING_READ, (
        f"one listing left {(after - before) / 2**20:.0f} MiB in Redis's Lua heap "
        f"({ENTRIES} names of {NAME >> 20} MiB read whole; the bound is "
        f"{registry.LISTING_READ >> 10} KiB)"
    )
