"""Review of issue 35 (workflows), round 35i: a held job's own expiry (`--expires-in`,
`--expires-at`, an ndjson `expires_in`) does not bound its hold.

What is wrong: workflows.hold bounds a wait only by `--after-timeout` or the queue's
`max_wait` (docs/workflows.md: "a job not started within max_wait of its enqueue expires
anyway: a held job has not started"). The same holds of a job's own expiry ("a job not
started by then is not run", jobd.newjob), yet it is not a bound: `jobd enqueue a p --after
never --expires-in 1s --batch B --on-complete cb` stays held for ever. Its expiry has passed
(were it released it would only be dead-lettered `expired` when read), but no one is told:
its waiters wait on, its batch never completes (`pending` 1 until the batch itself expires,
then no callback at all), and `jobd job` says it is waiting.

What should happen: a held job whose expiry passes ends as a job not started by its expiry
does (dead-lettered, `expired`, or `dependency` saying its expiry passed), in the step that
ends it: its waiters and its batch told, the batch calling back once with failed 1. (Taking
`min(after_timeout or max_wait, expires_at - now)` as the hold's bound is one way.)

Why it matters: expiry is how a producer says "this is worthless after T"; a workflow
(`--after`, `--batch`) that silently ignores it leaves batches that never call back and
waiters that never run or fail, which is what the issue's "when one of them is ... expired,
the waiting job is dead-lettered" is meant to prevent."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis
from support import jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, Daemon, callbacks, cli, queues_yaml


def test_a_held_job_whose_expiry_passes_is_not_held_for_ever(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    # w first: h's 1 s may pass before a second command has even started, on a loaded machine
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "h")
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "p", "--job-id", "h", "--after", "never",
                   "--expires-in", "1s", "--batch", "B", "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert r.hexists("{jobd:a}:held", "h") or any(
        f.get(b"jobd_job_id") == b"h" for _, f in r.xrange("{jobd:a}:dead")
    ), "h held (or already expired out of its hold)"
    # Its expiry passed 1 s after the enqueue; the daemons' duty looks every 2 s. Ten seconds
    # is far more than enough for a job not started by its expiry to end.
    end = time.monotonic() + 10
    while r.hexists("{jobd:a}:held", "h") and time.monotonic() < end:
        time.sleep(0.1)
    ended = not r.hexists("{jobd:a}:held", "h")
    batch = json.loads(cli(cfg, "batch", "B", "--json"))
    assert ended, (
        f"job h expired 1 s after its enqueue, still held 10 s later; batch B: {batch}; "
        f"its waiter w held too: {r.hexists('{jobd:a}:held', 'w')}"
    )
    wait_until(lambda: len(callbacks(tmp_path)) == 1, timeout=10, what="batch B's callback")
    assert callbacks(tmp_path)[0]["failed"] == 1

    # It ended as a job not started by its expiry ends: `expired`, and its waiter was told so.
    def dead() -> dict[bytes, dict[bytes, bytes]]:
        return {f[b"jobd_job_id"]: f for _, f in r.xrange("{jobd:a}:dead")}

    wait_until(lambda: b"w" in dead(), what="w dead-lettered")
    assert dead()[b"h"][b"jobd_error"] == b"expired"
    assert dead()[b"w"][b"jobd_stderr"] == b"dependency a h expired"
    assert not r.hgetall("{jobd:a}:waiters"), "h's registration with never went with it"
