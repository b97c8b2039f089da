"""Review 36n of issue 36: retention's ``lua/trim.lua`` still reads every group of the stream
unbounded (``XINFO GROUPS``, then per group ``XPENDING`` summary, and per entry of step 2's walk
``XPENDING`` on every group): anyone who can write to Redis adds groups to a queue's stream
(``XGROUP CREATE jobd:q name $``: no entry, no pending), and every trim call of that queue,
once a second (``retention.TRIM_EVERY``, up to ``MAX_CALLS_PER_TICK`` calls a tick), holds
Redis for as long as those groups make it. The fixer of 36l noted it and left it
(docs/design: "trim.lua still asks XINFO GROUPS unbounded"); the dashboard's group reads were
bounded for the same hostile set in rounds 36k/36l (``tests/test_review36k_group_names_block_
redis.py``), retention not.

Two ways, each measured as Redis's own time in scripts (INFO commandstats), one
``Store.trim(queue, maxlen, retention.BATCH)`` call as the daemon's Trimmer makes it:
- groups of large names: XINFO GROUPS copies every name into the script, and every XPENDING
  on a group passes its name back into Redis (step 1's summary per group, step 2's per entry
  walked and group, the foreign groups first in byte order): 8 groups of 8 MiB names and 100
  jobs running held Redis 15.8 s in one call here (a client with socket_timeout 120); the test
  uses 4 of 4 MiB and 10 jobs;
- many groups of small names, behind one long-running job (a pending entry first, so step 2
  walks ``BATCH`` acknowledged entries): ``pending_anywhere`` asks XPENDING on every group for
  every entry walked (1 000 entries x 2 000 groups: 2 million XPENDING calls).

What should happen (then): one trim call holds Redis a bounded time whatever groups others add
to the stream (the group reads' bound: 100 ms), e.g. trimming nothing (as with no own group) when
the stream has more groups, or heavier names, than a bound, said in the docs and logged.

Fixed (lua/trim.lua), first: only the config's groups were read, by name, and a stream with
others was not trimmed unless the daemon read them itself (names of 256 bytes at most, 16 groups
at most). That needed XINFO STREAM for the groups' count, which copies the first and last
entries whole (anyone's: 1 000 000 fields, 0.22 s a call, tests/test_trim_many_fields.py).

Contract changed (issue 36's threat model, docs/security.md): groups and their names can only be
made by a client with consumer rights on the stream (XGROUP CREATE), who can already acknowledge,
delete or destroy the queue's jobs; jobd does not bound the cost of reading what such a client
made. So trim.lua reads every group with XINFO GROUPS, whatever its name's length (no time is
asserted for those names), and trims as far as every group has read: a foreign group's pending
entries and last delivered id bound the trim, nothing it still needs is removed. Step 2 asks
XPENDING only of the groups holding entries, so groups holding none (the 2 000 below) cost it
nothing per entry passed: that stays within the bound, measured.
"""

from __future__ import annotations

from typing import Any

import redis
from support import group_read_usec, queue_config

from jobd.config import load
from jobd.daemon.retention import BATCH, Trimmer
from jobd.store.store import Store

WITHIN_USEC = 100_000  # the group reads' bound (review 36k/36l), Redis's time a call
LONG = 4 << 20  # bytes of a long group name


def _queue(r: redis.Redis, write_config: Any) -> Any:
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    return queue


def _ids(r: redis.Redis) -> list[bytes]:
    return [mid for mid, _ in r.xrange("jobd:q")]


def test_groups_of_large_names_are_read_and_bound_the_trim(
    r: redis.Redis, write_config: Any
) -> None:
    """4 groups of 4 MiB names, one of them holding entries: read, and the trim goes as far as
    that one has read, never past what it has pending or not yet been delivered."""
    queue = _queue(r, write_config)
    pipe = r.pipeline()
    for i in range(10):
        pipe.xadd("jobd:q", {"payload": f"p{i}"})
    ids = pipe.execute()
    r.xreadgroup("jobd", "d1", {"jobd:q": ">"})
    r.xack("jobd:q", "jobd", *ids)  # jobd's jobs all done
    names = [f"{i}".encode() + b"g" * LONG for i in range(4)]
    r.xgroup_create("jobd:q", names[0], id="0")  # another client's, from the start
    for name in names[1:]:  # and at the stream's end: nothing of theirs pending
        r.xgroup_create("jobd:q", name, id="$")
    r.xreadgroup(names[0], "a", {"jobd:q": ">"}, count=4)  # entries 0-3 pending there
    store = Store(r)
    assert store.trim(queue, 1, BATCH) == (0, False)
    assert _ids(r) == ids
    r.xack("jobd:q", names[0], ids[0], ids[2])
    assert store.trim(queue, 1, BATCH) == (2, False)  # 0 by step 1, 2 by step 2
    assert _ids(r) == [ids[1], *ids[3:]]
    r.xreadgroup(names[0], "a", {"jobd:q": ">"})
    r.xack("jobd:q", names[0], *ids)
    assert store.trim(queue, 1, BATCH) == (len(ids) - 3, False)
    assert _ids(r) == ids[-1:]


def test_many_groups_holding_nothing_cost_the_walk_nothing(
    r: redis.Redis, write_config: Any
) -> None:
    queue = _queue(r, write_config)
    pipe = r.pipeline()
    for i in range(3 * BATCH):
        pipe.xadd("jobd:q", {"payload": f"p{i}"})
    pipe.execute()
    delivered = r.xreadgroup("jobd", "d1", {"jobd:q": ">"})[0][1]
    long_running = delivered[0][0]  # one job still running: step 1 stops before it
    r.xack("jobd:q", "jobd", *[mid for mid, _ in delivered[1:]])
    pipe = r.pipeline()
    for i in range(2000):  # another client's groups at the end: none pending
        pipe.xgroup_create("jobd:q", f"foreign-{i}", id="$")
    pipe.execute()
    store = Store(r)
    store.trim(queue, 10**9, BATCH)  # the script loaded; nothing to trim (XLEN below)
    before = group_read_usec(r)
    result = store.trim(queue, 1, BATCH)
    used = group_read_usec(r) - before
    assert result == (BATCH - 1, True)  # step 2: BATCH looked at, the running one not removed
    assert r.xpending("jobd:q", "jobd")["min"] == long_running
    assert _ids(r)[0] == long_running
    assert used < WITHIN_USEC, (
        f"one trim call (BATCH {BATCH}) of a stream with 2 000 groups holding nothing, behind "
        f"one running job, held Redis {used / 1000:.0f} ms (result {result}): step 2 asks "
        f"XPENDING of groups that hold nothing, for every pending entry it passes"
    )


def test_the_trimmer_trims_as_far_as_every_group_has_read(
    r: redis.Redis, write_config: Any
) -> None:
    """16 foreign groups of small names and 4 of 4 MiB names, at the stream's end, every other
    job of jobd's still running: a tick removes the finished jobs, never a running one."""
    queue = _queue(r, write_config)
    pipe = r.pipeline()
    for i in range(3 * BATCH):
        pipe.xadd("jobd:q", {"payload": f"p{i}"})
    pipe.execute()
    delivered = r.xreadgroup("jobd", "d1", {"jobd:q": ">"})[0][1]
    r.xack("jobd:q", "jobd", *[mid for mid, _ in delivered[1::2]])  # every other one running
    running = [mid for mid, _ in delivered[::2]]
    for i in range(16):
        r.xgroup_create("jobd:q", f"guest-{i}", id="$")
    store = Store(r)
    removed, more = store.trim(queue, 1, BATCH)
    assert removed > 0 and more
    for i in range(4):
        r.xgroup_create("jobd:q", f"{i}".encode() + b"g" * LONG, id="$")
    for _ in range(3):
        Trimmer(store, queue, 1).tick()
    last = delivered[-1][0]  # jobd's last delivered entry: kept while it is (review 36o)
    assert _ids(r) == running + ([] if last in running else [last])
