"""Review of issue 35 (workflows), round 4 (review35c): a garbage entry in a queue's outbox,
written by someone else, on the three-master cluster (where a job's follow-ups go through its
queue's outbox). store/workflows.py removes a notice it cannot read "so that it never holds
back the notices behind it"; docs/workflows.md promises a job's follow-ups are added once it is
done ("a follow-up is never silently dropped"). Real daemon and handlers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from redis.cluster import RedisCluster
from support import DaemonProcess, LocalCluster, jobd_cli, wait_until
from test_after_batches import RUNS, runs

from jobd.config import load

Daemon = Callable[..., DaemonProcess]

PARENT = """\
#!/bin/sh
cat > /dev/null
printf '{"queue": "t", "payload": "x"}\\n' > "$JOBD_ENQUEUE"
"""


def test_one_garbage_outbox_entry_holds_back_every_follow_up_to_its_stream(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    """An entry in queue p's outbox that is no follow-up jobd wrote (no ``kind``; its
    ``fields`` not cmsgpack), naming queue t's stream. Job p1 of p then exits 0 writing one
    follow-up into t. The move groups the outbox's entries by target (store/outbox.py
    ``_move_round``) and sends each group as one follow_up.lua call: the garbage entry makes
    that call fail, on every move, at the daemon's settle and at every tick of its duty, and
    the call never gets to p1's follow-up: p1.1 is never added (and every later follow-up of
    p's jobs into t, among the outbox's first 100 entries, neither). A notice jobd cannot read
    is removed; a follow-up jobd cannot read holds back the others for good."""
    nodes = ", ".join(cluster.nodes[:2])
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{nodes}]\n"
        "queues:\n"
        f"  p:\n    command: [{script('parent.sh', PARENT)}]\n    stream: 'rv35c:p'\n"
        f"  t:\n    command: [{script('runs.sh', RUNS)}]\n    stream: 'rv35c:t'\n"
    )
    config = load(str(cfg))
    t = config.queues["t"]
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    try:
        client.xadd(config.queues["p"].keys.outbox, {
            "queue": "t", "stream": t.stream, "delayed": t.keys.delayed,
            "mark": "{rv35c:t}:follow-up:not-jobds", "due": "", "member": "m", "job": "g",
            "fields": b"\xc1",
        })  # fmt: skip
        daemon(cfg)
        out = jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: "p1.1" in runs(tmp_path), 20, what="p1's follow-up p1.1 run")
        outbox = config.queues["p"].keys.outbox  # fix35c: the garbage entry logged and removed
        wait_until(lambda: client.xlen(outbox) == 0, 10, what="p's outbox emptied")
    finally:
        client.close()
