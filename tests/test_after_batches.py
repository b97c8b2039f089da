"""Dependencies and batches (issue 35, workflows): a job --after others is held until they are
done (dead-lettered `dependency` when one fails, run anyway with --after-any-outcome); a batch's
callback is enqueued once, with the right counts, across daemons and through a SIGKILL. Real
daemons and handlers, the session's private Redis and its three-master cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from redis.cluster import RedisCluster
from support import DaemonProcess, LocalCluster, jobd_cli, wait_until, waiter_lines

from jobd import workflows
from jobd.config import load
from jobd.newjob import NewJob
from jobd.store.records import parse_records
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]

# Appends its job id to the file "runs" beside it; fails (for good) for payload "fail".
RUNS = """\
#!/bin/sh
p=$(cat)
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
[ "$p" != fail ]
"""
# RUNS for one-line payloads, in one process (no command substitution): a batch of 1000.
RUNS_ONE_LINE = """\
#!/bin/sh
IFS= read -r p
echo "$JOBD_JOB_ID" >> "${0%/*}/runs"
[ "$p" != fail ]
"""
# The callback's handler: its entry id and payload, one line, into "callbacks".
CALLBACK = """\
#!/bin/sh
p=$(cat)
echo "$JOBD_MESSAGE_ID $p" >> "$(dirname "$0")/callbacks"
"""


def queues_yaml(runs: Path, callback: Path, stream: str = "", extra: str = "") -> str:
    """Queues a and b (run by ``runs``) and cb (the callbacks)."""
    out = ["queues:\n"]
    for name, cmd in (("a", runs), ("b", runs), ("cb", callback)):
        out.append(f"  {name}:\n    command: [{cmd}]\n    retry: {{max_attempts: 1}}\n{extra}")
        if stream:
            out.append(f"    stream: '{stream}{name}'\n")
    return "".join(out)


def records(client: redis.Redis | RedisCluster, stream: str, job_id: str) -> list[dict]:
    found, _ = parse_records(client.hget(f"{{{stream}}}:history", job_id))
    return [rec.raw for rec in found]


def events(rec: list[dict]) -> list[str]:
    return [x["event"] for x in rec]


def cli(cfg: Path, *args: str, stdin: bytes | None = None) -> str:
    out = jobd_cli(*args[:1], "-c", str(cfg), *args[1:], stdin=stdin)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode()


def running_member(d: DaemonProcess) -> bool:
    """Whether a handler of ``d`` is running a member (runs.sh)."""
    import psutil

    try:
        children = psutil.Process(d.proc.pid).children(recursive=True)
        return any("runs.sh" in " ".join(c.cmdline()) for c in children)
    except psutil.Error:
        return False


def runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs"
    return path.read_text().split() if path.exists() else []


def test_a_job_after_two_others_runs_only_once_both_are_done(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    assert cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x", "--after", "b:y") == "w\n"
    assert events(records(r, "jobd:a", "w")) == ["waiting"]
    shown = cli(cfg, "job", "a", "w")
    assert "waiting for 2 of 2: a x, b y" in shown, shown
    cli(cfg, "enqueue", "a", "x", "--job-id", "x")
    wait_until(lambda: events(records(r, "jobd:a", "w")) == ["waiting", "dependency"],
               what="x's end told to w")  # fmt: skip
    assert runs(tmp_path) == ["x"] and r.xlen("jobd:a") == 1  # w is held still
    assert "waiting for 1 of 2: b y" in cli(cfg, "job", "a", "w")
    cli(cfg, "enqueue", "b", "y", "--job-id", "y")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "w")), what="w done")
    assert runs(tmp_path) == ["x", "y", "w"]
    assert events(records(r, "jobd:a", "w")) == ["waiting", "dependency", "released", "done"]
    told = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"released"]
    assert [(e[b"job"], e[b"dependency"]) for e in told] == [(b"w", b"b y")]
    assert r.hlen("{jobd:a}:held") == 0 and r.hlen("{jobd:a}:waiters") == 0
    # A job waited for that ended already counts at once.
    cli(cfg, "enqueue", "a", "z", "--job-id", "z", "--after", "x", "--after", "b:y")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "z")), what="z done")


def test_a_failed_dependency_dead_letters_the_job_unless_any_outcome(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    daemon(cfg)
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "ok", "--after", "bad")
    cli(cfg, "enqueue", "a", "v", "--job-id", "v", "--after", "bad", "--after-any-outcome")
    cli(cfg, "enqueue", "a", "", "--job-id", "ok")
    cli(cfg, "enqueue", "a", "fail", "--job-id", "bad")
    wait_until(lambda: r.xlen("{jobd:a}:dead") == 2, what="bad and w dead-lettered")
    wait_until(lambda: "done" in events(records(r, "jobd:a", "v")), what="v ran anyway")
    dead = {f[b"jobd_job_id"]: f for _, f in r.xrange("{jobd:a}:dead")}
    assert dead[b"w"][b"jobd_error"] == b"dependency"
    assert dead[b"w"][b"jobd_stderr"] == b"dependency a bad dead-lettered"
    assert dead[b"w"][b"payload"] == b"w"
    assert "w" not in runs(tmp_path)
    assert events(records(r, "jobd:a", "w"))[-1] == "dead-lettered"
    shown = cli(cfg, "dlq", "a", "list")
    assert "dependency" in shown


def batch_yaml(runs: Path, callback: Path, extra: str = "", stream: str = "") -> str:
    return queues_yaml(runs, callback, stream, "    concurrency: 8\n" + extra)


def callbacks(tmp_path: Path) -> list[dict]:
    """The callbacks run, each entry's once (a daemon killed as it ran one runs it again)."""
    path = tmp_path / "callbacks"
    lines = path.read_text().splitlines() if path.exists() else []
    runs = dict(line.split(" ", 1) for line in lines)  # entry id -> payload
    return [json.loads(x) for x in runs.values()]


def test_a_batch_of_1000_across_three_daemons_calls_back_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", RUNS_ONE_LINE), script("cb.sh", CALLBACK)))  # fmt: skip
    for _ in range(3):
        daemon(cfg)
    lines = b"".join(b"fail\n" if n % 100 == 0 else b"ok\n" for n in range(1000))
    cli(cfg, "enqueue", "a", "--lines", "-", "--batch", "B1", "--on-complete", "cb", stdin=lines)
    wait_until(lambda: callbacks(tmp_path), 60, what="the callback")
    a = load(str(cfg)).queues["a"].keys  # nothing left to move: no second callback can come
    wait_until(lambda: not r.exists(a.outbox) or r.xlen(a.outbox) == 0, what="the outbox moved")
    assert callbacks(tmp_path) == [
        {"batch": "B1", "state": "complete", "total": 1000, "done": 990, "failed": 10,
         "pending": 0},
    ]  # fmt: skip
    assert r.xlen("jobd:cb") == 1
    shown = json.loads(cli(cfg, "batch", "B1", "--json"))
    assert shown == {"batch": "B1", "state": "complete", "total": 1000, "done": 990,
                     "failed": 10, "pending": 0, "on_complete": "cb"}  # fmt: skip
    assert "complete, 1000 of 1000 ended" in cli(cfg, "batch", "B1")
    hosts = {x["consumer"] for x in (json.loads(v.split(b"\n")[-1]) for v in
                                     r.hvals("{jobd:a}:history"))}  # fmt: skip
    assert len(hosts) == 3, "not every daemon ran members"
    done = [f for _, f in r.xrange("{jobd:cb}:events") if f[b"event"] == b"batch complete"]
    assert [e[b"batch"] for e in done] == [b"B1"]
    assert jobd_cli("batch", "-c", str(cfg), "nope").returncode == 3
    late = jobd_cli("enqueue", "-c", str(cfg), "a", "--lines", "-", "--batch", "B1", stdin=b"x\n")
    assert late.returncode == 2 and b"is complete" in late.stderr, late.stderr
    late = jobd_cli("enqueue", "-c", str(cfg), "a", "x", "--batch", "B1")
    assert late.returncode == 2 and b"is complete" in late.stderr, late.stderr
    assert r.xlen("jobd:a") == 1000


def test_a_daemon_sigkilled_mid_batch_still_gives_one_callback(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    # Its run is written before it sleeps: a member killed in its sleep is run again, so a kill
    # that lands mid-job shows as more runs than members.
    # 0.2 s a member: the other daemon alone takes 7.5 s for all, so three kills (and the
    # restarts after them) come while members still run.
    slow = RUNS.replace('[ "$p" != fail ]', 'sleep 0.2\n[ "$p" != fail ]')
    lease = "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + batch_yaml(script("runs.sh", slow), script("cb.sh", CALLBACK), lease))  # fmt: skip
    d = daemon(cfg)
    other = daemon(cfg)
    lines = b"ok\n" * 300
    cli(cfg, "enqueue", "a", "--lines", "-", "--batch", "B2", "--on-complete", "cb", stdin=lines)
    for _ in range(3):  # killed three times, each while a handler of its runs a member
        wait_until(lambda d=d: running_member(d), what="a member running on the daemon to kill")
        d.kill()
        d = daemon(cfg)
    wait_until(lambda: callbacks(tmp_path), 60, what="the callback")
    # Every member settled and nothing left to move: a second callback could come from nowhere.
    a = load(str(cfg)).queues["a"].keys
    wait_until(lambda: not r.exists(a.outbox) or r.xlen(a.outbox) == 0, what="the outbox moved")
    assert callbacks(tmp_path) == [
        {"batch": "B2", "state": "complete", "total": 300, "done": 300, "failed": 0,
         "pending": 0},
    ]  # fmt: skip
    assert len(runs(tmp_path)) > 300, "no member was running when its daemon was killed"
    assert other.proc.poll() is None


def test_on_a_cluster_dependencies_and_a_batch_cross_slots(
    cluster: LocalCluster, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = tmp_path / "cluster.yaml"
    nodes = ", ".join(cluster.nodes[:2])
    handler = script("runs.sh", RUNS_ONE_LINE)
    cfg.write_text(f"redis:\n  cluster:\n    nodes: [{nodes}]\n"
                   + batch_yaml(handler, script("cb.sh", CALLBACK), "", "wf:"))  # fmt: skip
    client = RedisCluster.from_url(f"redis://{cluster.nodes[0]}")
    slots = {client.keyslot(k) for k in ("wf:a", "wf:b", "wf:cb", "jobd:batch:B3")}
    assert len({cluster.master_of(s) for s in slots}) > 1, "all on one node"
    try:
        for _ in range(3):
            daemon(cfg)
        # v and w in a's slot, each after two jobs in b's (another node's).
        cli(cfg, "enqueue", "a", "v", "--job-id", "v", "--after", "b:s1", "--after", "b:s2")
        cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "b:x", "--after", "b:y")
        cli(cfg, "enqueue", "b", "x", "--job-id", "x")
        cli(cfg, "enqueue", "b", "fail", "--job-id", "y")
        cli(cfg, "enqueue", "b", "s1", "--job-id", "s1")
        wait_until(lambda: events(records(client, "wf:a", "v")) == ["waiting", "dependency"],
                   what="s1's end told to v")  # fmt: skip
        wait_until(lambda: client.xlen("{wf:a}:dead") == 1, what="w dead-lettered")
        assert client.xrange("{wf:a}:dead")[0][1][b"jobd_error"] == b"dependency"
        assert "v" not in runs(tmp_path) and client.xlen("wf:a") == 0  # v is held still
        cli(cfg, "enqueue", "b", "s2", "--job-id", "s2")
        wait_until(lambda: "done" in events(records(client, "wf:a", "v")), what="v done")
        assert events(records(client, "wf:a", "v")) == ["waiting", "dependency", "released", "done"]
        assert sorted(runs(tmp_path)) == ["s1", "s2", "v", "x", "y"]
        lines = b"".join(b"fail\n" if n % 100 == 0 else b"ok\n" for n in range(1000))
        cli(cfg, "enqueue", "b", "--lines", "-", "--batch", "B3", "--on-complete", "cb",
            stdin=lines)  # fmt: skip
        wait_until(lambda: callbacks(tmp_path), 60, what="the callback")
        wait_until(lambda: client.xlen("{wf:b}:outbox") == 0, what="the outbox moved")
        assert callbacks(tmp_path) == [
            {"batch": "B3", "state": "complete", "total": 1000, "done": 990, "failed": 10,
             "pending": 0},
        ]  # fmt: skip
        assert client.xlen("wf:cb") == 1
        hosts = {json.loads(v.split(b"\n")[-1])["consumer"]
                 for v in client.hvals("{wf:b}:history")}  # fmt: skip
        assert len(hosts) == 3, "not every daemon ran members"
    finally:
        client.close()


def test_notices_moved_twice_count_once_and_call_back_once(
    r: redis.Redis, write_config, script
) -> None:
    """A mover that died before its XDEL, or two movers at once: a notice applied twice
    changes nothing twice (a batch member is counted once, a complete batch calls back once,
    a dependency's end releases its waiter once)."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    config = load(str(cfg))
    store = Store(r)
    with workflows.Member(store, config, config.queues["a"],
                          NewJob(batch="B", on_complete="cb")) as member:  # fmt: skip
        member.grow(2)
        member.added(2)
    rows = [
        (
            f"1-{n}".encode(),
            {
                b"kind": b"batch",
                b"batch": b"B",
                b"member": f"a j{n}".encode(),
                b"outcome": outcome,
                b"event": b"x",
            },
        )
        for n, outcome in ((1, b"done"), (2, b"failed"))
    ]
    for _ in range(2):
        assert store.move_notices("{jobd:a}:outbox", rows) == ([b"1-1", b"1-2"], None)
    assert r.xlen("jobd:cb") == 1
    ((_, cb),) = r.xrange("jobd:cb")
    assert json.loads(cb[b"payload"]) == {"batch": "B", "state": "complete", "total": 2,
                                          "done": 1, "failed": 1, "pending": 0}  # fmt: skip
    shown = store.batch_op("B", "show")
    assert shown is not None and (shown.total, shown.done, shown.failed) == (2, 1, 1)
    cli(cfg, "enqueue", "a", "w", "--job-id", "w", "--after", "x", "--after", "y")
    for dep in ("x", "x", "y", "y"):
        (waiter,) = waiter_lines(r, "{jobd:a}:waiters", dep)
        notice = {b"kind": b"release", b"dep": f"a {dep}".encode(), b"outcome": b"done",
                  b"event": b"done", b"waiter": waiter}  # fmt: skip
        store.move_notices("{jobd:a}:outbox", [(b"2-1", notice)])
        if dep == "x":
            assert r.xlen("jobd:a") == 0, "released before y was done"
    assert [f[b"job_id"] for _, f in r.xrange("jobd:a")] == [b"w"]
    assert events(records(r, "jobd:a", "w")) == ["waiting", "dependency", "released"]


def test_a_dead_lettered_member_requeued_names_the_batch_it_left(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """jobd's own dead letter of a member (settled: it failed for good) keeps its batch
    (jobd_batch, jobd_batch_incarnation), so `jobd dlq requeue` names the batch it leaves in
    its `requeued` record and `requeue` event; the new entry is a member no more (its second
    dead letter names none, and the batch calls back once). A jobd_batch longer than jobd
    writes (someone's XADD) is not copied (nor clipped: a requeue would leave it in place)."""
    cfg = write_config("redis: {url: '{redis}'}\n"
                       + queues_yaml(script("runs.sh", RUNS), script("cb.sh", CALLBACK)))  # fmt: skip
    r.xadd("jobd:a", {"payload": "fail", "job_id": "long", "jobd_batch": "L" * 801})
    daemon(cfg)
    cli(cfg, "enqueue", "a", "fail", "--job-id", "m", "--batch", "R", "--on-complete", "cb")
    wait_until(lambda: callbacks(tmp_path), what="the batch's callback")

    def letters() -> dict[bytes, tuple[bytes, dict]]:
        return {f[b"jobd_job_id"]: (i, f) for i, f in r.xrange("{jobd:a}:dead")}

    wait_until(lambda: len(letters()) == 2, what="long dead-lettered too")
    (dead, letter), (long_id, long_letter) = letters()[b"m"], letters()[b"long"]
    incarnation = r.hget("{jobd:batch:R}", "incarnation")
    assert (letter.get(b"jobd_batch"), letter.get(b"jobd_batch_incarnation")) == (b"R", incarnation)
    assert b"jobd_batch" not in long_letter
    cli(cfg, "dlq", "a", "requeue", dead.decode(), long_id.decode())
    requeued = [x for x in records(r, "jobd:a", "m") if x["event"] == "requeued"]
    assert [(x.get("batch"), x.get("batch_incarnation")) for x in requeued] == [
        ("R", incarnation.decode())
    ]
    (event, _) = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"requeue"]
    assert event[b"batch"] == b"R", event
    wait_until(lambda: len(letters()) == 2 and letters()[b"m"][0] != dead,
               what="m's second dead letter")  # fmt: skip
    assert b"jobd_batch" not in letters()[b"m"][1]
    assert sorted(runs(tmp_path)) == ["long", "long", "m", "m"] and r.xlen("jobd:cb") == 1
