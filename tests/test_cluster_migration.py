"""Queues whose Redis Cluster slot is being migrated (resharding), on real servers on loopback:
two masters, the queues' slot set MIGRATING on its master A and IMPORTING on B, and held so,
first with every key still on A, then with the keys moved to B (MIGRATE) — for a while all but
one priority level's stream, which stays on A (a queue's keys split between the two nodes) —,
jobs added meanwhile through a cluster client (which follows ASK). Each must start promptly: a
command of several keys not all on the node it reaches is refused (TRYAGAIN, or ASK then
TRYAGAIN) for as long as the migration lasts, so a read in one script over a queue's keys would
run nothing until it ends. Once the slot is B's, every job has run exactly once.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from support import DaemonProcess, LocalCluster, acked_all, wait_until

from jobd.config import load

Daemon = Callable[..., DaemonProcess]

PROMPT = 1.5  # seconds from a job's XADD to its start, at most, while the slot migrates
HELD_ON_A = 3.0  # seconds the slot migrates with its keys still on A
HELD_SPLIT = 2.0  # then with them on B but the levels queue's high level's stream
HELD_ON_B = 3.0  # then with every key on B

# Every start is a line "PAYLOAD UNIX-TIME" in `starts`.
HANDLER = """
    #!/bin/sh
    p=$(cat)
    echo "$p $(date +%s.%N)" >> {dir}/starts
"""

SETTINGS = """
redis:
  cluster:
    nodes: [{nodes}]
defaults:
  command: [{dir}/h.sh]
  concurrency: 4
  lease: {{renew_every: 300ms, reclaim_after: 1500ms}}
shutdown_grace: 2s
queues:
  plain: {{stream: '{stream}'}}
  levels: {{stream: '{levels}', priorities: [high, low]}}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", masters=2)
    c.start()
    yield c
    c.stop()


def starts(tmp_path: Path) -> dict[str, list[float]]:
    """Payload -> the times (Unix) its job started."""
    found: dict[str, list[float]] = {}
    path = tmp_path / "starts"
    for line in path.read_text().splitlines() if path.exists() else []:
        payload, at = line.split()
        found.setdefault(payload, []).append(float(at))
    return found


def node_id(port: int) -> str:
    with redis.Redis(port=port) as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


class Producer:
    """Adds jobs through a cluster client, one to each of ``streams`` at a time, and checks
    that each starts promptly; ``payloads``: every job added."""

    def __init__(self, rc: RedisCluster, streams: list[str], tmp_path: Path) -> None:
        self.rc, self.streams, self.tmp_path = rc, streams, tmp_path
        self.payloads: list[str] = []

    def run_promptly(self, name: str) -> None:
        """Add a job to each stream and wait (polling) until each starts, PROMPT at most
        after it was added."""
        added = time.time()
        batch = [f"{name}-{i}" for i in range(len(self.streams))]
        for stream, payload in zip(self.streams, batch, strict=True):
            self.rc.xadd(stream, {"payload": payload})
        self.payloads += batch
        what = f"jobs {batch} to start, mid-migration"
        wait_until(lambda: set(batch) <= set(starts(self.tmp_path)), PROMPT + 1, what)
        late = {p: round(starts(self.tmp_path)[p][0] - added, 2) for p in batch}
        assert max(late.values()) < PROMPT, f"started late (seconds after added): {late}"

    def keep_adding(self, phase: str, hold: float) -> None:
        """Jobs about every second for ``hold`` seconds, each started promptly."""
        end = time.monotonic() + hold
        n = 0
        while time.monotonic() < end:
            began = time.monotonic()
            self.run_promptly(f"{phase}{n}")
            n += 1
            time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))  # pacing, not an assertion
        assert n >= 2


def migrate(a: redis.Redis, port: int, slot: int, keep: bytes | None = None) -> None:
    """MIGRATE the slot's keys on ``a`` (but ``keep``) to the server at ``port``."""
    keys = [k for k in a.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000) if k != keep]
    assert keys, "the queues' keys are on A"
    a.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)


def test_queues_mid_migration_keep_running_jobs(
    cluster: LocalCluster, daemon: Daemon, tmp_path: Path
) -> None:
    stream = next(f"mig:q{n}" for n in range(1000) if cluster.node_of_slot(
        key_slot(f"mig:q{n}".encode())) == 0)  # fmt: skip
    slot = key_slot(stream.encode())
    levels = f"{{{stream}}}:levels"  # a queue with priority levels, in the same slot
    a, b = cluster.servers
    handler = tmp_path / "h.sh"
    handler.write_text(textwrap.dedent(HANDLER.format(dir=tmp_path)).lstrip())
    handler.chmod(0o755)
    config = tmp_path / "jobd.yaml"
    config.write_text(
        SETTINGS.format(nodes=", ".join(cluster.nodes), dir=tmp_path, stream=stream, levels=levels)
    )
    high, low = (level.stream for level in load(config).queues["levels"].all_levels())
    assert low == levels, "the default level reads the queue's stream"
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", a.port)])
    daemon(config)
    producer = Producer(rc, [stream, high, levels], tmp_path)
    producer.run_promptly("warm")  # the queues' keys exist now (history, events)

    ids = {s.port: node_id(s.port) for s in (a, b)}
    with redis.Redis(port=a.port) as on_a, redis.Redis(port=b.port) as on_b:
        on_b.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[a.port])
        on_a.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[b.port])
        producer.keep_adding("a", HELD_ON_A)  # every key still on A
        migrate(on_a, b.port, slot, keep=high.encode())
        producer.keep_adding("split", HELD_SPLIT)  # one level's stream on A, the rest on B
        migrate(on_a, b.port, slot)
        assert not on_a.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        producer.keep_adding("b", HELD_ON_B)  # every key on B
        for port in (b.port, a.port):
            with redis.Redis(port=port) as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[b.port])
    producer.run_promptly("after")

    per_stream = len(producer.payloads) // 3
    for s in (stream, high, levels):
        wait_until(lambda s=s: acked_all(rc, s, per_stream), what=f"every job of {s} acked")
    found = starts(tmp_path)
    assert set(found) == set(producer.payloads)
    assert all(len(times) == 1 for times in found.values()), f"a job ran twice: {found}"
