"""Review of issue 36: the overview's "running / slots" of a queue with priority levels.

docs/operations/dashboard.md: the overview shows "jobs running and the slots of the live daemons
serving it". A daemon's registry record lists one entry per stream it serves (``presence.served``:
one per priority level, each with the queue's concurrency), and ``pages._row`` sums the
concurrency of every entry that matches any level: a queue of two levels and concurrency 2 shows
4 slots (three levels: 6), and a backlog beside "1 / 4" reads as free slots that do not exist.

One real daemon, one queue `q` with `priorities: [high, low]` and `concurrency: 2`, one job
enqueued at `--priority low` whose handler sleeps; the real `jobd dashboard`'s /api/summary.
"""

from __future__ import annotations

from typing import Any

import redis
from support import dashboard_server, get_json, jobd_cli, wait_until

from jobd.store import registry


def test_a_priority_queue_row_counts_its_slots_once_per_level(
    r: redis.Redis, daemon: Any, write_config: Any, script: Any
) -> None:
    script("slow.sh", "#!/bin/sh\nexec sleep 30\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  q: {command: [./slow.sh], concurrency: 2, priorities: [high, low]}\n"
    )
    d = daemon(config)
    name = d.consumer()
    wait_until(lambda: name in {x["name"] for x in registry.listing(r)["daemons"]},
               what="the daemon listed")  # fmt: skip
    done = jobd_cli("enqueue", "-c", str(config), "--priority", "low", "q", "x")
    assert done.returncode == 0, done.stderr
    with dashboard_server(config) as port:

        def running() -> bool:
            try:
                return get_json(port, "/api/queue?queue=q")["status"]["running_count"] == 1
            except OSError:
                return False

        wait_until(running, what="the low job running (the queue page's count)")
        row = get_json(port, "/api/summary")["queues"]["q"]
    # Expected: one job running of the daemon's 2 slots for q.
    assert (row["running"], row["concurrency"]) == (1, 2), row
