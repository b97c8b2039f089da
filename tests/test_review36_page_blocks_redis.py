"""Review of issue 36: one page of dead letters (or a search in them) blocks Redis for seconds.

The queue page's reads are "bounded by the page (50) or the search's bound (10 000), whatever
the queue holds" (docs/operations/dashboard.md), and a record is "read only in the fields shown,
cut in Redis". The cut happens inside ``entries_shown.lua``, after each entry was read WHOLE into
the script (XREVRANGE … COUNT 1): the bound is in entries, not bytes. A dead letter keeps its
job's payload, up to ``max_payload`` (default 16 MiB). So one request of the dead-letters tab
(which the open page repeats every 5 s) copies 50 × 16 MiB inside one script, and a search up
to 10 000 × 16 MiB, while Redis serves nobody else: every daemon's read, renewal and settle waits
(and past ``busy-reply-threshold``, 5 s, every other client gets BUSY errors).

40 dead letters of a 16 MiB payload each (jobs at the default max_payload that failed), a real
daemon serving the queue, the real `jobd dashboard`; a second client PINGs Redis throughout.
"""

from __future__ import annotations

import http.client
from typing import Any

import redis
from support import dashboard_server

RECORDS = 40
PAYLOAD = 16 * 1024 * 1024 - 1024  # under the default max_payload


def get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


def worst_ping_during(port: int, action: Any) -> float:
    """The longest one command ran in Redis while ``action`` ran, as Redis measured it (its
    slow log, every command logged): what every other client waited behind it at least. (A
    PING's round trip, measured by a client thread, also counted that thread's own waits for
    the CPU on a loaded machine: 0.64 s once under a full suite's load.)"""
    client = redis.Redis(port=port)
    before = client.config_get("slowlog-*")
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    client.config_set("slowlog-log-slower-than", 0)
    try:
        action()
    finally:
        client.config_set("slowlog-log-slower-than", before["slowlog-log-slower-than"])
        entries = client.slowlog_get(100_000)
        client.config_set("slowlog-max-len", before["slowlog-max-len"])
        client.close()
    return max((e["duration"] for e in entries), default=0) / 1e6


def test_a_page_of_dead_letters_with_large_payloads_blocks_redis(
    r: redis.Redis, redis_server: Any, daemon: Any, write_config: Any
) -> None:
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/false], retry: {max_attempts: 1}}\n"
    )
    daemon(config)
    big = b"x" * PAYLOAD
    for i in range(RECORDS):  # as jobd writes a dead letter (tests/test_dashboard_security.py)
        r.xadd("{jobd:q}:dead", {
            "payload": big, "jobd_job_id": f"j-{i}", "jobd_queue": "q",
            "jobd_original_id": f"{i + 1}-0", "jobd_error": "exit", "jobd_exit_code": "1",
            "jobd_signal": "", "jobd_attempts": "1", "jobd_failed_at": "1795960000000",
            "jobd_stderr": "boom\n",
        })  # fmt: skip
    with dashboard_server(config) as port:
        page = worst_ping_during(
            redis_server.port, lambda: get(port, "/api/jobs?queue=q&state=dead")
        )
        search = worst_ping_during(
            redis_server.port, lambda: get(port, "/api/jobs?queue=q&state=dead&find=zz")
        )
    # Expected: a page that sends a few KiB a record does not stop Redis for other clients.
    assert max(page, search) < 0.5, (
        f"Redis answered nobody for {page:.2f} s during one page of dead letters, "
        f"{search:.2f} s during one search (one command's run, by Redis's slow log)"
    )
