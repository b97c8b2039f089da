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

import json
import urllib.parse
from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_json

QUEUES = 50


def _event(r: redis.Redis, queue: str, n: int) -> str:
    # The fields jobd's settling script writes for a done job (lib/jobs.lua emit), typical sizes.
    fields = {"event": "done", "queue": queue, "job": f"order-{n:08d}", "attempt": "1",
              "consumer": "worker-3-12345-9f8e7d6c", "host": "worker-3", "exit_code": "0",
              "duration_ms": "15", "origin": "enqueue-0123456789abcdef"}  # fmt: skip
    return r.xadd(f"{{jobd:{queue}}}:events", fields).decode()


def test_a_busy_queue_holds_back_every_other_queues_events_without_skipped(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    queues = "".join(f"  q{i}: {{command: [/bin/true]}}\n" for i in range(QUEUES))
    config = write_config("redis: {url: '{redis}'}\nqueues:\n" + queues)
    with dashboard_server(config) as port:
        after = get_json(port, "/api/events")["after"]
        rounds = []
        for round_ in range(6):
            for n in range(60):  # more than count (50) since the last poll
                _event(r, "q0", round_ * 100 + n)
            other = _event(r, "q1", round_)
            cursor = urllib.parse.quote(json.dumps(after))
            reply = get_json(port, f"/api/events?after={cursor}")
            after = reply["after"]
            shown = {(e["queue"], e["id"]) for e in reply["events"]}
            rounds.append((len(reply["events"]), reply["skipped"], ("q1", other) in shown))
    # Expected, as documented: each poll after more than 50 new events says skipped and gives
    # the newest, q1's among them.
    assert all(skipped and q1_shown for _, skipped, q1_shown in rounds), (
        "(events given, skipped, q1's newest event shown) per poll: " + repr(rounds)
    )
