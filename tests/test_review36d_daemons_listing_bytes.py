"""Review 4 of issue 36: /api/daemons, polled every second, has a bound per record, none in all.

``daemons_listed.lua`` lists the 1 000 newest beats and reads of each record the fields jobd
writes, each up to its bound: ``queues`` up to 256 KiB (``registry.QUEUES_READ``). Nothing
bounds the listing as a whole (the page's other reads share 1 MiB a request): 1 000 records
with 256 KiB of queues each move 256 MiB from Redis at each listing, and the overview asks
for ``/api/daemons`` every second (``DAEMONS_MS``), as does every ``jobd status``. A daemon
serving 50 queues writes about 5 KiB there.

100 registry entries beating now (written by hand, as anyone who can write to Redis can), each
record with 250 KiB of queues (valid JSON: they are shown); the bytes Redis sent
(``total_net_output_bytes``) for one /api/daemons.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import redis
from support import dashboard_server, get_json

ENTRIES = 100


def test_one_daemons_listing_moves_megabytes_every_second(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    served = []
    while len(orjson.dumps(served)) < 250 * 1024:
        n = len(served)
        served.append({"name": f"q{n}", "stream": f"jobd:q{n}", "group": "jobd", "concurrency": 1})
    queues = orjson.dumps(served)
    seconds, micros = r.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    for i in range(ENTRIES):
        name = f"host-{i}-4242-0123abcd"
        r.zadd("{jobd:daemons}", {name: now_ms})
        r.hset(f"{{jobd:daemons}}:daemon:{name}", mapping={
            "host": f"host-{i}", "pid": 4242, "version": "1.0", "process": "", "running": 0,
            "slots": 1, "beat_every": 5000, "lease": 60000, "state": "running",
            "started": now_ms, "queues": queues})  # fmt: skip
    with dashboard_server(config) as port:
        get_json(port, "/api/daemons")  # the script loaded
        before = int(r.info("stats")["total_net_output_bytes"])
        listed = get_json(port, "/api/daemons")
        sent = int(r.info("stats")["total_net_output_bytes"]) - before
    assert len(listed["daemons"]) == ENTRIES
    # Expected: a listing polled every second moves a bounded amount whatever the registry
    # holds: 1 MiB, as each of the page's other reads.
    assert sent <= 1 << 20, f"one /api/daemons: Redis sent {sent / 2**20:.1f} MiB"
