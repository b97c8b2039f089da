"""Review 36l of issue 36: a client on the metrics port that keeps asking for /metrics (no
token: the loopback default) slows a daemon's jobs four- to twelve-fold.

docs/security.md says a client on the metrics port cannot "starve /healthz or the jobs". Each
/metrics is rendered at each request, in the daemon's own process (``endpoint.serve``:
prometheus_client's ``make_wsgi_app``; ~0.1 s of Python for 50 queues' series), on the path's
2 workers (``server.PROBE_WORKERS``; round 36k gave /metrics workers of its own, "still rendered
at each request (at most 2 at once)"). Two threads rendering without a pause hold the GIL
against the daemon's loop, which starts, reaps and settles every job. Measured by hand (2000
jobs of /bin/true, concurrency 8, 50 queues): 1.6 to 2.0 s alone; 7.8 s while one connection
asked for /metrics again and again, 24.6 s with two, 19 to 39 s with 4 or 24 (a Prometheus
scraping every 15 s costs nothing of the kind: the flood is the point). This test, 1000 jobs and
two connections: 9.9, 21.9 and 19.0 s against 1.7, 2.3 and 1.1 s alone.

What should happen: a client on the metrics port slows the jobs by a bounded share whatever it
asks (suggested fix: render /metrics at most once per interval, e.g. once a second, and serve
every request in between from that copy; or pace the renders so the workers leave the GIL to
the loop). Bound here: the jobs take at most 3 times as long (plus 2 s) as without the client.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from support import free_port, wait_until
from test_review36k_healthz_behind_metrics import SCRAPES

QUEUES = 50  # a daemon of 50 queues: ~0.1 s a render
JOBS = 1000
CONNECTIONS = 2  # each asking for /metrics again as soon as it has its answer


def drained(r: redis.Redis, start: int) -> float:
    """Seconds for JOBS jobs of /bin/true on q0 to be done (the group's lag and pending 0)."""
    pipe = r.pipeline()
    for i in range(JOBS):
        pipe.xadd("jobd:q0", {"payload": "x", "job_id": f"j{start + i}"})
    pipe.execute()
    began = time.monotonic()

    def done() -> bool:
        group = r.xinfo_groups("jobd:q0")[0]
        return group["lag"] == 0 and group["pending"] == 0

    wait_until(done, what=f"{JOBS} jobs done", timeout=120)
    return time.monotonic() - began


def test_a_metrics_flood_does_not_starve_the_jobs(
    r: redis.Redis, write_config: Callable[..., Path], daemon: Any
) -> None:
    port = free_port()
    others = "".join(f"  q{i}: {{command: [/bin/true]}}\n" for i in range(1, QUEUES))
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "queues:\n  q0: {command: [/bin/true], concurrency: 8}\n" + others
    )
    daemon(config)
    alone = drained(r, 0)
    flood = subprocess.Popen([sys.executable, "-c", SCRAPES, str(port), str(CONNECTIONS), "300"])
    try:
        time.sleep(1)  # the scrapes under way (not an assertion: what the jobs meet)
        flooded = drained(r, JOBS)
    finally:
        flood.kill()
        flood.wait()
    assert flooded <= 3 * alone + 2, (
        f"{JOBS} jobs of /bin/true took {flooded:.1f} s while a client kept {CONNECTIONS} "
        f"connections asking for /metrics, {alone:.1f} s without it"
    )
