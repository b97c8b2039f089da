"""low: keep.lua's XCLAIM takes a deleted entry out of the group and writes no end: a batch
member deleted between its own daemon's reclaim and keep.lua is never told to its batch or
waiters, and is recorded nowhere.

What is wrong. f35d rests on "the command that meets a deleted pending entry (XCLAIM in a
renewal or a hand-back, XAUTOCLAIM in a reclaim) takes it out of the PEL, inside the script that
sent it. So that script, and only it, writes the end 'lost'" (docs/design/diary.md). keep.lua is
one more such script, and was left out: when a daemon's reclaim takes back its own running jobs
(their lease lapsed while Redis was away, docs/guarantees.md), the reader calls keep.lua
(reader.py ``claim``: ``self.store.keep(q, own)``, after hand_over) to renew them with
``XCLAIM … 0 id RETRYCOUNT n JUSTID``. On Redis 7.0+ (and Valkey) that XCLAIM purges an entry
whose data was deleted since the reclaim read it, and keep.lua counts it kept and writes
nothing. The renewal after it finds the entry pending nowhere ("settled": no record), no reclaim
ever sees it again: the job ends with no end, its batch never completes (it expires), its
waiters wait for their bound.

Reproduce (Redis 7.0 and Valkey 8.1, the store's scripts, as the reader calls them): consumer A reads a batch
member; its lease lapses; A's own reclaim takes it back (its data still there); the entry is
deleted (XDEL); A's keep.lua; A's renewal. No 'lost' event, no notice to the batch, nothing
pending.

What should happen: keep.lua records 'lost' for an entry its XCLAIM does not return, as renew.lua
does (lib/workflows.lua lost_end, with the taken hash and the waiters and outbox keys), or uses a
form that does not purge (XCLAIM without JUSTID still purges on 7.0; check XRANGE first and leave
a deleted entry to the renewal, which then purges and records it).

Why it matters: narrow (a deletion in the window between two calls of one reader pass, after an
outage longer than reclaim_after), but the end is lost for good, with no trace and no log line,
which is the very thing f35d set out to end.

Fixed (keep.lua; store/reading.py keep; daemon/reader.py): keep.lua ends 'lost' each entry its
XCLAIM returns nothing for (lib/workflows.lua lost_end, with the job ids the reader sends, the
history, waiters, outbox and taken keys), as renew.lua does. On Redis 6.2 its XCLAIM … JUSTID
keeps a deleted entry: A's renewals keep it too and its handler's outcome is the end (checked
here on 6.2)."""

from __future__ import annotations

import redis
from support import purges_deleted, queue_config, wait_until


def test_an_entry_deleted_before_keep_ends_lost_told_to_its_batch(
    r: redis.Redis, write_config
) -> None:
    from jobd.config import load
    from jobd.job import Job
    from jobd.store.store import Store

    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    q = load(str(write_config(queue_config("[/bin/true]", lease=lease)))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="$", mkstream=True)
    member = r.xadd("jobd:q", {"payload": "x", "job_id": "m", "jobd_batch": "B"}).decode()
    a = Store(r, "A")
    (read,) = a.read_levels(q, 10).entries[0][1]
    assert read[0].decode() == member
    assert r.hexists("{jobd:q}:taken", f"jobd:q|{member}")
    idle = lambda: r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["time_since_delivered"]  # noqa: E731
    wait_until(lambda: idle() >= 300, what="the lease lapsed (Redis away, say)")
    claimed = a.reclaim(q, "0-0", 10).claimed
    assert [c[0] for c in claimed] == [
        member.encode()
    ]  # its own, still running: the reader keeps it
    r.xdel("jobd:q", member)  # between the reclaim and keep.lua
    a.keep(q, [Job.from_entry(q.name, mid, fields) for mid, fields, _, _ in claimed])
    a.renew_telling(q, [member], [], ["m"])
    Store(r, "B").reclaim(q, "0-0", 10)
    lost = [f for _, f in r.xrange("{jobd:q}:events") if f[b"event"] == b"lost"]
    notices = [f for _, f in r.xrange("{jobd:q}:outbox")]
    if not purges_deleted(r):  # 6.2: kept, renewed, pending with A; its outcome is its end
        assert r.xpending_range("jobd:q", "jobd", "-", "+", 9)[0]["consumer"] == b"A"
        assert (lost, notices) == ([], [])
        return
    assert r.xpending("jobd:q", "jobd")["pending"] == 0  # out of the group: no one will tell
    assert [(f[b"job"], f[b"batch"]) for f in lost] == [(b"m", b"B")], lost
    assert [(n[b"kind"], n[b"outcome"]) for n in notices] == [(b"batch", b"failed")], notices
