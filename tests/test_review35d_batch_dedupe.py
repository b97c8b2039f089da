"""Review of issue 35 (workflows), round 5 (review35d): a batch member acknowledged unrun by its
queue's dedupe window. dedupe.lua acks a job whose job id is done within `dedupe.window` as
`deduped` (docs/producing.md: an end, "what an idempotent re-send wants"; lib/workflows.lua ENDS
counts it `done`), but it never calls lib/workflows.lua `ended`: no notice reaches the batch. So
a batch enqueued again with the job ids it had (an idempotent re-send, the case the window is
for), or two jobs of one job id in a batch ("two members, total 2, the batch completes once
both have ended": docs/workflows.md), stays `sealed` with members pending for ever and never
calls back. Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, callbacks, runs

Daemon = Callable[..., DaemonProcess]


def idle(r: redis.Redis) -> bool:
    return all(g["pending"] == 0 and g["lag"] == 0 for g in r.xinfo_groups("jobd:a"))


def test_a_batch_member_deduped_is_counted_and_the_batch_calls_back(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    runs_sh, cb = script("runs.sh", RUNS), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs_sh}]\n    dedupe: {{window: 1h}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    c = str(cfg)
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    wait_until(lambda: runs(tmp_path) == ["x"] and idle(r), what="x done")
    out = jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x", "--batch", "B",
                   "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    wait_until(lambda: r.xlen("jobd:a") == 2 and idle(r), what="the second x read (deduped)")
    assert runs(tmp_path) == ["x"]  # acknowledged unrun: deduped
    shown = jobd_cli("batch", "-c", c, "B", "--json")
    wait_until(lambda: callbacks(tmp_path), 10,
               what=f"the callback (batch now: {shown.stdout!r})")  # fmt: skip
    assert callbacks(tmp_path) == [
        {"batch": "B", "state": "complete", "total": 1, "done": 1, "failed": 0, "pending": 0}
    ]


def test_a_job_waiting_for_one_that_is_deduped_is_released(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The same gap for dependencies: h (--after x) waits for w; w is done, then enqueued again
    (--after x, a new run of it held): when x is done, w is released and read, and deduped (its
    job id done within the window) — an end (ENDS counts it done) that is never told to
    h, registered with w's held run: h waits for ever."""
    runs_sh, cb = script("runs.sh", RUNS), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs_sh}]\n    dedupe: {{window: 1h}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    c = str(cfg)
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "w", "--job-id", "w").returncode == 0
    wait_until(lambda: runs(tmp_path) == ["w"] and idle(r), what="w done")
    assert jobd_cli("enqueue", "-c", c, "a", "w", "--job-id", "w", "--after", "x").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "w").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "a", "x", "--job-id", "x").returncode == 0
    wait_until(lambda: "x" in runs(tmp_path) and not r.hexists("{jobd:a}:held", "w") and idle(r),
               what="x done, w released and read")  # fmt: skip
    wait_until(lambda: "h" in runs(tmp_path), 10,
               what=f"h run (held: {r.hkeys('{jobd:a}:held')})")  # fmt: skip


def test_a_batch_callback_is_not_taken_by_the_callback_queues_dedupe_window(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A batch id used again after its batch expired calls back again (docs/workflows.md,
    "Expiry"): its callback has the job id `batch:ID` again. The callback was written with the
    producer's field `job_id`, so a callback queue with a dedupe window acknowledged the second
    one unrun (`deduped`: the first one's mark said done): no second callback ever ran."""
    runs_sh, cb = script("runs.sh", RUNS), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs_sh}]\n    history: {{max_age: 3s}}\n"
        f"  cb:\n    command: [{cb}]\n    dedupe: {{window: 1h}}\n"
    )
    c = str(cfg)
    daemon(cfg)
    for n, job in enumerate(("one", "two"), 1):
        out = jobd_cli("enqueue", "-c", c, "a", job, "--job-id", job, "--batch", "B",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
        wait_until(lambda n=n: r.exists("jobd:cb") and r.xlen("jobd:cb") == n, 10,
                   what=f"callback {n} added")  # fmt: skip
        wait_until(lambda: all(g["pending"] == 0 and g["lag"] == 0
                               for g in r.xinfo_groups("jobd:cb")), what=f"callback {n} read")  # fmt: skip
        if n == 1:
            wait_until(lambda: not r.exists("{jobd:batch:B}"), what="the first batch expired")
    one = {"batch": "B", "state": "complete", "total": 1, "done": 1, "failed": 0, "pending": 0}
    assert callbacks(tmp_path) == [one, one]
