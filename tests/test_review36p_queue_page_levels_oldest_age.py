"""Review 36p of issue 36: the dashboard's queue page never shows the age of a job stuck on a
priority level other than the queue's default. Its "oldest pending" figure (dashboard.js
``figure(age(q.oldest_pending_age), "oldest pending")``) is the default level's alone
(``pages.queue_page``: ``status.with_levels``, whose top-level figures are the default stream's),
and its "Priority levels" table shows each level's backlog, pending and delayed, not the
``oldest_pending_age`` each level carries since review 36o (433a168). The overview's row of the
same queue (the oldest of every level's, 433a168), STATUS= and ``jobd_queue_oldest_pending_age``
(``report.queue_report``, a9258e1) say 700 s; the page an operator opens from that row says
"oldest pending –" (and "pending 0", "backlog (lag) 0" in its figures, while the overview row
sums every level's).

Reproduced: ``priorities: [high, low]`` (``low`` the default), a job on ``high`` delivered and
pending since 700 s (its entry id 700 s back on Redis's clock, so no test sleeps), nothing on
``low``: ``queue_page``'s ``oldest_pending_age`` is None and dashboard.js shows no level's age.

What should happen: the queue page shows the stuck job's age: its "oldest pending" figure the
oldest of every level's (as the overview's row), or its levels table each level's. Suggested
fix: ``pages.queue_page`` sets the figure to the max over ``levels`` (and sums pending and lag
as ``_row`` does), or dashboard.js adds an "oldest pending" column from ``b.oldest_pending_age``.

Fixed (review 36p): ``pages.queue_page`` gives a priority queue's figures over all its levels
(``status.over_levels``: entries, backlog, pending, delayed summed, the oldest pending age the
oldest), as the overview's row, and dashboard.js's levels table shows each level's oldest pending.
"""

from __future__ import annotations

import pathlib
from typing import Any

import redis
from test_review36o_overview_levels_oldest_age import STUCK_FOR, stuck_on_high

SCRIPT = pathlib.Path(__file__).parents[1] / "jobd" / "web" / "static" / "dashboard.js"


def test_the_queue_page_shows_the_age_of_a_job_stuck_on_another_level(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.store.store import Store
    from jobd.web import pages

    config = stuck_on_high(r, write_config)
    row = pages.summary(Store(r), config, {})["queues"]["q"]
    assert row["oldest_pending_age"] >= STUCK_FOR - 5, row  # the overview says it
    page = pages.queue_page(Store(r), config, {"queue": ["q"]})["status"]
    headline = page["oldest_pending_age"] or 0
    per_level = "b.oldest_pending_age" in SCRIPT.read_text()  # the levels table shows it
    assert headline >= STUCK_FOR - 5 or per_level, (
        f"a job pending for {STUCK_FOR} s on the queue's 'high' level (the overview says "
        f"{row['oldest_pending_age']:.0f} s): the queue page's oldest pending is "
        f"{page['oldest_pending_age']}, and its levels table shows no age"
    )
