"""Review 36f: a daemons listing still reads a whole page of huge names into Redis's Lua heap.

``daemons_listed.lua`` (2600c0c) reads names in pages growing 1, 2, 4, … 128, each "never more
entries than the bytes left for names hold names as long as the longest read yet". The longest
read yet is the longest of the names *before* the page: after 63 ordinary names (a fleet of 63
daemons: 40-odd bytes each), the next page is 64 entries whatever their length. So 40 names of
1 MiB that beat a little earlier than the fleet (anyone can ZADD them) are read whole, in one
ZRANGE, at every listing (``/api/daemons``, each queue page, ``jobd status``): exactly the 36e
defect (``tests/test_review36e_daemons_listing_names.py``: 40 names of 1 MiB left 67 MiB in
Lua's heap), which the fix closes only when the huge names are the newest. The docs say names
are read "LISTED × NAME_READ (312 KiB) at most, one page more", "names of any length pass them
by one page at most": a page here is 64 names of any length.

Measured as the 36e test does: ``used_memory_lua`` right after a listing, in a fresh Lua VM.
"""

from __future__ import annotations

import redis

from jobd.store import registry
from jobd.store.keys import DAEMONS

FLEET = 63  # ordinary names, the newest: pages 1+2+4+8+16+32
HUGE = 40
NAME = 1 << 20


def test_huge_names_behind_a_fleet_are_read_whole(r: redis.Redis) -> None:
    seconds, _ = r.time()
    now_ms = int(seconds) * 1000
    for i in range(FLEET):
        r.zadd(DAEMONS, {f"worker-{i:03d}.prod.example.com-{1000 + i}-0123abcd-0": now_ms})
    for i in range(HUGE):
        r.zadd(DAEMONS, {f"{i:04d}".encode() + b"n" * NAME: now_ms - 1000})
    registry.listing(r)  # the script loaded
    r.script_flush()  # a fresh Lua VM: its heap is what the next call leaves
    before = int(r.info("memory")["used_memory_lua"])
    listed = registry.listing(r)
    after = int(r.info("memory")["used_memory_lua"])
    names_bound = registry.LISTED * registry.NAME_READ
    # Expected: a listing reads LISTED x NAME_READ bytes of names (plus its fields' 768 KiB).
    assert after - before <= 2 * (registry.LISTING_READ + names_bound), (
        f"one listing left {(after - before) / 2**20:.0f} MiB in Redis's Lua heap: "
        f"{HUGE} names of {NAME >> 20} MiB behind {FLEET} ordinary ones read whole in one page "
        f"(the names' bound is {names_bound >> 10} KiB); listed {len(listed['daemons'])}, "
        f"error {listed['error']!r}"
    )
    # And it says so: the bytes for names spent before every entry was listed.
    assert listed["error"] and "names spent" in listed["error"], listed["error"]
