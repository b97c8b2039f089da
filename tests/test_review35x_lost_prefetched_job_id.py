"""low: a job a live daemon read ahead (prefetch) and has not started yet ends 'lost' under its
entry id, not its job id, when its entry is deleted: its history (`jobd job ID`) never shows
its end.

What is wrong. The renewal sends the job ids the daemon knows (lease.py Holdings.job_ids), but
only of entries whose handler started (``e.teller``): '' for one read ahead and waiting in the
daemon's inbox for a free slot, though the daemon read its fields (its job id among them) when
it read it. renew.lua then finds no job id (no taken record: no workflow; no running record:
never started) and records the end under the entry id. docs/guarantees.md says the end is
recorded "under its job id" for a held job; docs/workflows.md names only "a job of no workflow
deleted under a dead daemon before it ran half a second" as recorded under its entry id. A
read-ahead job can wait in the inbox as long as the running jobs take (prefetch: auto reads
ahead whenever handlers are short).

Reproduce (real daemon, real Redis, prefetch 4, concurrency 1): job 'first' runs (blocks); job
'second' is read ahead; its entry is deleted; the renewal ends it 'lost': the event names the
entry id as the job, and `jobd job a second` does not say 'lost'.

What should happen: the end is recorded under 'second' (the daemon knows it): Holdings.job_ids
gives the job id of an entry read but not started (from the delivered Job it holds, or the
inbox), so the renewal sends it.

Why it matters: whoever follows the job by its id (`jobd job`, a dashboard link, the history
hash) never learns it ended; its end is recorded under an id no producer knows. (Not checked:
whether `jobd enqueue --wait`, which matches events by entry, sees it.)

Fixed (task f35xb): the reader hands each entry's job id, as read, to ``Holdings.add`` (kept in
``_Held.job_id``), and ``Holdings.job_ids`` sends it for an entry whose handler has not started."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
while [ ! -e "$(dirname "$0")/go" ]; do sleep 0.05; done
"""


def test_a_read_ahead_job_deleted_ends_lost_under_its_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    concurrency: 1\n    prefetch: 4\n"
        "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
    )
    c = str(cfg)
    for job in ("first", "second"):
        assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", job).returncode == 0
    daemon(cfg)
    wait_until(lambda: (tmp_path / "runs").exists(), what="first running")
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 2, what="second read ahead")
    (entry,) = [mid for mid, f in r.xrange("jobd:a") if f[b"job_id"] == b"second"]
    r.xdel("jobd:a", entry)
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 1, 10, what="second purged")
    (lost,) = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"lost"]
    shown = json.loads(jobd_cli("job", "-c", c, "a", "second", "--json").stdout or "{}")
    (tmp_path / "go").touch()
    assert (lost[b"job"], lost[b"entry"]) == (b"second", entry), lost
    assert shown.get("state") == "lost", shown
