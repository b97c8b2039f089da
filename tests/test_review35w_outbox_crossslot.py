"""Review 35w of issue 35 (medium): one entry in a queue's outbox whose ``mark`` is not in the
slot of the ``stream`` it names (someone else's XADD on the three-master cluster: a mark with
another hash tag, or no ``mark`` field at all, read as '') holds back, for good, every follow-up
of the queue's jobs into that stream among the outbox's first 100 entries.

What is wrong: store/outbox.py ``_move_round`` groups the outbox's follow-ups by their target
(stream, delayed set) and sends each group as one follow_up.lua call whose keys are the stream,
the delayed set and every entry's mark. Redis refuses the whole call (CROSSSLOT: "Keys in
request don't hash to the same slot") when one mark is in another slot, before follow_up.lua
runs: review 35c's fix (follow_up.lua skips an entry whose ``fields`` it cannot unpack, for the
caller to remove) never gets the chance. The call fails at the settle's move and at every tick
of the daemons' duty, and the real follow-ups grouped with it are never added. An entry
whose ``fields`` unpack to more than some 8 000 values does the same from inside follow_up.lua
(``add_job``'s ``unpack``: "too many results to unpack", after the entries before it in its
group were added: they are 'there' next time, those after it never).

Reproduce: cluster config with queues p (a parent that writes one follow-up into t) and t; XADD
into p's outbox {stream: t's stream, delayed: t's delayed set, mark: 'elsewhere' (another
slot), fields: a cmsgpack array}; start a daemon; `jobd enqueue p x --job-id p1`. p1 exits 0,
its follow-up p1.1 is written into the outbox and never reaches t (the daemon logs CROSSSLOT
every 2 s).

What should happen: as for 35c's unreadable fields, an entry that is no follow-up jobd wrote
(its mark not in its stream's slot: jobd derives every mark in its target's slot, keys.py
QueueKeys.follow_up) is logged and removed, or at least sent on its own, so that it never holds
back the follow-ups behind or beside it. Why it matters: docs/workflows.md promises a done
job's follow-ups are added ("never silently dropped"); here one foreign write stops a whole
pipeline stage on a cluster with nothing said but a repeated log line.

Suggested fix: in ``_move_round``, check each follow-up entry before grouping it: its mark and
stream and delayed set must hash to one slot (redis.cluster key_slot on a cluster; on one Redis
every key shares the "slot"), and ``mark`` must start with the target's follow-up prefix; an
entry failing that is logged and XDELed like 35c's garbage. Alternatively send each entry whose
group call fails again on its own, removing those that fail for CROSSSLOT.

Fixed (f35wb): each follow-up entry is looked at alone before it joins its group's call
(store/outbox.py ``follow_up_misfit``): a stream, delayed set or mark missing or empty, keys in
more than one cluster slot, a due time that is neither '' nor Unix ms nor +MS (ZADD refuses
'1e400') make it no follow-up jobd wrote: logged (its first names and values cut and escaped)
and removed, counted as moved. follow_up.lua skips, for the caller to remove, fields of more
than MAX_FIELDS pairs as it skips unreadable ones, before add_job's unpack could fail. A
release or batch notice whose call has keys in two slots, or a value redis-py cannot encode,
is removed the same way (``call_misfit``). The daemon test's wait for "p1 ran or its follow-up
in the outbox" went: p's handler writes no run, and once the move works the outbox never holds
two entries, so it could only pass while the defect was there. The second test shows each
kind of entry removed alone, the good follow-up behind them added in the same move; each of
its cases fails without its part of the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
from redis.cluster import RedisCluster
from support import DaemonProcess, LocalCluster, jobd_cli, wait_until
from test_after_batches import RUNS, runs

from jobd.config import load
from jobd.store.store import Store
from jobd.store.workflows import waiter_line

Daemon = Callable[..., DaemonProcess]

PARENT = """\
#!/bin/sh
cat > /dev/null
printf '{"queue": "t", "payload": "x"}\\n' > "$JOBD_ENQUEUE"
"""
PACKED = b"\x92\xa7payload\xa1x"  # cmsgpack's {'payload', 'x'}: fields follow_up.lua reads


def test_an_outbox_entry_whose_mark_is_in_another_slot_holds_back_the_follow_ups(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    nodes = ", ".join(cluster.nodes[:2])
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{nodes}]\n"
        "queues:\n"
        f"  p:\n    command: [{script('parent.sh', PARENT)}]\n    stream: 'rv35w:p'\n"
        f"  t:\n    command: [{script('runs.sh', RUNS)}]\n    stream: 'rv35w:t'\n"
    )
    config = load(str(cfg))
    t = config.queues["t"]
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    try:
        assert client.keyslot("elsewhere") != client.keyslot(t.stream)
        outbox = config.queues["p"].keys.outbox
        client.xadd(outbox, {
            "queue": "t", "stream": t.stream, "delayed": t.keys.delayed, "mark": "elsewhere",
            "due": "", "member": "m", "job": "g", "fields": PACKED,
        })  # fmt: skip
        daemon(cfg)
        out = jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1")
        assert out.returncode == 0, out.stderr
        wait_until(lambda: "p1.1" in runs(tmp_path), 20, what="p1's follow-up p1.1 run")
        wait_until(lambda: client.xlen(outbox) == 0, 10, what="p's outbox emptied")
    finally:
        client.close()


def packed(values: list[bytes]) -> bytes:
    """cmsgpack's array of ``values`` (strings under 32 bytes), as settle.lua packs fields."""
    n = len(values)
    head = bytes([0x90 + n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return head + b"".join(bytes([0xA0 + len(v)]) + v for v in values)


def test_each_entry_that_would_fail_its_grouped_call_is_removed_alone(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Entries of p's outbox that would each make the whole follow_up.lua call of their group
    fail (no mark; a mark in another slot; a due time no number: ZADD refuses 1e400; fields of
    8 002 values: add_job's unpack fails after the entries before it were added), and a release
    notice whose waiter's stream is in another slot than its queue (CROSSSLOT), each beside a
    follow-up jobd wrote into the same stream, last: one move removes each bad one, logged,
    adds the good one and raises nothing."""
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{cluster.nodes[0]}]\n"
        "queues:\n  p:\n    command: [/bin/true]\n    stream: 'rv35w:p'\n"
        "  t:\n    command: [/bin/true]\n    stream: 'rv35w:t'\n"
    )
    p, t = load(str(cfg)).queues["p"], load(str(cfg)).queues["t"]
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    try:
        good = {"queue": "t", "stream": t.stream, "delayed": t.keys.delayed, "due": "",
                "member": "m", "job": "g", "fields": packed([b"payload", b"x"])}  # fmt: skip
        waiter = {**orjson.loads(waiter_line(t, "h")), "stream": "elsewhere"}
        wide = packed([b"f%d" % (i // 2) for i in range(8002)])
        mark = [t.keys.follow_up("p", "g", "o", n) for n in range(3)]
        notice = {"kind": "release", "dep": "t d", "outcome": "done", "event": "done",
                  "waiter": orjson.dumps(waiter)}  # fmt: skip
        bad = [{**good}, {**good, "mark": "elsewhere"}, {**good, "mark": mark[0], "due": "1e400"},
               {**good, "mark": mark[1], "fields": wide}, notice]  # fmt: skip
        for fields in [*bad, {**good, "mark": mark[2]}]:
            client.xadd(p.keys.outbox, fields)
        assert Store(client).move_follow_ups(p) == 6
        assert client.xlen(p.keys.outbox) == 0
        assert [f for _, f in client.xrange(t.stream)] == [{b"payload": b"x"}]
    finally:
        client.close()
