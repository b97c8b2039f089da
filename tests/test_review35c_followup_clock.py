"""Review of issue 35 (workflows), round 4 (review35c): a follow-up's `expires_in` and the
daemon host's clock. docs/workflows.md: the keys of a JOBD_ENQUEUE line "are those of
`--ndjson`"; docs/producing.md: `--expires-in` is "counted on Redis's clock", and a daemon
"whose clock is minutes off therefore neither expires fresh jobs nor runs expired ones". The
daemon turns a follow-up's expires_in into jobd_expires_at with its own host's clock
(jobd/process/followups.py: prepare(..., HostClock())). Real daemon (its wall clock moved by
libfaketime, tests/support.skewed) and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
import support
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import RUNS, runs

Daemon = Callable[..., DaemonProcess]

PARENT = """\
#!/bin/sh
cat > /dev/null
printf '{"queue": "t", "payload": "x", "expires_in": "1h"}\\n' > "$JOBD_ENQUEUE"
"""


def test_a_follow_up_expires_in_counts_on_redis_clock_not_the_daemons(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The daemon's clock is 2 hours behind Redis's. Job p1 of p exits 0 asking for one
    follow-up into t that expires in 1 hour: its jobd_expires_at is the daemon's now + 1 h, an
    hour before Redis's now; the follow-up is dead-lettered `expired` the moment it is read,
    and never runs (`jobd enqueue --ndjson` with the same line would count on Redis's clock)."""
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  p:\n    command: [{script('parent.sh', PARENT)}]\n"
        f"  t:\n    command: [{script('runs.sh', RUNS)}]\n"
    )
    daemon(cfg, {**support.skewed("-2h"), "JOURNAL_STREAM": ""})
    assert jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1").returncode == 0
    wait_until(lambda: r.exists("jobd:t") and r.xlen("jobd:t") == 1, what="p1's follow-up added")
    try:
        wait_until(lambda: "p1.1" in runs(tmp_path), 10, what="the follow-up p1.1 run")
    finally:
        dead = r.xrange("{jobd:t}:dead") if r.exists("{jobd:t}:dead") else []
        print("t's dead letters:", [(f.get(b"jobd_error"), f.get(b"job_id")) for _, f in dead])
