"""Scale-out, on real servers on loopback: a 3-master Redis Cluster, a Sentinel group forced to
fail over under load, and many daemons sharing consumer groups while some are SIGKILLed."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.sentinel import Sentinel
from support import (
    DaemonProcess,
    LocalCluster,
    SentinelGroup,
    acked_all,
    jobd_cli,
    kill_with_handlers,
    wait_until,
)

from jobd.store.keys import QueueKeys

Daemon = Callable[..., DaemonProcess]

# Each job's payload says how its handler behaves: ok, flaky (fails its first attempt), bad
# (exit 65: dead-lettered at once) or slow (4 s, well past reclaim_after: only a renewed lease
# keeps it from being taken over). Every start is a line in `starts`, every success in `done`.
HANDLER = """
    #!/bin/sh
    p=$(cat)
    [ ${{#p}} -eq "$JOBD_PAYLOAD_BYTES" ] || exit 75  # orphaned by a SIGKILLed daemon mid-write
    echo "$JOBD_QUEUE $p $JOBD_ATTEMPT" >> {dir}/starts
    case $p in
      bad*) exit 65 ;;
      flaky*) [ "$JOBD_ATTEMPT" -ge 2 ] || exit 1 ;;
      slow*) sleep 4 ;;
    esac
    echo "$JOBD_QUEUE $p" >> {dir}/done
"""

QUEUE_SETTINGS = """
defaults:
  command: [./h.sh]
  concurrency: 4
  lease: {renew_every: 300ms, reclaim_after: 1500ms}
  retry: {max_attempts: 3, backoff: 100ms, max_backoff: 200ms}
  exit_codes: {fail: [65]}
shutdown_grace: 2s
"""


def lines(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(" ".join(line.split()[:2]) for line in path.read_text().splitlines())


def handler(tmp_path: Path) -> None:
    path = tmp_path / "h.sh"
    path.write_text(textwrap.dedent(HANDLER.format(dir=tmp_path)).lstrip())
    path.chmod(0o755)


# -- Redis Cluster -----------------------------------------------------------------------------


def spread_streams(cluster: LocalCluster, per_node: int) -> dict[str, str]:
    """Queue name → stream, ``per_node`` streams on each master."""
    chosen: dict[int, list[str]] = {i: [] for i in range(len(cluster.servers))}
    n = 0
    while any(len(v) < per_node for v in chosen.values()):
        stream = f"media:q{n}"
        node = cluster.node_of_slot(key_slot(stream.encode()))
        if len(chosen[node]) < per_node:
            chosen[node].append(stream)
        n += 1
    streams = sorted(s for v in chosen.values() for s in v)
    return {f"q{i}": s for i, s in enumerate(streams)}


def test_three_daemons_on_a_three_master_cluster(
    cluster: LocalCluster, daemon: Daemon, tmp_path: Path
) -> None:
    queues = spread_streams(cluster, 2)
    handler(tmp_path)
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes[:2]) + "]\n"
        + QUEUE_SETTINGS + "queues:\n"
        + "".join(f"  {name}: {{stream: '{s}'}}\n" for name, s in queues.items())
    )  # fmt: skip
    assert jobd_cli("validate", str(config)).returncode == 0
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.servers[2].port)])

    # Daemon A takes the slow jobs; it is SIGKILLed with its handlers mid-way, B and C take over.
    first = daemon(config)
    for stream in queues.values():
        for i in range(2):
            rc.xadd(stream, {"payload": f"slow{i}"})
    wait_until(lambda: len(lines(tmp_path / "starts")) == 12, what="A running the slow jobs")
    # Killed before B and C start: starting two daemons can take longer than a slow job (seen
    # under load in CI: A finished them all, and no one took anything over).
    kill_with_handlers(first)
    assert not (tmp_path / "done").exists(), "A was killed mid-way through the slow jobs"
    others = [daemon(config), daemon(config)]
    for stream in queues.values():
        for i in range(10):
            rc.xadd(stream, {"payload": f"ok{i}"})
        for i in range(2):
            rc.xadd(stream, {"payload": f"flaky{i}"})
            rc.xadd(stream, {"payload": f"bad{i}"})
    done = tmp_path / "done"
    wait_until(lambda: sum(lines(done).values()) == 6 * 14, what="every job done")

    starts = lines(tmp_path / "starts")
    for name in queues:
        assert all(starts[f"{name} ok{i}"] == 1 for i in range(10))
        assert all(starts[f"{name} flaky{i}"] == 2 for i in range(2)), "retried once"
        assert all(starts[f"{name} bad{i}"] == 1 for i in range(2)), "dead-lettered at once"
        # Once by A (killed), once by B or C: their renewed leases kept them from a third run.
        slow = {i: starts[f"{name} slow{i}"] for i in range(2)}
        assert all(n == 2 for n in slow.values()), f"{name}: slow jobs started {slow}"
    assert set(lines(done).values()) == {1}

    # Every key of a queue lives on its stream's master, and nothing is left pending.
    for stream in queues.values():
        keys = QueueKeys.of(stream)
        node = cluster.servers[cluster.node_of_slot(key_slot(stream.encode()))]
        with redis.Redis(port=node.port) as own:
            wait_until(lambda own=own, keys=keys: own.xlen(keys.dead_letter) == 2)
            # A handler writes "done" before it exits; its ack follows the exit (the race this
            # used to lose by asserting at once).
            wait_until(lambda own=own, s=stream: own.xpending(s, "jobd")["pending"] == 0)
            # This minute's counters, or the last minute's when the jobs ran in it (the test
            # may cross a minute's end: seen once in CI).
            minute = int(time.time() // 60)
            assert own.exists(keys.stats(minute), keys.stats(minute - 1)) >= 1

    # The commands work on the cluster too.
    status = json.loads(jobd_cli("status", "-c", str(config), "--json").stdout)
    assert {name: q["dead_lettered"] for name, q in status["queues"].items()} == dict.fromkeys(
        queues, 2
    )
    assert len(jobd_cli("dlq", "-c", str(config), "q0", "list").stdout.splitlines()) == 2
    out = jobd_cli("dlq", "-c", str(config), "q0", "requeue", "--all")
    assert out.returncode == 0 and b"requeued 2" in out.stdout, out
    wait_until(lambda: lines(tmp_path / "starts")["q0 bad0"] == 2, what="a requeued job run")
    for name in ("q0", "q5"):  # a write and its WAIT go to the node of the queue's slot
        out = jobd_cli("enqueue", "-c", str(config), name, "ok-cli", "--wait-replicas", "0")
        assert out.returncode == 0, out.stderr
        out = jobd_cli("enqueue", "-c", str(config), name, "ok-later", "--delay", "200ms")
        assert out.returncode == 0, out.stderr
    for key in ("q0 ok-cli", "q5 ok-cli", "q0 ok-later", "q5 ok-later"):
        wait_until(lambda key=key: lines(done)[key] == 1, what=f"{key} from `jobd enqueue`")
    wait_until(lambda: rc.xlen(QueueKeys.of(queues["q0"]).dead_letter) == 2)
    out = jobd_cli("dlq", "-c", str(config), "q0", "purge", "--yes")
    assert out.returncode == 0, out.stderr
    assert rc.xlen(QueueKeys.of(queues["q0"]).dead_letter) == 0
    for d in others:
        assert d.stop() == 0
    rc.close()


# -- Sentinel ----------------------------------------------------------------------------------


class Producer(threading.Thread):
    """XADDs numbered jobs as fast as ``rate`` allows through a Sentinel-managed client, and
    remembers which ones Redis acknowledged (and when): a job counts as enqueued only then."""

    def __init__(self, sentinel: Sentinel, name: str, streams: list[str], rate: float) -> None:
        super().__init__(daemon=True)
        self.client = sentinel.master_for(name, socket_timeout=1, socket_connect_timeout=1)
        self.streams, self.interval = streams, 1 / rate
        self.acked: dict[str, float] = {}  # payload → when Redis acknowledged the XADD
        self.failed = 0  # XADDs that raised: the producer knows they may not be enqueued
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            payload = f"ok{n}"
            try:
                self.client.xadd(self.streams[n % len(self.streams)], {"payload": payload})
                self.acked[payload] = time.monotonic()
            except redis.RedisError:
                self.failed += 1
            n += 1
            time.sleep(self.interval)

    def stop(self) -> None:
        self.halt.set()
        self.join()
        self.client.close()


def test_daemons_follow_a_sentinel_failover_under_load(daemon: Daemon, tmp_path: Path) -> None:
    group = SentinelGroup(tmp_path / "servers")
    group.start()
    try:
        handler(tmp_path)
        config = tmp_path / "sentinel.yaml"
        config.write_text(
            f"redis:\n  sentinel: {{master: {group.name}, nodes: [{', '.join(group.nodes)}]}}\n"
            + QUEUE_SETTINGS + "queues:\n  a: {}\n  b: {}\n"
        )  # fmt: skip
        daemons = [daemon(config), daemon(config)]
        sentinel = Sentinel([("127.0.0.1", p) for p in group.sentinel_ports])
        producer = Producer(sentinel, group.name, ["jobd:a", "jobd:b"], rate=200)
        producer.start()
        done = tmp_path / "done"
        wait_until(lambda: sum(lines(done).values()) >= 200, what="jobs flowing before")
        group.failover()
        failed_over = time.monotonic()
        wait_until(
            lambda: sum(at > failed_over for at in list(producer.acked.values())) >= 200,
            what="200 jobs enqueued on the new master",
        )
        producer.stop()

        after = {p for p, at in producer.acked.items() if at > failed_over}

        def ran() -> set[str]:
            return {key.split()[1] for key in lines(done)}

        wait_until(lambda: after <= ran(), what="every job enqueued after the failover to run")
        with sentinel.master_for(group.name) as master:
            wait_until(
                lambda: all(acked_all(master, s, master.xlen(s)) for s in ("jobd:a", "jobd:b"))
            )
        runs = Counter(key.split()[1] for key in lines(done).elements())
        lost = set(producer.acked) - set(runs)
        duplicated = {p for p, n in runs.items() if n > 1}
        print(
            f"Sentinel failover under load: {len(producer.acked)} jobs enqueued "
            f"({producer.failed} XADDs failed and were not counted), {len(lost)} lost, "
            f"{len(duplicated)} run twice"
        )

        # The commands follow the new master too.
        # The old master is now the replica: a producer can wait for it to have the job.
        out = jobd_cli("enqueue", "-c", str(config), "a", "ok-cli", "--wait-replicas", "1")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: "ok-cli" in ran(), what="a job enqueued by `jobd enqueue`")
        status = json.loads(jobd_cli("status", "-c", str(config), "--json").stdout)
        assert set(status["queues"]) == {"a", "b"}
        assert jobd_cli("dlq", "-c", str(config), "a", "list").returncode == 0
        for d in daemons:
            assert d.stop() == 0
    finally:
        group.stop()


# -- many daemons on one Redis -----------------------------------------------------------------


def test_four_daemons_two_killed_mid_way_lose_nothing(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    handler(tmp_path)
    config = write_config(
        "redis: {url: '{redis}'}\n" + QUEUE_SETTINGS + "queues:\n  a: {}\n  b: {}\n"
    )
    daemons = [daemon(config) for _ in range(4)]
    pipe = r.pipeline(transaction=False)
    for n in range(5000):
        pipe.xadd("jobd:a" if n % 2 else "jobd:b", {"payload": f"ok{n}"})
    pipe.execute()
    done = tmp_path / "done"
    wait_until(lambda: sum(lines(done).values()) >= 1500, what="a third of the jobs done")
    killed = [d.consumer() for d in daemons[:2]]
    for d in daemons[:2]:
        kill_with_handlers(d)
    # What the killed daemons held (running, or finished but not yet acked): frozen now, until
    # their leases lapse. Only these jobs may run twice.
    held = set()
    for stream in ("jobd:a", "jobd:b"):
        for name in killed:
            for entry in r.xpending_range(stream, "jobd", "-", "+", 1000, consumername=name):
                [(_, fields)] = r.xrange(stream, entry["message_id"], entry["message_id"])
                held.add(fields[b"payload"].decode())
    wait_until(
        lambda: acked_all(r, "jobd:a", 2500) and acked_all(r, "jobd:b", 2500),
        timeout=90,
        what="every job acknowledged",
    )
    runs = Counter(key.split()[1] for key in lines(done).elements())
    lost = {f"ok{n}" for n in range(5000)} - set(runs)
    twice = sorted(p for p, n in runs.items() if n > 1)
    print(
        f"4 daemons, 2 SIGKILLed: 5000 jobs, {len(lost)} lost, {len(twice)} run twice "
        f"(the killed daemons held {len(held)} unacked)"
    )
    assert not lost
    assert set(twice) <= held, f"run twice but not held by a killed daemon: {set(twice) - held}"


def test_every_control_and_the_dashboard_work_on_a_cluster(
    cluster: LocalCluster, daemon: Daemon, tmp_path: Path
) -> None:
    """Each script names all its keys, in one slot: Redis Cluster refuses anything else."""
    handler(tmp_path)
    config = tmp_path / "controls.yaml"
    config.write_text(
        "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes) + "]\n" + QUEUE_SETTINGS
        + "queues:\n  c:\n    stream: 'media:controls'\n    priorities: [high, low]\n"
        "    limits: {concurrency: 2, rate: 100/1s}\n    dedupe: {window: 1h}\n"
        "    schedule: [{cron: '* * * * * *', payload: ok-tick, name: tick}]\n"
    )  # fmt: skip
    d = daemon(config)
    c = str(config)
    for args in (["ok-high", "--priority", "high"], ["ok-u", "--job-id", "u", "--unique"],
                 ["ok-d", "--job-id", "u"], ["flaky", "--priority", "high"]):  # fmt: skip
        out = jobd_cli("enqueue", "-c", c, "c", *args)
        assert out.returncode == 0, out.stderr
    done = tmp_path / "done"
    wait_until(
        lambda: {"c ok-high", "c ok-u", "c flaky", "c ok-tick"} <= set(lines(done)),
        what="jobs of every kind done",
    )
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.servers[0].port)])
    from jobd.config import load
    from jobd.store.store import Store
    from jobd.web.dashboard import overview

    q = overview(Store(rc), load(c))["queues"]["c"]
    assert q["hour"]["series"]["done"][-1] + q["hour"]["series"]["done"][-2] >= 4
    assert list(q["levels"]) == ["high", "low"] and q["limits"]["slots"]["limit"] == 2
    rc.close()
    errors = [line for line in d.log().splitlines() if " ERROR " in line]
    assert not errors, errors


def test_pause_resume_and_cancel_on_a_cluster(
    cluster: LocalCluster, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd pause`, `resume` and `cancel` on a three-master cluster, with two daemons and a
    queue on each of two masters (each script in its queue's slot): a paused queue starts
    nothing while the other runs; a running job on either daemon is cancelled through the lease
    renewal's reply; a delayed one is removed."""
    handler(tmp_path)
    queues = dict(list(spread_streams(cluster, 1).items())[:2])
    config = tmp_path / "cluster-controls.yaml"
    config.write_text(
        "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes) + "]\n" + QUEUE_SETTINGS
        + "queues:\n" + "".join(f"  {n}: {{stream: '{s}'}}\n" for n, s in queues.items())
    )  # fmt: skip
    (held, held_stream), (other, other_stream) = queues.items()
    daemons = [daemon(config), daemon(config)]
    c = str(config)
    assert jobd_cli("pause", "-c", c, held).returncode == 0
    for d in daemons:
        d.wait_log(f"queue={held} paused by ")
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.servers[0].port)])
    rc.xadd(held_stream, {"payload": "ok-held"})
    rc.xadd(other_stream, {"payload": "slow-other", "job_id": "slow-1"})
    starts = tmp_path / "starts"
    wait_until(lambda: f"{other} slow-other 1" in starts.read_text() if starts.exists() else False,
               what="the slow job of the queue not paused to start")  # fmt: skip
    assert f"{held} ok-held" not in starts.read_text()
    out = jobd_cli("cancel", "-c", c, other, "slow-1")
    assert out.returncode == 0 and b"slow-1: running on " in out.stdout, out
    wait_until(lambda: rc.xpending(other_stream, "jobd")["pending"] == 0, what="the cancellation")
    assert (
        jobd_cli("enqueue", "-c", c, held, "later", "--job-id", "d-1", "--delay", "1h").returncode
        == 0
    )
    out = jobd_cli("cancel", "-c", c, held, "d-1")
    assert out.returncode == 0 and b"d-1: delayed (due " in out.stdout, out
    assert jobd_cli("resume", "-c", c, held).returncode == 0
    done = tmp_path / "done"
    wait_until(lambda: f"{held} ok-held" in set(lines(done)), what="the paused job, resumed")
    assert f"{other} slow-other" not in set(lines(done)), "cancelled: stopped, never done"
    assert "later" not in starts.read_text()
    rc.close()
    # `jobd job` and `jobd events` read each queue on its own master.
    for queue, job in ((other, "slow-1"), (held, "d-1")):
        out = jobd_cli("job", "-c", c, queue, job, "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["state"] == "cancelled", out
    out = jobd_cli("events", "-c", c, "--json", "--count", "100")
    said = [json.loads(line) for line in out.stdout.splitlines()]
    kinds = {(e["queue"], e["event"]) for e in said}
    assert {(held, "pause"), (held, "resume"), (other, "cancel"), (held, "cancel")} <= kinds
    assert {(other, "cancelled"), (held, "cancelled"), (held, "done")} <= kinds
