"""Review of issue 35 (workflows), round 5 (review35d): a `--unique --after` job held on a priority
level other than the default, dead-lettered `dependency`. hold.lua takes the job id's mark at
the queue's key (QueueKeys.job_mark: derived from the queue's base stream, shared by its
levels); the round-4 fix gives it back when the held job is dead-lettered or cancelled where it
waits (lib/workflows.lua unmark). But unblock_call (store/workflows.py) names the mark
``QueueKeys.of(waiter["stream"]).job_mark(...)``: for a level, ``of`` makes the level's stream
its base, so unblock.lua is handed ``{jobd:a}:priority:high:job:h``, a key nobody wrote, and
the real mark ``{jobd:a}:job:h`` stays 'queued' for UNIQUE_TTL plus the bound: the job id is
refused (exit 3, "queued") for days, though the job is dead. On the default level the same
sequence frees it (tests/test_review35c_unique_after.py). Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, runs

Daemon = Callable[..., DaemonProcess]


def test_a_unique_held_job_on_a_priority_level_dead_lettered_frees_its_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """k (--unique --after y --priority high) is dead-lettered `dependency` when y fails; its
    job id should be free at once, as it is for a job held on the default level."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK),
                                    "    priorities: [high, low]\n"))  # fmt: skip
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "k", "--job-id", "k", "--unique", "--after", "y",
                   "--priority", "high")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert r.get("{jobd:a}:job:k") == b"queued"  # hold.lua took the queue's mark
    assert jobd_cli("enqueue", "-c", c, "a", "fail", "--job-id", "y").returncode == 0
    daemon(cfg)
    dead = "{jobd:a}:dead"
    wait_until(lambda: r.exists(dead) and r.xlen(dead) == 2, 20, what="y and k dead-lettered")
    assert not r.hexists("{jobd:a}:held", "k")
    assert r.get("{jobd:a}:job:k") is None, (
        f"the dead held job's --unique mark is left 'queued', ttl {r.pttl('{jobd:a}:job:k')} ms"
    )
    again = jobd_cli("enqueue", "-c", c, "a", "k2", "--job-id", "k", "--unique",
                     "--priority", "high")  # fmt: skip
    assert again.returncode == 0, (again.returncode, again.stderr)
    wait_until(lambda: runs(tmp_path).count("k") == 1, what="k, enqueued again, runs")
