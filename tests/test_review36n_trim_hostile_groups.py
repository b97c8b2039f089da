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

What should happen: one trim call holds Redis a bounded time whatever groups others add to the
stream (the group reads' bound: 100 ms), e.g. trimming nothing (as with no own group) when the
stream has more groups, or heavier names, than a bound, said in the docs and logged.

Fixed (lua/trim.lua): only the config's groups are read, by name (XPENDING … - + 0 finds them);
XINFO GROUPS is asked only when XINFO STREAM's count equals them: a stream with a group the
config does not name is not trimmed by the script alone. The daemon's trimmer then reads those
groups itself (XINFO GROUPS from its client) and passes them on, unless one's name is longer
than 256 bytes or they are more than 16 (then not trimmed, and logged): review 36n follow-up
(fixer f36e), tests/test_periodic_retention_safety.py; docs/concepts/failures.md, Retention.
"""

from __future__ import annotations

from typing import Any

import redis
from support import queue_config

from jobd.config import load
from jobd.daemon.retention import BATCH, MAX_GUESTS, Trimmer
from jobd.store.store import Store

WITHIN_USEC = 100_000  # the group reads' bound (review 36k/36l), Redis's time a call


def _script_usec(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return int(sum(v.get("usec", 0) for k, v in stats.items() if k.startswith("cmdstat_eval")))


def _queue(r: redis.Redis, write_config: Any) -> Any:
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    return queue


def _one_trim_usec(r: redis.Redis, queue: Any) -> tuple[int, tuple[int, bool]]:
    store = Store(r)
    store.trim(queue, 10**9, BATCH)  # the script loaded; nothing to trim (XLEN below)
    before = _script_usec(r)
    result = store.trim(queue, 1, BATCH)
    return _script_usec(r) - before, result


def test_large_group_names_hold_redis_at_each_trim(r: redis.Redis, write_config: Any) -> None:
    queue = _queue(r, write_config)
    pipe = r.pipeline()
    for i in range(10):
        pipe.xadd("jobd:q", {"payload": f"p{i}"})
    pipe.execute()
    r.xreadgroup("jobd", "d1", {"jobd:q": ">"})  # every job delivered, all pending
    for i in range(4):  # another client's groups, at the stream's end: nothing of theirs pending
        r.xgroup_create("jobd:q", f"{i}".encode() + b"g" * (4 << 20), id="$")
    used, result = _one_trim_usec(r, queue)
    assert used < WITHIN_USEC, (
        f"one trim call of a stream with 4 foreign groups of 4 MiB names, 10 jobs running held Redis "
        f"{used / 1000:.0f} ms in scripts (result {result}): trim.lua copies every group's name "
        f"(XINFO GROUPS), weighed by nothing, at every call of every tick"
    )


def test_many_groups_hold_redis_at_each_trim(r: redis.Redis, write_config: Any) -> None:
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
    used, result = _one_trim_usec(r, queue)
    assert r.xpending("jobd:q", "jobd")["min"] == long_running
    assert used < WITHIN_USEC, (
        f"one trim call (BATCH {BATCH}) of a stream with 2 000 foreign groups, behind one "
        f"running job, held Redis {used / 1000:.0f} ms in scripts (result {result}): step 2's "
        f"pending_anywhere asks XPENDING on every group for every entry it walks"
    )


def test_the_trimmer_reading_foreign_groups_holds_redis_within_the_bound(
    r: redis.Redis, write_config: Any
) -> None:
    """Follow-up (fixer f36e): the trimmer passes up to MAX_GUESTS foreign groups of small
    names to the script, which asks XPENDING on each group per pending entry step 2 passes:
    behind every other entry pending (a walk over BATCH entries), one call stays in the
    bound; and with the hostile sets above, a tick calls no script that reads them."""
    queue = _queue(r, write_config)
    pipe = r.pipeline()
    for i in range(3 * BATCH):
        pipe.xadd("jobd:q", {"payload": f"p{i}"})
    pipe.execute()
    delivered = r.xreadgroup("jobd", "d1", {"jobd:q": ">"})[0][1]
    r.xack("jobd:q", "jobd", *[mid for mid, _ in delivered[1::2]])  # every other one running
    guests = [f"guest-{i}".encode() for i in range(MAX_GUESTS)]
    for name in guests:
        r.xgroup_create("jobd:q", name, id="$")
    store = Store(r)
    assert sorted(store.guest_groups(queue) or []) == sorted(guests)
    store.trim_call(queue, 10**9, BATCH, guests)  # the script loaded; nothing to trim
    before = _script_usec(r)
    removed, _more, foreign = store.trim_call(queue, 1, BATCH, guests)
    used = _script_usec(r) - before
    assert foreign == 0 and removed > 0
    assert used < WITHIN_USEC, f"one trim call with {MAX_GUESTS} guests held Redis {used} us"
    for i in range(4):  # and a group of a 4 MiB name: not passed, nothing trimmed
        r.xgroup_create("jobd:q", f"{i}".encode() + b"g" * (4 << 20), id="$")
    length, before = r.xlen("jobd:q"), _script_usec(r)
    Trimmer(store, queue, 1).tick()
    assert r.xlen("jobd:q") == length
    assert _script_usec(r) - before < WITHIN_USEC
