"""Review of issue 36 (second pass): the dashboard's reads are bounded (docs/operations/
dashboard.md: "Every read is bounded in bytes too … 1 MiB"), but four reads were not:

1. ``recent.lua`` took a job's last history record with an unanchored ``string.match(blob,
   '([^\\n]*)\\n?$')``: Lua tries the pattern at every position, each try running to the end of
   its line, so the cost is the sum of the squares of the lines' lengths. One job with a long
   history (thousands of records, or a few MiB someone wrote) blocked Redis for seconds each
   time its page of recent jobs was drawn (every 5 s while the tab is open).
2. ``lib/shown.lua`` counted an entry's bytes, not its fields: an entry of 100 000 empty fields
   holds a few bytes, so a page read 50 (or 200) of them whole, millions of fields copied into
   the script while Redis served nobody.
3. ``registry.LISTED`` kept the 1 000 *oldest* beats: with more entries (anyone who can write
   to Redis can add them), the live daemons were the ones left out.
4. The overview (``/api/summary``), the queue page and the running tab read each queue's active
   hash with HGETALL, one XPENDING and one ZSCORE per record: with 100 000 records (running
   jobs, or someone else's) that is tens of MiB through the dashboard and 200 000 commands.

Real Redis, the real ``jobd dashboard`` (and a real daemon where one is listed); Redis being
blocked is measured from a second client (the longest a PING waited for its PONG), what a
request moved out of Redis from its own count (``total_net_output_bytes``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from support import dashboard_server, get_json

QUEUE = "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"
HISTORY, HISTORY_AT = "{jobd:q}:history", "{jobd:q}:history:at"
BLOCKED = 1.0  # seconds Redis may keep a PING waiting while a page is drawn (2 to 5+ before)


def now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def sent(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


def worst_ping_during(r: redis.Redis, action: Callable[[], Any]) -> tuple[float, Any]:
    """The longest a PING waited for its PONG (a BUSY reply is no PONG: it is sent again)
    while ``action`` ran, and what ``action`` returned. A script still running after the
    action (the server gave up on it) is killed."""
    client = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
    worst, done = [0.0], threading.Event()

    def ping() -> None:
        while not done.is_set():
            sent_at = time.monotonic()
            while True:
                try:
                    client.ping()
                    break
                except redis.ResponseError:  # BUSY: a script runs past busy-reply-threshold
                    time.sleep(0.01)
            worst[0] = max(worst[0], time.monotonic() - sent_at)
            time.sleep(0.01)

    thread = threading.Thread(target=ping)
    thread.start()
    try:
        result = action()
    finally:
        time.sleep(0.2)  # the PING waiting behind a script comes back now
        done.set()
        thread.join(60)
        with_kill(client)
        client.close()
    return worst[0], result


def with_kill(client: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # NOTBUSY
        client.script_kill()


@pytest.fixture
def config(write_config: Any) -> Path:
    return write_config(QUEUE)


@pytest.fixture
def page(config: Path) -> Iterator[Callable[[str], dict]]:
    with dashboard_server(config) as port:
        yield lambda path: get_json(port, path)


# -- 1. the last record of a long history ---------------------------------------------------


def history(records: int, size: int, last: str = "done") -> bytes:
    """A job's records as the settling scripts write them: one JSON object a line, oldest
    first, each about ``size`` bytes (its stderr tail), the last one ``last``."""
    line = {"event": "retried", "attempt": 1, "stderr": "e" * size, "consumer": "c"}
    lines = [orjson.dumps(line)] * (records - 1)
    lines.append(orjson.dumps({**line, "event": last, "attempt": records}))
    return b"\n".join(lines)


def test_a_page_of_recent_jobs_with_a_long_history_does_not_block_redis(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """850 records of 1 060 bytes (stderr tails; 900 KiB, under the page's 1 MiB: read): Lua's
    unanchored match cost about 850 × 1 060² steps; finding the last newline backwards, 1 060."""
    r.hset(HISTORY, "long", history(850, 1000))
    r.zadd(HISTORY_AT, {"long": now_ms(r)})
    blocked, shown = worst_ping_during(r, lambda: page("/api/jobs?queue=q&state=recent"))
    assert [(j["job_id"], j["event"], j["attempt"]) for j in shown["jobs"]] == [
        ("long", "done", "850")
    ], shown
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during one page"


def test_a_history_of_a_few_mib_is_not_read_and_the_page_goes_on(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """2 MiB of records under one job (jobd keeps 64 KiB a job: someone else wrote them) beside
    two jobs of 700 KiB: the big one is said, not read; the two do not fit one 1 MiB page, the
    cursor goes on to the second."""
    at = now_ms(r)
    r.hset(HISTORY, mapping={"big": history(2000, 1000), "a": history(2000, 300, "expired"),
                             "b": history(2000, 300, "poison")})  # fmt: skip
    r.zadd(HISTORY_AT, {"big": at, "a": at - 1, "b": at - 2})
    blocked, first = worst_ping_during(r, lambda: page("/api/jobs?queue=q&state=recent"))
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during one page"
    rows = [(j["job_id"], j["event"]) for j in first["jobs"]]
    assert rows == [("big", ""), ("a", "expired")] and first["cursor"], first
    assert "bytes, more than a page reads" in first["jobs"][0]["bad"], first["jobs"][0]
    second = page(f"/api/jobs?queue=q&state=recent&cursor={first['cursor']}")
    assert [(j["job_id"], j["event"]) for j in second["jobs"]] == [("b", "poison")], second
    assert second["cursor"] is None
