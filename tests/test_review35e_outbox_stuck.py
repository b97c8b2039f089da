"""Review of issue 35 (workflows), round 6 (review35e): review 35d made a batch hash holding
what jobd never wrote (anyone who can write the batch's key: bytes not UTF-8) "taken as no
batch", so that "a notice failing at every move" no longer does. A count that is no integer in
that hash (the same writer) still fails at every move, by design of lua/batch.lua ("the
notice stays to be moved again"), and a move reads the outbox from its start, MOVE_BATCH (100)
entries a round (store/outbox.py): once 100 such notices lead the queue's outbox, nothing
behind them is ever moved. Here a batch of 100 members whose hash says done=abc leaves the
release of job h (--after x, x done) for ever behind them: h never runs. Real daemon."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import RUNS, runs

from jobd.config import load
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]


def test_notices_that_always_fail_do_not_hold_back_the_outbox(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    runs_sh = script("runs.sh", RUNS)
    cfg = write_config(f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{runs_sh}]\n")
    c = str(cfg)
    r.hset("{jobd:batch:B}", "done", "abc")  # someone's write where the batch will live
    lines = "".join(f"m{n}\n" for n in range(100)).encode()
    out = jobd_cli("enqueue", "-c", c, "a", "--lines", "-", "--batch", "B", stdin=lines)
    assert out.returncode == 0, out.stderr
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    out = jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x")
    assert out.returncode == 0, out.stderr
    daemon(cfg)
    wait_until(lambda: "x" in runs(tmp_path), 30, what="the members and x run")
    wait_until(lambda: "h" in runs(tmp_path), 15,
               what=f"h released and run (outbox: {r.xlen('{jobd:a}:outbox')} entries)")  # fmt: skip


def test_more_failing_notices_than_a_call_reads_leave_a_cursor(
    r: redis.Redis, write_config
) -> None:
    """More notices that always fail than one call's rounds read: each call goes on after the
    last entry the previous one read (a cursor), so the good notice behind them is applied by
    the second call, and the failed ones stay (tried again once the cursor wraps)."""
    cfg = write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n")
    q = load(str(cfg)).queues["a"]
    store = Store(r)
    r.hset("{jobd:batch:B}", "done", "abc")  # every count of B fails
    for n in range(150):
        r.xadd(q.keys.outbox, {"kind": "batch", "batch": "B", "member": f"a m{n}",
                               "outcome": "done", "event": "done"})  # fmt: skip
    r.hset("{jobd:batch:C}", mapping={"state": "sealed", "total": 1, "done": 0, "failed": 0,
                                      "open": 0, "ttl": 3600})  # fmt: skip
    r.xadd(q.keys.outbox, {"kind": "batch", "batch": "C", "member": "a c", "outcome": "done",
                           "event": "done"})  # fmt: skip
    for _ in range(2):
        with pytest.raises(redis.ResponseError):
            store.move_follow_ups(q, rounds=1)
    assert r.hget("{jobd:batch:C}", "done") == b"1"
    assert r.hget("{jobd:batch:C}", "state") == b"complete"
    assert r.xlen(q.keys.outbox) == 150
    with pytest.raises(redis.ResponseError):  # from the first again: B's still fail
        store.move_follow_ups(q, rounds=1)
    assert r.xlen(q.keys.outbox) == 150
