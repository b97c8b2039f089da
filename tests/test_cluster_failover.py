"""A Redis Cluster master failover under load (issue 16), on real servers on loopback: three
masters with one replica each (cluster-node-timeout 1 s), two `jobd run` daemons, a producer
adding jobs to two queues — `hot` on the shard that fails over, `cold` on another — and the hot
shard's master replaced while jobs run, retry, hold renewed leases and are acknowledged.

- Graceful (`CLUSTER FAILOVER` on the replica): the master holds its writers until the replica
  has every write, then steps down, so nothing acknowledged is lost. Every job runs once (the
  flaky ones twice: they fail once and retry), unless a daemon logged taking it over.
- Crash (SIGKILL of the master; the cluster promotes its replica once the master has been
  unreachable for cluster-node-timeout): replication is asynchronous, so whatever the master
  acknowledged but had not yet sent is gone — enqueues (those jobs are lost) and acks (those
  jobs run again). What still holds, and what is asserted: every job a replica confirmed
  (WAIT 1) runs, every job enqueued after the failover runs, nothing stays pending, no retry
  stays waiting, the daemons live on.
"""

from __future__ import annotations

import re
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from support import DaemonProcess, LocalCluster, acked_all, jobd_cli, wait_until

from jobd.config import load
from jobd.producer import Durability, NotDurable, ProducerError, enqueue
from jobd.store.keys import QueueKeys

Daemon = Callable[..., DaemonProcess]

JOBS = 300  # enqueued under load, alternately on `hot` and `cold`
RATE = 60  # a second: the producer is still at work well after the failover
AFTER = 60  # enqueued once the failover is over

# Every start is a line "JOB_ID ATTEMPT" in `starts`, every success a line "JOB_ID" in `done`.
# flaky* fails its first attempt and is retried (through the delayed set); slow* runs 2 s, past
# reclaim_after: only leases renewed on the new master keep it from being taken over; the
# others run 0.1 s, so that several jobs of each queue are running when the master changes.
HANDLER = """
    #!/bin/sh
    echo "$JOBD_JOB_ID $JOBD_ATTEMPT" >> {dir}/starts
    case $JOBD_JOB_ID in
      flaky*) [ "$JOBD_ATTEMPT" -ge 2 ] || exit 1 ;;
      slow*) sleep 2 ;;
      *) sleep 0.1 ;;
    esac
    echo "$JOBD_JOB_ID" >> {dir}/done
"""

SETTINGS = """
defaults:
  command: [{dir}/h.sh]
  concurrency: 4
  lease: {{renew_every: 300ms, reclaim_after: 1500ms}}
  retry: {{max_attempts: 5, backoff: 100ms, max_backoff: 200ms}}
shutdown_grace: 3s
"""


def job_id(n: int) -> str:
    if n % 25 == 7:
        return f"slow{n}"
    return f"flaky{n}" if n % 10 == 3 else f"ok{n}"


def counts(path: Path) -> Counter[str]:
    """How many lines of ``path`` name each job id."""
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().splitlines() if line.strip())


def streams_apart(cluster: LocalCluster) -> tuple[str, str]:
    """Two streams: one on shard 0 (the one failed over), one on shard 1."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < 2:
        stream = f"work:{n}"
        shard = cluster.node_of_slot(key_slot(stream.encode()))
        if shard in (0, 1):
            found.setdefault(shard, stream)
        n += 1
    return found[0], found[1]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "servers", masters=3, replicas_per_master=1, node_timeout_ms=1000)
    c.start()
    yield c
    c.stop()


def setup(tmp_path: Path, cluster: LocalCluster) -> tuple[Path, dict[str, str], int]:
    """The handler and a config with the two queues; returns it, queue → stream, hot's slot."""
    handler = tmp_path / "h.sh"
    handler.write_text(textwrap.dedent(HANDLER.format(dir=tmp_path)).lstrip())
    handler.chmod(0o755)
    hot, cold = streams_apart(cluster)
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes) + "]\n"
        + SETTINGS.format(dir=tmp_path)
        + f"queues:\n  hot: {{stream: '{hot}'}}\n  cold: {{stream: '{cold}'}}\n"
    )  # fmt: skip
    return config, {"hot": hot, "cold": cold}, key_slot(hot.encode())


def cluster_client(cluster: LocalCluster) -> RedisCluster:
    nodes = [ClusterNode("127.0.0.1", s.port) for s in cluster.servers]
    return RedisCluster(startup_nodes=nodes, socket_timeout=2, socket_connect_timeout=1)


class Producer(threading.Thread):
    """Enqueues job ids ``first`` … ``first+count-1``, alternately on `hot` and `cold`, about
    ``rate`` a second, each sent once and never again. ``acked``: the job ids Redis
    acknowledged; ``failed``: those whose enqueue raised (in Redis or not: the producer cannot
    know). Plain: `XADD` through one long-lived cluster client (redis-py follows MOVED and
    finds a new master after a connection error). ``durable``: `jobd.producer.enqueue` with
    `Durability(replicas=1)` on a client of its own each time (what `jobd enqueue
    --wait-replicas 1` does): acknowledged means a replica has the job too."""

    def __init__(
        self, config: Path, first: int, count: int, rate: float, durable: bool = False
    ) -> None:
        super().__init__(daemon=True)
        self.config = load(str(config))
        self.first, self.count, self.interval, self.durable = first, count, 1 / rate, durable
        nodes = [ClusterNode(h, p) for h, p in self.config.redis.cluster or ()]
        self.client = RedisCluster(startup_nodes=nodes, socket_timeout=2, socket_connect_timeout=1)
        self.acked: set[str] = set()
        self.failed: dict[str, str] = {}  # job id -> the error
        self.unconfirmed: set[str] = set()  # durable: enqueued, but no replica had it in time
        self.attempted = 0
        self.halt = threading.Event()

    def run(self) -> None:
        for n in range(self.first, self.first + self.count):
            if self.halt.is_set():
                return
            jid, queue = job_id(n), ("hot", "cold")[n % 2]
            try:
                if self.durable:
                    enqueue(self.config, queue, b"x", job_id=jid,
                            durability=Durability(replicas=1, timeout=0.2))  # fmt: skip
                else:
                    stream = self.config.queues[queue].stream
                    self.client.xadd(stream, {"payload": b"x", "job_id": jid})
                self.acked.add(jid)
            except NotDurable as exc:
                self.failed[jid] = repr(exc)
                self.unconfirmed.add(jid)
            except (redis.RedisError, ProducerError) as exc:
                self.failed[jid] = repr(exc)
            self.attempted += 1
            self.halt.wait(self.interval)

    def stop(self) -> None:
        self.halt.set()
        if self.is_alive():
            self.join(30)
        self.client.close()


def taken_over(daemons: list[DaemonProcess]) -> set[str]:
    """Job ids a daemon logged taking over (lease lapsed) or losing (lease lost)."""
    ids: set[str] = set()
    for d in daemons:
        log = d.log()
        ids |= set(re.findall(r"job=(\S+) lease lapsed; taken over", log))
        ids |= set(re.findall(r"job=(\S+) outcome not recorded: the lease was lost", log))
        ids |= set(re.findall(r"queue=\S+ job=(\S+) .*lease lost", log))
    return ids


def in_flight(cluster: LocalCluster, stream: str) -> int:
    """Entries of ``stream`` delivered and not yet acknowledged, on its master now."""
    master = cluster.master_of(key_slot(stream.encode()))
    assert master is not None
    with redis.Redis(port=master.port) as r:
        return int(r.xpending(stream, "jobd")["pending"])


def drained(rc: RedisCluster, streams: dict[str, str]) -> bool:
    """Every entry of every stream delivered and acknowledged, and no retry waiting."""
    try:
        return all(
            rc.zcard(QueueKeys.of(s).delayed) == 0 and acked_all(rc, s, rc.xlen(s))
            for s in streams.values()
        )
    except redis.RedisError:
        return False


def pending(rc: RedisCluster, streams: dict[str, str]) -> str:
    """What is left, for a failure message."""
    return ", ".join(
        f"{name}: {rc.xpending(s, 'jobd')['pending']} pending, "
        f"{rc.zcard(QueueKeys.of(s).delayed)} delayed"
        for name, s in streams.items()
    )


def wait_done(done: Path, wanted: set[str], timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while missing := wanted - set(counts(done)):
        assert time.monotonic() < end, f"not done after {timeout}s: {sorted(missing)}"
        time.sleep(0.05)


def wait_drained(rc: RedisCluster, streams: dict[str, str], timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not drained(rc, streams):
        assert time.monotonic() < end, f"still not drained after {timeout}s: {pending(rc, streams)}"
        time.sleep(0.05)


def test_graceful_cluster_failover_under_load_loses_nothing(
    cluster: LocalCluster, daemon: Daemon, tmp_path: Path
) -> None:
    config, streams, slot = setup(tmp_path, cluster)
    daemons = [daemon(config), daemon(config)]
    producer = Producer(config, 0, JOBS, RATE)
    producer.start()
    done = tmp_path / "done"
    wait_until(lambda: sum(counts(done).values()) >= JOBS // 4, what="jobs flowing before")
    busy = in_flight(cluster, streams["hot"])
    old, new = cluster.failover(slot)
    at = sum(counts(done).values())
    producer.join(JOBS / RATE + 30)
    producer.stop()
    assert not producer.is_alive()

    # The old master follows the new one: `jobd enqueue` can wait for it to have a job.
    out = jobd_cli("enqueue", "-c", str(config), "hot", "x", "--job-id", "ok-cli",
                   "--wait-replicas", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    enqueued = producer.acked | {"ok-cli"}
    wait_done(done, enqueued)
    rc = cluster_client(cluster)
    wait_drained(rc, streams)

    runs, starts = counts(done), counts(tmp_path / "starts")
    twice = {j for j, n in runs.items() if n > 1}
    again = taken_over(daemons)
    print(
        f"graceful cluster failover with {at} of {JOBS} jobs done, {busy} hot ones in flight: "
        f"{len(producer.acked)} "
        f"enqueued, {len(producer.failed)} XADDs failed, {len(twice)} run twice, "
        f"{len(again)} taken over"
    )
    assert not producer.failed, f"XADDs refused by a graceful failover: {producer.failed}"
    assert set(runs) == enqueued, "a job lost or invented"
    assert not twice - again, f"run twice, no takeover logged: {sorted(twice - again)}"
    for jid in enqueued - again:
        assert starts[jid] == (2 if jid.startswith("flaky") else 1), (jid, starts[jid])
    # The hot queue now lives on the promoted replica; its old master is a replica.
    with redis.Redis(port=new.port) as promoted:
        assert promoted.execute_command("ROLE")[0] == b"master"
        assert promoted.xpending(streams["hot"], "jobd")["pending"] == 0
        assert promoted.xlen(streams["hot"]) >= JOBS // 2
    with redis.Redis(port=old.port) as demoted:
        assert demoted.execute_command("ROLE")[0] == b"slave"
    for d in daemons:
        assert d.proc.poll() is None, f"a daemon died:\n{d.log()}"
        assert " ERROR " not in d.log(), d.log()
    for d in daemons:
        assert d.stop() == 0
    rc.close()


@pytest.mark.parametrize(
    "comes_back",
    [
        pytest.param(True, id="crashed-master-back"),
        pytest.param(False, id="crashed-master-stays-down"),
    ],
)
def test_cluster_master_killed_under_load_keeps_the_queue_moving(
    cluster: LocalCluster, daemon: Daemon, tmp_path: Path, comes_back: bool
) -> None:
    config, streams, slot = setup(tmp_path, cluster)
    daemons = [daemon(config), daemon(config)]
    producer = Producer(config, 0, JOBS, RATE, durable=True)
    producer.start()
    done = tmp_path / "done"
    wait_until(lambda: sum(counts(done).values()) >= JOBS // 4, what="jobs flowing before")
    busy = in_flight(cluster, streams["hot"])
    killed, promoted = cluster.kill_master(slot)
    at = sum(counts(done).values())
    if comes_back:  # the crashed server restarts and follows the master that replaced it
        cluster.restart(killed)
    # The producer goes on a while on the new master (each hot enqueue waits for a replica,
    # in vain while the crashed server is down), then stops.
    mark = producer.attempted
    wait_until(lambda: producer.attempted >= mark + 30 or not producer.is_alive(), 20)
    producer.stop()
    assert not producer.is_alive()

    # After the failover: every job enqueued runs, whether the crashed server is back or not.
    later = Producer(config, JOBS, AFTER, rate=200)
    later.run()
    later.stop()
    assert not later.failed, f"enqueues refused after the failover: {later.failed}"
    wanted = producer.acked | later.acked  # confirmed by a replica, or enqueued after
    wait_done(done, wanted)
    rc = cluster_client(cluster)
    wait_drained(rc, streams)

    runs = counts(done)
    twice = {j for j, n in runs.items() if n > 1}
    unconfirmed, refused = producer.unconfirmed, set(producer.failed) - producer.unconfirmed
    print(
        f"master SIGKILLed with {at} jobs done, {busy} hot ones in flight: "
        f"{len(producer.acked)} enqueues confirmed by a "
        f"replica, {len(unconfirmed)} enqueued but unconfirmed ({len(unconfirmed - set(runs))} "
        f"of them never ran: lost with the master), {len(refused)} failed while the cluster "
        f"was down ({len(refused & set(runs))} of them ran all the same), then {len(later.acked)} "
        f"enqueued after the failover; {len(twice)} jobs run twice, "
        f"{len(taken_over(daemons))} taken over"
    )
    assert set(runs) <= wanted | set(producer.failed), "a job nobody enqueued"
    with redis.Redis(port=promoted.port) as new:
        assert new.execute_command("ROLE")[0] == b"master"
    for d in daemons:
        assert d.proc.poll() is None, f"a daemon died:\n{d.log()}"
    for d in daemons:
        assert d.stop() == 0
    rc.close()


def test_one_producer_client_follows_a_cluster_failover(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """`jobd.producer.enqueue(..., client=c)` with one long-lived client, as an application
    holds one: it must reach the new master after a graceful failover and after a crash."""
    config, streams, slot = setup(tmp_path, cluster)
    loaded = load(str(config))
    client = cluster_client(cluster)
    assert enqueue(loaded, "hot", b"x", job_id="before", client=client) == "before"
    cluster.failover(slot)
    wait_until(
        lambda: _enqueues(loaded, client, "after-graceful"), 5, "an enqueue after a failover"
    )
    cluster.kill_master(slot)
    wait_until(lambda: _enqueues(loaded, client, "after-crash"), 5, "an enqueue after a crash")
    with redis.Redis(port=cluster.master_of(slot).port) as master:  # type: ignore[union-attr]
        ids = [f[b"job_id"] for _, f in master.xrange(streams["hot"])]
    assert ids[-2:] == [b"after-graceful", b"after-crash"], ids
    client.close()


def _enqueues(config: object, client: RedisCluster, job: str) -> bool:
    try:
        enqueue(config, "hot", b"x", job_id=job, client=client)  # type: ignore[arg-type]
    except ProducerError:
        return False
    return True
