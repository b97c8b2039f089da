"""Review of issue 36: the delayed tab sends every delayed job's whole payload from Redis to the
dashboard, to show its job id, due time and attempt.

docs/operations/dashboard.md: the delayed / retrying tab lists "job id, due time, attempt,
level", read by "ZRANGE by index, 50 at most"; "No request walks a whole stream, set or hash:
every read is bounded by the page (50) or the search's bound". ``pages._delayed`` calls
``Store.delayed_list`` (``delayed_list.lua``), which returns each member's fields decoded, the
payload whole, and ``shown.delayed`` then keeps the job id and attempt. A delayed member carries
its payload (up to ``max_payload``, 16 MiB by default; a retry waiting for its backoff too), so
one page of 50 moves up to 800 MiB from Redis into the dashboard, every 5 s while the tab is
open; a search reads 1 000 members a page (up to 16 GiB).

Ten jobs enqueued by `jobd enqueue --delay 1h --payload-file` (4 MiB - 1 KiB each), a real
daemon, the real `jobd dashboard`; Redis's own count of bytes it sent (INFO
total_net_output_bytes) around one request of the tab.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_json, jobd_cli

JOBS = 10
PAYLOAD = (
    4 * 1024 * 1024 - 1024
)  # 16 MiB - 1 KiB (max_payload) at first: 4 MiB shows it at a quarter of the cost


def sent(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


def test_one_page_of_the_delayed_tab_reads_every_payload_whole(
    r: redis.Redis, daemon: Any, write_config: Any, tmp_path: Path
) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    daemon(config)
    payload = tmp_path / "payload"
    payload.write_bytes(b"x" * PAYLOAD)
    for i in range(JOBS):
        done = jobd_cli("enqueue", "-c", str(config), "--delay", "1h", "--job-id", f"j-{i}",
                        "--payload-file", str(payload), "q")  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert r.zcard("{jobd:q}:delayed") == JOBS
    with dashboard_server(config) as port:
        # A page also stops reading once it read READ_BUDGET bytes in Redis (a member is read
        # whole there): the ten come in pages, following the cursor.
        before = sent(r)
        pages, cursor = [], ""
        while cursor is not None and len(pages) <= JOBS:
            pages.append(get_json(port, "/api/jobs?queue=q&state=delayed&cursor=" + cursor))
            cursor = pages[-1]["cursor"]
        moved = sent(r) - before
    found = [job["job_id"] for page in pages for job in page["jobs"]]
    assert sorted(found) == sorted(f"j-{i}" for i in range(JOBS))
    shown = len(json.dumps(pages))
    # Expected: the ten job ids, due times and attempts cost Redis a few KiB to send.
    assert moved < 1024 * 1024, (
        f"{len(pages)} page(s) of {JOBS} delayed jobs ({shown} bytes of JSON) made Redis send "
        f"{moved / 2**20:.0f} MiB to the dashboard"
    )
