"""Review 36g: cancelling a delayed job due past the year 9999 tracebacks after the cancel.

d8a14b7 reads a removed member's score with ``browse.score_ms``: a score is "no time" (None)
only past ``TIME_MAX_MS`` (8.64e15 ms, JavaScript's date range, year 275760). Below it, the
due is kept as ms, and ``jobd.cancel.where`` formats it with ``datetime.fromtimestamp``,
which refuses any year past 9999 (ValueError "year 33658 is out of range"). A score of 1e15
(anyone's ZADD; the delayed tab lists it and offers it to the bulk cancel) therefore makes
``jobd cancel`` end in a traceback and ``/api/cancel`` (``web.actions.found_shown`` calls
``where``) answer 500 -- after cancel_delayed.lua removed the job and wrote its history.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from support import jobd_cli

from jobd import config as jobd_config
from jobd.cancel import cancel, where
from jobd.store.store import Store
from jobd.web.actions import found_shown


def _delayed_at(r: redis.Redis, write_config: Any, score: float) -> tuple[Any, Any]:
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")
    out = jobd_cli("enqueue", "-c", str(config), "--job-id", "far", "--delay", "1h", "q", "x")
    assert out.returncode == 0, out.stderr
    q = jobd_config.load(str(config)).queues["q"]
    (member,) = r.zrange(q.keys.delayed, 0, -1)
    r.zadd(q.keys.delayed, {member: score}, xx=True)
    return config, q


@pytest.mark.parametrize("score", [1e15, -1e15])
def test_jobd_cancel_of_a_job_due_past_9999_says_where(
    r: redis.Redis, write_config: Any, score: float
) -> None:
    config, q = _delayed_at(r, write_config, score)
    out = jobd_cli("cancel", "-c", str(config), "q", "far")
    assert r.zcard(q.keys.delayed) == 0  # the cancel happened
    assert b"Traceback" not in out.stderr and out.returncode == 0, (
        out.returncode,
        out.stderr[-300:],
    )


def test_api_cancel_shows_a_job_due_past_9999(r: redis.Redis, write_config: Any) -> None:
    _, q = _delayed_at(r, write_config, 1e15)
    (found,) = cancel(Store(r), q, ["far"], 60_000, "review@host")
    assert found.where == "delayed"
    try:
        shown = found_shown(found, 60.0)  # what /api/cancel answers with
    except ValueError as exc:
        raise AssertionError(f"/api/cancel would answer 500: {exc!r}") from exc
    assert shown["said"] == where(found, "60s")
