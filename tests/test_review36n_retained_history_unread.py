"""Review 36n of issue 36: a healthy queue that has simply run its jobs has its group "not
read" for good once its stream keeps enough finished entries: lag, pending and consumers null,
the overview ``unknown`` (with nothing waiting), ``jobd status`` "group not read", the metrics'
jobd_queue_lag and jobd_queue_pending NaN, the consumers not listed.

``lib/group.lua group_read`` reads the group only when the stream's MEMORY USAGE (SAMPLES 1: an
estimate of every node: the first node's size times the nodes, plus the last) is within the
summary's 16 MiB. That bounds the whole stream, where XINFO STREAM copies only its first and
last entries and XPENDING one name. A stream keeps finished (acknowledged) entries until
retention trims them to ``retention.maxlen``; docs/reference/configuration.md's example sets
``retention: {maxlen: 100000}``, and the docs measure 100 000 entries of 300 bytes at 32 MiB.
Here 20 000 jobs of 1 KiB, every one delivered and acknowledged (nothing waits, nothing
pending): the stream weighs about 25 MiB and the queue's lag, pending and consumers are not
read at each summary. The CHANGELOG and the Lua header speak of "a backlog of about 13 000
jobs of 1 KiB"; this is no backlog.

What should happen: a queue whose jobs are all done shows lag 0, pending 0 and its consumers
whatever its retention keeps (weigh what the replies copy: the first and last entries, e.g.
each read by XRANGE - + COUNT 1 / XREVRANGE after weighing that node alone, or count the
groups another way).

Fixed (lib/group.lua, issue 36's threat model): no group read weighs the stream any more (no
MEMORY USAGE gate, no XINFO STREAM): XINFO GROUPS gives the group's figures and the groups'
count, XPENDING … - + 1 the oldest pending id, XINFO CONSUMERS the consumers (256 at most),
none of which copies an entry, whatever retention keeps.
"""

from __future__ import annotations

from typing import Any

import redis

JOBS = 20_000


def test_a_queue_with_its_jobs_done_and_kept_has_its_group_read(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.config import load
    from jobd.store import status

    config = load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  q: {command: [/bin/true], retention: {maxlen: 100000}}\n")))  # fmt: skip
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    payload = b"p" * 1024
    for start in range(0, JOBS, 2000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, start + 2000):
            pipe.xadd("jobd:q", {"payload": payload, "job_id": f"j{i}"})
        pipe.execute()
    while True:  # a daemon ran every job: delivered, then acknowledged
        got = r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"}, count=5000)
        if not got:
            break
        r.xack("jobd:q", "jobd", *[mid for mid, _ in got[0][1]])
    assert r.xpending("jobd:q", "jobd")["pending"] == 0
    weight = r.memory_usage("jobd:q", samples=1)
    report = status.gather(r, config)["queues"]["q"]
    shown = {k: report.get(k) for k in ("lag", "pending", "consumers_count")}
    assert shown == {"lag": 0, "pending": 0, "consumers_count": 1}, (
        f"{JOBS} jobs of 1 KiB all done (none waiting, none pending), kept by retention "
        f"(maxlen 100000, the docs' example): the stream weighs {weight / 2**20:.1f} MiB and "
        f"the queue's group is not read: {shown}"
    )


def test_default_retention_leaves_the_consumers_unlisted(r: redis.Redis, write_config: Any) -> None:
    """The same weight decides whether the group's consumers are listed (1 MiB: NAMES_READ):
    with the default retention (maxlen 1000) and jobs of 1 KiB, a queue whose jobs are all done
    keeps a stream of about 1.2 MiB, and its consumers are "not listed" for good (the queue
    page's consumers, `jobd status`), though it has one consumer of a 12-byte name."""
    from jobd.config import load
    from jobd.store import status

    config = load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")))  # fmt: skip
    assert config.queues["q"].retention_maxlen == 1000  # the default
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(1000):
        pipe.xadd("jobd:q", {"payload": b"p" * 1024, "job_id": f"j{i}"})
    pipe.execute()
    got = r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"})
    r.xack("jobd:q", "jobd", *[mid for mid, _ in got[0][1]])
    weight = r.memory_usage("jobd:q", samples=1)
    report = status.gather(r, config)["queues"]["q"]
    assert (report["lag"], report["pending"]) == (0, 0), report  # the group read
    assert report.get("consumers_listed") and len(report.get("consumers") or []) == 1, (
        f"1000 jobs of 1 KiB done, kept by the default retention: the stream weighs "
        f"{weight / 2**20:.2f} MiB and its one consumer is not listed: "
        f"consumers_count {report.get('consumers_count')}, listed "
        f"{report.get('consumers_listed')}, consumers {report.get('consumers')}"
    )
