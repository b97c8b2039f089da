"""Review of issue 35 (workflows), round 35l: `jobd enqueue --unique --job-id x --after d`
run again once x's hold ended (d done: x released) exits 0, "sent before", where its job id's
mark says x is queued: it should exit 3, as any `--unique` enqueue of a job id queued.

What is wrong: review 35k added workflows.ended_already, read by producer._enqueue before the
batch opens (jobd/producer.py, `if job.after and workflows.ended_already(...)`: return the job
id, exit 0). It looks at the queue's held:ended set only; hold.lua, which it stands in front
of, answers the --unique mark first (`if KEYS[9] then ... GET ... return state end`, before
`hold_ended_at`). docs/workflows.md: "With `--unique`, the job id's mark answers first, as
before (exit 3 while it says queued or done)"; and "`--unique --after`: the job is held only if
its job id is not queued, running or done within the dedupe window (exit 3 otherwise, as for any
`--unique` job)". A producer that relies on exit 3 to know "there already" is told "added".

What should happen: exit 3 (Duplicate in Python). Suggested fix: ended_already is asked only
for a job that is not --unique (or reads the mark too, answering Duplicate first), so that the
order of hold.lua's answers holds.

Real daemon (to end d), a private Redis: x is released delayed an hour, its mark 'queued'."""

from __future__ import annotations

from collections.abc import Callable

import redis
from support import DaemonProcess, acked_all, jobd_cli, wait_until

from jobd.config import load

Daemon = Callable[..., DaemonProcess]
CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a:\n    command: [/bin/true]\n"


def test_a_unique_after_enqueue_again_once_released_is_a_duplicate(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    cfg = write_config(CONFIG)
    c = str(cfg)
    a = load(c).queues["a"]
    assert jobd_cli("enqueue", "-c", c, "a", "d", "--job-id", "d").returncode == 0
    daemon(cfg)
    wait_until(lambda: acked_all(r, a.stream, 1), what="d done")
    argv = ("enqueue", "-c", c, "a", "x", "--job-id", "x", "--unique", "--after", "d",
            "--delay", "1h")  # fmt: skip
    first = jobd_cli(*argv)
    assert first.returncode == 0, first.stderr
    wait_until(lambda: not r.hlen(a.keys.held), what="x released (d done already)")
    mark = r.get(a.keys.job_mark("x"))
    assert mark == b"queued", mark
    again = jobd_cli(*argv)
    assert again.returncode == 3, (
        f"x is queued (released, delayed an hour; its mark {mark!r}), yet `--unique` again "
        f"exits {again.returncode}: {again.stdout!r} {again.stderr!r}"
    )
