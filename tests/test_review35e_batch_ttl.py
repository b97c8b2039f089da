"""Review of issue 35 (workflows), round 6 (review35e): a batch's keys expire `history.max_age`
"of the queue its jobs were added to" after its latest change (docs/workflows.md, "Expiry");
several enqueues may add to one batch, into different queues. Each `open` (lua/batch.lua)
writes its queue's max_age as the batch's ttl, the latest opener's winning: one enqueue into a
queue of short history after one into a queue of long history shortens the batch's life below
what the first queue's members need. Here the member of queue a (history 1h) still runs when
the batch, its ttl cut to queue b's 2 s, expires: its end is counted into nothing and the
batch never calls back. Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, callbacks, runs

Daemon = Callable[..., DaemonProcess]

BLOCKING = """\
#!/bin/sh
p=$(cat)
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
while [ "$p" = block ] && [ ! -e "$(dirname "$0")/go" ]; do sleep 0.1; done
"""


def test_a_batch_lives_as_long_as_the_longest_history_of_its_queues(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    sh, cb = script("runs.sh", BLOCKING), script("cb.sh", CALLBACK)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{sh}]\n    history: {{max_age: 1h}}\n"
        f"  b:\n    command: [{sh}]\n    history: {{max_age: 2s}}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    c = str(cfg)
    daemon(cfg)
    try:
        out = jobd_cli("enqueue", "-c", c, "a", "block", "--job-id", "long", "--batch", "B",
                       "--on-complete", "cb")  # fmt: skip
        assert out.returncode == 0, out.stderr
        wait_until(lambda: runs(tmp_path) == ["long"], what="the member of a running")
        out = jobd_cli("enqueue", "-c", c, "b", "x", "--job-id", "short", "--batch", "B")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: "short" in runs(tmp_path), what="the member of b done")
        # Queue b's history.max_age (2 s) and one more pass on Redis's clock: long within
        # queue a's hour, long enough for a batch cut to 2 s to be gone.
        until = r.time()[0] + 3
        wait_until(lambda: r.time()[0] >= until, 10, what="3 s of Redis's clock")
    finally:
        (tmp_path / "go").touch()
    wait_until(lambda: callbacks(tmp_path), 15,
               what=f"the callback (batch key there: {r.exists('{jobd:batch:B}')})")  # fmt: skip
