"""Review of issue 36: garbage in the daemon registry breaks `jobd status` and the dashboard.

docs/operations/observing.md#daemons promises "Whatever the registry holds, `jobd status` works
... a record with fields jobd would not write lists its daemon with `problems` saying which".
A real daemon beats; then someone who can write to Redis adds one entry to the registry:

- an entry whose score is +inf (``ZADD {jobd:daemons} +inf x``): ``registry.daemon_json`` does
  ``int(score)`` -> OverflowError;
- a record whose ``started`` (or ``lease``, ``beat_every``) is a 400-digit number: ``int()``
  takes it, ``/ 1000`` raises OverflowError;
- a record whose ``pid`` is 2**70: listed, but orjson cannot encode an int beyond 64 bits, so
  the dashboard's JSON reply fails.

Each makes `jobd status` exit 1 with a traceback (the real daemon is no longer shown either)
and the dashboard's /api/daemons and /api/summary answer 500: the overview shows nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from support import dashboard_server, jobd_cli, queue_config, wait_until

from jobd.store import registry


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


@pytest.fixture
def dashboard() -> Iterator[Callable[..., int]]:
    """Start dashboards of a config (``env`` added to their environment): their ports; each
    is stopped at the end (``support.dashboard_server``)."""
    with contextlib.ExitStack() as stack:
        yield lambda config, env=None: stack.enter_context(dashboard_server(config, env))


def record(r: redis.Redis, **fields: str) -> None:
    """A registry entry beaten now, with a record jobd would write but for ``fields``."""
    seconds, micros = r.time()
    now = seconds * 1000 + micros // 1000
    r.zadd("{jobd:daemons}", {"garbage": now})
    r.hset(
        "{jobd:daemons}:daemon:garbage",
        mapping={"host": "h", "pid": "1", "version": "v", "running": "0", "slots": "1",
                 "beat_every": "5000", "lease": "60000", "queues": "[]", "state": "running",
                 "started": str(now), "beat": str(now), **fields},
    )  # fmt: skip


GARBAGE: dict[str, Callable[[redis.Redis], Any]] = {
    "score_inf": lambda r: r.zadd("{jobd:daemons}", {"garbage": float("inf")}),
    "started_400_digits": lambda r: record(r, started="1" + "0" * 400),
    "lease_400_digits": lambda r: record(r, lease="1" + "0" * 400),
    "pid_2_to_70": lambda r: record(r, pid=str(2**70)),
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_one_garbage_registry_entry_breaks_status_and_the_dashboard(
    r: redis.Redis, daemon: Any, write_config: Any, dashboard: Any, kind: str
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    d = daemon(config)
    name = d.consumer()
    wait_until(lambda: name in {x["name"] for x in registry.listing(r)["daemons"]},
               what="the real daemon listed")  # fmt: skip
    port = dashboard(config)
    assert get(port, "/api/daemons")[0] == 200

    GARBAGE[kind](r)

    done = jobd_cli("status", "-c", str(config), "--json")
    code, body = get(port, "/api/daemons")
    summary, _ = get(port, "/api/summary")
    listed = json.loads(done.stdout)["daemons"] if done.returncode == 0 else []
    seen = {
        "status exit": done.returncode, "status lists the real daemon": name in {
            x["name"] for x in listed}, "/api/daemons": code, "/api/summary": summary,
    }  # fmt: skip
    # Expected (documented): status works, the real daemon listed, the garbage one with problems;
    # the dashboard answers.
    assert seen == {"status exit": 0, "status lists the real daemon": True,
                    "/api/daemons": 200, "/api/summary": 200}, (seen, body[-300:],
                                                                done.stderr[-300:])  # fmt: skip
