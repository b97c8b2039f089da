"""Review of issue 36: a key of another type fails a queue's whole page (500), where the
overview and `jobd status` show such a key as a dash.

``pages.queue_page`` ends with ``store.client.zcard(q.keys.history_at)`` outside any error
handling (``status.queue_status`` reads in a pipeline with raise_on_error=False and shows '-'),
so a string at ``{jobd:q}:history:at`` makes /api/queue answer 500 and the page shows neither the
queue's figures, nor its charts, nor its tabs. The tabs of a stream or set of another type
(waiting, delayed, dead letters, recent) answer 500 likewise, where "a record jobd would not have
written is shown marked as bad", "never failing the page" (docs/operations/dashboard.md).
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
import redis
from support import dashboard_server, queue_config

KEYS = {
    "{jobd:q}:history:at": "/api/queue?queue=q",
    "{jobd:q}:dead": "/api/jobs?queue=q&state=dead",
    "{jobd:q}:delayed": "/api/jobs?queue=q&state=delayed",
    "jobd:q": "/api/jobs?queue=q&state=waiting",
}


def status_of(port: int, path: str) -> int:
    return fetch(port, path)[0]


def fetch(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


@pytest.mark.parametrize("key", list(KEYS))
def test_a_key_of_another_type_fails_the_page_reading_it(
    r: redis.Redis, daemon: Any, write_config: Any, key: str
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    daemon(config)
    r.delete(key)
    r.set(key, "someone else's")
    with dashboard_server(config) as port:
        summary, (page, body) = status_of(port, "/api/summary"), fetch(port, KEYS[key])
    assert summary == 200
    assert page == 200, f"{KEYS[key]} answered {page} with a string at {key}"
    # ... and says what is wrong, for that part: the key, its type, and what jobd keeps there.
    said = json.loads(body)
    errors = said.get("status", {}).get("errors") or [said.get("error")]
    assert f"the key {key} holds a string, not a" in errors[0], said
