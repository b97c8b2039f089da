"""Review of issue 35 (workflows), round 7 (review35f): review 35e's fix "an enqueue refused
leaves its batch alone" (producer._enqueue checks the job and its --after through
workflows.waited_for before workflows.Member opens the batch) leaves one check of a held job
after the batch is opened and counted: its wait's bound, which workflows.hold turns into
``timeout_ms`` only then (``int(timeout * 1000)``, ``orjson.dumps``). An --after-timeout that
is a valid duration for the CLI but above 64 bits of ms (`100000000000000000s`) fails there
with a TypeError (a traceback, exit 1, not a usage error), as Python's ``after_timeout=nan``
(ValueError) does: the batch was opened and grown, the enqueue seals it empty, it is complete
at once, its --on-complete callback is enqueued with total 0, and it takes no more jobs.

And a bound that fits 64 bits but not once Redis's clock is added (`10000000000000000s`,
hold.lua: ``string.format('%d', now + timeout_ms)``) is scored -2^63 in held:until: the held
job is due at once and the queue's outbox duty dead-letters it `dependency` (expired) at its
next pass, the opposite of "wait practically for ever". No daemon: the duty's call is made
as the daemon makes it (Store.expire_held)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson
import redis
from support import jobd_cli

from jobd import producer, workflows
from jobd.config import load
from jobd.newjob import NewJob
from jobd.store.store import Store

CONFIG = (
    "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
    "  cb:\n    command: [/bin/true]\n"
)


def test_an_after_timeout_too_large_is_refused_before_its_batch_opens(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x",
                   "--after-timeout", "100000000000000000s",
                   "--batch", "B", "--on-complete", "cb")  # fmt: skip
    callbacks = r.xlen("jobd:cb") if r.exists("jobd:cb") else 0
    shown = jobd_cli("batch", "-c", c, "B").stdout.decode().strip()
    assert (out.returncode, callbacks, shown) == (2, 0, ""), out.stderr[-300:]


def test_a_python_after_timeout_nan_leaves_the_batch_alone(r: redis.Redis, write_config) -> None:
    config = load(str(write_config(CONFIG)))
    job = NewJob(b"p", "h", after="x", after_timeout=float("nan"), batch="B", on_complete="cb")
    with contextlib.suppress(ValueError):  # refused: fine, so long as nothing was written
        producer.enqueue_job(config, "a", job)
    assert not r.exists("{jobd:batch:B}") and not r.exists("jobd:cb")


def test_a_huge_after_timeout_does_not_expire_the_held_job_at_once(
    r: redis.Redis, write_config
) -> None:
    """Changed from the review's (which took the 10000000000000000s bound, exit 0): the fix the
    review asks for refuses a bound past ten years (workflows.MAX_AFTER_TIMEOUT) as a usage
    error; the longest allowed is held and not due at once, and a bound past 2^63 ms written
    by another client is cut by hold.lua (not scored -2^63, due at once)."""
    cfg = write_config(CONFIG)
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x",
                   "--after-timeout", "10000000000000000s")  # fmt: skip
    assert (out.returncode, r.hexists("{jobd:a}:held", "h")) == (2, False), out.stderr
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x",
                   "--after-timeout", f"{workflows.MAX_AFTER_TIMEOUT}s")  # fmt: skip
    assert out.returncode == 0, out.stderr
    config = load(c)
    q = config.queues["a"]
    store = Store.open(config.redis, "test")
    try:
        after = orjson.dumps({"deps": ["a x"], "all": ["a x"], "any": False,
                              "timeout_ms": 10**19})  # fmt: skip
        assert store.hold(q, "h2", after, None, "m2", b"{}", {b"job_id": b"h2"}) == 1
        expired, _ = store.expire_held(q)  # the outbox duty's pass
        now_ms = store.clock_ms()
    finally:
        store.close()
    assert expired == 0 and r.hexists("{jobd:a}:held", "h") and r.hexists("{jobd:a}:held", "h2")
    scores = [s for _, s in r.zrange(q.keys.held_until, 0, -1, withscores=True)]
    assert len(scores) == 2 and all(now_ms < s <= now_ms + 315360000000 for s in scores)
    lua = (Path(workflows.__file__).parent / "store" / "lua" / "hold.lua").read_text()
    assert f"MAX_WAIT_MS = {workflows.MAX_AFTER_TIMEOUT * 1000} " in lua


def test_a_python_after_timeout_of_zero_or_less_is_refused_as_the_cli_refuses_it(
    r: redis.Redis, write_config
) -> None:
    """`--after-timeout 0` is a usage error ("more than 0, or leave it out for no bound"); the
    producer, which never checks it, holds the job with a bound already passed: the outbox
    duty's next pass dead-letters it `dependency` (expired) unrun, its batch counting a
    failure."""
    config = load(str(write_config(CONFIG)))
    for n, bound in enumerate((0.0, -60.0)):
        with contextlib.suppress(ValueError):  # refused: fine
            producer.enqueue_job(config, "a", NewJob(b"p", f"h{n}", after="x", after_timeout=bound))
    store = Store.open(config.redis, "test")
    try:
        expired, _ = store.expire_held(config.queues["a"])  # the outbox duty's pass
    finally:
        store.close()
    assert expired == 0
