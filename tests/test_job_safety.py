"""Job safety under faults and hostile entries: each test rebuilds a defect a review confirmed
(issue 16) on a real Redis and real daemons, and checks that nothing is lost, wedged, or run
twice by accident."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, pending_count, wait_until

Daemon = Callable[..., DaemonProcess]


def outage(server, seconds: float) -> None:
    """Stop Redis (it writes its AOF) for ``seconds``, then start it again on the same port."""
    server.stop()
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, seconds + 5, f"{seconds}s of outage")
    server.start()


def lines(path: Path) -> Counter[str]:
    return Counter(path.read_text().split()) if path.exists() else Counter()


def test_a_limited_queue_reads_again_after_a_redis_blip(
    durable_redis, tmp_path: Path, script, daemon: Daemon
) -> None:
    """A connection error while taking the queue's cluster-wide slots used to leak the local
    slots taken before it: an idle daemon lost them all and never read the queue again."""
    script("job.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/done\n")
    config = tmp_path / "jobd.yaml"
    config.write_text(
        f"redis: {{url: '{durable_redis.url}'}}\n"
        "queues:\n  q: {command: [./job.sh], concurrency: 2, limits: {concurrency: 2}}\n"
    )
    d = daemon(config)
    r = redis.Redis(port=durable_redis.port)
    r.xadd("jobd:q", {"payload": "x", "job_id": "before"})
    wait_until(lambda: lines(tmp_path / "done") == Counter(["before"]), what="the first job")
    outage(durable_redis, 3)
    r = redis.Redis(port=durable_redis.port)
    for i in range(3):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"after-{i}"})
    wait_until(lambda: len(lines(tmp_path / "done")) == 4, 30, "the three jobs after the blip")
    wait_until(lambda: pending_count(r, "jobd:q") == 0, what="every entry acked")
    assert d.proc.poll() is None
