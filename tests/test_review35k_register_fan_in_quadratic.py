"""Review of issue 35 (workflows), round 35k: registering the jobs of a fan-in (N jobs
`--after gate`) costs Redis O(N²): each registration (wait_on.lua) reads the gate's whole
waiters value, searches it, and writes it back whole with one line more. Review 35j made the
fan-in's *cancel* cost linear time ("a cancelled fan-in costs Redis linear time"); building it
is still quadratic.

What is wrong: wait_on.lua keeps every waiter of job `D` in one hash field (one JSON line
each, ~170 bytes here, more with a hook and long names): `HGET` of the value, a copy of it
('\\n' .. old) searched for the line (registered once however often sent), a second copy
(old .. line), and `HSET` of the whole: about five passes over all the lines registered
before, per registration. Measured here: 1000 registrations on one gate cost 0.4 s of
scripts, 4000 cost 5.9 s (14.7x for 4x the jobs; each call of the last ones about 3 ms,
blocking every other client), 10 000 would take about 40 s; the gate's end, telling the same
jobs (one release notice each, applied by unblock.lua), is linear: for 3000 jobs, 3.7 s of
registering against 0.16 s of telling (24 times).

What should happen: registering one waiter costs about what telling one waiter costs,
whatever the number already registered (one field per waiter, `D\\0HOLD` as the marks field
already does, or a set of lines, with the dedupe a field's existence). Here: registering N
jobs costs at most 5 times the gate's end and the moves of its N release notices.

Why it matters: a fan-in of thousands of jobs on one gate (an aggregate after a batch, the
pipeline docs/workflows.md shows) is the workload `--after` exists for; enqueuing it keeps
Redis busy for seconds to minutes, the daemons' leases, reads and settles waiting behind each
script.

Fixed: one registration is a few fields of its own (lib/workflows.lua add_waiter), deduped by
the existence of its name's field; taking one off (unwait.lua) and telling them (``ended``)
follow. The second test plants waiters in the format before (a daemon of the previous version
wrote them) and shows them told, taken off and deduped as any."""

from __future__ import annotations

import json

import redis
from support import jobd_cli, waiter_lines

from jobd.config import load
from jobd.newjob import NewJob
from jobd.producer import enqueue_job
from jobd.store.store import Store

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"
N = 3000


def scripts_usec(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def test_registering_a_fan_in_costs_redis_linear_time(r: redis.Redis, write_config) -> None:
    c = str(write_config(CONFIG))
    config = load(c)
    q = config.queues["a"]
    store = Store(r, "daemon")
    out = jobd_cli("enqueue", "-c", c, "a", "g", "--job-id", "gate", "--delay", "1h")
    assert out.returncode == 0, out.stderr
    before = scripts_usec(r)
    for i in range(N):  # each: hold.lua, then wait_on.lua
        enqueue_job(config, "a", NewJob(b"p", f"w{i}", after=("gate",)), client=r)
    registered = scripts_usec(r) - before
    assert r.hlen("{jobd:a}:held") == N
    before = scripts_usec(r)
    assert jobd_cli("cancel", "-c", c, "a", "gate").returncode == 0  # N release notices
    while store.move_follow_ups(q):  # unblock.lua each (dead-lettered `dependency`)
        pass
    told = scripts_usec(r) - before
    assert r.hlen("{jobd:a}:held") == 0, "every waiter was told of the gate's end"
    assert registered <= 5 * told, (
        f"registering {N} jobs after one gate took {registered / 1e6:.2f} s of scripts in "
        f"Redis, {registered / told:.0f} times telling them of its end ({told / 1e6:.2f} s)"
    )


def legacy(r: redis.Redis, key: str, dep: str, gone: str = "") -> list[dict]:
    """Rewrite ``dep``'s waiters as a jobd before review 35k kept them: one field DEP, a line
    each; ``gone`` a hold token marked gone (unwait.lua's DEP\\0gone: "LINES MARKED\\n" then
    a token a line). The waiters, decoded."""
    lines = waiter_lines(r, key, dep)
    for field in r.hkeys(key):
        if field.startswith(dep.encode() + b"\0"):
            r.hdel(key, field)
    r.hset(key, dep, b"".join(x + b"\n" for x in lines))
    if gone:
        r.hset(key, dep + "\0gone", f"{len(lines)} 1\n{gone}\n")
    return [json.loads(x) for x in lines]


def test_waiters_registered_in_the_format_before_are_told_once(
    r: redis.Redis, write_config
) -> None:
    """An upgrade: waiters a daemon of the previous version registered (all in one field) are
    registered once when sent again, taken off by an unwait notice, and told of their job's
    end (a hold marked gone not told), every field going with the end."""
    c = str(write_config(CONFIG))
    config = load(c)
    q, key = config.queues["a"], "{jobd:a}:waiters"
    store = Store(r, "daemon")
    for gate in ("g1", "g2"):
        out = jobd_cli("enqueue", "-c", c, "a", "g", "--job-id", gate, "--delay", "1h")
        assert out.returncode == 0, out.stderr
    for i in range(4):
        enqueue_job(config, "a", NewJob(b"p", f"w{i}", after=("g1",)), client=r)
    for i in range(2):
        enqueue_job(config, "a", NewJob(b"p", f"v{i}", after=("g2",)), client=r)
    w = legacy(r, key, "g1", gone=json.loads(waiter_lines(r, key, "g1")[3])["hold"])
    legacy(r, key, "g2")
    enqueue_job(config, "a", NewJob(b"p", "w0", after=("g1",)), client=r)  # sent again
    assert [json.loads(x)["job"] for x in waiter_lines(r, key, "g1")] == ["w0", "w1", "w2"]
    assert not r.hexists(key, "g1") and not r.hexists(key, "g1\0gone"), "moved, once"
    assert store.unwait(q, "g1", "w1", w[1]["hold"]) == 1  # w1's hold ended where it waited
    assert store.unwait(q, "g1", "w1", w[1]["hold"]) == 0
    for gate in ("g1", "g2"):  # g2's waiters still in the format before
        assert jobd_cli("cancel", "-c", c, "a", gate).returncode == 0
        while store.move_follow_ups(q):
            pass
    held = {j.decode() for j in r.hkeys("{jobd:a}:held")}
    assert held == {"w1", "w3"}, "w0, w2, v0, v1 told (dead-lettered `dependency`), once"
    dead = [f[b"jobd_job_id"].decode() for _, f in r.xrange(q.dead_letter.stream)]
    assert sorted(dead) == ["v0", "v1", "w0", "w2"]
    assert r.hlen(key) == 0
