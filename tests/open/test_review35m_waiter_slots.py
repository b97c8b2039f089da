"""Review 35m: lib/workflows.lua gives each waiter of a job a slot, JOB\\0SLOT, numbered from
JOB\\0n's HIGH, which only grows while one waiter is left (drop_waiter lowers LIVE, never
HIGH; the counter goes only with the last waiter). ``ended`` then walks slots 1..HIGH, an HGET
each: its cost is that of every registration ever made while one waiter stayed (a job waited
for by one long job while others are enqueued --after it and cancelled, or held and released,
for weeks), not of the waiters left; and a JOB\\0n someone wrote ("9999999999 1") makes the end
of that job loop in Redis for hours, after its first write (no SCRIPT KILL). Fix idea: keep
the live slots in a set or list (JOB\\0s) and walk it, or cap HIGH and renumber when it
exceeds twice LIVE; read HIGH only up to a bound."""

from __future__ import annotations

import redis

from jobd.store.scripts import source

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
