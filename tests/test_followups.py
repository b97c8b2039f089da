"""Follow-ups (issue 35, workflows): the jobs a handler writes into the file JOBD_ENQUEUE names
are enqueued with its acknowledgement, exactly once, and never for a failed attempt. Real
daemons and handlers, the session's private Redis and its three-master cluster."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from support import DaemonProcess, LocalCluster, group_info, jobd_cli, wait_until

from jobd.config import load
from jobd.job import Job
from jobd.outcome import Outcome, Verb
from jobd.process import followups
from jobd.store.records import parse_records
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]

# Writes three follow-ups: two into b, one into c (a JSON payload).
THREE = """\
#!/bin/sh
cat > /dev/null
{
  printf '%s\\n' '{"queue": "b", "payload": "one"}'
  printf '%s\\n' '{"queue": "b", "payload": "two", "fields": {"k": "v"}}'
  printf '\\n'
  printf '%s\\n' '{"queue": "c", "payload": {"n": 3}}'
} > "$JOBD_ENQUEUE"
"""

# Writes its follow-ups, then fails on its first attempt; done on its second.
FAILS_FIRST = """\
#!/bin/sh
cat > /dev/null
printf '%s\\n' "{\\"queue\\": \\"b\\", \\"payload\\": \\"attempt $JOBD_ATTEMPT\\"}" > "$JOBD_ENQUEUE"
[ "$JOBD_ATTEMPT" -ge 2 ]
"""


def queues_yaml(command: Path | str, parent: str = "", streams: bool = False) -> str:
    """Queues a (the parent), b and c (follow-ups, run by /bin/true); on a cluster each in a
    slot of its own (streams named so)."""
    lines = ["queues:\n", f"  a:\n    command: [{command}]\n"]
    lines.append("    retry: {max_attempts: 2, backoff: 10ms}\n" + parent)
    if streams:
        lines.append("    stream: 'wf:a'\n")
    for name in ("b", "c"):
        lines.append(f"  {name}:\n    command: [/bin/true]\n")
        if streams:
            lines.append(f"    stream: 'wf:{name}'\n")
    return "".join(lines)


def config(write_config, command: Path | str, parent: str = "", name: str = "jobd.yaml") -> Path:
    return write_config("redis: {url: '{redis}'}\n" + queues_yaml(command, parent), name)


def job_ids(client: redis.Redis | RedisCluster, stream: str) -> list[str]:
    """The job ids of every entry of ``stream`` (nothing is trimmed in these tests)."""
    return [f[b"job_id"].decode() for _, f in client.xrange(stream)]


def records(client: redis.Redis | RedisCluster, stream: str, job_id: str) -> list[dict]:
    found, _ = parse_records(client.hget(f"{{{stream}}}:history", job_id))
    return [rec.raw for rec in found]


def enqueue(cfg: Path, queue: str, payload: str, job_id: str) -> None:
    out = jobd_cli("enqueue", "-c", str(cfg), queue, payload, "--job-id", job_id)
    assert out.returncode == 0, out.stderr


def test_a_done_parent_enqueues_its_three_follow_ups_once(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg = config(write_config, script("three.sh", THREE))
    daemon(cfg)
    enqueue(cfg, "a", "go", "p1")
    wait_until(lambda: records(r, "jobd:c", "p1.3"), what="the follow-up in c done")
    wait_until(lambda: len(records(r, "jobd:b", "p1.2")) == 1, what="the second in b done")
    assert job_ids(r, "jobd:b") == ["p1.1", "p1.2"]
    assert job_ids(r, "jobd:c") == ["p1.3"]
    (_, one), (_, two) = r.xrange("jobd:b")
    assert (one[b"payload"], one[b"jobd_parent"]) == (b"one", b"a p1")
    assert (two[b"payload"], two[b"k"]) == (b"two", b"v")
    assert r.xrange("jobd:c")[0][1][b"payload"] == b'{"n":3}'
    (done,) = records(r, "jobd:a", "p1")
    assert (done["follow_ups"], done["follow_up_jobs"]) == (3, ["b p1.1", "b p1.2", "c p1.3"])
    assert records(r, "jobd:b", "p1.1")[0]["parent"] == "a p1"
    events = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"follow-ups"]
    assert [(e[b"job"], e[b"count"], e[b"queues"]) for e in events] == [(b"p1", b"3", b"b,c")]
    shown = jobd_cli("job", "-c", str(cfg), "a", "p1").stdout.decode()
    assert "  follow-ups: 3\n    b p1.1\n    b p1.2\n    c p1.3" in shown
    assert "  parent: a p1" in jobd_cli("job", "-c", str(cfg), "b", "p1.2").stdout.decode()


def test_a_failed_attempt_enqueues_none_and_a_dead_lettered_parent_none(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    cfg = config(write_config, script("fails.sh", FAILS_FIRST))
    fails = script("always.sh", FAILS_FIRST.replace('[ "$JOBD_ATTEMPT" -ge 2 ]', "exit 1"))
    cfg_dead = config(write_config, fails, name="dead.yaml")
    first = daemon(cfg)
    enqueue(cfg, "a", "go", "retried")
    wait_until(lambda: records(r, "jobd:b", "retried.1"), what="the follow-up done")
    (_, only), *more = r.xrange("jobd:b")
    assert (only[b"payload"], more) == (b"attempt 2", [])
    assert first.stop() == 0
    daemon(cfg_dead)
    enqueue(cfg_dead, "a", "go", "dead")
    wait_until(lambda: r.xlen("{jobd:a}:dead") == 1, what="the parent dead-lettered")
    time.sleep(0.2)  # nothing is due to come: a late write would show here
    assert r.xlen("jobd:b") == 1


def test_a_file_jobd_will_not_take_dead_letters_the_parent_with_why(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    lines = {
        "over": ['{"queue": "b", "payload": "x"}'] * 3,
        "unknown": ['{"queue": "b", "payload": "x"}', '{"queue": "nope", "payload": "x"}'],
        "invalid": ['{"queue": "b", "payload": "x"}', '{"queue": "b", "payload": "x", "delya": 1}'],
    }
    handler = script("bad.sh", '#!/bin/sh\ncat > "$JOBD_ENQUEUE"\n')
    cfg = config(write_config, handler, "    max_follow_ups: 2\n")
    daemon(cfg)
    for name, body in lines.items():
        enqueue(cfg, "a", "\n".join(body) + "\n", name)
    wait_until(lambda: r.xlen("{jobd:a}:dead") == 3, what="three dead letters")
    why = {f[b"jobd_job_id"].decode(): f for _, f in r.xrange("{jobd:a}:dead")}
    assert {f[b"jobd_error"] for f in why.values()} == {b"enqueue"}
    assert b"more than max_follow_ups (2) jobs" in why["over"][b"jobd_stderr"]
    assert b"line 2: queue 'nope' is not in the config" in why["unknown"][b"jobd_stderr"]
    assert b"line 2: unknown key 'delya' (did you mean 'delay'?)" in why["invalid"][b"jobd_stderr"]
    assert r.xlen("jobd:b") == 0
    assert records(r, "jobd:a", "over")[-1]["error"] == "enqueue"


def test_a_settle_sent_again_enqueues_nothing_twice(r: redis.Redis, write_config) -> None:
    """A lost reply: the recorder sends the same settle again; the entry is acked already, and
    the replay writes none of its follow-ups (one Redis, and a parent's outbox on a cluster)."""
    cfg = load(str(config(write_config, "/bin/true")))
    a = cfg.queues["a"]
    r.xgroup_create("jobd:a", "jobd", id="0", mkstream=True)
    mid = r.xadd("jobd:a", {"payload": "x", "job_id": "p"}).decode()
    r.xreadgroup("jobd", "me", {"jobd:a": ">"})
    job = Job.from_entry("a", mid.encode(), {b"payload": b"x", b"job_id": b"p"})
    data = b'{"queue": "b", "payload": "1"}\n{"queue": "c", "payload": "2"}\n'
    follow = followups.parse(data, job, a, cfg.queues)
    store = Store(r, "me")
    for _ in range(2):
        store.settle([Outcome(Verb.ACK, a, job, follow_ups=follow)])
    assert (job_ids(r, "jobd:b"), job_ids(r, "jobd:c")) == (["p.1"], ["p.2"])


def test_a_parent_retried_after_its_first_success_writes_its_follow_ups_once(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon
) -> None:
    """Every reply cut as parents finish (settles among them): each settle that applied and
    lost its reply is sent again, and what was not applied runs again; every follow-up once."""
    from faultproxy import FaultProxy

    handler = script("three.sh", THREE)
    with FaultProxy(redis_server.port) as proxy:
        # A cut read's reply leaves its parent pending until reclaim_after (1 s here, not 60 s:
        # the wait below is for settles replayed, not for a lost read's lease to lapse).
        lease = "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
        cfg = write_config(f"redis: {{url: '{proxy.url}'}}\n" + queues_yaml(handler, lease))
        daemon(cfg)
        for n in range(20):
            enqueue(cfg, "a", "go", f"p{n}")
            if n % 3 == 0:
                proxy.cut(after_reply_bytes=1)
        wait_until(lambda: r.xlen("jobd:b") >= 40 and r.xlen("jobd:c") >= 20, 60)
        assert proxy.cuts > 0
    time.sleep(0.3)
    want_b = sorted(f"p{n}.{i}" for n in range(20) for i in (1, 2))
    assert sorted(job_ids(r, "jobd:b")) == want_b
    assert sorted(job_ids(r, "jobd:c")) == sorted(f"p{n}.3" for n in range(20))


# Which of chaos's parents fail for good (payload "fail", max_attempts 1): every tenth.
def failing(n: int) -> bool:
    return n % 10 == 0


def chaos_handler(script, tmp_path: Path) -> Path:
    """THREE, its run written first, a short sleep (parents still run when a daemon is killed);
    it writes its follow-ups whatever its payload, then fails for payload "fail"."""
    runs = f"IFS= read -r p; echo $JOBD_JOB_ID >> {tmp_path}/runs; sleep 0.05"
    return script("three.sh", THREE.replace("cat > /dev/null", runs) + '[ "$p" != fail ]\n')


def chaos(client, cfg: Path, daemon: Daemon, parents: int) -> None:
    """``parents`` parents of three follow-ups each, a tenth of them failing for good (after
    writing their follow-ups), their daemon SIGKILLed three times as they run (a new one started
    each time): every follow-up of a done parent exactly once, none of a dead-lettered one."""
    lines = (b'{"payload": "fail", "job_id": "p%d", "max_attempts": 1}\n' % n if failing(n)
             else b'{"payload": "x", "job_id": "p%d"}\n' % n for n in range(parents))  # fmt: skip
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "--ndjson", "-", stdin=b"".join(lines))
    assert out.returncode == 0, out.stderr
    # The follow-ups are counted where they are enqueued, not run: 1350 handlers spared.
    assert jobd_cli("pause", "-c", str(cfg), "b", "c").returncode == 0
    d = daemon(cfg)
    for _ in range(3):
        time.sleep(0.4)
        d.kill()
        d = daemon(cfg)
    queues = load(str(cfg)).queues
    a, b, c = (queues[name].stream for name in "abc")
    letters, outbox = queues["a"].dead_letter.stream, queues["a"].keys.outbox
    dead = sorted(f"p{n}" for n in range(parents) if failing(n))
    done = [n for n in range(parents) if not failing(n)]
    wait_until(lambda: client.xlen(b) >= 2 * len(done) and client.xlen(c) >= len(done)
               and client.xlen(letters) >= len(dead), 90)  # fmt: skip
    # Every entry of a settled (none pending, none unread) and, on a cluster, its outbox moved:
    # nothing more can come, a duplicate included.
    wait_until(lambda: (g := group_info(client, a))["pending"] == 0 and g["lag"] == 0
               and client.xlen(outbox) == 0, what="every parent settled")  # fmt: skip
    ran = (cfg.parent / "runs").read_text().split()
    print(f"{parents} parents, {len(ran)} runs: {len(ran) - len(set(ran))} run again")
    assert len(ran) > parents, "no parent was running when its daemon was killed"
    counted = collections.Counter(job_ids(client, b) + job_ids(client, c))
    assert set(counted) == {f"p{n}.{i}" for n in done for i in (1, 2, 3)}
    assert {k: v for k, v in counted.items() if v > 1} == {}
    assert sorted(f[b"jobd_job_id"].decode() for _, f in client.xrange(letters)) == dead


def test_sigkilled_daemons_enqueue_every_follow_up_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    parent = "    lease: {renew_every: 200ms, reclaim_after: 1s}\n    concurrency: 16\n"
    cfg = config(write_config, chaos_handler(script, tmp_path), parent)
    chaos(r, cfg, daemon, 500)


def cluster_config(cluster: LocalCluster, tmp_path: Path, handler: Path, parent: str = "") -> Path:
    cfg = tmp_path / "cluster.yaml"
    nodes = ", ".join(cluster.nodes[:2])
    cfg.write_text(
        f"redis:\n  cluster:\n    nodes: [{nodes}]\n" + queues_yaml(handler, parent, True)
    )
    return cfg


def test_on_a_cluster_follow_ups_go_through_the_outbox_once(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = cluster_config(cluster, tmp_path, script("three.sh", THREE))
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    slots = {client.keyslot(f"wf:{n}") for n in "abc"}
    assert len({cluster.master_of(s) for s in slots}) > 1, "the queues share a node"
    d = daemon(cfg)
    enqueue(cfg, "a", "go", "p1")
    wait_until(lambda: records(client, "wf:c", "p1.3"), what="the follow-up in c done")
    assert job_ids(client, "wf:b") == ["p1.1", "p1.2"]
    assert client.xlen("{wf:a}:outbox") == 0
    # A move made again (a mover that died before its XDEL, two movers at once, a lost reply):
    # the same outbox entry moved twice adds its follow-up once.
    assert d.stop() == 0  # nothing else reads queue a now
    queues = load(str(cfg)).queues
    a = queues["a"]
    client.xgroup_create("wf:a", "mine", id="$")
    mid = client.xadd("wf:a", {"payload": "x", "job_id": "p2"})
    client.xreadgroup("mine", "me", {"wf:a": ">"})
    job = Job.from_entry("a", mid, {b"payload": b"x", b"job_id": b"p2"})
    follow = followups.parse(b'{"queue": "b", "payload": "1"}\n', job, a, queues)
    store = Store(client, "me")
    for _ in range(2):  # a settle sent again writes nothing into the outbox
        store.settle([Outcome(Verb.ACK, dataclasses.replace(a, group="mine"), job,
                              follow_ups=follow)])  # fmt: skip
    ((_, left),) = client.xrange("{wf:a}:outbox")
    assert store.move_follow_ups(a) == 1
    client.xadd("{wf:a}:outbox", left)  # as if its XDEL never came
    assert store.move_follow_ups(a) == 1
    assert job_ids(client, "wf:b") == ["p1.1", "p1.2", "p2.1"]
    assert client.xlen("{wf:a}:outbox") == 0
    client.close()


def test_on_a_cluster_sigkilled_daemons_enqueue_every_follow_up_once(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    parent = "    lease: {renew_every: 200ms, reclaim_after: 1s}\n    concurrency: 16\n"
    cfg = cluster_config(cluster, tmp_path, chaos_handler(script, tmp_path), parent)
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    try:
        chaos(client, cfg, daemon, 500)
    finally:
        client.close()
