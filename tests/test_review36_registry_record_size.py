"""Review of issue 36: a daemon-registry record is read whole, every second, by every open
overview.

``registry.listing`` reads each listed daemon's record with HGETALL and only then cuts what it
shows (``TEXT_SHOWN``, 256 characters); the overview polls /api/daemons every second
(``DAEMONS_MS``). The registry "was written by anyone who can write to Redis" (its docstring):
one record with a 30 MiB field (a stray HSET, or a writer gone wrong) makes every open overview
pull 30 MiB a second from Redis, and each `jobd status` 30 MiB. A real daemon beats; one
garbage record beside it; the real `jobd dashboard`; Redis's count of bytes sent around one
/api/daemons.
"""

from __future__ import annotations

from typing import Any

import redis
from support import dashboard_server, get_json, queue_config, wait_until

from jobd.store import registry


def sent(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


def test_a_30_mib_field_in_one_record_is_read_whole_by_each_daemons_poll(
    r: redis.Redis, daemon: Any, write_config: Any
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    d = daemon(config)
    wait_until(lambda: d.consumer() in {x["name"] for x in registry.listing(r)["daemons"]},
               what="the daemon listed")  # fmt: skip
    seconds, micros = r.time()
    now = seconds * 1000 + micros // 1000
    r.zadd("{jobd:daemons}", {"garbage": now})
    r.hset("{jobd:daemons}:daemon:garbage", mapping={
        "host": "h", "pid": "1", "version": "v", "running": "0", "slots": "1", "queues": "[]",
        "beat_every": "5000", "lease": "600000", "started": str(now), "state": "running",
        "junk": b"x" * (30 * 1024 * 1024),
    })  # fmt: skip
    with dashboard_server(config) as port:
        before = sent(r)
        listed = get_json(port, "/api/daemons")
        moved = sent(r) - before
    assert len(listed["daemons"]) == 2
    # Expected: what the list shows (a few fields of 256 characters at most) is what is read.
    assert moved < 1024 * 1024, f"one /api/daemons (polled every second): {moved / 2**20:.0f} MiB"
