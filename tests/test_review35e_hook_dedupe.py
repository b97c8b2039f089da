"""Review of issue 35 (workflows), round 6 (review35e): the fix of review 35d for a batch's
callback (its job id sent as jobd's own jobd_job_id, "so the callback queue's dedupe window
never takes it" for an earlier one) was not made for the on_dead_letter hook, the same kind of
job: its job id `J.dead` goes as the producer's field `job_id` (store/chains.py hook_args), so
a hook queue with a dedupe window (alerts that must not page twice for one re-send) acknowledges
unrun, as `deduped`, the alert of the second dead-lettering of a job id within the window: a
job enqueued again under its id (a nightly job id, a requeue from the dead letters) that fails
again pages no one. Each hook has a mark of its own (its dead-letter entry: keys.follow_up), so
jobd means them as two jobs; the alert queue's handler runs once. Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

Daemon = Callable[..., DaemonProcess]

FAILS = "#!/bin/sh\ncat >/dev/null\nexit 1\n"
ALERT = '#!/bin/sh\ncat >/dev/null\necho "$JOBD_JOB_ID" >> "$(dirname "$0")/alerts"\n'


def alerts(tmp_path: Path) -> list[str]:
    path = tmp_path / "alerts"
    return path.read_text().split() if path.exists() else []


def test_a_job_id_dead_lettered_twice_pages_twice_through_a_deduping_alert_queue(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    fails, alert = script("fails.sh", FAILS), script("alert.sh", ALERT)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{fails}]\n    retry: {{max_attempts: 1}}\n"
        "    on_dead_letter: {queue: alerts}\n"
        f"  alerts:\n    command: [{alert}]\n    dedupe: {{window: 1h}}\n"
    )
    c = str(cfg)
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "nightly").returncode == 0
    wait_until(lambda: alerts(tmp_path) == ["nightly.dead"], what="the first alert")
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "nightly").returncode == 0
    wait_until(lambda: r.exists("{jobd:a}:dead") and r.xlen("{jobd:a}:dead") == 2, 20,
               what="the second dead letter")  # fmt: skip
    wait_until(lambda: r.exists("jobd:alerts") and r.xlen("jobd:alerts") == 2
               and all(g["pending"] == 0 and g["lag"] == 0
                       for g in r.xinfo_groups("jobd:alerts")), 20,
               what="the second alert added and read")  # fmt: skip
    assert alerts(tmp_path) == ["nightly.dead", "nightly.dead"]
