"""A job whose stream entry is deleted while a live daemon runs it (XDEL by hand; a producer's
XADD MAXLEN does the same: tests/test_review36o_producer_user_deletes_jobs.py). The daemon's
lease renewal finds the entry gone (XCLAIM takes it out of the group) and stops the handler;
the renewal's step records the job's end, 'lost', once, and tells it to its batch (counted
failed) and to the jobs waiting for it: one waiting --after it is dead-lettered `dependency`,
one waiting --after-any-outcome is released and runs. Its end is told though it was read
before any job waited for it (wait_on.lua records it in the taken hash, by its running
record). Real daemon, real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, purges_deleted, queue_config, wait_until
from test_after_batches import CALLBACK, callbacks

Daemon = Callable[..., DaemonProcess]

HANDLER = """\
#!/bin/sh
cat >/dev/null
echo "$JOBD_JOB_ID" >> "$(dirname "$0")/runs"
case "$JOBD_JOB_ID" in x|y) exec sleep 60;; esac
"""


def runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs"
    return path.read_text().split() if path.exists() else []


LEASE = "{renew_every: 200ms, reclaim_after: 1s}"


def batch_member_x(
    write_config,
    script,
    handler: str,
    *enqueue: str,
    lease: str = LEASE,
    queue: str = "",
    top: str = "",
) -> Path:
    """A config of queue a (the handler ``handler`` as its command, one attempt, ``lease``, and
    ``queue``'s lines) and queue cb (test_after_batches' CALLBACK), ``top`` lines before them;
    and job x enqueued on a in batch B, its callback on cb (``enqueue``: more options)."""
    cb = script("cb.sh", CALLBACK)
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\n{top}queues:\n"
        f"  a:\n    command: [{script('h.sh', handler)}]\n{queue}"
        f"    retry: {{max_attempts: 1}}\n    lease: {lease}\n"
        f"  cb:\n    command: [{cb}]\n"
    )
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "x", "--job-id", "x", "--batch", "B",
                   "--on-complete", "cb", *enqueue)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return cfg


def test_a_running_job_whose_entry_is_deleted_ends_lost_told_to_batch_and_waiters(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    cfg = batch_member_x(write_config, script, HANDLER, queue="    concurrency: 4\n")
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "y", "--job-id", "y").returncode == 0
    d = daemon(cfg)
    wait_until(lambda: {"x", "y"} <= set(runs(tmp_path)), what="x and y running")
    # y had no waiter when it was read: the waiters come while it runs (its running record
    # says where it runs once it ran half a second).
    wait_until(lambda: r.hexists("{jobd:a}:active", "y"), what="y's running record")
    for name, extra in (("h", []), ("k", ["--after-any-outcome"])):
        out = jobd_cli("enqueue", "-c", c, "a", name, "--job-id", name, "--after", "y", *extra)
        assert out.returncode == 0, out.stderr
    assert r.hlen("{jobd:a}:taken") == 2  # x (a batch's) and y (waited for)
    entries = {f[b"job_id"]: mid for mid, f in r.xrange("jobd:a")}
    r.xdel("jobd:a", entries[b"x"], entries[b"y"])
    d.wait_log("job=x attempt=1 lease lost: the entry now belongs to nobody")
    d.wait_log("job=y attempt=1 lease lost: the entry now belongs to nobody")
    wait_until(lambda: callbacks(tmp_path), 10, what="the batch's callback")
    (told,) = callbacks(tmp_path)
    assert (told["done"], told["failed"]) == (0, 1), told
    wait_until(lambda: "k" in runs(tmp_path), 10, what="k released (any outcome)")
    wait_until(lambda: r.exists("{jobd:a}:dead"), 10, what="h dead-lettered")
    (dead,) = [f for _, f in r.xrange("{jobd:a}:dead")]
    assert (dead[b"jobd_job_id"], dead[b"jobd_error"]) == (b"h", b"dependency")
    assert "h" not in runs(tmp_path)
    lost = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"lost"]
    assert sorted((f[b"job"], f[b"entry"]) for f in lost) == sorted(
        [(b"x", entries[b"x"]), (b"y", entries[b"y"])]
    )  # once each
    for job in ("x", "y"):
        record = json.loads(r.hget("{jobd:a}:history", job).splitlines()[-1])
        assert record["event"] == "lost", record
        shown = json.loads(jobd_cli("job", "-c", c, "a", job, "--json").stdout)
        assert shown["state"] == "lost", shown
    assert r.xpending("jobd:a", "jobd")["pending"] == 0
    assert not r.hlen("{jobd:a}:taken")
    assert runs(tmp_path).count("x") == 1 and runs(tmp_path).count("y") == 1  # not run again


def test_a_job_handed_back_at_a_stop_after_its_entry_was_deleted_ends_lost(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The daemon stops (SIGTERM) before a renewal sees the entry gone: the hand-back's XCLAIM
    (settle.lua 'back') takes the deleted entry out of the group, and the same step records
    its end, 'lost', with the job id and batch its note carries, and tells them; its --unique
    mark goes (the hand-back sends it: review 35x), so the job id can be sent again."""
    lease = "{renew_every: 20s, reclaim_after: 2m}"  # no renewal within the test
    cfg = batch_member_x(write_config, script, HANDLER, "--unique", lease=lease,
                         top="shutdown_grace: 100ms\n")  # fmt: skip
    c = str(cfg)
    assert jobd_cli("enqueue", "-c", c, "a", "h", "--job-id", "h", "--after", "x").returncode == 0
    assert r.get("{jobd:a}:job:x") == b"queued"
    first = daemon(cfg)
    wait_until(lambda: "x" in runs(tmp_path), what="x running")
    (entry,) = [mid for mid, f in r.xrange("jobd:a") if f[b"job_id"] == b"x"]
    r.xdel("jobd:a", entry)
    first.stop()
    if not purges_deleted(r):  # 6.2: handed back; the next daemon's reclaim acks it, ends it
        daemon(cfg)
        wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 0, 10, what="reclaimed")
    assert r.xpending("jobd:a", "jobd")["pending"] == 0  # not handed back: taken out
    lost = [f for _, f in r.xrange("{jobd:a}:events") if f[b"event"] == b"lost"]
    assert [(f[b"job"], f[b"entry"], f[b"batch"]) for f in lost] == [(b"x", entry, b"B")]
    assert not r.exists("{jobd:a}:job:x"), "the end took its --unique mark"
    daemon(cfg)  # moves the notices the stopped one may have left
    wait_until(lambda: callbacks(tmp_path), 10, what="the batch's callback")
    assert callbacks(tmp_path)[0]["failed"] == 1
    wait_until(lambda: r.exists("{jobd:a}:dead"), 10, what="h dead-lettered")
    assert [f[b"jobd_error"] for _, f in r.xrange("{jobd:a}:dead")] == [b"dependency"]


def test_the_taken_records_of_jobs_settled_as_usual_are_swept(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Each batch member read is recorded in {S}:taken, and kept while it is pending (a long
    one, of batch S); one settled as usual (done) takes its record with it (settle.lua:
    lib/workflows.lua untake, review 35x; before, it was left to the sweep of later writes):
    after 300 members, four at a time, only the pending one's is left. A job of no workflow is
    never recorded."""
    handler = script("h.sh", "#!/bin/sh\ncat >/dev/null\n"
                     '[ "$JOBD_JOB_ID" = slow ] && while [ ! -e "$(dirname "$0")/go" ]; '
                     "do sleep 0.05; done\nexit 0\n")  # fmt: skip
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    concurrency: 4\n"
    )
    c = str(cfg)
    out = jobd_cli("enqueue", "-c", c, "a", "s", "--job-id", "slow", "--batch", "S")
    assert out.returncode == 0, out.stderr
    lines = tmp_path / "lines"
    lines.write_text("".join(f"{i}\n" for i in range(300)))
    out = jobd_cli("enqueue", "-c", c, "a", "--lines", str(lines), "--batch", "B")
    assert out.returncode == 0, out.stderr
    for i in range(20):
        r.xadd("jobd:a", {"payload": "p", "job_id": f"plain{i}"})
    daemon(cfg)
    state = lambda: json.loads(jobd_cli("batch", "-c", c, "B", "--json").stdout)  # noqa: E731
    wait_until(lambda: state()["done"] == 300, 60, what="the batch done")
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 1, what="all settled but slow")
    (slow,) = [mid for mid, f in r.xrange("jobd:a") if f.get(b"job_id") == b"slow"]
    left = r.hgetall("{jobd:a}:taken")
    assert list(left) == [b"jobd:a|" + slow], left  # pending: kept; the others' gone
    (tmp_path / "go").touch()
    wait_until(lambda: r.xpending("jobd:a", "jobd")["pending"] == 0, what="slow done")


def test_a_batch_member_dead_lettered_takes_its_taken_record_with_it(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """dead_letter.lua removes the taken record of the job it ends (lib/workflows.lua untake,
    review 35x): with no later read to sweep it, it would stay for good."""
    handler = script("h.sh", "#!/bin/sh\ncat >/dev/null\nexit 64\n")
    cfg = write_config(
        f"redis: {{url: '{{redis}}'}}\nqueues:\n  a:\n    command: [{handler}]\n"
        "    exit_codes: {fail: [64]}\n"
    )
    out = jobd_cli("enqueue", "-c", str(cfg), "a", "x", "--job-id", "x", "--batch", "B")
    assert out.returncode == 0, out.stderr
    daemon(cfg)
    wait_until(lambda: r.exists("{jobd:a}:dead"), 10, what="x dead-lettered")
    wait_until(lambda: not r.xpending("jobd:a", "jobd")["pending"], what="x acked")
    assert not r.exists("{jobd:a}:taken")


def test_a_live_holder_and_a_reclaimer_racing_write_the_end_once(
    r: redis.Redis, write_config, tmp_path: Path
) -> None:
    """Entries of a batch member and of a plain job read by consumer A, then deleted: B's
    reclaim (XAUTOCLAIM purges a deleted entry whatever its idle time) writes both ends and
    the batch's notice; A's renewal, and each call sent again, find nothing pending and write
    nothing more (A is told the entries are lost, owner none)."""
    from jobd.config import load
    from jobd.store.store import Store

    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    q = load(str(write_config(queue_config("[/bin/true]", lease=lease)))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="$", mkstream=True)
    member = r.xadd("jobd:q", {"payload": "x", "job_id": "m", "jobd_batch": "B"}).decode()
    plain = r.xadd("jobd:q", {"payload": "x", "job_id": "p"}).decode()
    a, b = Store(r, "A"), Store(r, "B")
    read = a.read_levels(q, 10).entries[0][1]
    assert [mid.decode() for mid, _ in read] == [member, plain]
    assert r.hkeys("{jobd:q}:taken") == [f"jobd:q|{member}".encode()]  # the member alone
    r.xdel("jobd:q", member, plain)
    for _ in range(2):  # the second call: a replay
        assert sorted(b.reclaim(q, "0-0", 10).deleted) == ([] if _ else sorted([member, plain]))
    lost = a.renew_telling(q, [member, plain], [], ["m", "p"])[0]
    assert sorted((x.message_id, x.owner) for x in lost) == sorted([(member, ""), (plain, "")])
    events = [f for _, f in r.xrange("{jobd:q}:events") if f[b"event"] == b"lost"]
    assert sorted((f[b"job"], f[b"consumer"]) for f in events) == sorted(
        [(b"m", b"B"), (plain.encode(), b"B")]  # p: its job id nowhere left (no running record)
    )
    notices = [f for _, f in r.xrange("{jobd:q}:outbox")]
    assert [(n[b"kind"], n[b"outcome"], n[b"event"]) for n in notices] == [
        (b"batch", b"failed", b"lost")
    ]
    assert not r.hlen("{jobd:q}:taken")


def test_a_read_of_jobs_of_no_workflow_costs_one_type_and_writes_nothing(
    r: redis.Redis, write_config
) -> None:
    """The hot path: a read of 50 plain jobs asks Redis one TYPE more (the waiters hash, once
    a call) and writes no taken record (with jobs waiting on the queue: two HEXISTS an entry)."""
    from jobd.config import load
    from jobd.store.store import Store

    q = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="$", mkstream=True)
    for i in range(50):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    store = Store(r, "A")
    store.read_levels(q, 1)  # loads the script
    r.config_resetstat()
    assert len(store.read_levels(q, 100).entries[0][1]) == 49
    stats = r.info("commandstats")
    calls = {k: stats.get(f"cmdstat_{k}", {}).get("calls", 0) for k in ("type", "hexists", "hset")}
    assert calls == {"type": 1, "hexists": 0, "hset": 0}, calls
    assert not r.exists("{jobd:q}:taken")
