"""medium: a --unique job that ends 'lost' keeps its 'queued' mark for 7 days: the same job id
sent again with --unique is refused as a duplicate (exit 3) for a week, while `jobd job` says it
ended 'lost'.

What is wrong. A --unique job's mark ({S}:job:ID, "queued") is "cleared with the job's ack or
dead letter" (docs/concepts/scheduling.md); while it runs, its daemon renews it (keep_marks:
UNIQUE_TTL, 7 days). The new end 'lost' (renew.lua, reclaim.lua, settle.lua 'back': lib/
workflows.lua lost_job) writes the job's end and tells its batch and waiters, but leaves the
mark as it is: still "queued", 7 days to live. The mark's 7-day lifetime was the fallback for a
job "taken as lost" when nothing could tell; f35d now knows the job ended, and by which id.
A producer that sees 'lost' (`jobd job`, `jobd enqueue --wait`, its waiters' dead letters)
and sends the job again, as it must (its payload is gone), is told "already queued" (exit 3,
producer.Duplicate) for a week, and the job never runs; cron-style or idempotent producers
that always pass --unique lose the job id altogether.

Reproduce (real daemon, real Redis): `jobd enqueue --unique --job-id U`; while it runs, its
entry is deleted (XDEL; a producer's XADD MAXLEN does the same); the daemon's renewal ends it
'lost'; `jobd enqueue --unique --job-id U` again exits 3.

What should happen: the step that writes 'lost' deletes the job's --unique mark if it still says
'queued' (as dead_letter.lua and settle.lua do), so the job id is free the moment its end is
known; the second enqueue exits 0 and the job runs.

Suggested fix: the mark key is derived from the job id (store/keys.py job_mark), which renew.lua
knows from the daemon (it could send each held --unique job's mark key as a KEY: lease.py marks
already lists them for keep_marks) and reclaim.lua knows only from the taken record or the
active record; for the reclaim, the taken record could note the mark's key (or the 'unique'
flag) when the entry has jobd_unique, and the reclaim read it with a key passed by the caller
per claimed page; at least the live holder's renewal (the common case) can clear it.

Fixed (task f35xb): the step that writes 'lost' deletes the job's --unique mark while it says
'queued' (lib/workflows.lua ``lost_job``). The holder knows its jobs' marks (it read them:
lease.py ``_Held.mark``) and sends each with its renewal as a declared key (renew.lua KEYS[11..],
by index from ARGV), and with a hand-back (settle.lua, a --unique job's mark). A reclaimer
cannot know the mark of an entry it never read: a --unique job deleted under a dead daemon
keeps its mark until it expires (docs/workflows.md, Limits)."""

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
[ -e "$(dirname "$0")/once" ] && exit 0
touch "$(dirname "$0")/once"
exec sleep 60
"""


def test_a_unique_job_that_ended_lost_can_be_sent_again(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", HANDLER)
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
    )
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "U", "--unique").returncode == 0
    d = daemon(cfg)
    wait_until(lambda: (tmp_path / "once").exists(), what="U running")
    (entry,) = [mid for mid, _ in r.xrange("jobd:a")]
    r.xdel("jobd:a", entry)
    d.wait_log("job=U attempt=1 lease lost: the entry now belongs to nobody")
    wait_until(lambda: json.loads(r.hget("{jobd:a}:history", "U").splitlines()[-1])["event"]
               == "lost", what="U ended 'lost'")  # fmt: skip
    assert json.loads(jobd_cli("job", "-c", c, "a", "U", "--json").stdout)["state"] == "lost"
    again = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "U", "--unique")
    assert again.returncode == 0, (again.returncode, again.stdout, again.stderr,
                                   r.get("{jobd:a}:job:U"), r.pttl("{jobd:a}:job:U"))  # fmt: skip
    wait_until(lambda: (tmp_path / "runs").read_text().split() == ["U", "U"], 10,
               what="U sent again, run")  # fmt: skip
