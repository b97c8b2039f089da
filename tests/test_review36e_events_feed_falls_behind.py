"""Review 5 of issue 36: the events feed still falls behind a busy queue for good, never skipping.

The fix of review 36d (``BrowseOps._events_since``) probes a queue that stopped at its share of
the 1 MiB from its newest down to where it stopped, to its share too; when that probe stops at
its share as well (a gap not read), the reply holds the events up to where the first read
stopped, and is skipped only when ``len(events) + unread > count``, where ``unread`` is the
probe's events: at most one share. So whenever two shares hold fewer than ``count`` (50, the
page's poll) events, a gap is never skipped, however large it grows: each poll moves the
cursor by one share, a queue settling more than that between two polls puts the feed further
behind at each poll, the other queues' events never show and ``skipped`` stays false.

50 queues (as in 36d) with job ids of 1000 bytes (jobd takes 1024: ``job.MAX_JOB_ID``): a share
(about 20 KiB) holds about 12 of jobd's events; each round 30 events in q0 (fewer than count:
no skip is due by count alone), then one in q1, then the page's poll with the last cursor.
(With jobd's own short ids the same happens from about 100 queues.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, feed_polls, queues_config, settled_event

QUEUES = 50


def _event(r: redis.Redis, queue: str, n: int) -> str:
    return settled_event(r, queue, f"order-{n:08d}-" + "x" * 985)  # a long job id


def test_a_busy_queue_with_long_ids_puts_the_feed_behind_for_good(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(queues_config(QUEUES))
    with dashboard_server(config) as port:
        rounds = []
        # 30 events a round: fewer than count (50) since the last poll
        for reply, q1_shown in feed_polls(r, port, rounds=8, busy=30, event=_event):
            behind = len(r.xrange("{jobd:q0}:events", "(" + reply["after"]["q0"], "+"))
            rounds.append((len(reply["events"]), reply["skipped"], q1_shown, behind))
    # Expected: the feed keeps up (every event since, or the newest with skipped): q1's newest
    # event is shown at each poll, and q0's events not yet given never pile up past count.
    assert all((skipped or q1) and behind <= 50 for _, skipped, q1, behind in rounds), (
        "(events given, skipped, q1's newest shown, q0's events behind the cursor) per poll: "
        + repr(rounds)
    )
