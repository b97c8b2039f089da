"""Review 35m: lib/workflows.lua gives each waiter of a job a slot, JOB\\0SLOT, numbered from
JOB\\0n's HIGH, which only grows while one waiter is left (drop_waiter lowers LIVE, never
HIGH; the counter goes only with the last waiter). ``ended`` then walks slots 1..HIGH, an HGET
each: its cost is that of every registration ever made while one waiter stayed (a job waited
for by one long job while others are enqueued --after it and cancelled, or held and released,
for weeks), not of the waiters left; and a JOB\\0n someone wrote ("9999999999 1") makes the end
of that job loop in Redis for hours, after its first write (no SCRIPT KILL). Fix idea: keep
the live slots in a set or list (JOB\\0s) and walk it, or cap HIGH and renumber when it
exceeds twice LIVE; read HIGH only up to a bound.

Fixed: a waiter taken off has the last slot's moved into its own (lib/workflows.lua
fill_slot), so slots stay 1..LIVE; the end walks until LIVE waiters are found or past 64 empty
slots."""

from __future__ import annotations

import json
import random

import redis
from support import jobd_cli, waiter_lines

from jobd.config import load
from jobd.newjob import NewJob
from jobd.producer import enqueue_job
from jobd.store.scripts import source
from jobd.store.store import Store

W = "{q}:waiters"


def wait(r: redis.Redis, job: str, holder: str, token: str) -> None:
    line = f'{{"job": "{holder}", "hold": "{token}"}}'
    ks = ["{q}:history", W, "{q}:active", "{q}:mark", "{q}:stream"]
    assert r.eval(source("wait_on"), len(ks), *ks, job, line, "g", holder, token) == [b"waiting"]


def unwait(r: redis.Redis, job: str, holder: str, token: str) -> None:
    assert r.eval(source("unwait"), 1, W, job, holder, token) == 1


def test_slots_walked_at_the_end_grow_with_past_registrations_not_live_ones(
    r: redis.Redis,
) -> None:
    wait(r, "dep", "long", "aa")  # one waiter stays throughout
    for i in range(200):
        wait(r, "dep", f"h{i}", f"{i:04x}")
        unwait(r, "dep", f"h{i}", f"{i:04x}")
    high, live = r.hget(W, "dep\0n").split()
    assert int(live) == 1
    assert int(high) <= 2, f"ended() would walk {int(high)} slots for {int(live)} waiter"


def slots(r: redis.Redis, key: str, job: str) -> tuple[int, int, list[int]]:
    """HIGH, LIVE and the slot numbers that hold a waiter of ``job``."""
    high, live = (int(x) for x in (r.hget(key, f"{job}\0n") or b"0 0").split())
    held = sorted(int(f[len(job) + 1 :]) for f in r.hkeys(key) if f[len(job) + 1 :].isdigit()
                  and f.startswith(job.encode() + b"\0"))  # fmt: skip
    return high, live, held


def test_waiters_taken_off_in_any_order_leave_the_rest_in_slots_one_to_live_all_told(
    r: redis.Redis, write_config
) -> None:
    """Each waiter taken off has the last slot's moved into its own (slots stay 1..LIVE, each
    name's index saying its slot); the job's end tells exactly the waiters left, once each."""
    c = str(write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"))
    config = load(c)
    q, key = config.queues["a"], "{jobd:a}:waiters"
    store = Store(r, "daemon")
    assert (
        jobd_cli("enqueue", "-c", c, "a", "g", "--job-id", "gate", "--delay", "1h").returncode == 0
    )
    for i in range(40):
        enqueue_job(config, "a", NewJob(b"p", f"w{i}", after=("gate",)), client=r)
    holds = {json.loads(x)["job"]: json.loads(x)["hold"] for x in waiter_lines(r, key, "gate")}
    off = random.Random(35).sample(sorted(holds), 25)
    for job in off:
        assert store.unwait(q, "gate", job, holds[job]) == 1
        high, live, held = slots(r, key, "gate")
        assert high == live and held == list(range(1, live + 1)), (high, live, held)
        for line in waiter_lines(r, key, "gate"):  # every index names the slot it is in
            assert json.loads(line)["job"] not in off[: off.index(job) + 1]
    assert len(waiter_lines(r, key, "gate")) == 15
    assert jobd_cli("cancel", "-c", c, "a", "gate").returncode == 0
    while store.move_follow_ups(q):
        pass
    dead = sorted(f[b"jobd_job_id"].decode() for _, f in r.xrange(q.dead_letter.stream))
    assert dead == sorted(set(holds) - set(off)), "the waiters left told, once each"
    assert {j.decode() for j in r.hkeys("{jobd:a}:held")} == set(off)
    assert r.hlen(key) == 0


def test_a_count_someone_wrote_walks_a_bounded_number_of_slots(
    r: redis.Redis, write_config
) -> None:
    """JOB\\0n written as "2000000 1" (not jobd's): the end reads the one waiter and stops,
    in well under 0.2 s (it walked every slot number before: seconds; 9999999999, hours)."""
    c = str(write_config("redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"))
    config = load(c)
    q, key = config.queues["a"], "{jobd:a}:waiters"
    assert (
        jobd_cli("enqueue", "-c", c, "a", "g", "--job-id", "gate", "--delay", "1h").returncode == 0
    )
    enqueue_job(config, "a", NewJob(b"p", "w", after=("gate",)), client=r)
    r.hset(key, "gate\0n", "2000000 1")
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    assert jobd_cli("cancel", "-c", c, "a", "gate").returncode == 0
    worst = max(e["duration"] for e in r.slowlog_get(128))
    r.config_set("slowlog-log-slower-than", 10000)
    assert worst < 200_000, f"a command of the cancel ran {worst} µs"
    while Store(r, "daemon").move_follow_ups(q):
        pass
    assert r.xlen(q.dead_letter.stream) == 1
