"""Review 36f: one registry record's ``queues_sha`` gives every daemon of that digest its queues.

2600c0c: a beat writes its queues' SHA-1 (``queues_sha``) and a listing reads the ``queues`` of
records of the same digest once, in the newest beat's row (``daemons_listed.lua``), and
``registry.listing`` gives that text to every older record naming the digest. Neither checks
that the text read has that digest (Lua has ``redis.sha1hex``; Python ``hashlib``): the digest
is only a field of the record, readable by anyone listing the registry and writable by anyone
who can write to Redis (the registry holds whatever anyone wrote: the listing's docs take care
that such a record is "listed with a problem", never trusted).

So a stranger's record (any name, beating a little newer than the fleet) that copies the
fleet's ``queues_sha`` and holds its own ``queues`` text makes every real daemon of the fleet
listed as serving the stranger's queues, and none of their own: the queue pages then list no
daemon serving them (``registry.serving``), the overview counts no slots and shows the queue
``stalled``. And a record naming the digest with no ``queues`` at all leaves the whole fleet
``queues: []``, ``queues_read: false``.
"""

from __future__ import annotations

import orjson
import redis

from jobd.store import registry
from jobd.store.keys import DAEMONS
from jobd.store.registry import Beat, Served
from jobd.store.store import Store

SERVED = (Served("orders", "jobd:orders", "jobd", 8),)
FAKE = [{"name": "stranger", "stream": "jobd:stranger", "group": "jobd", "concurrency": 1}]


def _fleet(r: redis.Redis) -> bytes:
    store = Store(r)
    beat = Beat(host="worker-1", pid=4242, version="1.0.0", process=None, queues=SERVED,
                running=0, slots=8, beat_every_ms=5000, lease_ms=60000, keep_ms=600000,
                state="running")  # fmt: skip
    store.beat("worker-1-4242-0123abcd", beat)
    return r.hget(registry.daemon_record("worker-1-4242-0123abcd"), "queues_sha")


def _stranger(r: redis.Redis, digest: bytes, queues: bytes | None) -> None:
    seconds, _ = r.time()
    name = "stranger-1-1-ffff"
    fields = {"host": "stranger", "pid": 1, "version": "1.0.0", "state": "running",
              "queues_sha": digest}  # fmt: skip
    if queues is not None:
        fields["queues"] = queues
    r.hset(registry.daemon_record(name), mapping=fields)
    r.zadd(DAEMONS, {name: int(seconds) * 1000 + 1000})  # a little newer than the fleet's beat


def _worker(r: redis.Redis) -> dict:
    listed = registry.listing(r)["daemons"]
    return next(d for d in listed if d["name"] == "worker-1-4242-0123abcd")


def test_a_strangers_record_does_not_give_a_daemon_its_queues(r: redis.Redis) -> None:
    digest = _fleet(r)
    assert digest and len(digest) == 40
    _stranger(r, digest, orjson.dumps(FAKE))
    worker = _worker(r)
    names = [q["name"] for q in worker["queues"]]
    # Expected: the daemon is listed with the queues its own record holds.
    assert names == ["orders"], (
        f"worker-1 is listed serving {names} (a stranger's record's queues, of the same "
        f"queues_sha, never checked): it serves ['orders']; problems {worker['problems']}"
    )


def test_a_strangers_digest_without_queues_does_not_hide_a_daemons_queues(
    r: redis.Redis,
) -> None:
    digest = _fleet(r)
    _stranger(r, digest, None)
    worker = _worker(r)
    # Expected: its own queues, read (they are 80 bytes, and the listing's bytes barely touched).
    assert worker["queues_read"] and [q["name"] for q in worker["queues"]] == ["orders"], (
        f"worker-1 is listed with queues {worker['queues']}, queues_read "
        f"{worker['queues_read']}: a stranger's record naming its digest, without queues, "
        "marked them read"
    )
