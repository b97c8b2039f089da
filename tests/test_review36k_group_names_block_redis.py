"""Review 36k of issue 36: a stream's other consumer groups, their names long, block Redis for
about a second at every read of the queue's group (each summary, queue page, status report).

``lib/group.lua group_read`` (hashes_shown.lua's '=GROUP' and '>GROUP', ``status.group_args``:
``jobd status``, ``/api/summary`` for every queue every 5 s of an open overview, ``/api/queue``,
and every daemon's status report each tick) sends ``XINFO GROUPS stream`` and looks for the
queue's group in what it answers. Its header says the group is "read in Redis to a bound
whatever the stream holds: anyone who can write to Redis can add groups and consumers ...,
their names of any length"; but the bound is on what leaves Redis only. XINFO GROUPS answers
every group of the stream, each name whole, into the script: 16 groups of 4 MiB names
(``XGROUP CREATE`` by anyone who can write: 64 MiB) made each call take 1.1 s here, 24 of
them ~1.1 s, and 100 000 groups of short names ~0.33 s; one summary of a page of queues holds
Redis that long per queue so defaced (the same holds for XINFO CONSUMERS when the group has
CONSUMERS_LISTED or fewer consumers: their names are copied whole before being cut).

What should happen: one read of a queue's group holds Redis a bounded time whatever other
groups the stream has (e.g. look at how many groups the stream has first and read XINFO GROUPS
only when few, saying otherwise that the group is not read, as ``listed`` 0 does for
consumers; or keep the group's last delivered id and lag from what XREADGROUP/XPENDING tell
for the group itself). Bound here: 100 ms for one call (the summary's whole budget of Redis
time is of that order).

Contract changed (issue 36, lib/group.lua): group and consumer names, and how many there are,
can only be made by a client with consumer rights on the stream (XGROUP CREATE, XREADGROUP,
XCLAIM), who can already acknowledge, delete or destroy the queue's jobs (docs/security.md).
jobd bounds what producers can make it read, not the names such a client made: the group read
asks XINFO GROUPS (every group's name copied into the script) and XINFO CONSUMERS (256 consumers
at most, each name cut to HASH_VALUE bytes in the reply). So these tests assert the figures are
read and the names cut, not a time; the old bound read nothing of a queue whose stream held
its finished jobs (test_review36n_retained_history_unread.py).
"""

from __future__ import annotations

import redis

from jobd.store import status

GROUPS = 16
NAME = 4 << 20  # bytes of each other group's name


def test_other_groups_of_long_names_leave_the_queues_group_read(r: redis.Redis) -> None:
    r.xadd("q", {"payload": "x"})
    r.xgroup_create("q", "jobd", "0")
    for i in range(GROUPS):
        r.xgroup_create("q", b"g" * NAME + str(i).encode(), "0")
    group = status.hashes_shown(r, ["q"], [status.group_spec("=", "jobd")])[0]
    assert group is not None and group.groups == GROUPS + 1
    assert (group.last_delivered, group.lag, group.pending, group.count) == (b"0-0", 1, 0, 0)


def test_the_queues_group_alone_is_read_whole(r: redis.Redis) -> None:
    """The stream's only group is the queue's: its last delivered id, lag, pending count and
    consumers are read."""
    first = r.xadd("q", {"payload": "x"})
    r.xadd("q", {"payload": "y"})
    r.xgroup_create("q", "jobd", "0")
    r.xreadgroup("jobd", "c1", {"q": ">"}, count=1)
    group = status.hashes_shown(r, ["q"], [status.group_spec(">", "jobd")])[0]
    assert group is not None and group.last_delivered == first and group.groups == 1
    assert (group.lag, group.pending, group.oldest, group.count) == (1, 1, first, 1)
    assert group.listed and [c[:3] for c in group.consumers] == [(b"c1", 2, 1)]


def test_100_000_short_groups_leave_the_queues_group_read(r: redis.Redis) -> None:
    r.xadd("q", {"payload": "x"})
    pipe = r.pipeline(transaction=False)
    for i in range(100_000):
        pipe.xgroup_create("q", f"g{i}", "0")
    pipe.execute()
    r.xgroup_create("q", "jobd", "0")
    group = status.hashes_shown(r, ["q"], [status.group_spec(">", "jobd")])[0]
    assert group is not None and group.groups == 100_001
    assert (group.lag, group.pending, group.count, group.listed) == (1, 0, 0, True)


def test_long_consumer_names_are_listed_cut(r: redis.Redis) -> None:
    """16 consumers of 1 MiB names: listed (256 or fewer), each name cut to HASH_VALUE bytes
    with its length."""
    r.xadd("q", {"payload": "x"})
    r.xgroup_create("q", "jobd", "0")
    names = [f"{n:02d}".encode() + b"c" * (1 << 20) for n in range(16)]
    for name in names:
        r.xgroup_createconsumer("q", "jobd", name)
    group = status.hashes_shown(r, ["q"], [status.group_spec(">", "jobd")])[0]
    assert group is not None and (group.count, group.listed, group.lag) == (16, True, 1)
    listed = sorted((c[0], c[1]) for c in group.consumers)
    assert listed == [(n[: status.HASH_VALUE], len(n)) for n in names]
