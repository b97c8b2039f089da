"""Review of issue 35 (workflows), round 5 (review35d), confirmed and left open: a job whose
stream entry is deleted (XDEL by hand) while a daemon that died holds it. The daemon that takes
the entry over (reclaim.lua) finds no data and acknowledges it, with no end told: the job
waiting --after it stays held, its batch stays sealed with a member pending. docs/workflows.md
(Dependencies) documents the gap; a fix needs the job's batch where the reclaim can read it
(the active record holds the job id only, and only once the handler ran half a second) and an
end event of its own ("lost"). Real daemons, SIGKILL.

Fixed (lib/workflows.lua take_note, lost_end; read_levels.lua, reclaim.lua, renew.lua): the
read that takes the entry of a workflow job (a batch's, or one with waiters) records its job
id, batch and incarnation in the queue's taken hash ({S}:taken), and the step that takes a
deleted entry out of the group (XAUTOCLAIM here, a renewal's XCLAIM for a live holder) writes
its end, 'lost', once: its history record, an event, and notices to its batch (counted failed)
and its waiters (dead-lettered `dependency`), as any failure."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import callbacks
from test_lost_live_holder import batch_member_x

Daemon = Callable[..., DaemonProcess]

SLOW = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
exec sleep 60
"""


def test_a_pending_entry_deleted_under_a_dead_daemon_tells_its_waiter_and_batch(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = batch_member_x(write_config, script, SLOW)
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x").returncode == 0
    first = daemon(cfg)
    wait_until(lambda: (tmp_path / "runs").exists(), what="x running")
    first.kill()
    entry = r.xrange("jobd:a")[0][0]
    r.xdel("jobd:a", entry)
    daemon(cfg)
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 0, 20, what="the entry reclaimed")
    wait_until(lambda: not r.hexists("{jobd:a}:held", "h"), 10, what="h told x ended")
    wait_until(lambda: callbacks(tmp_path), 10, what="the batch's callback")
    (told,) = callbacks(tmp_path)
    assert (told["done"], told["failed"]) == (0, 1), told
    (dead,) = [f for _, f in r.xrange("{jobd:a}:dead") if f[b"jobd_job_id"] == b"h"]
    assert dead[b"jobd_error"] == b"dependency"
    lost = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"lost"]
    assert [(f[b"job"], f[b"entry"], f[b"batch"]) for f in lost] == [(b"x", entry, b"B")]
    record = json.loads(r.hget("{jobd:a}:history", "x").splitlines()[-1])
    assert (record["event"], record["batch"]) == ("lost", "B"), record
    shown = json.loads(jobd_cli("job", "-c", c, "a", "x", "--json").stdout)
    assert shown["state"] == "lost", shown
    assert not r.hlen("{jobd:a}:taken")  # its record went with its end
