"""Review 35q: a delayed (or retried) batch member's `promoted` record names no batch.

docs/workflows.md: "A member's records carry `batch` ... every record of it". Review 35o linked
every Lua writer's record to the member's batch (lua/lib/jobs.lua ``linked``) but promote.lua
writes the `promoted` record of a due job (a --delay member, and every retried member: its
retry sits in the delayed set) without it: its records read ``scheduled B, promoted -``."""

from __future__ import annotations

import json

import redis
from support import jobd_cli, wait_until

from jobd.config import load
from jobd.store.store import Store

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n"
    "  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_a_promoted_member_record_names_its_batch(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "due", "--delay", "300ms",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    store, q = Store(r), load(c).queues["a"]
    r.xgroup_create(q.stream, "jobd", id="0", mkstream=True)
    wait_until(lambda: store.promote(q, 100, 1000) and r.zcard(q.keys.delayed) == 0, 10,
               what="the job due, moved to its stream")  # fmt: skip
    got = json.loads(jobd_cli("job", "-c", c, "a", "due", "--json").stdout)
    records = [" ".join((x["event"], x.get("batch", "-"))) for x in got["records"]]
    assert records == ["scheduled B", "promoted B"], records
