"""medium: on a Redis Cluster an outbox move sends every follow-up it read for one target in
one follow_up.lua call, whatever they hold: the follow-ups of several parents (8 parents of 7
jobs of 1 MiB each, each parent inside the default max_follow_ups_bytes of 8 MiB) are added by
one script of their sum, which max_follow_ups_bytes was meant to bound.

What is wrong. Review 35w's fix bounds what one parent's follow-ups hold (process/followups.py
``weight``, max_follow_ups_bytes) because Redis serves no other client while the one call that
writes them runs, and it keeps several parents settled together from adding up (settle.lua:
store/outcomes.py ``CALL_FIELDS``). On a cluster settle.lua writes them into the parent queue's
outbox, and store/outbox.py ``_move_round`` then reads up to MOVE_BATCH (100) entries and sends
all those of one target (stream, delayed set) as one follow_up.lua call, bounded by the count
of entries only: up to 100 follow-ups of the target's max_payload each (16 MiB by default). A
move gathers the follow-ups of every parent settled since the last one: the settling daemon's
own move right after its settle (which reads from the outbox's start, the other daemons'
entries included), and above all the outbox duty after a move failed or its daemon died
(``recorder._move_follow_ups``: "its duty moves them").

Reproduce (three-master cluster, one daemon): queue p (concurrency 8), each job writing 7 lines
of a 1 MiB payload into t; SLOWLOG on every node; 8 jobs of p held at a barrier, CLIENT PAUSE
WRITE on p's node for 1.5 s, the barrier opened: the outcomes gather, settle.lua writes their
56 follow-ups into p's outbox, and one move adds them. On t's node SLOWLOG shows follow_up.lua
call of 49 entries (49 MiB, 190 ms of Redis by SLOWLOG, where a call of one parent's 7 took
20-30 ms). A fix of the settle side alone (tests/open/test_review35y_heavy_parents_add_up.py)
leaves this: the settles of one pipeline are one round trip, the move after them reads all.

What should happen: as the docs say of settle (docs/workflows.md, "what bounds a file"), one
call adds at most about one max_follow_ups_bytes of follow-ups, or one follow-up when it alone
is more. Why it matters: the call blocks every client of that node: every daemon's renewals
and reads, every producer, for the sum of what was waiting (after an outage, 100 entries of up
to 16 MiB: 1.6 GiB in one call, and as much in one XRANGE reply).

Suggested fix: in ``_move_round``, cut each target's group into calls of at most a byte budget
(the sum of each entry's ``fields`` length, which the entry holds already; the queue's
max_follow_ups_bytes or a fixed bound near the default), an entry larger than the budget alone;
and read fewer entries when they are large (XRANGE COUNT stays, a budget of bytes stops the
round early).

Fixed (fixer f35y): store/outbox.py ``cut`` splits each target's entries into follow_up.lua
calls of at most the outbox queue's max_follow_ups_bytes (``packed_weight``: the packed
fields' bytes, 128 a field, the count read from cmsgpack's array header) and max_follow_ups
entries, an entry alone when it is more: here calls of 7. Not done: the XRANGE that reads up
to MOVE_BATCH entries still brings them all in one reply.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from support import DaemonProcess, LocalCluster, jobd_cli, wait_until

from jobd.config import load
from jobd.store.scripts import sha

Daemon = Callable[..., DaemonProcess]

PARENTS, LINES, MIB = 8, 7, 2**20


def node_of(client: RedisCluster, key: str) -> redis.Redis:
    """A plain client on the master that holds ``key``."""
    node = client.get_node_from_key(key)
    return redis.Redis(host=node.host, port=node.port)


def test_one_move_adds_the_follow_ups_of_many_parents_in_one_call(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    lines = tmp_path / "follow-ups"
    lines.write_text("".join(
        json.dumps({"queue": "t", "payload": "x" * (MIB - 64)}) + "\n" for _ in range(LINES)
    ))  # fmt: skip
    parent = script("parent.sh", f"""\
        #!/bin/sh
        cat > /dev/null
        touch {tmp_path}/started.$JOBD_JOB_ID
        while [ ! -e {tmp_path}/go ]; do sleep 0.05; done
        cat {lines} > "$JOBD_ENQUEUE"
        """)  # fmt: skip
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{cluster.nodes[0]}]\n"
        f"queues:\n  p:\n    command: [{parent}]\n    stream: 'rv35y:p'\n"
        f"    concurrency: {PARENTS}\n"
        "  t:\n    command: [/bin/true]\n    stream: 'rv35y:t'\n"
    )
    config = load(str(cfg))
    p, t = config.queues["p"], config.queues["t"]
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    p_node, t_node = node_of(client, p.stream), node_of(client, t.stream)
    try:
        daemon(cfg)
        for n in range(PARENTS):
            out = jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", f"p{n}")
            assert out.returncode == 0, out.stderr
        wait_until(lambda: len(list(tmp_path.glob("started.*"))) == PARENTS, 20, what="started")
        t_node.config_set("slowlog-log-slower-than", 0)
        t_node.config_set("slowlog-max-len", 100000)
        t_node.slowlog_reset()
        p_node.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        (tmp_path / "go").touch()
        wait_until(lambda: client.xlen(t.stream) == PARENTS * LINES, 30, what="all added")
        follow_up = sha("follow_up").encode()
        moved = []  # (follow-ups, µs) of each follow_up.lua call
        for entry in t_node.slowlog_get(100000):
            words = entry["command"].split(b" ", 3)
            if len(words) > 2 and words[1] == follow_up:
                moved.append((int(words[2]) - 2, entry["duration"]))
        assert moved, "no follow_up.lua call in t's node's SLOWLOG"
        most = max(moved)
        assert most[0] <= LINES, (
            f"one follow_up.lua call added {most[0]} follow-ups of 1 MiB ({most[1]} µs); "
            f"one parent's are {LINES}; all calls: {sorted(moved)}"
        )
    finally:
        p_node.close()
        t_node.close()
        client.close()
