"""Review 36n of issue 36 (found while checking trim.lua's group reads): behind one
long-running job, retention's every trim call copies the whole retained tail of the stream
into the script, entries whole: with the default ``retention.maxlen`` (1000) and jobs of 64 KiB
(``max_payload`` is 16 MiB), one finished job a second, each call held Redis 360 to 640 ms
(7 ticks in 2 runs) to delete one entry: Redis busy half of every second, for as long as the job
runs. No one hostile: jobd's own jobs and its default config.

``lua/trim.lua`` step 2 (``scan_from(delivered, budget)``) asks ``XRANGE (cursor delivered
COUNT budget`` with the whole budget (``retention.BATCH``: 1 000 entries) whatever ``excess``
is (here 1), reading every entry whole (payloads and all), then deletes ``excess`` of them and
sets the cursor just past them: the next tick reads the same 1 000 entries again. Step 1 is
bounded ("never a burst of large entries": whole nodes dropped unread, READ_STEP entries at
most); step 2 is not, in entries' bytes. With 1 MiB jobs, one call after 200 finished behind
a running one held Redis 2.0 s (Redis's memory peak doubling with the copy).

What should happen: a trim call holds Redis a bounded time whatever the entries hold (100 ms
here), e.g. step 2 reading at most ``excess`` (plus the pending ones) entries, or only their
ids (XRANGE cannot: XPENDING on the range gives the pending ids, and XDEL needs no read).

Fixed (lua/trim.lua): step 2 takes the pending ids from XPENDING on the range and reads only the
acknowledged entries it deletes, one at a time, 4 MiB a call at most (one entry at least).
"""

from __future__ import annotations

from typing import Any

import redis
from support import queue_config

from jobd.config import load
from jobd.daemon.retention import BATCH, READ_BYTES
from jobd.store.store import Store

WITHIN_USEC = 100_000
PAYLOAD = 64 << 10


def _script_usec(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return int(sum(v.get("usec", 0) for k, v in stats.items() if k.startswith("cmdstat_eval")))


def _done(r: redis.Redis, n: int, keep_first: bool = False) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd("jobd:q", {"payload": b"p" * PAYLOAD, "job_id": f"j{i}"})
    pipe.execute()
    got = r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"})[0][1]
    r.xack("jobd:q", "jobd", *[mid for mid, _ in got[1 if keep_first else 0 :]])


def test_each_trim_call_behind_a_running_job_reads_the_whole_tail(
    r: redis.Redis, write_config: Any
) -> None:
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    maxlen = queue.retention_maxlen
    assert maxlen == 1000  # the default
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    _done(r, maxlen + 1, keep_first=True)  # the first job still runs
    store = Store(r)
    store.trim(queue, 10**9, BATCH)  # the script loaded
    held = []
    for _ in range(3):  # three ticks: one more job done each
        before = _script_usec(r)
        removed, _more = store.trim(queue, maxlen, BATCH)
        held.append((_script_usec(r) - before) // 1000)
        assert removed == 1
        _done(r, 1)
    assert max(held) * 1000 < WITHIN_USEC, (
        f"retention at its default maxlen {maxlen}, jobs of {PAYLOAD >> 10} KiB, one running: "
        f"each trim call removed 1 entry and held Redis {held} ms (calls every "
        f"second): step 2 reads {BATCH} entries whole at each call"
    )


def test_a_burst_of_large_entries_behind_a_running_job_is_read_within_the_byte_bound(
    r: redis.Redis, write_config: Any
) -> None:
    """200 jobs of 1 MiB done behind a running one, maxlen 1: each call reads READ_BYTES (one
    entry more at most), deletes what it read and says more; calls in turn delete every one of
    them but the last (the group's last delivered: review 36o), never the running job's entry."""
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(201):
        pipe.xadd("jobd:q", {"payload": b"p" * (1 << 20), "job_id": f"j{i}"})
    ids = pipe.execute()
    got = r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"})[0][1]
    r.xack("jobd:q", "jobd", *[mid for mid, _ in got[1:]])
    store = Store(r)
    calls = 0
    while r.xlen("jobd:q") > 2:  # the group's last delivered entry is kept (review 36o)
        removed, more = store.trim(queue, 1, BATCH)
        assert 1 <= removed <= (READ_BYTES >> 20) + 1 and (more or r.xlen("jobd:q") == 2)
        calls += 1
        assert calls <= 200
    assert [mid for mid, _ in r.xrange("jobd:q")] == [ids[0], ids[-1]]
