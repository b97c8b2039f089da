"""low: a job that ends 'lost' while `jobd cancel` has marked it leaves its 'job:JOB_ID' mark
behind: the same job id enqueued again within --unseen-for (1 h by default) is acked unrun as
cancelled.

What is wrong. `jobd cancel J` of a running job marks its entry ('id:STREAM|ENTRY') and its
job id ('job:J', for --unseen-for). Every other end takes both marks with it (settle.lua
``unmark``, dead_letter.lua, lib/jobs.lua cancelled_instead: "one left behind would cancel the
job's next enqueue, or a requeue"). The new end 'lost' does not: renew.lua and reclaim.lua
(lib/workflows.lua lost_end) write the end and leave the marks; the daemon's later 'cancel'
settle finds the entry pending nowhere and writes nothing. (The renewal also reports the
deleted entry twice, lost and cancelled: renew.lua builds ``cancelled`` from ``mine``, deleted
entries included.) So the job id's mark outlives its job, and a producer that sends J again
after seeing it 'lost' (the one thing to do with a lost job: its payload is gone) has it
cancelled unrun, with no cancel asked for it.

Reproduce (real Redis, the store's scripts, then a real daemon): consumer A reads J; `jobd
cancel J` marks it; its entry is deleted (XDEL) before A acts on the cancel; A's renewal takes
it out of the group and writes 'lost'. J is enqueued again: the daemon acks it unrun,
'cancelled (jobd cancel) before it started'.

What should happen: the step that writes 'lost' removes the entry's marks as every other end
does (the 'id:' mark, and 'job:J' of the job id it records the end under), so J sent again
runs; or, as cancelled_instead does for a marked job that ended another way, the marked job
ends 'cancelled' instead of 'lost', its marks removed, once.

Suggested fix: renew.lua and reclaim.lua pass the cancellation marks key to lost_end (renew.lua
has it: KEYS[2]; reclaim.lua would take it as one more key), and lost_job does ZREM marks
'id:STREAM|ENTRY' 'job:JOB' when the key is a zset; renew.lua builds ``cancelled`` from the
entries renewed, not from ``mine``.

Fixed (task f35xb): ``lost_job`` removes the entry's cancellation marks ('id:STREAM|ENTRY' and
'job:JOB') as every other end does: renew.lua and settle.lua pass their marks key, reclaim.lua
takes it as KEYS[9]. renew.lua reports as cancelled only the entries it renewed: the deleted
one is reported once, lost."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]


def test_a_job_lost_while_marked_cancelled_leaves_no_mark_on_its_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    from jobd.cancel import cancel
    from jobd.config import load
    from jobd.store.store import Store

    handler = script(
        "h.sh", '#!/bin/sh\ncat >/dev/null\necho "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"\n'
    )
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
    )
    c = str(cfg)
    q = load(c).queues["a"]
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "J").returncode == 0
    r.xgroup_create("jobd:a", "jobd", id="0")
    a = Store(r, "A")
    (entry,) = [mid.decode() for mid, _ in a.read_levels(q, 10).entries[0][1]]
    (found,) = cancel(a, q, ["J"], 3_600_000, "op@host")
    assert found.where == "running", found
    r.xdel("jobd:a", entry)
    lost = a.renew_telling(q, [entry], [], ["J"])[0]
    # Reported once, lost (not cancelled too: renew.lua's ``cancelled`` is of the entries renewed).
    assert [(x.message_id, x.cancelled) for x in lost] == [(entry, False)], lost
    assert not r.zrange("{jobd:a}:cancels", 0, -1), "the end took the job's marks with it"
    events = [f[b"event"] for _, f in r.xrange("{jobd:a}:events") if f.get(b"job") == b"J"]
    assert events.count(b"lost") == 1, events
    assert r.xpending("jobd:a", "jobd")["pending"] == 0
    # J ended ('lost'); the producer sends it again.
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "J").returncode == 0
    d = daemon(cfg)
    wait_until(lambda: json.loads(r.hget("{jobd:a}:history", "J").splitlines()[-1])["event"]
               != "lost", 15, what="J, enqueued again, settled")  # fmt: skip
    last = json.loads(r.hget("{jobd:a}:history", "J").splitlines()[-1])
    runs = (tmp_path / "runs").read_text().split() if (tmp_path / "runs").exists() else []
    assert "cancelled (jobd cancel) before it started" not in d.log(), last
    assert runs == ["J"], last
    assert last["event"] == "done", last
