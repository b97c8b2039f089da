"""Review of issue 35 (workflows), round 8 (review35g): a held --unique job's mark (hold.lua)
lasts ``UNIQUE_TTL + bound`` (b9df72d cuts the bound; the formula is older) whatever the job's
own due time. With ``--delay`` the job is released into the delayed set, due later than that,
and release (unblock.lua, or hold's own when what it waits for is done already) does not set
the mark again: the mark is gone a week before the job is due, and then another
`jobd enqueue --unique --job-id` of the same id is taken (enqueue_unique.lua reads only the
mark): two jobs of one --unique job id, what --unique is there to prevent. A --unique job
with the same --delay and no --after keeps its mark until UNIQUE_TTL after it is due
(producer.enqueue's docstring). The test reads the mark's PTTL after the release instead of
waiting a week. A real daemon runs the job waited for."""

from __future__ import annotations

import redis
from support import jobd_cli, wait_until

from jobd.config import load

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
DAY_MS = 86400 * 1000


def test_a_released_unique_job_keeps_its_mark_until_it_is_due(
    r: redis.Redis, write_config, daemon
) -> None:
    path = write_config(CONFIG)
    c = str(path)
    q = load(c).queues["a"]
    plain = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "u0", "--unique",
                     "--delay", "30d")  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert r.pttl(q.keys.job_mark("u0")) > 30 * DAY_MS  # due in 30 days, then UNIQUE_TTL
    daemon(path)
    x = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x", "--wait", "--wait-timeout", "30s")
    assert x.returncode == 0, x.stderr
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "u1", "--unique",
                   "--delay", "30d", "--after", "x", "--after-timeout", "1h")  # fmt: skip
    assert out.returncode == 0, out.stderr
    wait_until(lambda: not r.hexists("{jobd:a}:held", "u1"), what="u1 released")
    assert r.zcard(q.keys.delayed) == 2  # u0 and u1, both due in 30 days
    left = r.pttl(q.keys.job_mark("u1"))
    assert left > 30 * DAY_MS, f"u1's mark is gone in {left / DAY_MS:.2f} days, due in 30"


def test_the_lua_unique_ttl_is_the_store_s() -> None:
    """lib/workflows.lua's UNIQUE_TTL_MS (a released held job's mark) is keys.UNIQUE_TTL."""
    from jobd.store import scripts
    from jobd.store.keys import UNIQUE_TTL

    assert f"local UNIQUE_TTL_MS = {UNIQUE_TTL * 1000} " in scripts.source("unblock")
