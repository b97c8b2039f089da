"""Limits and leases, the scripts' edge cases, against a real Redis: a release of more slots
than Lua can unpack, a renewal racing a hand-back, and the waiting consumers of `jobd status`
that stopped or died."""

from __future__ import annotations

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
    keys = ["jobd:q", queue.keys.stats(), queue.keys.cancels, *notes.keys(queue)]
    note = ["handed back", handed, "", b'{"event":"handed back"}', 0]  # lua/lib/jobs.lua note_at
    args = ["jobd", "me", 60, 0, notes.settings(queue), "back", handed, 0, -1, *note]
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
