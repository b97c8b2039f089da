"""Review 5 of issue 36: a member at +inf in a delayed set or the history fails the page (500).

The delayed set's and the history's scores are read as Redis writes them and parsed with
``int(float(score))`` (``BrowseOps.delayed_shown``, ``BrowseOps.recent``). A sorted set takes
``+inf`` and ``-inf`` as scores (ZADD … +inf, from anyone who can write to Redis, or a client
computing a due time from a bad number): ``int(float("inf"))`` raises OverflowError, and the
reply is a 500 "the dashboard failed": the overview's next delayed jobs (``/api/overview``),
the queue's delayed page and its recently-done page (``/api/jobs``) are gone, for as long as the
member stays (promote.lua never moves a job due at +inf; the history's is trimmed by age).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_status

from jobd import config as jobd_config


def test_an_infinite_score_fails_the_delayed_and_recent_pages(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q0: {command: [/bin/true]}\n")
    qkeys = jobd_config.load(str(config)).queues["q0"].keys
    r.zadd(qkeys.delayed, {b"not a job": float("inf")})
    r.zadd(qkeys.history_at, {b"some-job": float("inf")})
    paths = ("/api/overview", "/api/jobs?queue=q0&state=delayed", "/api/jobs?queue=q0&state=recent")
    with dashboard_server(config) as port:
        replies = {path: get_status(port, path) for path in paths}
    # Expected: each page answers (the member shown as due never, or not jobd's), never a 500.
    assert all(code == 200 for code, _ in replies.values()), replies
