"""No script fails half-way (issue 32, point 3's audit): `redis.call` aborts a script with its
earlier writes applied, so a call that can fail (someone else's key of another type at one of
jobd's names, a value that is no number) never comes after a write.

Each test plants such a key through a real daemon, or calls the store on the session's private
Redis, and shows what the half-done script did before: a batch run whole with a cancelled job
in it, a queue that never reads, a --unique id refused for days, a periodic tick lost, an entry
stranded until reclaim_after, a lost lease never reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_group, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
echo "start $JOBD_JOB_ID" >> {dir}/ran
case "$JOBD_JOB_ID" in long*) sleep 60 & wait ;; esac
echo "done $JOBD_JOB_ID" >> {dir}/ran
"""


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran"
    return path.read_text().splitlines() if path.exists() else []


def handler(script, tmp_path: Path) -> Path:
    return script("h.sh", HANDLER.format(dir=tmp_path))


def plant_stats(r: redis.Redis) -> None:
    """A string at the queue's counters of this minute and the next few (keys.stats)."""
    minute = int(time.time() // 60)
    for m in range(minute - 1, minute + 4):
        r.set(f"{{jobd:q}}:stats:{m}", "someone else's")


def test_counters_of_another_type_never_run_a_cancelled_job_nor_fail_a_settle(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """cancelled.lua counted with HINCRBY after its XACK: a string at the minute's counters
    failed it, and the reader ran the batch, the cancelled job included."""
    config = write_config(queue_config(f"[{handler(script, tmp_path)}]", concurrency=2))
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    waiting = r.xadd("jobd:q", {"payload": "x"}).decode()
    r.xadd("jobd:q", {"payload": "x", "job_id": "other"})
    assert jobd_cli("cancel", "-c", str(config), "q", waiting).returncode == 0
    plant_stats(r)
    d = daemon(config)
    wait_until(lambda: "done other" in ran(tmp_path), what="the other job")
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="every ack")
    assert f"start {waiting}" not in ran(tmp_path), ran(tmp_path)
    d.wait_log(f"job={waiting} attempt=1 cancelled (jobd cancel) before it started")
    out = jobd_cli("job", "-c", str(config), "q", "other")
    assert b"done" in out.stdout.split(b"\n")[0], out.stdout
    assert "WRONGTYPE" not in d.log()


def test_limit_keys_of_another_type_are_replaced_and_the_queue_runs(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """acquire.lua took slots (ZADD) and tokens (HSET), then read the waiting consumers with
    HGETALL: a string there failed every call, slots and tokens taken, and the queue never
    read again."""
    config = write_config(
        queue_config(
            f"[{handler(script, tmp_path)}]",
            concurrency=2,
            limits="{concurrency: 4, rate: 100/1s}",
        )
    )
    for name in ("waiting", "rate"):
        r.set(f"{{jobd:q}}:{name}", "someone else's")
    r.hset("{jobd:q}:running", "not", "a sorted set")
    daemon(config)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "limited"})
    wait_until(lambda: "done limited" in ran(tmp_path), what="the job of the limited queue")


def test_a_stream_of_another_type_never_leaves_a_unique_id_refused(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """enqueue_unique.lua set the 'queued' mark, then XADD failed: the job was not added, and
    its id was refused as a duplicate for UNIQUE_TTL (7 days)."""
    config = write_config(queue_config(f"[{handler(script, tmp_path)}]"))
    enqueue = ("enqueue", "-c", str(config), "q", "x", "--job-id", "u1", "--unique")
    r.set("jobd:q", "someone else's")
    refused = jobd_cli(*enqueue)
    assert refused.returncode != 0 and b"WRONGTYPE" in refused.stderr, refused
    assert not r.exists("{jobd:q}:job:u1"), "no mark for a job never added"
    r.delete("jobd:q")
    added = jobd_cli(*enqueue)
    assert added.returncode == 0, added
    assert r.xlen("jobd:q") == 1


def test_a_stream_of_another_type_never_loses_a_periodic_tick(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """tick.lua marked the tick taken (SET NX), then XADD failed: the tick was never enqueued
    by any daemon."""
    from jobd.config import load
    from jobd.store.store import Store

    q = load(str(write_config(queue_config(f"[{handler(script, tmp_path)}]")))).queues["q"]
    store = Store(r)
    at = int(time.time())
    r.set("jobd:q", "someone else's")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.tick(q, "nightly", at, {b"payload": b"x"}, 60_000, None)
    r.delete("jobd:q")
    assert store.tick(q, "nightly", at, {b"payload": b"x"}, 60_000, None).outcome == "added"
    assert r.xlen("jobd:q") == 1


def test_a_level_that_cannot_be_read_never_strands_what_another_level_delivered(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """read_levels.lua read the high level (delivered: pending on this consumer), then failed on
    the low one: the entries read were never handed to the reader, and waited for a reclaim.
    And a reader whose reclaim or read met the low level's key first went on failing at its
    group check (WRONGTYPE) for good, reading no level: the low level is set aside instead,
    the high one read, and the low one read again once its key is a stream again."""
    config = write_config(
        queue_config(
            f"[{handler(script, tmp_path)}]",
            concurrency=4,
            priorities="[high, low]",
            lease="{renew_every: 10s, reclaim_after: 60s}",
        )
    )
    d = daemon(config)
    wait_group(r, "{jobd:q}:priority:high")
    wait_group(r, "jobd:q")  # the low level is the queue's own stream
    r.delete("jobd:q")
    r.set("jobd:q", "someone else's")
    # The reader meets the key (its next reclaim or read) before the high level has a job.
    wait_until(lambda: "WRONGTYPE" in d.log(), what="the reader to meet the low level's key")
    r.xadd("{jobd:q}:priority:high", {"payload": "x", "job_id": "high-1"})
    wait_until(lambda: "done high-1" in ran(tmp_path), what="the high level's job to run")
    d.wait_log("level 'low': stream 'jobd:q' is a key of another type")
    r.delete("jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "low-1"})
    wait_until(lambda: "done low-1" in ran(tmp_path), what="the low level's job to run")
    d.wait_log("level 'low': stream 'jobd:q' readable again")


def test_a_running_set_of_another_type_still_reports_a_lost_lease(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """renew.lua renewed the leases (XCLAIM), then ZADDed their slots: a string at the running
    set failed every renewal after its writes, and the leases it found lost were never
    reported (the handler ran on beside its new owner's)."""
    config = write_config(
        queue_config(
            f"[{handler(script, tmp_path)}]",
            concurrency=2,
            limits="{concurrency: 2}",
            lease="{renew_every: 200ms, reclaim_after: 2s}",
        )
    )
    d = daemon(config)
    wait_group(r, "jobd:q")
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": "long-1"})
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-2"})  # still held: its slot is renewed
    wait_until(lambda: {"start long-1", "start long-2"} <= set(ran(tmp_path)), what="both")
    r.delete("{jobd:q}:running")
    r.set("{jobd:q}:running", "someone else's")  # every slot in use: no acquire replaces it
    r.xclaim("jobd:q", "jobd", "thief", 0, [mid])
    d.wait_log("lease lost: the entry now belongs to consumer thief")


def _store_and_queue(r: redis.Redis, write_config, script, tmp_path: Path, **settings: object):
    from jobd.config import load
    from jobd.store.store import Store

    config = write_config(queue_config(f"[{handler(script, tmp_path)}]", **settings))
    return Store(r), load(str(config)).queues["q"]


def test_histograms_with_a_field_that_is_no_number_take_the_other_counts(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """observe.lua stopped at a field someone else made no number, the counts before it
    added and the ones after it not, and failed."""
    store, q = _store_and_queue(r, write_config, script, tmp_path)
    key = q.keys.timings(int(r.time()[0]) // 60)
    r.hset(key, "run:0", "someone else's")
    store.scripts.observe(keys=[key], args=[3600, "wait:0", 1, "run:0", 1, "run:1", 1])
    assert r.hgetall(key) == {b"wait:0": b"1", b"run:0": b"someone else's", b"run:1": b"1"}


def test_a_stream_of_another_type_moves_no_delayed_member(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """promote.lua dead-lettered a malformed member and removed it, then failed on the next
    member's XADD: a call that failed had written."""
    store, q = _store_and_queue(r, write_config, script, tmp_path)
    r.zadd(q.keys.delayed, {b"not msgpack": 1, b"\x93\xa1u\xa7payload\xa1x": 2})
    r.set(q.stream, "someone else's")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.promote(q, 10, 60_000)
    assert r.zcard(q.keys.delayed) == 2 and not r.exists(q.dead_letter.stream)


def test_a_bucket_of_another_type_never_fails_a_bind_after_its_slots(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """bind.lua bound the slots, then read the bucket's tokens (HGET) to give back the unused
    ones: someone else's key there failed it, and the reader learnt nothing of the stream."""
    store, q = _store_and_queue(
        r, write_config, script, tmp_path, limits="{concurrency: 4, rate: 10/1s}"
    )
    newest = r.xadd(q.stream, {"payload": "x"}).decode()
    assert store.acquire(q, 2).granted == 2
    r.delete(q.keys.rate)
    r.rpush(q.keys.rate, "someone else's")
    assert store.bind(q, 2, []) == newest
    assert r.zcard(q.keys.running) == 0, "the unused slots given back"


def test_every_command_a_script_calls_is_in_the_documented_acl() -> None:
    """The ACL user of docs/operations/redis.md (``ACL_COMMANDS``) may run every command any
    script calls: HSCAN (lib/jobs.lua) and PTTL (keep_marks.lua) were missing, and under that
    user the scripts calling them failed with NOPERM."""
    import re

    from jobd.store.connection import ACL_COMMANDS

    lua = Path(__file__).resolve().parent.parent / "jobd" / "store" / "lua"
    called = {
        name.lower()
        for path in lua.rglob("*.lua")
        for name in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", path.read_text())
    }
    allowed = {command.split("|")[0] for command in ACL_COMMANDS}
    assert called and called <= allowed, sorted(called - allowed)
    documented = (lua.parent.parent.parent / "docs" / "operations" / "redis.md").read_text()
    assert all(f"+{command}" in documented for command in ACL_COMMANDS), "the docs' ACL line"
