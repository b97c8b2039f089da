"""Review 36o of issue 36: the overview's row of a queue with ``priorities`` sums its pending
entries over every level (``web.pages._row``: "a priority queue's figures summed over its
levels") but takes the oldest pending age of the default level alone (``q["oldest_pending_age"]``:
``status.with_levels`` keeps no age per level). A job stuck on another level is counted pending
and shown with no age: the overview's "oldest pending" says "–", the column it sorts a stuck
queue by.

Reproduced: ``priorities: [high, low]`` (``low`` the default), a job on ``high`` delivered and
pending since 700 s (its entry id 700 s back on Redis's clock, so no test sleeps), nothing on
``low``: the row says pending 1, oldest pending age None.

What should happen: the row's age is the oldest of every level's (700 s here), as its pending
count is every level's. Suggested fix: ``with_levels`` keeps each level's
``oldest_pending_age`` and ``_row`` takes their max.

Fixed (review 36o, part A): ``status.with_levels`` keeps each level's ``oldest_pending_age``,
and ``web.pages._row`` shows the oldest of them.
"""

from __future__ import annotations

from typing import Any

import redis
from support import queue_config

STUCK_FOR = 700  # seconds


def stuck_on_high(r: redis.Redis, write_config: Any) -> Any:
    """A config of queue q with levels high and low, each level's group made, and one job on
    'high' pending for STUCK_FOR seconds (its id that old, delivered to a consumer)."""
    from jobd.config import load

    config = load(str(write_config(queue_config("[/bin/true]", priorities="[high, low]"))))
    q = config.queues["q"]
    levels = {level.priority: level for level in q.all_levels()}
    for level in levels.values():  # as a daemon's reader makes them (ensure_group)
        r.xgroup_create(level.stream, level.group, id="0", mkstream=True)
    seconds, _ = r.time()
    entry = f"{(seconds - STUCK_FOR) * 1000}-0"  # enqueued 700 s ago
    r.xadd(levels["high"].stream, {"payload": "p", "job_id": "stuck"}, id=entry)
    r.xreadgroup(levels["high"].group, "host-1-abcdabcdabcdabcd", {levels["high"].stream: ">"})
    return config


def test_the_overview_shows_no_age_for_a_job_stuck_on_another_level(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.store.store import Store
    from jobd.web import pages

    config = stuck_on_high(r, write_config)
    row = pages.summary(Store(r), config, {})["queues"]["q"]
    assert row["pending"] == 1, row
    assert (row["oldest_pending_age"] or 0) >= STUCK_FOR - 5, (
        f"a job pending for {STUCK_FOR} s on the queue's 'high' level: the overview's row says "
        f"pending {row['pending']}, oldest pending age {row['oldest_pending_age']}"
    )
