"""Review of issue 35 (workflows), round 4 (review35c): `jobd enqueue --after` interrupted by a
lost reply, then run again with the same --job-id as docs/workflows.md says to ("An interrupted
`jobd enqueue --after` (Redis went away) can be run again with the same `--job-id`: holding,
registering and counting are each done once"). Real daemon and handlers; the enqueues reach the
session's private Redis through the fault-injecting proxy (tests/faultproxy.py), which holds the
reply of one call (the call ran in Redis) and then cuts the connection."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import redis
from faultproxy import FaultProxy
from support import DaemonProcess, RedisServer, jobd_cli, wait_until
from test_after_batches import CALLBACK, RUNS, batch_yaml, runs

Daemon = Callable[..., DaemonProcess]


def idle(r: redis.Redis, stream: str) -> bool:
    """Every entry of ``stream`` read and acknowledged by the daemon's group."""
    groups = r.xinfo_groups(stream) if r.exists(stream) else []
    return bool(groups) and all(g["pending"] == 0 and g["lag"] == 0 for g in groups)


def test_an_after_enqueue_whose_release_reply_is_lost_runs_its_job_once(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`jobd enqueue --after x --job-id h` where x is done already: the enqueue holds h,
    finds x ended, and releases h itself (unblock.lua). That release's reply lost (the
    connection cut), the enqueue fails, and the user runs the same command again, as the docs
    say to. hold.lua finds h no longer held (released), so it holds it again, and the second
    run releases it again: h is added to its stream twice and runs twice, though "holding,
    registering and counting are each done once"."""
    queues = batch_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK))
    with FaultProxy(redis_server.port) as proxy:
        direct = write_config("redis: {url: '{redis}'}\n" + queues)
        proxied = write_config(f"redis: {{url: '{proxy.url}'}}\n" + queues, name="proxied.yaml")
        daemon(direct)
        assert jobd_cli("enqueue", "-c", str(direct), "a", "x", "--job-id", "x").returncode == 0
        wait_until(lambda: runs(tmp_path) == ["x"] and idle(r, "jobd:a"), what="x done")
        proxy.hold_reply(b"released", to=b"EVALSHA")
        cmd = [sys.executable, "-m", "jobd", "enqueue", "-c", str(proxied), "a", "h",
               "--job-id", "h", "--after", "x"]  # fmt: skip
        enqueue = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: proxy.holding() == 1, what="the release's reply held")
        proxy.cut()
        enqueue.communicate(timeout=60)
        proxy.release()
        reran = enqueue.returncode != 0
        if reran:  # as the docs say: the same command again
            again = jobd_cli(*cmd[3:])
            assert again.returncode == 0, again.stderr
    wait_until(lambda: "h" in runs(tmp_path) and idle(r, "jobd:a"), what="h run")
    assert r.xlen("jobd:a") == 2, (
        f"h added {r.xlen('jobd:a') - 1} times (enqueue run again: {reran})"
    )
    assert runs(tmp_path).count("h") == 1, runs(tmp_path)
