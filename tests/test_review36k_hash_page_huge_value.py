"""Review 36k of issue 36: one huge value in a queue's active hash, or in its hash of consumers
waiting for a limit, holds Redis about a second at each read of it (every summary, status
report, running tab).

``lib/shown.lua hash_read`` (running_shown.lua: the running jobs of every queue in
``/api/summary``, the running tab, ``jobd status``; hashes_shown.lua's '*' spec:
``status.hash_specs``' consumers waiting for a limit, read by every status report) reads the
hash in HSCAN pages and bounds the bytes read "one page more at most". But HSCAN returns each
field with its value whole, and a value may be of any size (anyone who can write to Redis can
HSET one; a hash of values over hash-max-listpack-value is a table, so ``listpack_bytes`` does
not look at it): one field of 128 MiB made each read take ~0.9 s here, though the value is
never returned (longer than the cap). running_shown.lua's header says "Whatever the hash holds
(100 000 records, a value of 500 MiB, someone else's), one call reads a bounded part of it".

What should happen: one read holds Redis a bounded time whatever a value's size (suggested fix:
take the names without their values, ``HRANDFIELD key N`` (distinct names, no values: 1 ms
here for the same hash; every name when the hash holds N or fewer, as the active hash of a
queue of up to RUNNING_READ slots does), then ``HSTRLEN`` each and ``HMGET`` those within the
cap, as hashes_shown.lua's ``known`` does for named fields; HSCAN only for a hash of more than
N fields, of which the page's values are counted). Bound here: 100 ms for one read.
"""

from __future__ import annotations

import time

import pytest
import redis

from jobd.store import history, scripts, status

VALUE = 64 << 20  # bytes of the one value someone HSET
WITHIN = 0.1  # seconds one read may hold Redis


def read_running(r: redis.Redis) -> object:
    args = [history.RUNNING_READ, 1 << 20, history.ACTIVE_CAP, history.RUNNING_PAGE]
    return scripts.call(r, "running_shown", ["active"], args)


def read_waiting(r: redis.Redis) -> object:
    return status.hashes_shown(r, ["active"], ["*"])


@pytest.mark.parametrize("read", [read_running, read_waiting], ids=["running_shown", "hash_star"])
def test_one_read_of_a_hash_is_bounded_whatever_a_value_holds(r: redis.Redis, read) -> None:  # type: ignore[no-untyped-def]
    r.hset("active", "job-1", b"x" * VALUE)
    read(r)  # the script loaded
    began = time.monotonic()
    read(r)
    took = time.monotonic() - began
    assert took < WITHIN, (
        f"one read of a hash holding one {VALUE >> 20} MiB value held Redis {took:.2f} s "
        f"(HSCAN's page carries the value whole, though it is never returned)"
    )
