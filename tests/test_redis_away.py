"""Redis that answers but cannot write for now: a failover behind one address (the old master
now a replica says READONLY), a script running past busy-reply-threshold (BUSY). That is Redis
being away for a while, not a job's failure: nothing is dropped, and jobd follows the address to
the new master."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis
from faultproxy import FaultProxy
from support import DaemonProcess, RedisServer, answers_busy, pending_count, wait_until
from support import words as lines

from jobd.config import load
from jobd.daemon.lease import Holdings, key, lease_clock
from jobd.daemon.recorder import Recorder
from jobd.job import Job
from jobd.outcome import Outcome, Verb

Daemon = Callable[..., DaemonProcess]


def test_a_failover_behind_one_address_is_followed(tmp_path: Path, script, daemon: Daemon) -> None:
    """The address (a VIP, a DNS name: here a proxy) moves to the promoted replica while the
    old master turns replica. Its READONLY used to be taken for the call's own error: the
    connection was kept, and the daemon never read again."""
    master = RedisServer(tmp_path / "a")
    master.start()
    r = redis.Redis(port=master.port)
    replica = RedisServer(tmp_path / "b")
    replica.start()
    b = redis.Redis(port=replica.port)
    try:
        b.replicaof("127.0.0.1", master.port)
        wait_until(lambda: b.info("replication")["master_link_status"] == "up")
        with FaultProxy(master.port) as proxy:
            script("job.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/ran\nsleep 1\n")
            config = tmp_path / "jobd.yaml"
            config.write_text(
                f"redis: {{url: '{proxy.url}'}}\nqueues:\n  q:\n    command: [./job.sh]\n"
                "    lease: {renew_every: 500ms, reclaim_after: 3s}\n"
            )
            d = daemon(config)
            r.xadd("jobd:q", {"payload": "x", "job_id": "before"})
            wait_until(lambda: lines(tmp_path / "ran")["before"] == 1, what="the first job")
            wait_until(lambda: b.xlen("jobd:q") == 1, what="the replica to catch up")
            b.replicaof("NO", "ONE")
            r.replicaof("127.0.0.1", replica.port)
            proxy.upstream = ("127.0.0.1", replica.port)  # new connections reach the new master
            for i in range(3):
                b.xadd("jobd:q", {"payload": "x", "job_id": f"after-{i}"})
            wait_until(lambda: len(lines(tmp_path / "ran")) == 4, 30, "the jobs after failover")
            wait_until(lambda: pending_count(b, "jobd:q") == 0, what="every job acked there")
            assert d.proc.poll() is None
    finally:
        replica.stop()
        master.stop()


def test_a_busy_redis_keeps_outcomes_until_it_answers_again(
    r: redis.Redis, redis_server, write_config
) -> None:
    """Another client's script runs past busy-reply-threshold: Redis answers BUSY to every
    write for a while. The recorder used to count that as the outcome's own failure, give up
    after 5 tries, and leave a job that exited 0 to run again."""
    q = load(str(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")))
    config, queue = q.redis, q.queues["q"]
    r.xgroup_create(queue.stream, queue.group, id="0", mkstream=True)
    mid = r.xadd(queue.stream, {"payload": "x"}).decode()
    r.xreadgroup(queue.group, "me", {queue.stream: ">"})
    holdings = Holdings()
    holdings.add(key(queue), [mid], lease_clock())
    recorder = Recorder(config, "me", holdings)
    recorder.start()
    recorder.store.client.ping()
    r.config_set("busy-reply-threshold", 100)
    slow = redis.Redis(port=redis_server.port, socket_timeout=60)
    busy = threading.Thread(target=_loop_until_killed, args=(slow,))
    busy.start()
    try:
        wait_until(lambda: answers_busy(r), what="Redis to answer BUSY")
        recorder.record([Outcome(Verb.ACK, queue, Job("q", mid, {b"payload": b"x"}, "job-1", 1))])
        end = time.monotonic() + 2.5  # longer than the 5 tries, 0.2 s apart, that it used to give
        wait_until(lambda: time.monotonic() >= end, 5)
    finally:
        _kill_script(r)
        busy.join(10)
        r.config_set("busy-reply-threshold", 5000)
    wait_until(
        lambda: pending_count(r, queue.stream) == 0, 15, "the ack written once Redis answers"
    )
    recorder.stop()
    recorder.join(10)


def _loop_until_killed(client: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # killed by SCRIPT KILL
        client.eval("while true do end", 0)


def _kill_script(client: redis.Redis) -> None:
    def killed() -> bool:
        try:
            client.script_kill()
        except redis.ResponseError as exc:
            return "NOTBUSY" in str(exc)
        return True

    wait_until(killed, 10, "the busy script killed")
