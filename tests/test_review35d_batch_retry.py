"""Review of issue 35 (workflows), round 5 (review35d): a batch member that is retried. A member's
end is counted in its batch through the field jobd_batch (lua/lib/workflows.lua batch_of, from
the attempt's note: store/notes.py reads job.fields[BATCH]). A failed attempt that is retried is
no end; its next attempt is a new entry whose fields are Job.next_attempt_fields() — which
carries jobd_unique and jobd_parent but not jobd_batch (jobd/job.py, though KEPT lists BATCH). So
the attempt that finally ends (done, or dead-lettered) is no member of any batch: its end is
never counted, the batch stays `sealed` with a member pending for ever, and its callback never
comes. docs/workflows.md: a batch calls back exactly once when "every member ends (done,
dead-lettered, expired or cancelled)". Every batch test runs with `retry: {max_attempts: 1}`.
Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, callbacks, runs

Daemon = Callable[..., DaemonProcess]

# Fails its first attempt, succeeds on the second.
FLAKY = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
[ "$JOBD_ATTEMPT" != 1 ]
"""


def test_a_batch_member_that_succeeds_on_its_retry_completes_the_batch(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    flaky, cb = script("flaky.sh", FLAKY), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{flaky}]\n    retry: {{max_attempts: 2, backoff: 100ms}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "m", "--job-id", "m", "--batch", "B",
                   "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    daemon(cfg)
    wait_until(lambda: runs(tmp_path).count("m") == 2, 20, what="m failed once, then run again")
    wait_until(lambda: all(g["pending"] == 0 and g["lag"] == 0 for g in r.xinfo_groups("jobd:a"))
               and not r.zcard("{jobd:a}:delayed"), 20, what="m's retry done")  # fmt: skip
    shown = jobd_cli("batch", "-c", str(cfg), "B", "--json")
    wait_until(lambda: callbacks(tmp_path), 10,
               what=f"the callback (batch now: {shown.stdout!r})")  # fmt: skip
    assert callbacks(tmp_path) == [
        {"batch": "B", "state": "complete", "total": 1, "done": 1, "failed": 0, "pending": 0}
    ]


def test_a_batch_member_whose_retry_is_cancelled_while_delayed_counts_failed(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The same gap through cancel_delayed.lua: the retry waiting in the delayed set named no
    batch (lib/workflows.lua batch_in reads its fields), so cancelling it told none."""
    flaky, cb = script("flaky.sh", FLAKY), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{flaky}]\n    retry: {{max_attempts: 2, backoff: 1h, max_backoff: 2h}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "m", "--job-id", "m", "--batch", "D",
                   "--on-complete", "cb")  # fmt: skip
    assert out.returncode == 0, out.stderr
    daemon(cfg)
    wait_until(
        lambda: r.zcard("{jobd:a}:delayed") == 1, 20, what="m failed once, its retry delayed"
    )
    assert jobd_cli("cancel", "-c", c, "a", "m").returncode == 0
    shown = jobd_cli("batch", "-c", c, "D", "--json")
    wait_until(lambda: callbacks(tmp_path), 10,
               what=f"the callback (batch now: {shown.stdout!r})")  # fmt: skip
    assert callbacks(tmp_path) == [
        {"batch": "D", "state": "complete", "total": 1, "done": 0, "failed": 1, "pending": 0}
    ]
    assert runs(tmp_path) == ["m"]
