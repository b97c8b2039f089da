"""Review 36n of issue 36: a job stuck for 15 minutes, and the daemon's gauge
``jobd_queue_oldest_pending_age_seconds`` says 0: the stuck-job alert that
docs/operations/observing.md gives (``max by (queue) (jobd_queue_oldest_pending_age_seconds) >
600``) never fires.

Since review 36l a queue's group is not read when its stream weighs more than the summary's
16 MiB (``lib/group.lua``: MEMORY USAGE of the whole stream, finished entries kept by
retention included: 20 000 jobs of 1 KiB done, under the docs' example ``retention: {maxlen:
100000}``). Then the oldest pending entry is not read either, ``oldest_pending_age`` is None,
and ``metrics._queue_state`` sets ``report["oldest_pending_age"] or 0``
(jobd/web/metrics.py) where lag and pending get NaN: "no pending entry" (docs/operations/
monitoring.md: "0 when none"), not "not known".

What should happen: an oldest pending age not known is NaN (absent), as the lag and pending
are, and the docs' alert says how to catch it (or the group is read: the 36n retained-history
reproduction); never 0 while a job is stuck.

Fixed (jobd/web/metrics.py): the age not read was NaN (0 only when nothing is pending), and
docs/operations/observing.md gave an alert for it. Since issue 36's group read (lib/group.lua:
no weighing of the stream) the group is read whatever retention keeps: the age is the stuck
job's (900 s), and an age is never "not read" (the NaN and its alert are gone).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from jobd.config import load
from jobd.daemon.notify import Notifier
from jobd.daemon.report import LoopView, StatusReport
from jobd.web.metrics import Metrics

DONE = 20_000


def test_a_stuck_job_reads_as_oldest_pending_age_0(r: redis.Redis, write_config: Any) -> None:
    config = load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  q: {command: [/bin/true], retention: {maxlen: 100000}}\n")))  # fmt: skip
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    now_ms = int(r.time()[0]) * 1000
    stuck = r.xadd("jobd:q", {"payload": "stuck", "job_id": "stuck"}, id=f"{now_ms - 900_000}-0")
    payload = b"p" * 1024
    for start in range(0, DONE, 2000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, start + 2000):
            pipe.xadd("jobd:q", {"payload": payload, "job_id": f"j{i}"})
        pipe.execute()
    while True:  # a daemon ran every job, and one has been running for 15 minutes
        got = r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"}, count=5000)
        if not got:
            break
        r.xack("jobd:q", "jobd", *[mid for mid, _ in got[0][1] if mid != stuck])
    assert r.xpending("jobd:q", "jobd")["min"] == stuck
    metrics = Metrics()
    metrics.watch("q", lambda: 1.0, lambda: 0.0)
    view = LoopView(queues=tuple(config.queues.values()), running=1, slots=1, live=True)
    StatusReport(r, metrics, Notifier(None), lambda: view, served=True).tick()
    get = metrics.registry.get_sample_value
    age = get("jobd_queue_oldest_pending_age_seconds", {"queue": "q"})
    lag = get("jobd_queue_lag", {"queue": "q"})
    assert age is not None and age >= 900, (
        f"a job pending for {(time.time() * 1000 - now_ms + 900_000) / 1000:.0f} s, behind "
        f"{DONE} jobs done kept by retention: jobd_queue_oldest_pending_age_seconds {age} "
        f"(jobd_queue_lag {lag}): the docs' stuck-job alert (> 600) never fires"
    )
