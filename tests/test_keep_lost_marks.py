"""A job that keep.lua ends 'lost' takes its marks with it, as renew.lua's do: `jobd cancel`'s
'id:STREAM|ENTRY' and 'job:J' marks and its 'queued' --unique mark.

keep.lua (a daemon taking back its own running jobs after an outage: reader.py ``claim``,
store/reading.py ``keep``) ends 'lost' a job whose entry was deleted between the reclaim and it
(test_review35x_keep_purges_deleted.py). It passed lib/workflows.lua ``lost_end`` neither the
queue's cancellation marks nor the job's --unique mark, which renew.lua passes: the job's
'job:J' mark outlived it (J enqueued again within --unseen-for was acked unrun, cancelled) and
its --unique mark kept saying 'queued' (J sent again with --unique was refused for days). (It
passed no --unique marks at all, and lost_end indexed them: keep.lua failed on such an entry.)

Fixed (task f35z): store/reading.py ``keep`` takes the jobs as the reclaim read them and sends
the cancellation marks key and each --unique job's mark (a declared key, by index from ARGV, as
renew.lua's); keep.lua passes both to ``lost_end``."""

from __future__ import annotations

import redis
from support import jobd_cli, purges_deleted, queue_config, wait_until


def test_a_job_keep_ends_lost_leaves_no_cancel_mark_and_no_unique_mark(
    r: redis.Redis, write_config
) -> None:
    from jobd.cancel import cancel
    from jobd.config import load
    from jobd.job import Job
    from jobd.store.store import Store

    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    c = str(write_config(queue_config("[/bin/true]", lease=lease)))
    q = load(c).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    assert jobd_cli("enqueue", "-c", c, "q", "p", "--job-id", "U", "--unique").returncode == 0
    assert r.get("{jobd:q}:job:U") == b"queued"
    a = Store(r, "A")
    (entry,) = [mid.decode() for mid, _ in a.read_levels(q, 10).entries[0][1]]
    idle = lambda: r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["time_since_delivered"]  # noqa: E731
    wait_until(lambda: idle() >= 300, what="the lease lapsed (Redis away, say)")
    claimed = a.reclaim(q, "0-0", 10).claimed
    assert [c[0].decode() for c in claimed] == [entry]  # its own, still running: kept
    (found,) = cancel(a, q, ["U"], 3_600_000, "op@host")
    assert found.where == "running", found
    assert sorted(r.zrange("{jobd:q}:cancels", 0, -1)) == [b"id:jobd:q|" + entry.encode(),
                                                          b"job:U"]  # fmt: skip
    r.xdel("jobd:q", entry)  # between the reclaim and keep.lua
    kept = a.keep(q, [Job.from_entry(q.name, mid, fields) for mid, fields, _, _ in claimed])
    if not purges_deleted(r):  # 6.2: kept, pending with A; its outcome is its end (and marks')
        assert kept == 1
        return
    assert kept == 0
    assert r.xpending("jobd:q", "jobd")["pending"] == 0
    events = [f[b"event"] for _, f in r.xrange("{jobd:q}:events") if f.get(b"job") == b"U"]
    assert events.count(b"lost") == 1, events
    assert not r.zrange("{jobd:q}:cancels", 0, -1), "the end took the job's cancel marks"
    assert not r.exists("{jobd:q}:job:U"), "the end freed the job id's --unique mark"
    again = jobd_cli("enqueue", "-c", c, "q", "p", "--job-id", "U", "--unique")
    assert again.returncode == 0, (again.returncode, again.stdout, again.stderr)
