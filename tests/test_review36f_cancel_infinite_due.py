"""Review 36f: cancelling a delayed job whose score is +inf fails after removing it.

2f5b68b made a score of ±inf (or past a date's range) read as "no time" in the pages
(``browse.score_ms``): the delayed tab now lists such a job, due null, and offers it to the
bulk cancel. But the cancel reads the removed members' scores with ``int(due)``
(``ControlOps.cancel_delayed``): ``int(b"inf")`` raises ValueError *after* cancel_delayed.lua
removed the job and wrote its history. ``/api/cancel`` (and ``jobd cancel``) then fail (500,
a traceback) though the job was cancelled, and say nothing of where it was found.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis
from support import jobd_cli

from jobd import config as jobd_config
from jobd.cancel import cancel
from jobd.store.store import Store


def test_a_delayed_job_due_at_inf_is_cancelled_and_said(r: redis.Redis, write_config: Any) -> None:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    out = jobd_cli("enqueue", "-c", str(config), "--job-id", "never", "--delay", "1h", "q", "x")
    assert out.returncode == 0, out.stderr
    q = jobd_config.load(str(config)).queues["q"]
    (member,) = r.zrange(q.keys.delayed, 0, -1)
    r.zadd(q.keys.delayed, {member: float("inf")}, xx=True)  # anyone can; the page shows it
    try:
        found = cancel(Store(r), q, ["never"], 60_000, "review@host")
    except ValueError as exc:
        raise AssertionError(
            f"cancelling job 'never' (due +inf, listed due null on the delayed tab) raised "
            f"{exc!r}; removed from the delayed set meanwhile: {r.zcard(q.keys.delayed) == 0}"
        ) from exc
    # Expected: it is found in the delayed set, removed, and said so (due: none).
    assert [f.where for f in found] == ["delayed"], found
    assert found[0].due_ms is None, found  # no time: due never (``browse.score_ms``)
    # And its history says no due time (was -9223372036854775808: Lua's %d of inf).
    shown = jobd_cli("job", "-c", str(config), "--json", "q", "never")
    assert shown.returncode == 0, shown.stderr
    (record,) = [e for e in orjson.loads(shown.stdout)["records"] if e["event"] == "cancelled"]
    assert record.get("due") is None, record
