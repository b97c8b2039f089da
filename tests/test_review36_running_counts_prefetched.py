"""Review of issue 36: the overview's "running" counts entries read ahead (prefetch), not jobs
running: a queue of concurrency 1 shows "4 / 1" while its own page says 1 running.

``pages._row`` takes ``running`` as the sum of the consumers' pending entries (XINFO CONSUMERS),
which holds the entries a daemon read ahead of its free slots (``prefetch``) besides the jobs
running; the queue page counts the running records (``store.running``). docs/operations/
dashboard.md: the overview shows "jobs running and the slots of the live daemons serving it".
A real daemon, q with concurrency 1 and prefetch 3, a handler that sleeps, four jobs.
"""

from __future__ import annotations

from typing import Any

import redis
from support import dashboard_server, get_json, pending_count, wait_until


def test_the_overview_counts_prefetched_entries_as_running(
    r: redis.Redis, daemon: Any, write_config: Any, script: Any
) -> None:
    script("slow.sh", "#!/bin/sh\nexec sleep 30\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  q: {command: [./slow.sh], concurrency: 1, prefetch: 3}\n"
    )
    daemon(config)
    for _ in range(4):
        r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: pending_count(r, "jobd:q") == 4, what="one running, three read ahead")
    with dashboard_server(config) as port:
        wait_until(lambda: get_json(port, "/api/queue?queue=q")["status"]["running_count"] == 1,
                   what="the queue page: one running")  # fmt: skip
        row = get_json(port, "/api/summary")["queues"]["q"]
    # Expected: the overview's running is the queue page's: one job running of one slot.
    assert (row["running"], row["concurrency"]) == (1, 1), row
