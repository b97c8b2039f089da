"""Review 36o of issue 36: one producer's entry makes every later job of the queue look young for
good, so a stuck job is never shown as stuck: the oldest pending age (``status._with_group``,
the overview, a queue's page, ``jobd status``, ``jobd_queue_oldest_pending_age_seconds`` and the
docs' alert on it, observing.md's ``> 600``) is the Redis time less the oldest pending entry id's
milliseconds, and the id is the producer's to choose. ``XADD jobd:q <now + 10 years>-0 …`` (the
documented producer-only user may: ``+xadd``) moves the stream's last id ten years ahead, and
Redis gives every later entry (``jobd enqueue``'s ``XADD *``, a retry's) that same millisecond
(``max(now, last ms)``, the sequence counting up): their age is ``max(0, now - id)``, 0, whatever
how long they have waited or run. d53cf0b made this figure "always read" (its NaN alert gone),
and the docs say it is the age "since it was added".

Reproduced: a producer's entry with a future id, then a job enqueued the usual way; a daemon
reads both, the producer's is done, the job is stuck (its delivery 700 s ago: ``XCLAIM … IDLE``,
so no test sleeps). ``queue_status`` says its age is 0.0, where the alert wants > 600.

What should happen: a job pending 700 s shows at least 700 s, whatever ids a producer wrote
(the id's time is a producer's claim, not Redis's clock). Suggested fix: ``lib/group.lua``'s
``XPENDING … - + 1`` already answers the oldest entry's idle ms (time since its last delivery,
on Redis's clock): the age is at least that (``max(now - id ms, idle)``); or take the age from
Redis's clock at the first delivery where the id is ahead of Redis's time.

Fixed (review 36o, part A): ``lib/group.lua`` returns the oldest pending entry's idle ms from
its ``XPENDING … - + 1``, and ``status.pending_age`` takes the age as ``max(now - id ms, idle)``.
"""

from __future__ import annotations

from typing import Any

import redis
from support import queue_config

STUCK_FOR = 700  # seconds since the job's delivery: over the docs' alert (> 600)
YEARS = 10 * 365 * 86400 * 1000  # ms


def test_a_future_entry_id_hides_a_stuck_job(r: redis.Redis, write_config: Any) -> None:
    from jobd.config import load
    from jobd.store import status

    q = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    seconds, micros = r.time()
    ahead = f"{seconds * 1000 + micros // 1000 + YEARS}-0"
    r.xadd(q.stream, {"payload": "x", "job_id": "producers"}, id=ahead)  # a producer's XADD
    job = r.xadd(q.stream, {"payload": "p", "job_id": "stuck"})  # jobd enqueue's XADD *
    consumer = "host-1-abcdabcdabcdabcd"
    r.xreadgroup(q.group, consumer, {q.stream: ">"}, count=2)
    r.xack(q.stream, q.group, ahead)  # the producer's job is done
    r.xclaim(q.stream, q.group, consumer, 0, [job], idle=STUCK_FOR * 1000)  # read 700 s ago
    report = status.queue_status(r, q)
    assert report["pending"] == 1, report
    assert (report["oldest_pending_age"] or 0) >= STUCK_FOR - 1, (
        f"a job pending for {STUCK_FOR} s (entry {job.decode()}, after a producer's entry "
        f"{ahead}: Redis gave it that millisecond) shows as pending for "
        f"{report['oldest_pending_age']} s: the age is taken from the entry id alone"
    )
