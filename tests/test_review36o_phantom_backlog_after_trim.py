"""Review 36o of issue 36: one producer's ``XADD … MAXLEN`` leaves a queue with a backlog that
is not there, for good. d53cf0b takes the lag from ``XINFO GROUPS`` as Redis says it
(``lib/group.lua``: ``f['lag']``), and Redis 7.0 computes it as the stream's entries-added less
the group's entries-read: entries trimmed before the group read them (``XADD`` with ``MAXLEN``
or ``MINID``, which the documented producer-only user may send; an operator's ``XTRIM``) are
never read, so they stay in the lag for as long as the group lives (each later read adds one to
entries-read, each later entry one to entries-added: the difference stays).

Reproduced: a queue whose group has read (two jobs run and done), three more jobs enqueued;
a producer adds one entry with ``MAXLEN = 1`` (the three are gone); the daemon reads that one
and acknowledges it: nothing waits, nothing is pending. Redis says lag 3: ``jobd status``'s lag,
the overview's backlog (its state ``stalled`` with no daemon up, else ``busy``, for ever), the
daemons' ``STATUS=`` backlog and ``jobd_queue_lag`` all say 3 jobs wait.

What should happen: with nothing after the group's last delivered id, the lag is 0 (or, where
it cannot be told, not known: never a count of jobs that do not exist). Redis's figure is wrong
here while it is not null, so no reading of it alone can tell; suggested fix: when it is
positive, check that an entry follows the last delivered id (bounded as a null lag's count
must be: test_review36o_null_lag_count_copies_entry.py) and count as for a null lag when the
two disagree; or document Redis's lag as an upper bound after a trim of undelivered entries,
and have the overview not call such a queue ``stalled`` on it alone.

Fixed (review 36o, part A): ``lib/group.lua`` reads the stream's XLEN with the group, and a lag
past it (no group can have more entries waiting than the stream holds) is taken as not known,
as a null one; a lag wrong by less than the stream's length is still Redis's upper bound
(docs/operations/redis.md).
"""

from __future__ import annotations

from typing import Any

import redis
from support import queue_config


def test_a_producers_maxlen_leaves_a_phantom_backlog(r: redis.Redis, write_config: Any) -> None:
    from jobd.config import load
    from jobd.store import status
    from jobd.store.store import Store
    from jobd.web import pages

    config = load(str(write_config(queue_config("[/bin/true]"))))
    q = config.queues["q"]
    consumer = "host-1-abcdabcdabcdabcd"
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    for i in range(2):
        r.xadd(q.stream, {"payload": "p", "job_id": f"ran-{i}"})
    for _, entries in r.xreadgroup(q.group, consumer, {q.stream: ">"}):
        r.xack(q.stream, q.group, *(e for e, _ in entries))  # done
    for i in range(3):
        r.xadd(q.stream, {"payload": "p", "job_id": f"gone-{i}"})
    r.xadd(q.stream, {"payload": "p", "job_id": "mine"}, maxlen=1, approximate=False)
    for _, entries in r.xreadgroup(q.group, consumer, {q.stream: ">"}):
        r.xack(q.stream, q.group, *(e for e, _ in entries))  # read and done: nothing waits
    r.xadd(q.stream, {"payload": "p", "job_id": "later"})  # later jobs: the gap stays
    for _, entries in r.xreadgroup(q.group, consumer, {q.stream: ">"}):
        r.xack(q.stream, q.group, *(e for e, _ in entries))
    queue = status.gather(r, config)["queues"]["q"]
    assert r.xpending(q.stream, q.group)["pending"] == 0
    assert not r.xreadgroup(q.group, consumer, {q.stream: ">"})  # nothing waits
    row = pages.summary(Store(r), config, {})["queues"]["q"]
    assert queue["lag"] in (0, None), (
        f"nothing waits and nothing is pending; the queue's lag is {queue['lag']} (Redis's "
        f"{r.xinfo_groups(q.stream)[0]['lag']}: the 3 entries a producer's XADD … MAXLEN "
        f"trimmed before the group read them), the overview's row: backlog {row['backlog']}, "
        f"state {row['state']}"
    )
