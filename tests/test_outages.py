"""Redis going away under load, and connections cut: nothing lost, the daemon carries on."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import redis
from support import DaemonProcess, acked_all, outage, pending_count, wait_until
from support import words as lines

Daemon = Callable[..., DaemonProcess]


def test_redis_outages_under_load_lose_nothing(
    durable_redis, tmp_path: Path, script, daemon: Daemon
) -> None:
    script("short.sh", f"#!/bin/sh\nsleep 0.01\necho $JOBD_JOB_ID >> {tmp_path}/short\n")
    script(
        "long.sh",
        f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/long.started\nsleep 7\n"
        f"echo $JOBD_JOB_ID >> {tmp_path}/long\n",
    )
    config = tmp_path / "jobd.yaml"
    config.write_text(
        f"redis: {{url: '{durable_redis.url}'}}\n"
        "defaults:\n  lease: {renew_every: 500ms, reclaim_after: 2s}\n"
        "queues:\n"
        "  short: {command: [./short.sh], concurrency: 8}\n"
        "  long: {command: [./long.sh], concurrency: 8, timeout: 1m}\n"
    )
    r = redis.Redis(port=durable_redis.port)
    pipe = r.pipeline(transaction=False)
    for i in range(600):
        pipe.xadd("jobd:short", {"payload": "x", "job_id": f"s-{i}"})
    pipe.execute()
    d = daemon(config)

    wait_until(lambda: len(lines(tmp_path / "short")) >= 150, what="150 short jobs done")
    outage(durable_redis, 3)
    wait_until(lambda: len(lines(tmp_path / "short")) == 600, 60, "all 600 short jobs done")

    for i in range(8):
        r.xadd("jobd:long", {"payload": "x", "job_id": f"l-{i}"})
    wait_until(lambda: len(lines(tmp_path / "long.started")) == 8, what="8 long jobs running")
    # Twice reclaim_after: the leases lapse meanwhile; the jobs run on 3 s past it (7 s).
    outage(durable_redis, 4)
    wait_until(lambda: len(lines(tmp_path / "long")) == 8, 60, "all 8 long jobs done")

    r = redis.Redis(port=durable_redis.port)
    wait_until(lambda: pending_count(r, "jobd:short") == 0 and pending_count(r, "jobd:long") == 0)
    short, long = lines(tmp_path / "short"), lines(tmp_path / "long")
    print(
        f"outages: short done {len(short)}, duplicates {sum(short.values()) - len(short)}; "
        f"long done {len(long)}, duplicates {sum(long.values()) - len(long)}"
    )
    assert set(short) == {f"s-{i}" for i in range(600)}
    assert long == Counter({f"l-{i}": 1 for i in range(8)}), "long jobs ran once each"
    assert r.xlen("{jobd:short}:dead") == r.xlen("{jobd:long}:dead") == 0
    assert d.proc.poll() is None
    log = d.log()
    assert "Redis unreachable" in log and "Redis reachable again" in log
    assert log.count("Redis unreachable") <= 2 * 4, "logged once per change of state"


def test_killed_connections_are_reopened(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $(cat) >> {tmp_path}/ran\n")
    d = daemon(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./h.sh]}\n"))
    r.xadd("jobd:q", {"payload": "before"})
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    killed = r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed >= 3, "the daemon's reader, recorder and ticker connections"
    r.xadd("jobd:q", {"payload": "after"})
    wait_until(lambda: acked_all(r, "jobd:q", 2) and pending_count(r, "jobd:q") == 0)
    assert (tmp_path / "ran").read_text().split() == ["before", "after"]
    assert d.proc.poll() is None


def test_daemon_started_before_redis_waits_quietly_then_works(
    tmp_path: Path, script, daemon: Daemon
) -> None:
    from support import RedisServer

    server = RedisServer(tmp_path / "late-redis")  # its port is chosen; it is not running yet
    script("h.sh", f"#!/bin/sh\ncat > {tmp_path}/got\n")
    config = tmp_path / "jobd.yaml"
    config.write_text(f"redis: {{url: '{server.url}'}}\nqueues:\n  q: {{command: [./h.sh]}}\n")
    d = daemon(config)
    d.wait_log("Redis unreachable")
    process = psutil.Process(d.proc.pid)
    cpu_before, started = sum(process.cpu_times()[:2]), time.monotonic()
    wait_until(lambda: time.monotonic() - started >= 2, what="2 s of waiting for Redis")
    cpu = sum(process.cpu_times()[:2]) - cpu_before
    assert cpu < 0.2, f"the daemon spun while Redis was away: {cpu:.2f}s of CPU in 2 s"
    assert d.log().count("queue=q Redis unreachable") == 1, "logged once, not once per retry"
    server.start()
    try:
        redis.Redis(port=server.port).xadd("jobd:q", {"payload": "finally"})
        wait_until(lambda: acked_all(redis.Redis(port=server.port), "jobd:q", 1), what="the job")
        assert (tmp_path / "got").read_text() == "finally"
        assert d.proc.poll() is None
    finally:
        server.stop()
