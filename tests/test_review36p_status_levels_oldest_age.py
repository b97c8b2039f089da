"""Review 36p of issue 36: `jobd status` (its text, ``cli.status.render``) never shows the age of
a job stuck on a priority level other than the queue's default. The queue's line prints the
default level's ``oldest_pending_age`` alone, and each level's line prints its length, lag,
pending and delayed but not its ``oldest_pending_age``, which ``status.with_levels`` keeps since
review 36o (433a168). So where the dashboard's overview (the oldest of every level's, 433a168),
a daemon's STATUS= and ``jobd_queue_oldest_pending_age`` (``report.queue_report``: the oldest of
any level, a9258e1) say 700 s, `jobd status` says "pending 0 (oldest -)" for the queue and no
age anywhere: the one place an operator at a terminal looks for a stuck job.

Reproduced: ``priorities: [high, low]`` (``low`` the default), a job on ``high`` delivered and
pending since 700 s (its entry id 700 s back on Redis's clock, so no test sleeps), nothing on
``low``: ``render(gather(...))`` holds no age of 11 minutes or more.

What should happen: `jobd status` shows the stuck job's age, as the overview and the metrics
do: the queue's line the oldest of every level's (as the overview's row), or each level's line
its own oldest pending age. Suggested fix: ``cli.status.render`` prints ``_age(b
['oldest_pending_age'])`` on each level's line (and/or the max over levels on the queue's).

Fixed (review 36p): the queue's line says its pending entries and the oldest one's age over all
its levels (``status.over_levels``, as the overview's row), each level's line its own age.
"""

from __future__ import annotations

import re
from typing import Any

import redis
from test_review36o_overview_levels_oldest_age import STUCK_FOR, stuck_on_high


def test_jobd_status_shows_the_age_of_a_job_stuck_on_another_level(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.cli.status import render
    from jobd.store.status import gather

    config = stuck_on_high(r, write_config)
    report = gather(r, config)
    assert report["queues"]["q"]["levels"]["high"]["oldest_pending_age"] >= STUCK_FOR - 5
    text = render(report)
    ages = [float(m) for m in re.findall(r"(\d+\.\d)m\b", text)]
    assert any(age >= (STUCK_FOR - 5) / 60 for age in ages), (
        f"a job pending for {STUCK_FOR} s on the queue's 'high' level (the overview and the "
        f"metrics say so): `jobd status` shows no such age:\n{text}"
    )
