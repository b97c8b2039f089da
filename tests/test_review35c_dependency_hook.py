"""Review of issue 35 (workflows), round 4 (review35c): a held job dead-lettered `dependency`
and its queue's `on_dead_letter:` hook. docs/workflows.md: "`on_dead_letter: {queue: NAME}`
enqueues, each time a job of the queue is dead-lettered, one job into queue NAME whose payload
is the dead-letter record as JSON ... The job is written by the script that writes the
record"; and of --after: a failed dependency "dead-letters the waiting job at once, with
`jobd_error=dependency`", as does a bound that passes. Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import RUNS

from jobd.config import load

Daemon = Callable[..., DaemonProcess]


@pytest.mark.parametrize("how", ["dependency failed", "after-timeout"])
def test_a_job_dead_lettered_dependency_sends_its_on_dead_letter_job(
    r: redis.Redis, write_config, script, daemon: Daemon, how: str
) -> None:
    """Queue a has `on_dead_letter: {queue: alerts}`; job w of a waits for b:x. When x fails
    (or w's 1 s bound passes first), w is dead-lettered `dependency` (its record in a's
    dead-letter stream), but by unblock.lua / expire_held.lua (lib/workflows.lua held_dead),
    which never call the hook (lib/chains.lua is dead_letter.lua's only): no `w.dead` job ever
    reaches alerts. A pipeline whose every queue has an alerts hook (the docs' example) is
    silent when a step is dead-lettered because the one before it failed."""
    runs = script("runs.sh", RUNS)
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  a:\n    command: [{runs}]\n    on_dead_letter: {{queue: alerts}}\n"
        f"  b:\n    command: [{runs}]\n    retry: {{max_attempts: 1}}\n"
        f"  alerts:\n    command: [{runs}]\n"
    )
    dead = load(str(cfg)).queues["a"].dead_letter.stream
    timeout = ["--after-timeout", "1s"] if how == "after-timeout" else []
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "w", "--job-id", "w", "--after", "b:x",
                   *timeout)  # fmt: skip
    assert out.returncode == 0, out.stderr
    if how == "dependency failed":
        assert jobd_cli("enqueue", "-c", str(cfg), "b", "fail", "--job-id", "x").returncode == 0
    daemon(cfg)
    wait_until(lambda: r.exists(dead) and r.xlen(dead) == 1, 20, what="w dead-lettered")
    ((_, record),) = r.xrange(dead)
    assert record[b"jobd_error"] == b"dependency"

    def alerts() -> list[bytes]:
        return [f.get(b"jobd_job_id", b"") for _, f in r.xrange("jobd:alerts")]

    try:
        wait_until(lambda: alerts() == [b"w.dead"], 10, what="w's on_dead_letter job in alerts")
    finally:
        print("alerts:", alerts(), "dead-letter streams:", r.keys("*dead*"))


def test_on_a_cluster_the_held_jobs_hook_job_goes_through_the_outbox(
    cluster, script, daemon: Daemon, tmp_path
) -> None:
    """fix35c: on the three-master cluster the hook's queue is in another slot: the job is
    written into the held job's queue's outbox with its dead-letter record, and moved on."""
    from redis.cluster import RedisCluster

    runs = script("runs.sh", RUNS)
    nodes = ", ".join(cluster.nodes[:2])
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{nodes}]\nqueues:\n"
        f"  a:\n    command: [{runs}]\n    stream: 'rv35h:a'\n    on_dead_letter: {{queue: alerts}}\n"
        f"  b:\n    command: [{runs}]\n    stream: 'rv35h:b'\n    retry: {{max_attempts: 1}}\n"
        f"  alerts:\n    command: [{runs}]\n    stream: 'rv35h:alerts'\n"
    )
    config = load(str(cfg))
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    try:
        out = jobd_cli("enqueue", "-c", str(cfg), "a", "w", "--job-id", "w", "--after", "b:x")
        assert out.returncode == 0, out.stderr
        assert jobd_cli("enqueue", "-c", str(cfg), "b", "fail", "--job-id", "x").returncode == 0
        daemon(cfg)
        alerts = config.queues["alerts"].stream
        wait_until(lambda: client.exists(alerts) and client.xlen(alerts) == 1, 20,
                   what="w's on_dead_letter job in alerts")  # fmt: skip
        ((_, f),) = client.xrange(alerts)
        assert f[b"jobd_job_id"] == b"w.dead"
        assert b'"jobd_error":"dependency"' in f[b"payload"]
    finally:
        client.close()
