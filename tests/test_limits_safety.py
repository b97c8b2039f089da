"""Limits and leases, the scripts' edge cases, against a real Redis: a release of more slots
than Lua can unpack, a renewal racing a hand-back, and the waiting consumers of `jobd status`
that stopped or died."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, queue_config, wait_until

from jobd.config import QueueConfig, load
from jobd.daemon import limits
from jobd.store import notes
from jobd.store.keys import slot_member
from jobd.store.leases import WAITING_STALE
from jobd.store.scripts import Batch, Scripts
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]


@pytest.fixture
def queue(tmp_path: Path, redis_server) -> QueueConfig:
    path = tmp_path / "c.yaml"
    path.write_text(
        f"redis: {{url: '{redis_server.url}'}}\n"
        "queues:\n  q: {command: [/bin/true], limits: {concurrency: 2}}\n"
    )
    return load(str(path)).queues["q"]


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def read(r: redis.Redis, count: int, consumer: str = "me") -> list[str]:
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for i in range(count):
        r.xadd("jobd:q", {"payload": str(i)})
    reply = r.xreadgroup("jobd", consumer, {"jobd:q": ">"}, count=count)
    return [mid.decode() for mid, _ in reply[0][1]]


# -- release.lua -----------------------------------------------------------------------------


def test_a_release_frees_more_slots_than_lua_can_unpack(r: redis.Redis, queue) -> None:
    members = [slot_member("me", "jobd:q", f"{i}-0") for i in range(9000)]
    for first in range(0, len(members), 1000):
        r.zadd(queue.keys.running, dict.fromkeys(members[first : first + 1000], 1e13))
    freed = Scripts(r).release(keys=[queue.keys.running], args=members)
    assert freed == 9000
    assert r.zcard(queue.keys.running) == 0


# -- renew.lua after a hand-back -------------------------------------------------------------


def test_a_renewal_after_a_hand_back_leaves_the_entry_reclaimable_at_once(
    r: redis.Redis, queue
) -> None:
    """The recorder hands an entry back (and frees its slot) while the ticker's renewal, with
    a snapshot of the held ids taken before, runs after it: the renewal must not take the entry
    back (reset its idle time) nor re-add its slot."""
    kept, handed = read(r, 2)
    scripts = Scripts(r)
    slot = slot_member("me", "jobd:q", handed)
    r.zadd(queue.keys.running, {slot: redis_ms(r) + 60_000})
    snapshot = [kept, handed]
    outcome = Batch()  # what the recorder sends: settle 'back', then the slot's release
    keys = ["jobd:q", queue.keys.stats(int(r.time()[0]) // 60), queue.keys.cancels, *notes.keys(queue),
            queue.keys.waiters, queue.keys.outbox, queue.keys.taken]  # fmt: skip
    note = ["handed back", handed, "", b'{"event":"handed back"}', 0]  # lua/lib/jobs.lua note_at
    args = ["jobd", "me", 60, 0, notes.settings(queue), 0, "back", handed, 0, -1, *note, 0]
    outcome.add(scripts.settle, keys, args)
    outcome.add(scripts.release, [queue.keys.running], [slot])
    assert outcome.run(r) == [[], 1]
    lost = Store(r, "me").renew(queue, snapshot)
    assert [(x.message_id, x.owner) for x in lost] == [(handed, "")]
    assert r.zscore(queue.keys.running, slot) is None, "the handed-back entry's slot re-added"
    assert r.zscore(queue.keys.running, slot_member("me", "jobd:q", kept)) is not None
    # Any consumer takes it now, not a reclaim_after later.
    min_idle = int(queue.lease.reclaim_after * 1000)
    claimed = r.xautoclaim("jobd:q", "jobd", "other", min_idle, "0-0", justid=True)
    assert [c.decode() for c in claimed] == [handed]


# -- the waiting hash ------------------------------------------------------------------------


def test_acquire_prunes_waiting_fields_of_readers_that_stopped_asking(
    r: redis.Redis, queue
) -> None:
    now = redis_ms(r)
    r.hset(
        queue.keys.waiting,
        mapping={
            "dead": f"slot {now - 3600_000}",  # a consumer SIGKILLed an hour ago
            "garbled": "nonsense",
            "alive": f"rate {now - 1000}",  # asked a second ago
        },
    )
    limiter = limits.Limiter(Store(r, "me"), queue)
    assert limiter.acquire(1)[0] == 1
    assert r.hgetall(queue.keys.waiting) == {b"alive": f"rate {now - 1000}".encode()}
    # Both slots taken: this one waits, and is listed with Redis's time; the hash expires
    # once no reader refreshes it (every daemon gone).
    assert limits.Limiter(Store(r, "other"), queue).acquire(1)[0] == 1
    assert limiter.acquire(1)[0] == 0
    reason, at = r.hget(queue.keys.waiting, "me").split()
    assert reason == b"slot" and abs(int(at) - redis_ms(r)) < 1000
    assert 0 < r.pttl(queue.keys.waiting) <= WAITING_STALE * 1000


def test_a_stopping_reader_removes_its_waiting_field(r: redis.Redis, queue) -> None:
    r.hset(queue.keys.waiting, mapping={"me": f"slot {redis_ms(r)}", "other": "slot 1"})
    limits.Limiter(Store(r, "me"), queue).leave()
    assert r.hkeys(queue.keys.waiting) == [b"other"]
    # Redis away: no error, the field goes stale
    limits.Limiter(Store(redis.Redis(port=1), "me"), queue).leave()


def test_status_stops_listing_a_dead_daemon_as_waiting(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(queue_config("[/bin/true]", limits="{concurrency: 2}"))
    r.hset("{jobd:q}:waiting", "ghost-123-abcd", f"slot {redis_ms(r) - 3600_000}")
    status = jobd_cli("status", "-c", str(config))
    assert b"consumer ghost-123-abcd waiting for a slot" in status.stdout
    daemon(config)  # an idle reader asks for slots before each read: it prunes the field
    wait_until(lambda: not r.hexists("{jobd:q}:waiting", "ghost-123-abcd"), 10, "the field pruned")
    assert b"ghost" not in jobd_cli("status", "-c", str(config)).stdout


# -- a reload that adds limits.concurrency -----------------------------------------------------


def test_a_reload_that_adds_a_concurrency_limit_counts_the_jobs_already_running(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Two jobs run on a queue with no limit; a reload sets limits.concurrency: 2. They held no
    cluster-wide slot (none existed): the new reader must count them before it takes one, or
    a third job starts, three running under a limit of two, until they end."""
    gate = tmp_path / "gate"
    script(
        "slow.sh",
        f'#!/bin/sh\np=$(cat)\necho "$p" >> {tmp_path}/started\n'
        f"while [ ! -e {gate} ]; do sleep 0.05; done\n",
    )
    settings = {"concurrency": 3, "lease": "{renew_every: 1s, reclaim_after: 3s}"}
    config = write_config(queue_config("[./slow.sh]", **settings))
    d = daemon(config)

    def started() -> list[str]:
        path = tmp_path / "started"
        return path.read_text().split() if path.exists() else []

    for i in range(2):
        r.xadd("jobd:q", {"payload": f"before-{i}"})
    wait_until(lambda: len(started()) == 2, what="two jobs running")
    write_config(queue_config("[./slow.sh]", limits="{concurrency: 2}", **settings))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done: q")
    r.xadd("jobd:q", {"payload": "after"})
    # The new reader either starts it (the limit exceeded) or is refused a slot, and says so.
    wait_until(
        lambda: "after" in started() or r.hexists("{jobd:q}:waiting", d.consumer()),
        what="the reader to start the job or wait for a slot",
    )
    assert sorted(started()) == ["before-0", "before-1"], "a third job ran under a limit of two"
    # The replaced reader may still have been blocked in its read when the job came: it read
    # it, and the loop hands it back ("limits set after it was read"); until that hand-back is
    # written, the renewal counts its slot too (3 for a moment: a slot too many refused, never
    # a job too many run). Once settled, the two running jobs hold the two slots.
    wait_until(lambda: r.zcard("{jobd:q}:running") == 2, what="the two running jobs' slots only")
    assert sorted(started()) == ["before-0", "before-1"], "a third job ran under a limit of two"
    gate.touch()
    wait_until(lambda: "after" in started(), what="the job to start once a slot is free")


def test_a_reload_moving_a_limited_queue_keeps_its_cluster_wide_limit(
    r: redis.Redis, daemon: Daemon, write_config, tmp_path: Path
) -> None:
    """Queue q (limits.concurrency 2, local concurrency 4) runs 2 jobs on stream s1; a reload
    moves it to s2 (same limit). The slots of the jobs still running live in ``{s1}:running``;
    the new reader counted ``{s2}:running`` only, so 2 more of q's jobs started: 4 handlers of
    q under a limit of 2. Now it binds them there too, and frees them once they end."""
    runs, go = tmp_path / "runs", tmp_path / "go"
    body = f"echo start >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done"

    def write(stream: str) -> Path:
        return write_config(
            f"""
            redis: {{url: '{{redis}}'}}
            queues:
              q: {{command: [sh, -c, '{body}'], concurrency: 4, stream: '{stream}',
                  limits: {{concurrency: 2}}}}
            """
        )

    def started() -> int:
        return runs.read_text().count("start") if runs.exists() else 0

    config = write("s1")
    d = daemon(config)
    for i in range(3):
        assert jobd_cli("enqueue", "-c", str(config), "q", f"j{i}").returncode == 0
    wait_until(lambda: started() == 2, what="2 running")
    write("s2")
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    for i in range(3, 5):
        assert jobd_cli("enqueue", "-c", str(config), "q", f"j{i}").returncode == 0
    # The new reader waits for a slot (acquire.lua found none free: its field in the waiting
    # hash), the two old jobs' slots bound in the new running set; nothing more started.
    wait_until(lambda: r.hlen("{s2}:waiting") == 1, what="the reader waiting for a slot")
    assert r.zcard("{s2}:running") == 2
    assert started() == 2, f"{started()} handlers of q at once under limits.concurrency 2"
    go.touch()  # the two old jobs end: their slots are freed here too, and j3, j4 start
    wait_until(lambda: started() == 4, what="the jobs read after the move")
    wait_until(lambda: r.zcard("{s2}:running") == 0, what="every slot freed")
