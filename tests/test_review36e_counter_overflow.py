"""Review 5 of issue 36: one long number in a minute's counters takes the overview down (500).

The minute's counters (``{jobd:Q}:stats:M``) and histograms are read "only the fields jobd
writes, each only when short" (``status.hashes_shown``: values of 256 bytes or less), then
parsed with ``int()`` (``status._counters``, ``figures._count``) and no bound: a value of 21
digits (anyone who can write to Redis: one HSET; or HINCRBY's own int64 range, summed over the
hour's 60 minutes or a queue's levels) becomes a Python int past 64 bits, and ``orjson.dumps``
refuses it (TypeError: Integer exceeds 64-bit range). The reply is a 500 "the dashboard
failed": the whole overview (``/api/summary``, every queue) and the queue's page
(``/api/queue``, its charts) are gone for as long as the minute's hash is kept (2 h), from one
field of one queue. The hostile-bytes sweep of the page never sees it: it is no text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_status, queues_config

from jobd import config as jobd_config
from jobd.store import keys


def test_a_long_counter_value_fails_the_overview_and_the_queue_page(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(queues_config(2))
    seconds, _ = r.time()
    minute = keys.minute(int(seconds))
    qkeys = jobd_config.load(str(config)).queues["q0"].keys
    big = "1" + "0" * 20  # 21 digits: past 64 bits
    for m in (minute, minute - 1):  # this minute and the last (the overview's per minute)
        r.hset(qkeys.stats(m), mapping={"done": big})
    with dashboard_server(config) as port:
        replies = {path: get_status(port, path) for path in ("/api/summary", "/api/queue?queue=q0")}
    # Expected: the pages answer (the counter shown as not jobd's, or capped), never a 500.
    assert all(code == 200 for code, _ in replies.values()), replies
