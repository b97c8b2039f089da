"""Review 5 of issue 36: a batch's page (``/api/batch``) reads and sends its hash's values whole.

Every other read of the dashboard is bounded in Redis ("a value someone else wrote never
leaves Redis"), but ``pages.batch_page`` runs ``batch.lua show``, which HMGETs the batch's
``state``, ``on_complete``, ``callback``, … whatever their size, and the page returns
``on_complete`` as it is. A batch hash is anyone's to write (``{jobd:batch:ID}``; jobd writes a
queue name there): a 32 MiB ``on_complete`` makes each look at the batch (the job page's batch
link, polled with the page) copy 32 MiB in Redis's Lua, send it to the dashboard, and send it to
the browser, where it is drawn as text.
"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import orjson
import redis
from support import dashboard_server, jobd_cli

from jobd.store.keys import batch

VALUE = 32 << 20


def test_a_batch_page_sends_a_huge_on_complete_whole(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q0: {command: [/bin/true]}\n")
    r.hset(batch("b1"), mapping={"state": "open", "open": 0, "total": 1, "done": 0,
                                 "failed": 0, "on_complete": b"q" * VALUE})  # fmt: skip
    with dashboard_server(config) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("GET", "/api/batch?id=b1")
            reply = conn.getresponse()
            size = len(reply.read())
        finally:
            conn.close()
    # Expected: a field jobd writes short (a queue name) is read only when short, as elsewhere.
    assert size < 64 * 1024, f"/api/batch sent {size >> 20} MiB (status {reply.status})"


def test_jobd_batch_says_an_on_complete_too_long_was_not_read(
    r: redis.Redis, write_config: Any
) -> None:
    """The CLI shares the show: the counts, and how long an on_complete it did not read is."""
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q0: {command: [/bin/true]}\n")
    r.hset(batch("b1"), mapping={"state": "open", "open": 0, "total": 1, "done": 0,
                                 "failed": 0, "on_complete": b"q" * (1 << 20)})  # fmt: skip
    shown = jobd_cli("batch", "-c", str(config), "b1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout) < 4096
    said = orjson.loads(shown.stdout)
    assert said["on_complete"] is None and said["on_complete_unread"] == 1 << 20, said
    text = jobd_cli("batch", "-c", str(config), "b1").stdout.decode()
    assert f"on complete: {1 << 20} bytes" in text, text
