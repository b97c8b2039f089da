"""Review of issue 35 (workflows), round 35j: taking a cancelled hold's registration off
(unwait.lua, review 35i) costs Redis time in the number of jobs waiting on the same job, per
notice: cancelling the N jobs of a fan-in (N jobs `--after gate`) costs O(N²) JSON decodes in
Redis, seconds of scripts for a thousand, minutes for ten thousand, the queue's outbox
moves stuck behind them.

What is wrong: unwait.lua reads the whole value of the job waited for in `{D}:waiters` (one
JSON line per waiter) and cjson-decodes every line to find the one of its hold, then writes
the value back whole; each of the N unwait notices does it again. Measured here: 1000 held
jobs on one gate, cancelled (cancel_held.lua, as `jobd cancel`), their 1000 unwait notices moved: several
seconds of EVALSHA in Redis, 90 times the cost below (2000: 30 s, the longest script
0.5 s; 3000: 47 s of moving),
while the gate's own end, telling the same 1000 waiters (one release notice each,
unblock.lua dead-lettering each `dependency`), costs a small fraction of it. Before review
35i a cancel cost nothing there (and leaked the lines).

What should happen: taking one hold's registration off costs about what telling one waiter
costs: not a decode of every other waiter's line (a plain search for the hold's token, or
one hash field per hold, are two ways). Here: the cancel and its unwait moves cost at most 5
times the gate's cancel and its release moves, for the same number of waiters.

Why it matters: a fan-in (a thousand or more jobs after one gate, the pattern batches and
aggregates use) cancelled together makes Redis busy for seconds to minutes, each script
blocking every other client (the daemons' leases, reads and settles) for up to half a
second, and the outbox of the queue, which also carries its follow-ups and batch notices, is
stuck behind it."""

from __future__ import annotations

import json

import redis
from support import jobd_cli, waiter_lines

from jobd.config import load
from jobd.newjob import NewJob
from jobd.producer import enqueue_job
from jobd.store.store import Store

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
N = 1000


def scripts_usec(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def live(r: redis.Redis, dep: str) -> list[str]:
    """The jobs registered with ``dep`` whose hold has not ended (review 35k: one registration
    a field, taken off by unwait.lua)."""
    return [json.loads(x)["job"] for x in waiter_lines(r, "{jobd:a}:waiters", dep)]


def moved(store: Store, q) -> None:
    """The queue's outbox moved out, as a daemon's duty moves it."""
    while store.move_follow_ups(q):
        pass


def test_cancelling_a_fan_in_costs_redis_linear_time(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    config = load(c)
    q = config.queues["a"]
    store = Store(r, "daemon")
    out = jobd_cli("enqueue", "-c", c, "a", "g", "--job-id", "gate", "--delay", "1h")
    assert out.returncode == 0, out.stderr
    for prefix in ("c", "r"):  # c: to be cancelled; r: to be told of gate's end
        for i in range(N):
            enqueue_job(config, "a", NewJob(b"p", f"{prefix}{i}", after=("gate",)), client=r)
    cancelled = [f"c{i}" for i in range(N)]
    before = scripts_usec(r)
    for k in range(0, N, 100):
        store.cancel_held(q, cancelled[k : k + 100], "test")
    moved(store, q)  # N unwait notices
    unwait = scripts_usec(r) - before
    assert not r.hexists("{jobd:a}:held", "c0")
    assert sorted(live(r, "gate")) == sorted(f"r{i}" for i in range(N))  # r's stay
    before = scripts_usec(r)
    assert jobd_cli("cancel", "-c", c, "a", "gate").returncode == 0
    moved(store, q)  # N release notices (the cancel moves them): each r dead-lettered
    release = scripts_usec(r) - before
    assert not r.hexists("{jobd:a}:held", "r0") and r.hlen("{jobd:a}:waiters") == 0
    assert unwait <= 5 * release, (
        f"taking {N} cancelled holds' registrations off one job cost Redis {unwait / 1e6:.2f} s "
        f"of scripts, telling {N} waiters of that job's end {release / 1e6:.2f} s: each unwait "
        "decodes every waiter's line"
    )
