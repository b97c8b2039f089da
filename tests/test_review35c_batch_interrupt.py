"""Review of issue 35 (workflows), round 4 (review35c): `jobd enqueue --lines --batch` stopped by
Ctrl-C (SIGINT) while a round trip of jobs is in flight. docs/workflows.md: "An enqueue that
cannot finish (Redis away for longer than its retries, or the enqueue killed, in the middle of
a round trip of jobs, before its seal notice is written) leaves the batch open ... no count can
be trusted; it never completes"; and "The callback's counts are the batch's at that moment:
`total` the jobs added, `done` plus `failed` equal to it". Real daemon and handlers; the
enqueue reaches Redis through the fault-injecting proxy (tests/faultproxy.py), which holds the
reply of the jobs' pipeline (Redis added them)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import redis
from faultproxy import FaultProxy
from support import DaemonProcess, RedisServer, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, callbacks, runs

Daemon = Callable[..., DaemonProcess]


def test_an_enqueue_interrupted_mid_round_trip_does_not_seal_a_short_count(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Five lines into batch K; the pipeline that adds them ran in Redis, its reply held, and
    the user presses Ctrl-C. Member.__exit__ keeps the batch open only when the error is
    "Redis unreachable" (jobd/workflows.py); a KeyboardInterrupt is not, so it seals the
    batch with the jobs counted before that round trip: 0. The batch is complete at once, its
    callback says total 0 while five members were added and run after it."""
    queues = batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK))
    with FaultProxy(redis_server.port) as proxy:
        direct = write_config("redis: {url: '{redis}'}\n" + queues)
        proxied = write_config(f"redis: {{url: '{proxy.url}'}}\n" + queues, name="proxied.yaml")
        daemon(direct)
        proxy.hold_reply(b"\r\n", to=b"XADD")
        cmd = [sys.executable, "-m", "jobd", "enqueue", "-c", str(proxied), "a", "--lines", "-",
               "--batch", "K", "--on-complete", "cb"]  # fmt: skip
        enqueue = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)  # fmt: skip
        assert enqueue.stdin is not None
        enqueue.stdin.write(b"1\n2\n3\n4\n5\n")
        enqueue.stdin.close()
        wait_until(lambda: proxy.holding() == 1, what="the jobs' pipeline reply held")
        assert r.xlen("jobd:a") == 5  # Redis added them
        enqueue.send_signal(signal.SIGINT)
        enqueue.wait(60)
        assert enqueue.stdout is not None and enqueue.stderr is not None
        enqueue.stdout.close()  # fix35c: read nothing, left open the test failed on a warning
        enqueue.stderr.close()
        proxy.release()
    wait_until(lambda: len(runs(tmp_path)) == 5, what="the five members run")
    wait_until(lambda: r.xlen("{jobd:a}:outbox") == 0, what="their ends moved")
    got = callbacks(tmp_path)
    assert all(c["total"] == 5 for c in got), got  # a callback, if any, counts what was added
