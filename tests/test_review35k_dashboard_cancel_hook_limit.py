"""Review of issue 35 (workflows), round 35k: the dashboard's Cancel of a job another queue's
held job waits for dead-letters that held job with an `on_dead_letter` record cut to the hook
queue's `max_payload` of the day it was held, not the one in force: review 35j's fix reaches
the daemons and the CLI, not the dashboard (nor the Python API, nor a config whose queue's
`on_dead_letter` was removed since).

What is wrong: store/workflows.py `unblock_call` takes the hook queue's limit from
`Store.payload_limits`, which only `know_hook(q)` fills, and only for `q.on_dead_letter` of the
queues it is given: the CLI's stores are given every queue of the config
(cli/common.py `store_for`), a daemon's every queue at each reload. The dashboard's store
(web/dashboard.py `Dashboard`: `Store.open(config.redis, "dashboard")`) is given none; its
Cancel (web/actions.py -> jobd.cancel.cancel -> move_notices -> `move_follow_ups(b)`) learns
only the hook of the cancelled job's queue `b` (it has none), so the release notice for `h`
(queue `a`, hook `alerts`) is applied with the limit copied into h's waiter line when `h` was
held: 64 KiB, though `alerts` takes 2 KiB now. The same holds for `jobd.producer` callers and
for any store whose config no longer names `alerts` in an `on_dead_letter` (the limit is
learned through the hooking queues, never from the hook queue's own `max_payload`).

What should happen: as docs/workflows.md says since review 35j, the record is cut to "the
`max_payload` in force when the daemon (or the cancelling command) applies the dependency's
end": the hook queue's own `max_payload` in the config of whoever applies it.

Why it matters: the dashboard is where operators cancel; lowering an alerts queue's
`max_payload` then makes the held job's dependency failure page no one (the hook's job is
dead-lettered `malformed` by the alerts queue's daemons), the case review 35j meant to fix."""

from __future__ import annotations

from pathlib import Path

import redis
from support import jobd_cli
from test_dashboard_pages import TOKEN, App

from jobd.config import load


def text(most: str) -> str:
    return (
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a:\n    command: [/bin/true]\n    on_dead_letter: {queue: alerts}\n"
        "  b:\n    command: [/bin/true]\n"
        f"  alerts:\n    command: [/bin/true]\n    max_payload: {most}\n"
        "dashboard: {actions: true, token_file: token}\n"
    )


def test_a_dashboard_cancel_cuts_a_held_jobs_hook_to_the_limit_in_force(
    r: redis.Redis, write_config, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    before = str(write_config(text("64KiB"), "before.yaml"))
    for queue, *args in (("b", "y", "--job-id", "y", "--delay", "1h"),
                         ("a", "x" * 3000, "--job-id", "h", "--after", "b:y")):  # fmt: skip
        out = jobd_cli("enqueue", "-c", before, queue, *args)
        assert out.returncode == 0, out.stderr
    now = write_config(text("2KiB"), "now.yaml")  # the operator lowers alerts' max_payload
    assert jobd_cli("validate", "-c", str(now)).returncode == 0
    app = App(now)
    code, body = app.call("POST", "/api/cancel", {"queue": "b", "job_ids": ["y"]}, app.headers())
    assert code == 200, body
    assert [f["where"] for f in body["found"]] == ["delayed"], body
    assert not r.hexists("{jobd:a}:held", "h"), "h is dead-lettered `dependency` by the cancel"
    entries = r.xrange(load(str(now)).queues["alerts"].stream)
    assert entries, f"no hook job in alerts: {r.keys('*')}"
    payload = entries[-1][1][b"payload"]
    assert len(payload) <= 2048, (
        f"the hook's job has a payload of {len(payload)} bytes, above alerts' max_payload "
        "(2048) in force: its daemon dead-letters it unrun, as malformed"
    )
