"""Every way a job ends is told to the jobs waiting for it and to its batch (issue 35's gaps):
a job `jobd cancel` stops before it runs (waiting in its stream, in the delayed set, as it
becomes due, held for others), a held job cancelled, and a held job that waited its whole
bound (--after-timeout, the queue's max_wait). Real daemons and handlers on the session's
private Redis."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from support import LocalCluster, jobd_cli, wait_until
from test_after_batches import (
    CALLBACK,
    RUNS,
    Daemon,
    callbacks,
    cli,
    events,
    queues_yaml,
    records,
    runs,
)

from jobd.config import load
from jobd.job import Job
from jobd.outcome import Outcome, Verb
from jobd.store.store import Store


def dead(r: redis.Redis) -> dict[bytes, dict[bytes, bytes]]:
    return {f[b"jobd_job_id"]: f for _, f in r.xrange("{jobd:a}:dead")}


def test_jobs_cancelled_before_they_ran_tell_their_waiters_and_their_batch(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """x1 waits in the stream (acked unrun when read), x2 in the delayed set (removed), h is
    held (cancelled where it waits), y is found nowhere and enqueued after the cancel, delayed
    (removed as it becomes due): each one's waiters are told (dead-lettered `dependency`, or run
    with --after-any-outcome) and the batch of x1, x2 and h calls back once, all failed."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    cli(cfg, "enqueue", "a", "x1", "--job-id", "x1", "--batch", "B", "--on-complete", "cb")
    cli(cfg, "enqueue", "a", "x2", "--job-id", "x2", "--delay", "1h", "--batch", "B")
    cli(cfg, "enqueue", "a", "h", "--job-id", "h", "--after", "never", "--batch", "B")
    cli(cfg, "enqueue", "a", "w1", "--job-id", "w1", "--after", "x1")
    cli(cfg, "enqueue", "a", "w2", "--job-id", "w2", "--after", "x2", "--after-any-outcome")
    cli(cfg, "enqueue", "a", "wh", "--job-id", "wh", "--after", "h")
    cli(cfg, "enqueue", "a", "wy", "--job-id", "wy", "--after", "y")
    shown = json.loads(cli(cfg, "cancel", "a", "x1", "x2", "h", "y", "--json"))
    assert [(x["job_id"], x["found"]) for x in shown["jobs"]] == [
        ("x1", "waiting"), ("x2", "delayed"), ("h", "held"), ("y", "marked"),
    ], shown  # fmt: skip
    # The ends of x2 and h are told at once (the cancel moves its notices): w2 is released, wh
    # dead-lettered; x1's end comes when it is read, y's when it becomes due.
    assert sorted(r.hkeys("{jobd:a}:held")) == [b"w1", b"wy"]
    assert events(records(r, "jobd:a", "h"))[-1] == "cancelled"
    cli(cfg, "enqueue", "a", "y", "--job-id", "y", "--delay", "1s")
    daemon(cfg)
    wait_until(lambda: len(dead(r)) == 3, 20, what="w1, wh and wy dead-lettered")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "w2")), what="w2 run anyway")
    gone = dead(r)
    assert {j: f[b"jobd_error"] for j, f in gone.items()} == {
        b"w1": b"dependency", b"wh": b"dependency", b"wy": b"dependency"}  # fmt: skip
    assert gone[b"w1"][b"jobd_stderr"] == b"dependency a x1 cancelled"
    assert gone[b"wy"][b"jobd_stderr"] == b"dependency a y cancelled"
    wait_until(lambda: callbacks(tmp_path), 20, what="the batch's callback")
    time.sleep(0.5)  # a second callback would show
    assert callbacks(tmp_path) == [
        {"batch": "B", "state": "complete", "total": 3, "done": 0, "failed": 3, "pending": 0},
    ]  # fmt: skip
    assert runs(tmp_path) == ["w2"]
    assert r.hlen("{jobd:a}:held") == 0 and r.xlen("{jobd:a}:outbox") == 0


def test_a_held_job_waits_at_most_its_bound_then_is_dead_lettered(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """--after-timeout (or the queue's max_wait) bounds a held job's wait: it is dead-lettered
    `dependency` saying what it waited for, never seen or not ended; its own waiters are told.
    A held job with no bound waits on."""
    slow = "#!/bin/sh\nsleep 30\n"
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK))
                       + f"  slow:\n    command: [{script('slow.sh', slow)}]\n"
                       + "  bounded:\n"
                       + f"    command: [{script('runs2.sh', RUNS)}]\n    max_wait: 1s\n")  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "slow", "", "--job-id", "s")
    wait_until(lambda: r.hlen("{jobd:slow}:active") == 1, what="s running")
    cli(cfg, "enqueue", "a", "t", "--job-id", "t", "--after", "ghost", "--after", "slow:s",
        "--after-timeout", "1s")  # fmt: skip
    cli(cfg, "enqueue", "a", "wt", "--job-id", "wt", "--after", "t")
    cli(cfg, "enqueue", "a", "forever", "--job-id", "forever", "--after", "ghost")
    cli(cfg, "enqueue", "bounded", "m", "--job-id", "m", "--after", "a:ghost")
    wait_until(lambda: len(dead(r)) == 2, 20, what="t and wt dead-lettered")
    gone = dead(r)
    assert gone[b"t"][b"jobd_error"] == b"dependency"
    assert gone[b"t"][b"jobd_stderr"] == b"waited 1s for a ghost, never seen; slow s, not ended"
    assert gone[b"wt"][b"jobd_stderr"] == b"dependency a t dead-lettered"
    wait_until(lambda: r.xlen("{jobd:bounded}:dead") == 1, 20, what="m dead-lettered")
    ((_, m),) = r.xrange("{jobd:bounded}:dead")
    assert m[b"jobd_stderr"] == b"waited 1s for a ghost, never seen"
    assert r.hkeys("{jobd:a}:held") == [b"forever"]
    assert r.zcard("{jobd:a}:held:until") == 0
    assert "dead-lettered" in events(records(r, "jobd:a", "t"))
    assert runs(tmp_path) == []


def test_cancel_of_a_held_job_in_json_and_words(r: redis.Redis, write_config, script) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    cli(cfg, "enqueue", "a", "h", "--job-id", "h", "--after", "x")
    out = jobd_cli("cancel", "-c", str(cfg), "a", "h")
    assert out.returncode == 0 and b"held (waiting for other jobs)" in out.stdout, out
    assert r.hlen("{jobd:a}:held") == 0 and r.hlen("{jobd:a}:after") == 0
    assert jobd_cli("cancel", "-c", str(cfg), "a", "h").returncode == 3  # found nowhere now


def test_a_job_cancelled_instead_of_retried_tells_its_waiters_and_its_batch(
    r: redis.Redis, write_config, script
) -> None:
    """Its handler failed on its own as `jobd cancel` landed (the daemon had not stopped it
    yet): retry.lua acknowledges it cancelled, not retried, and tells its waiter and batch.
    (Written through the store: a daemon that learns of the cancel first settles it as
    cancelled, another path.)"""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    q = load(str(cfg)).queues["a"]
    cli(cfg, "enqueue", "a", "x", "--job-id", "x", "--batch", "R")
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x")
    r.xgroup_create("jobd:a", "jobd", id="0")
    ((_, [(mid, fields)]),) = r.xreadgroup("jobd", "me", {"jobd:a": ">"})
    shown = json.loads(cli(cfg, "cancel", "a", "x", "--json"))
    assert shown["jobs"][0]["found"] == "running"
    store = Store(r, "me")
    store.settle([Outcome(Verb.RETRY, q, Job.from_entry("a", mid, fields), error="exit",
                          delay=10)])  # fmt: skip
    assert r.zcard("{jobd:a}:delayed") == 0  # not retried
    assert events(records(r, "jobd:a", "x"))[-1] == "cancelled"
    store.move_follow_ups(q)
    assert dead(r)[b"w"][b"jobd_stderr"] == b"dependency a x cancelled"
    state = store.batch_op("R", "show")
    assert state is not None and (state.state, state.failed) == ("complete", 1)


def test_on_a_cluster_a_held_job_expires_and_a_cancelled_one_tells_across_slots(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = tmp_path / "cluster.yaml"
    nodes = ", ".join(cluster.nodes[:2])
    cfg.write_text(f"redis:\n  cluster:\n    nodes: [{nodes}]\n"
                   + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK), "ends:"))  # fmt: skip
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    assert cluster.master_of(client.keyslot("ends:a")) != cluster.master_of(
        client.keyslot("ends:b")
    ), "a and b on one node"
    try:
        daemon(cfg)
        cli(cfg, "enqueue", "a", "t", "--job-id", "t", "--after", "b:ghost", "--after-timeout",
            "1s")  # fmt: skip
        cli(cfg, "enqueue", "b", "h", "--job-id", "h", "--after", "ghost", "--batch", "K",
            "--on-complete", "cb")  # fmt: skip
        cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "b:h")
        cli(cfg, "cancel", "b", "h")
        wait_until(lambda: client.xlen("{ends:a}:dead") == 2, 20, what="t and w dead-lettered")
        gone = {f[b"jobd_job_id"]: f[b"jobd_stderr"] for _, f in client.xrange("{ends:a}:dead")}
        assert gone == {b"t": b"waited 1s for b ghost, never seen",
                        b"w": b"dependency b h cancelled"}  # fmt: skip
        wait_until(lambda: callbacks(tmp_path), 20, what="K's callback")
        assert callbacks(tmp_path)[0]["failed"] == 1
    finally:
        client.close()
