"""Review of issue 36: the dashboard (and `jobd status`) read ages and minutes on the local clock
of the host serving them, not Redis's.

docs/operations/dashboard.md: "Every figure comes from Redis, so any host's page shows the whole
cluster"; the registry takes care that "every time is Redis's clock, so hosts' clocks never
matter". But ``status.gather`` / ``pages.queue_page`` take ``now = time.time()`` of the serving
host, and from it ``oldest_pending_age`` (now - an entry id, which is Redis's clock), the minute
whose counters are "done/failed per minute", and the hour of the charts (``figures.last_hour``).
That ``time`` is also what the page's relative times ("4.1s ago") are measured from.

One real daemon (clock true) does 10 jobs and holds one slow job. Two `jobd dashboard`s read the
same Redis: one with the true clock, one whose host clock is one hour ahead (libfaketime, as
tests/support.skewed). They should agree; the skewed one says the job held for a second has been
pending an hour, and that no job was done in the last hour (an empty chart).
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from support import acked_all, dashboard_server, jobd_cli, pending_count, skewed, wait_until


def get(port: int, path: str) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
        assert reply.status == 200, body
        return json.loads(body)
    finally:
        conn.close()


@pytest.fixture
def dashboard() -> Iterator[Callable[..., int]]:
    """Start dashboards of a config (``env`` added to their environment): their ports; each
    is stopped at the end (``support.dashboard_server``)."""
    with contextlib.ExitStack() as stack:
        yield lambda config, env=None: stack.enter_context(dashboard_server(config, env))


def test_a_dashboard_host_an_hour_ahead_shows_wrong_ages_and_an_empty_hour(
    r: redis.Redis, daemon: Any, write_config: Any, script: Any, dashboard: Any
) -> None:
    script("slow.sh", "#!/bin/sh\nexec sleep 60\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  q: {command: [/bin/true]}\n"
        "  slow: {command: [./slow.sh]}\n"
    )
    daemon(config)
    for _ in range(10):
        r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: acked_all(r, "jobd:q", 10), what="10 jobs done")
    r.xadd("jobd:slow", {"payload": "x"})
    wait_until(lambda: pending_count(r, "jobd:slow") == 1, what="the slow job held")

    true_port = dashboard(config)
    ahead_port = dashboard(config, skewed("+1h"))

    def seen(port: int) -> dict[str, Any]:
        row = get(port, "/api/summary")["queues"]["slow"]
        hour = get(port, "/api/queue?queue=q")["status"]["hour"]
        return {
            "slow pending for an hour or more": row["oldest_pending_age"] >= 3000,
            "jobs done in the last hour": sum(hour["series"]["done"]),
        }

    truth = seen(true_port)
    assert truth == {"slow pending for an hour or more": False, "jobs done in the last hour": 10}
    ahead = seen(ahead_port)
    # `jobd status` on that host says the same as its dashboard.
    done = jobd_cli("status", "-c", str(config), "--json", env=skewed("+1h"))
    age = json.loads(done.stdout)["queues"]["slow"]["oldest_pending_age"]
    # Expected: the same figures from any host (they are all in Redis).
    assert (ahead, age < 3000) == (truth, True), f"jobd status there: oldest pending {age:.0f}s"
