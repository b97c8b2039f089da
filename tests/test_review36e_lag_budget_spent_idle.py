"""Review 5 of issue 36: once the request's LagBudget is spent, a queue with jobs waiting and no
daemon is shown "idle", backlog 0.

Since fe7fa64 one 16 MiB ``LagBudget`` is shared by a summary's queues, taken in turn: a queue
counted after it is spent gets ``count_after`` → (0, not exact) without a read, so its lag is
``0`` "at least". ``pages._row`` then sums ``lag or 0`` into ``backlog`` (0) and derives the
state from it: not "stalled" (jobs wait and no live daemon serves it) nor "busy", but "idle".
A null lag is common: ``jobd cancel`` of a waiting job XDELs it (Redis says null until the
group reads past it). One queue with 20 MiB waiting (legitimate jobs of 10 KiB), and one with
4 jobs waiting (one cancelled: null lag), no daemon: the second row says idle and backlog 0,
the overview's sort by state hides the very queue an incident is about.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_json


def test_a_stalled_queue_past_the_lag_budget_shows_idle(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  big: {command: [/bin/true]}\n"
        "  small: {command: [/bin/true]}\n"
    )
    for name, count, size in (("big", 2000, 10 * 1024), ("small", 5, 100)):
        stream = f"jobd:{name}"
        r.xgroup_create(stream, "jobd", id="0", mkstream=True)
        pipe = r.pipeline(transaction=False)
        for n in range(count):
            pipe.xadd(stream, {"job_id": f"{name}-{n}", "payload": "x" * size})
        ids = pipe.execute()
        r.xdel(stream, ids[1])  # a waiting job cancelled (`jobd cancel`): Redis's lag is null
        assert r.xinfo_groups(stream)[0]["lag"] is None
    with dashboard_server(config) as port:
        rows = get_json(port, "/api/summary")["queues"]
    small = (
        rows["small"] if isinstance(rows, dict) else next(q for q in rows if q["name"] == "small")
    )
    # Expected: 4 jobs wait and no daemon serves the queue: never "idle". (Since review 36o a
    # null lag is not counted, that read entries: "unknown", its lag not known; and jobd cancel
    # does not XDEL: an operator's XDEL or another application's makes such a null.)
    assert (small["state"], small["lag_known"]) == ("unknown", False), small
