"""Review 4 of issue 36: the events feed falls behind a busy queue for good, never skipping.

``/api/events?after=…`` is documented to give, "when more than ``count`` came since, the newest
… instead with ``skipped: true``" (the feed stays current). But with the 1 MiB budget shared
among the queues (``BrowseOps.events_shown``: 1 MiB ÷ 50 queues ≈ 20 KiB each), a queue with
more than its share of new events stops at its share, and every other queue's events past that
one are held back; the reply holds fewer than ``count`` events, so ``skipped`` stays false.
A queue settling more jobs between two polls than its share holds (about 30 events of jobd's
own size: a queue doing 10 jobs/s against a poll every few seconds) makes the feed fall
further behind at each poll: the other queues' events never show, and nothing says so.

50 queues (no daemon needed: the dashboard reads Redis); each round, 60 events of jobd's
shape in q0 then one in q1, then the page's poll with the cursor the last reply gave.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, feed_polls, queues_config, settled_event

QUEUES = 50


def _event(r: redis.Redis, queue: str, n: int) -> str:
    return settled_event(r, queue, f"order-{n:08d}", origin="enqueue-0123456789abcdef")


def test_a_busy_queue_holds_back_every_other_queues_events_without_skipped(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(queues_config(QUEUES))
    with dashboard_server(config) as port:
        # 60 events a round: more than count (50) since the last poll
        rounds = [
            (len(reply["events"]), reply["skipped"], q1_shown)
            for reply, q1_shown in feed_polls(r, port, rounds=6, busy=60, event=_event)
        ]
    # Expected, as documented: each poll after more than 50 new events says skipped and gives
    # the newest, q1's among them.
    assert all(skipped and q1_shown for _, skipped, q1_shown in rounds), (
        "(events given, skipped, q1's newest event shown) per poll: " + repr(rounds)
    )
