"""Review 5 of issue 36: with 200 daemons serving 50 queues, live daemons lose their queues.

The listing reads LISTING_READ (768 KiB) of record fields in all, newest beats first
(``lua/daemons_listed.lua``, 1f0ae4a); a daemon serving 50 queues writes about 4-5 KiB of
``queues`` (the docs' own figure), so past about 160 such daemons, the daemons that beat
longest ago are listed with ``queues: []`` and a problem ("not read: the listing read its 768
KiB"). Their queues' pages then list fewer daemons serving them (``registry.serving``), and
which daemons are missing changes with every beat. This is what issue 36 asked to end ("a live
one was missing from queues"), at a size the listing claims to handle (LISTED: 1 000 daemons),
from daemons writing only what jobd writes.

200 records as ``RegistryOps.beat`` writes them (each serving the same 50 queues), one listing.
"""

from __future__ import annotations

import redis

from jobd.store import registry
from jobd.store.registry import Beat, Served
from jobd.store.store import Store

DAEMONS = 200
QUEUES = 50


def test_every_live_daemon_is_listed_with_its_queues(r: redis.Redis) -> None:
    store = Store(r)
    served = tuple(Served(f"orders-region-{i:02d}", f"jobd:orders-region-{i:02d}", "jobd", 8)
                   for i in range(QUEUES))  # fmt: skip
    for n in range(DAEMONS):
        beat = Beat(host=f"worker-{n:03d}.prod.example.com", pid=1000 + n, version="1.0.0",
                    process=None, queues=served, running=0, slots=8, beat_every_ms=5000,
                    lease_ms=60000, keep_ms=600000, state="running")  # fmt: skip
        store.beat(f"worker-{n:03d}.prod.example.com-{1000 + n}-0123abcd", beat)
    listed = registry.listing(r)["daemons"]
    assert len(listed) == DAEMONS
    without = [d["name"] for d in listed if len(d["queues"]) != QUEUES]
    serving = registry.serving(listed, "jobd:orders-region-00", "jobd")
    # Expected: every live daemon listed with the 50 queues it serves, and so serving each.
    assert not without, (
        f"{len(without)} of {DAEMONS} live daemons listed without their queues; "
        f"queue orders-region-00 served by {len(serving)}; a problem said: "
        f"{next(d['problems'] for d in listed if d['name'] == without[0])}"
    )


def test_a_record_whose_queues_were_not_read_says_so(r: redis.Redis) -> None:
    """Daemons serving queues no other serves (a digest each): past the listing's bytes the
    oldest beats' queues are not read, and each says so (``queues_read`` false, a problem)."""
    store = Store(r)
    for n in range(DAEMONS):
        served = tuple(Served(f"own-{n:03d}-{i:02d}", f"jobd:own-{n:03d}-{i:02d}", "jobd", 8)
                       for i in range(QUEUES))  # fmt: skip
        beat = Beat(host=f"w{n:03d}", pid=n + 1, version="1.0.0", process=None, queues=served,
                    running=0, slots=8, beat_every_ms=5000, lease_ms=60000, keep_ms=600000,
                    state="running")  # fmt: skip
        store.beat(f"w{n:03d}-{n + 1}-0123abcd", beat)
    listed = registry.listing(r)["daemons"]
    assert len(listed) == DAEMONS
    cut = [d for d in listed if not d["queues_read"]]
    assert cut, "200 records of 50 queues each, none alike, fit in the listing's bytes"
    assert all(len(d["queues"]) == QUEUES for d in listed if d["queues_read"])
    for d in cut:
        assert d["queues"] == [] and any("not read" in p for p in d["problems"]), d
