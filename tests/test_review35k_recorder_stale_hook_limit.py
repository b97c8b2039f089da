"""Review of issue 35 (workflows), round 35k: after a reload that lowers the `on_dead_letter`
queue's `max_payload`, a job started before the reload puts the old limit back into the
daemon's shared `payload_limits` when it is dead-lettered, and the held job it dead-letters
`dependency` sends its hook a record cut to that old limit: larger than the hook's queue takes.

What is wrong: review 35j's fix (store/workflows.py `know_hook`, `unblock_call`) keeps the
hook queues' max_payload "in force" in `Store.payload_limits`, one dict the ticker's store and
the recorder's share (daemon/loop.py `periodic_duties`). The outbox duty fills it from the
config in force, but `Store.move_follow_ups(queue)` fills it too, from the queue it is given,
and the recorder gives it `outcomes[0].queue`: the QueueConfig the handler was started with
(process/policy.py `of_handler`: `handler.queue`), the config before the reload. So a job
that ran across the reload and is dead-lettered writes the old (higher) limit back into the
shared dict (`know_hook(old a)`), and the recorder then moves, in the same call, the release
notice its dead letter wrote: unblock.lua dead-letters the held job `h` and cuts its record to
the old 64 KiB, not to the 2 KiB in force. (It stays wrong until the outbox duty's next pass.)

What should happen: a held job's `on_dead_letter` record fits the hook queue's max_payload of
the config in force when its dependency's end is applied (docs/workflows.md; review 35j): a
view of a queue from before a reload never overrides the limits of the config in force.

Why it matters: exactly the case review 35j fixed (the operator lowers the alerts queue's
`max_payload`), back for every held job whose dependency was running during the reload (a
long job, the common case for a dependency): the hook's job is itself dead-lettered
`malformed` in the alerts queue, and the failure pages no one."""

from __future__ import annotations

import signal
from pathlib import Path

import redis
from support import jobd_cli, wait_until

from jobd.config import load

HANDLER = """\
#!/bin/sh
cat >/dev/null
touch {dir}/started.$JOBD_JOB_ID
while [ ! -e {dir}/go ]; do sleep 0.05; done
exit 1
"""


def text(handler: Path, most: str) -> str:
    return (
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{handler}]\n    retry: {{max_attempts: 1}}\n"
        "    on_dead_letter: {queue: alerts}\n"
        f"  alerts:\n    command: [/bin/true]\n    max_payload: {most}\n"
    )


def test_a_job_run_across_a_reload_does_not_bring_back_the_old_hook_limit(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    handler = script("gate.sh", HANDLER.format(dir=tmp_path))
    cfg = write_config(text(handler, "64KiB"))
    c = str(cfg)
    d = daemon(cfg)
    assert jobd_cli("pause", "-c", c, "alerts").returncode == 0  # its jobs stay to be looked at
    out = jobd_cli("enqueue", "-c", c, "a", "small", "--job-id", "d")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: (tmp_path / "started.d").exists(), what="d running")
    out = jobd_cli("enqueue", "-c", c, "a", "x" * 3000, "--job-id", "h", "--after", "d")
    assert out.returncode == 0, out.stderr
    write_config(text(handler, "2KiB"))  # the operator lowers alerts' max_payload, reloads
    assert jobd_cli("validate", "-c", c).returncode == 0
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    (tmp_path / "go").touch()  # d, started before the reload, fails: h is dead-lettered
    alerts = load(c).queues["alerts"].stream
    wait_until(lambda: r.xlen(alerts) >= 2, what="d's and h's hook jobs in alerts")
    assert not r.hexists("{jobd:a}:held", "h")
    sizes = {f.get(b"jobd_job_id", k): len(f[b"payload"]) for k, f in r.xrange(alerts)}
    too_large = {k: n for k, n in sizes.items() if n > 2048}
    assert not too_large, (
        f"hook jobs above alerts' max_payload (2048) in force: {too_large}; its daemon "
        "dead-letters them unrun, as malformed"
    )
