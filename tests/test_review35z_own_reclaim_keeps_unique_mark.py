"""medium: a live daemon with a free slot ends its own deleted --unique job 'lost' through its
reclaim pass, not its renewal, and the job's 'queued' mark stays for 7 days: the f35xb fix
(lost_job deletes the mark) holds only when the daemon's every slot is busy.

What is wrong. f35xb has the holder send each held --unique job's mark with its renewal
(lease.py ``Holdings.job_ids``, renew.lua KEYS[11..]) and with a hand-back, so that the step that
ends a deleted job 'lost' deletes the mark while it says 'queued'. reclaim.lua cannot (its
caller passes ``uniques = {}``: "a reclaimer cannot know the mark of an entry it never read").
But on Redis 7.0+ XAUTOCLAIM takes a deleted pending entry out of the group whatever its idle
time and whoever holds it (t_stream.c checks the entry exists before min-idle-time), and the
daemon's own reader runs a reclaim pass every ``min(1 s, reclaim_after / 4)`` while a slot is
free (reader.py ``fill``: RECLAIM_EVERY), against a renewal every ``renew_every`` (10 s by
default). So with concurrency 2 or more, the holder's own reclaim nearly always reaches the
deleted entry first: reclaim.lua writes 'lost' (under the job id its running record gives) and
leaves the mark 'queued' with its 7-day life; the renewal later finds nothing to do. The
reproduction of f35x (tests/test_review35x_lost_unique_mark.py) uses concurrency 1 with its
one job running, so no reclaim pass runs there. Likely the same (not checked here) for the job
id of a just-started job (f35xb's other half): the reclaim records it under the entry id.

Reproduce (real daemon, real Redis 7.0; default lease, 10 s / 60 s; concurrency 2): `jobd
enqueue --unique --job-id U`; once its handler has run half a second, its entry is deleted
(XDEL); within a second U's history says 'lost' (the reader's reclaim); `jobd enqueue --unique
--job-id U` again exits 3 (Duplicate), {jobd:a}:job:U still 'queued', TTL ~7 days.

What should happen: the job id is free as soon as its end 'lost' is written, whichever of the
holder's steps writes it (renewal, hand-back, keep, or its own reclaim); the second enqueue
exits 0 and U runs again.

Why it matters: the case f35x set out to mend (a producer resending a lost --unique job is
refused for a week) stays the usual outcome for any queue with concurrency > 1, which is most.

Every other daemon's reclaim pass does the same to the holder's entry (a second daemon on the
queue: its passes run every second whatever it holds), so a holder-side fix alone leaves the
multi-daemon case as it is.

Suggested fix: the read that takes a --unique job (read_levels.lua, reclaim.lua: its entry
has jobd_unique) notes it in the taken hash as it notes a workflow job (lib/workflows.lua
take_note), so that any step that ends the entry 'lost' knows its job id and that it is
--unique; reclaim.lua returns those job ids with its deleted ids, and its caller frees each
mark in a call of its own (a declared key: store/keys.py job_mark; deleted only while it says
'queued'; a daemon dying in between leaves the mark to its TTL, as now). Narrower: the reader
sends its own held entries' marks and job ids (Holdings ``_Held.mark``, ``_Held.job_id``)
with its reclaim, as renew.lua takes them; that covers a lone daemon only.

Fixed (task f35zz), as suggested: the read that takes a --unique job (read_levels.lua,
reclaim.lua: lib/workflows.lua ``take_note``) writes its taken record (a fourth element, 1:
--unique); ``lost_end`` returns the job ids of the --unique jobs it ended whose mark it was not
sent, reclaim.lua replies them (``Reclaimed.unfreed``), and the reader frees their marks in a
call of its own (store/reading.py ``free_lost_marks``, lua/lost_marks.lua: each deleted while
it says 'queued'), for its own held jobs and any other daemon's alike (the second test here, on
6.2 and 7.0). A daemon dying between the two calls leaves the marks to expire, as before. The
taken record of a --unique job goes with its end (settle.lua, dead_letter.lua ``untake``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, purges_deleted, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
[ -e "$(dirname "$0")/once" ] && exit 0
touch "$(dirname "$0")/once"
exec sleep 60
"""


def test_a_unique_job_its_own_daemon_reclaims_lost_can_be_sent_again(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    if not purges_deleted(r):
        pytest.skip("Redis 6.2: a reclaim takes a deleted entry only once idle past reclaim_after")
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    concurrency: 2\n    lease: {renew_every: 10s, reclaim_after: 60s}\n"
    )
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "U", "--unique").returncode == 0
    d = daemon(cfg)
    wait_until(lambda: r.hexists("{jobd:a}:active", "U"), what="U running, its record written")
    (entry,) = [mid for mid, _ in r.xrange("jobd:a")]
    r.xdel("jobd:a", entry)
    d.wait_log("was pending but its data is gone")  # the reader's reclaim pass, not the renewal
    last = lambda: json.loads((r.hget("{jobd:a}:history", "U") or b"{}").splitlines()[-1])  # noqa: E731
    wait_until(lambda: last().get("event") == "lost", 5, what="U ended 'lost' (by the reclaim)")
    again = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "U", "--unique")
    assert again.returncode == 0, (again.returncode, again.stderr,
                                   r.get("{jobd:a}:job:U"), r.pttl("{jobd:a}:job:U"))  # fmt: skip
    wait_until(lambda: (tmp_path / "runs").read_text().split() == ["U", "U"], 10,
               what="U sent again, run")  # fmt: skip


def test_another_daemons_reclaim_of_a_deleted_unique_job_frees_its_mark(
    r: redis.Redis, write_config
) -> None:
    """A --unique job read by consumer A (which died), its entry deleted, its lease lapsed: B's
    reclaim ends it 'lost' under its job id (its taken record) and replies its job id, whose
    mark ``free_lost_marks`` then deletes; the job id can be sent again (6.2 and 7.0)."""
    from jobd.config import load
    from jobd.store.store import Store

    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    c = str(write_config(queue_config("[/bin/true]", lease=lease)))
    q = load(c).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    assert jobd_cli("enqueue", "-c", c, "q", "p", "--job-id", "U", "--unique").returncode == 0
    (entry,) = [mid.decode() for mid, _ in Store(r, "A").read_levels(q, 10).entries[0][1]]
    r.xdel("jobd:q", entry)
    idle = lambda: r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["time_since_delivered"]  # noqa: E731
    wait_until(lambda: idle() >= 300, what="A's lease lapsed")
    b = Store(r, "B")
    got = b.reclaim(q, "0-0", 10)
    assert (got.claimed, got.deleted, got.unfreed) == ([], [entry], [b"U"])
    lost = [f[b"job"] for _, f in r.xrange("{jobd:q}:events") if f[b"event"] == b"lost"]
    assert lost == [b"U"]
    assert r.get("{jobd:q}:job:U") == b"queued"  # until the second call
    assert b.free_lost_marks(q, got.unfreed) == 1
    assert not r.exists("{jobd:q}:job:U") and not r.exists("{jobd:q}:taken")
    again = jobd_cli("enqueue", "-c", c, "q", "p", "--job-id", "U", "--unique")
    assert again.returncode == 0, (again.returncode, again.stderr)
