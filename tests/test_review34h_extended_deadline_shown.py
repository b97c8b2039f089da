"""Review 34h: a handler that extends its deadline (EXTEND_TIMEOUT_USEC, within the queue's
max_timeout) runs on past its queue's timeout, as it should; but everything that shows the job
still names its first deadline, start + timeout: ``jobd job`` ("running on … deadline T"),
``jobd job --json`` (``running.deadline``), the dashboard's running list (its deadline "red
once past", docs/operations/dashboard.md) and ``/api/job``. start.lua writes ``deadline`` once,
and the lease renewal that carries what the handler told (renew.lua) writes progress and
status, never the deadline. An operator then sees a healthy job that asked for more time as
overdue, past the deadline jobd enforces (and, with a watchdog, cannot see the sooner one).

What should happen: the running record's deadline follows what the daemon enforces (at most a
renewal interval old, as progress and status are): after ``jobd notify --extend 20s`` under a
1 s timeout, ``running.deadline`` is about now + 20 s, not since + 1 s.

Real daemon, real handler (sh with `jobd notify`), a private Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from support import JOBD, JOBD_ENV, DaemonProcess, acked_all, jobd_cli, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
LEASE = "{renew_every: 300ms, reclaim_after: 3s}"


def running_told(config: Path, job_id: str) -> dict[str, Any] | None:
    out = jobd_cli("job", "-c", str(config), "q", job_id, "--json")
    running = json.loads(out.stdout).get("running") if out.stdout else None
    return running if running and running.get("status") == "extended" else None


def test_the_running_record_shows_the_deadline_a_handler_extended_to(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f"""
        #!/bin/sh
        {JOBD} notify --extend 20s --status extended
        while [ ! -e {tmp_path}/go ]; do sleep 0.05; done
        """,
    )
    # 5 s: the handler's `jobd notify --extend` starts an interpreter that imports the config's
    # modules (0.15 s of CPU), over 1 s on a CI machine's load, which timed attempt 1 out before
    # it said anything; the record must still show the 20 s, far past these 5
    settings = dict(env=JOBD_ENV, lease=LEASE, timeout="5s", max_timeout="30s")
    config = write_config(queue_config("[./h.sh]", **settings))
    daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "x"})
    try:
        running = wait_until(lambda: running_told(config, "x"), what="its status shown")
        since, deadline = running["since"], running["deadline"]
        assert deadline - since >= 15_000, (
            f"running.deadline is since + {deadline - since} ms: the queue's 5 s timeout, not "
            "the 20 s the handler extended it by (and runs on to)"
        )
    finally:
        (tmp_path / "go").touch()
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job done")
