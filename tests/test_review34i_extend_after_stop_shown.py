"""Review 34i: a handler that asks for more time after jobd has stopped it (its timeout
passed: SIGTERM sent, SIGKILL due ``kill_grace`` later) is not given it: ``Handler.heard``
leaves ``due`` alone once it is stopping, and ``jobd_timeout_extensions_total`` does not count
it (``Channel.count_taken``). But ``Told.take`` records the extension all the same
(``extended_to``, ``changed``), and since review 34h the lease renewal writes that deadline into
the running record (``lease.deadline_ms`` -> renew.lua): ``jobd job --json``'s
``running.deadline`` (and ``jobd job``, ``/api/job``, the dashboard's running list) then shows
a deadline an hour away for a handler that jobd SIGKILLs a few seconds later. The record was
meant to carry "the deadline jobd enforces" (CHANGELOG, review 34h); an operator looking at a
job that was just stopped for its timeout sees it as granted more time, the opposite of what
happens. ``process.channel``'s own docstring says a message "is ignored once its handler is
being stopped"; the status the test's handler sends with it (``stopping``) is shown too.

What should happen: an extension heard once the handler is stopping changes nothing shown
(the deadline stays what it was, or becomes when SIGKILL is due), never the asked-for one.

Real daemon, real handler (sh trapping SIGTERM and asking for an hour with `jobd notify`),
a private Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from support import JOBD, JOBD_ENV, DaemonProcess, acked_all, jobd_cli, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
LEASE = "{renew_every: 300ms, reclaim_after: 3s}"


def running(config: Path, job_id: str) -> dict[str, Any] | None:
    out = jobd_cli("job", "-c", str(config), "q", job_id, "--json")
    return json.loads(out.stdout).get("running") if out.stdout else None


class Renewals:
    """Counts the lease renewals of the queue's one pending entry (each resets its idle time:
    renew.lua's XCLAIM JUSTID), as seen by polling."""

    def __init__(self, r: redis.Redis) -> None:
        self.r, self.idle, self.count = r, float("inf"), 0

    def seen(self) -> int:
        pending = self.r.xpending_range("jobd:q", "jobd", "-", "+", 1)
        idle = pending[0]["time_since_delivered"] if pending else float("inf")
        if idle < self.idle:
            self.count += 1
        self.idle = idle
        return self.count


def test_an_extension_asked_after_the_stop_is_not_shown_as_the_deadline(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    go, read = tmp_path / "go", tmp_path / "read"
    script(
        "h.sh",
        f"""
        #!/bin/sh
        trap '{JOBD} notify --extend 1h --status stopping && touch {read}; while [ ! -e {go} ]; do sleep 0.05; done; exit 0' TERM
        while [ ! -e {go} ]; do sleep 0.05; done
        """,
    )
    settings = dict(env=JOBD_ENV, lease=LEASE, timeout="1s", max_timeout="2h", kill_grace="20s")
    config = write_config(queue_config("[./h.sh]", **settings))
    daemon(config)
    r.xadd("jobd:q", {"payload": "", "job_id": "x"})
    try:
        wait_until(read.exists, what="its request for an hour read by jobd, after its SIGTERM")
        renewals = Renewals(r)
        wait_until(lambda: renewals.seen() >= 3, what="three lease renewals since")
        shown = running(config, "x")
        assert shown is not None, "the job no longer running: SIGKILL came early?"
        since, deadline = shown["since"], shown["deadline"]
        assert deadline - since < 60_000, (
            f"running.deadline is since + {deadline - since} ms: the hour the handler asked "
            "for after its SIGTERM, which jobd does not give it (SIGKILL comes 20 s after the "
            "1 s timeout)"
        )
    finally:
        go.touch()
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job ended")
