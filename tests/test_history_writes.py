"""Job history and the events stream, as written: every outcome's record and event come from the
script that settles it, in the same step (docs/concepts/history.md). Real daemons on the session's private
Redis; the crash test SIGKILLs daemons under load and finds no job without its record.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, kill_with_handlers, queue_config, wait_until

from jobd.store import notes
from jobd.store.scripts import Scripts

Daemon = Callable[..., DaemonProcess]
HISTORY, ACTIVE, EVENTS = "{jobd:q}:history", "{jobd:q}:active", "{jobd:q}:events"


def records(r: redis.Redis, job: str | bytes) -> list[dict]:
    raw = r.hget(HISTORY, job)
    return [json.loads(line) for line in raw.split(b"\n")] if raw else []


def events(r: redis.Redis, kind: str | None = None) -> list[dict[str, str]]:
    found = [
        {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        for _, fields in r.xrange(EVENTS)
    ]
    return [e for e in found if kind is None or e["event"] == kind]


def test_each_outcome_has_its_record_and_event(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """done, retried (with due), dead-lettered, expired: each attempt's record has when, where and
    how it ended, with the output's tails; the events say the same, in order."""
    command = "[/bin/sh, -c, 'echo out-$JOBD_ATTEMPT; echo err >&2; exit $(cat)']"
    config = write_config(queue_config(command, retry="{max_attempts: 2, backoff: 10ms}"))
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "0", "job_id": "ok"})
    r.xadd("jobd:q", {"payload": "3", "job_id": "bad"})
    r.xadd("jobd:q", {"payload": "0", "job_id": "late", "jobd_expires_at": str(10**11)})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 2, what="two dead letters")
    wait_until(lambda: len(records(r, "ok")) == 1, what="the record of ok")
    (ok,) = records(r, "ok")
    assert ok["event"] == "done" and ok["exit_code"] == 0 and ok["attempt"] == 1
    assert ok["stdout"] == "out-1\n" and ok["stderr"] == "err\n"
    assert ok["consumer"] == d.consumer() and ok["pid"] > 0 and ok["host"]
    assert ok["at"] - ok["started_at"] >= ok["duration_ms"]
    retried, promoted, dead = records(r, "bad")
    assert promoted["event"] == "promoted" and promoted["new_entry"] == dead["entry"]
    assert (retried["event"], retried["error"], retried["exit_code"]) == ("retried", "exit", 3)
    assert retried["due"] > retried["at"]  # backoff 10ms, with jitter
    assert (dead["event"], dead["attempt"], dead["stdout"]) == ("dead-lettered", 2, "out-2\n")
    (late,) = records(r, "late")
    assert late["event"] == "expired" and "pid" not in late and late["detail"]
    kinds = [(e["event"], e["job"]) for e in events(r)]
    assert kinds.index(("retried", "bad")) < kinds.index(("dead-lettered", "bad"))
    assert ("done", "ok") in kinds and ("expired", "late") in kinds
    done = events(r, "done")[0]
    assert done["consumer"] == d.consumer() and done["exit_code"] == "0"


def test_a_long_job_is_active_with_its_pid_and_deadline_until_it_ends(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    command = f"[/bin/sh, -c, 'while [ ! -e {gate} ]; do sleep 0.05; done']"
    daemon(write_config(queue_config(command, timeout="60s")))
    before = int(r.time()[0]) * 1000
    r.xadd("jobd:q", {"payload": "x", "job_id": "long"})
    wait_until(lambda: r.hget(ACTIVE, "long"), what="the active record")
    head, body = r.hget(ACTIVE, "long").split(b"\n", 1)
    record = json.loads(body)
    assert head == f"jobd:q|{record['entry']}".encode()
    assert record["pid"] > 0 and record["attempt"] == 1
    assert before - 1000 <= record["since"] <= before + 5000
    assert record["deadline"] == record["since"] + 60_000
    gate.touch()
    wait_until(lambda: len(records(r, "long")) == 1, what="the job to end")
    assert not r.hexists(ACTIVE, "long"), "settled with its active record"


def test_operator_actions_are_in_the_events_with_who_did_them(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = str(write_config(queue_config("[/bin/sh, -c, 'exit 3']", retry="{max_attempts: 1}")))
    for args in (["pause", "q"], ["pause", "q"], ["resume", "q"], ["resume", "q"]):
        assert jobd_cli(*args[:1], "-c", config, *args[1:]).returncode == 0
    daemon(Path(config))
    r.xadd("jobd:q", {"payload": "x", "job_id": "failed"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="a dead letter")
    assert jobd_cli("dlq", "-c", config, "q", "requeue", "--all").returncode == 0
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="dead again")
    assert jobd_cli("dlq", "-c", config, "q", "purge", "--yes").returncode == 0
    assert jobd_cli("cancel", "-c", config, "q", "nowhere").returncode == 3
    said = [e for e in events(r) if "by" in e]
    assert [e["event"] for e in said] == ["pause", "resume", "requeue", "purge", "cancel"]
    assert all("@" in e["by"] for e in said)
    assert said[1]["paused_by"] == said[0]["by"]
    assert said[2]["job"] == "failed" and said[3]["count"] == "1" and said[4]["job"] == "nowhere"
    requeued = [x for x in records(r, "failed") if x["event"] == "requeued"]
    assert requeued and requeued[0]["new_entry"]


def test_history_is_capped_by_maxlen_and_max_age_and_a_foreign_key_blocks_nothing(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(queue_config("[/bin/true]", history="{maxlen: 3, events: 5}"))
    daemon(config)
    for i in range(10):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    wait_until(lambda: r.hexists(HISTORY, "j9"), what="the last job's record")
    wait_until(lambda: r.hlen(HISTORY) == 3, what="history trimmed to maxlen")
    assert r.zcard("{jobd:q}:history:at") == 3 and r.xlen(EVENTS) < 10 + 100  # MAXLEN ~
    # Someone else's keys where the history lives: jobs are still done, nothing wedges.
    r.delete(HISTORY, EVENTS)
    r.set(HISTORY, "not a hash")
    r.set(EVENTS, "not a stream")
    r.xadd("jobd:q", {"payload": "x", "job_id": "after"})
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0 and r.xinfo_groups(
        "jobd:q")[0]["lag"] == 0, what="the job to be acked")  # fmt: skip
    assert r.get(HISTORY) == b"not a hash"


def test_history_ages_out_on_redis_clock_and_a_replay_writes_nothing_twice(
    r: redis.Redis, write_config
) -> None:
    """A settle sent twice (its reply lost) finds its entry acked: one record, one event. A job
    whose latest record is older than max_age goes, on Redis's clock."""
    from jobd.config import load

    q = load(write_config(queue_config("[/bin/true]", history="{max_age: 1s}"))).queues["q"]
    scripts = Scripts(r)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.hset(HISTORY, "ancient", '{"at":1,"event":"done"}')
    r.zadd("{jobd:q}:history:at", {"ancient": 1})
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": b"\xff\xfe"})
    r.xreadgroup("jobd", "me", {"jobd:q": ">"})
    keys = ["jobd:q", q.keys.stats(int(r.time()[0]) // 60), q.keys.cancels, *notes.keys(q), q.keys.waiters,
            q.keys.outbox, q.keys.taken]  # fmt: skip
    note = ["done", b"\xff\xfe", 5, b'{"event":"done"}', 1, "consumer", "me", 0]
    for _ in range(2):
        args = ["jobd", "me", 60, 0, notes.settings(q), 0, "ack", mid, 0, -1, *note]
        scripts.settle(keys=keys, args=args)
    assert len(records(r, b"\xff\xfe")) == 1 and len(events(r, "done")) == 1
    assert records(r, b"\xff\xfe")[0]["started_at"] == records(r, b"\xff\xfe")[0]["at"] - 5
    assert not r.hexists(HISTORY, "ancient"), "older than max_age on Redis's clock"


def test_cancelled_jobs_lost_leases_and_reclaims_are_recorded(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Cancelled running (its handler's pid and signal), waiting (never ran) and delayed (its
    due time) jobs; a lease lost to an operator's XCLAIM (the new owner); a reclaim after a
    daemon died."""
    config = write_config(
        queue_config(
            "[/bin/sh, -c, 'exec sleep 30']",
            concurrency=1,
            lease="{renew_every: 200ms, reclaim_after: 1s}",
        )
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "running"})
    r.xadd("jobd:q", {"payload": "x", "job_id": "waiting"})
    delay = ["--job-id", "delayed", "--delay", "1h"]
    assert jobd_cli("enqueue", "-c", str(config), *delay, "q", "x").returncode == 0
    wait_until(lambda: r.hget(ACTIVE, "running"), what="the running job's active record")
    for job in ("waiting", "delayed", "running"):  # waiting first: it never starts
        assert jobd_cli("cancel", "-c", str(config), "q", job).returncode in (0, 3)  # 3: marked
    wait_until(lambda: records(r, "waiting") and records(r, "running"), what="both cancelled")
    (running,) = records(r, "running")
    assert running["event"] == "cancelled" and running["pid"] > 0 and running["signal"] == 15
    (waiting,) = records(r, "waiting")
    assert waiting["event"] == "cancelled" and "pid" not in waiting
    scheduled, delayed = records(r, "delayed")
    assert scheduled["event"] == "scheduled" and abs(scheduled["due"] - delayed["due"]) <= 5
    assert delayed["event"] == "cancelled" and delayed["due"] > delayed["at"] and delayed["by"]
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": "stolen"})
    wait_until(lambda: r.hget(ACTIVE, "stolen"), what="the next job to run")
    r.xclaim("jobd:q", "jobd", "operator", 0, [mid])
    wait_until(lambda: events(r, "lease lost"), what="the lease lost")
    (lost,) = events(r, "lease lost")
    assert (lost["job"], lost["owner"], lost["consumer"]) == ("stolen", "operator", d.consumer())
    r.xack("jobd:q", "jobd", mid)  # the operator is done with it
    r.xadd("jobd:q", {"payload": "x", "job_id": "orphan"})
    wait_until(lambda: r.hget(ACTIVE, "orphan"), what="the orphan to run")
    kill_with_handlers(d)
    other = daemon(config)
    wait_until(lambda: any(e["job"] == "orphan" for e in events(r, "reclaimed")), what="reclaim")
    (reclaimed,) = [e for e in events(r, "reclaimed") if e["job"] == "orphan"]
    assert reclaimed["consumer"] == other.consumer() and reclaimed["deliveries"] == "2"


def test_a_crash_between_two_calls_leaves_no_job_without_its_record(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """Three daemons run 600 short jobs, enqueued in six waves, and after each wave one of them
    is SIGKILLed (with its handlers) while it holds entries of it, mid-write: every job ends
    done exactly once, with exactly one 'done' record and one 'done' event, and nothing is left
    pending. (The kills wait for the victim to hold work, not for a clock: a fixed rhythm of
    kills found the jobs all done before the third on a fast run.)"""
    config = write_config(
        queue_config(
            "[/bin/sh, -c, 'sleep 0.05']",
            concurrency=4,
            lease="{renew_every: 200ms, reclaim_after: 1s}",
        )
    )
    daemons = [daemon(config) for _ in range(3)]
    jobs = [f"c{i}" for i in range(600)]
    for wave in range(6):
        for job in jobs[wave * 100 : (wave + 1) * 100]:
            r.xadd("jobd:q", {"payload": "x", "job_id": job})
        victim = daemons[wave % 3]
        name = victim.consumer()
        wait_until(lambda n=name: r.xpending_range("jobd:q", "jobd", "-", "+", 1, consumername=n),
                   what=f"{name} to hold entries of wave {wave}")  # fmt: skip
        kill_with_handlers(victim)
        daemons[wave % 3] = daemon(config)
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0 and len(
        events(r, "done")) >= len(jobs), what="every job done", timeout=120)  # fmt: skip
    done = Counter(e["job"] for e in events(r, "done"))
    assert done == Counter(jobs), "exactly one done event a job"
    for job in jobs:
        assert [x["event"] for x in records(r, job)].count("done") == 1, job
    stats = sum(int(v) for k, v in _stats(r).items() if k == b"done")
    assert stats == len(jobs)


def _stats(r: redis.Redis) -> dict[bytes, bytes]:
    total: Counter[bytes] = Counter()
    for key in r.scan_iter("{jobd:q}:stats:*"):
        for k, v in r.hgetall(key).items():
            total[k] += int(v)
    return {k: str(v).encode() for k, v in total.items()}


def test_a_job_enqueued_for_later_is_found_delayed(r: redis.Redis, write_config) -> None:
    """`jobd enqueue --delay` (and each delayed line of a bulk enqueue) records the job as
    scheduled with its due time on Redis's clock, so `jobd job` finds it delayed; one already
    due went to the stream and has no such record."""
    config = str(write_config(queue_config("[/bin/true]")))
    now = int(r.time()[0]) * 1000
    out = jobd_cli("enqueue", "-c", config, "--job-id", "later", "--delay", "1h", "q", "x")
    assert out.returncode == 0, out
    lines = b'{"payload": "a", "job_id": "b1", "delay": "2h"}\n{"payload": "b", "job_id": "b2"}\n'
    out = jobd_cli("enqueue", "-c", config, "--ndjson", "-", "q", stdin=lines)
    assert out.returncode == 0, out
    (later,) = records(r, "later")
    assert later["event"] == "scheduled" and now + 3_500_000 < later["due"] < now + 3_700_000
    assert records(r, "b1")[0]["due"] > later["due"] and records(r, "b2") == []
    out = jobd_cli("job", "-c", config, "q", "later", "--json")
    assert json.loads(out.stdout)["state"] == "delayed", out


def test_an_entry_deleted_while_it_runs_leaves_no_active_record(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """XDEL of a running job's entry: its renewal finds the lease lost (the data gone, so the
    script cannot read the job id from the entry); the job's active record goes with it.
    The same with the holder dead: the daemon that reclaims finds the entry deleted. Each job
    ends 'lost' (task f35d), under its job id: the holder's renewal sends it; the reclaim
    reads it from the active record it removes."""
    config = write_config(
        queue_config(
            "[/bin/sh, -c, 'exec sleep 30']",
            concurrency=1,
            lease="{renew_every: 200ms, reclaim_after: 1s}",
        )
    )
    d = daemon(config)
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": "deleted"})
    wait_until(lambda: r.hget(ACTIVE, "deleted"), what="the active record")
    r.xdel("jobd:q", mid)
    wait_until(lambda: events(r, "lost"), what="the job lost")
    assert [e["job"] for e in events(r, "lost")] == ["deleted"]
    assert not r.hexists(ACTIVE, "deleted"), "the deleted entry's job is listed as running"
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": "orphan"})
    wait_until(lambda: r.hget(ACTIVE, "orphan"), what="the next job to run")
    kill_with_handlers(d)
    r.xdel("jobd:q", mid)
    other = daemon(config)
    other.wait_log(f"entry {mid.decode()} was pending but its data is gone")
    assert not r.hexists(ACTIVE, "orphan"), "the deleted entry's job is listed as running"
    assert [e["job"] for e in events(r, "lost")] == ["deleted", "orphan"]


def test_many_entries_deleted_at_once_leave_no_active_record(r: redis.Redis, write_config) -> None:
    """The active records of entries deleted while pending are found by the entry they name,
    over the whole hash: it was one pass over it per entry (100 entries over 20 000 records:
    1.9 s in one script, Redis blocked). Now one pass a call for them all: every one goes, in
    a renewal (the holder's) and in a reclaim (another daemon's), and no other record."""
    from jobd.config import load
    from jobd.store.store import Store

    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    q = load(str(write_config(queue_config("[/bin/true]", lease=lease)))).queues["q"]
    r.hset(ACTIVE, mapping={f"other{i}": f"jobd:q|{i}-9\n{{}}" for i in range(3000)})
    r.xgroup_create("jobd:q", "jobd", id="$", mkstream=True)

    def deleted_while_read(holder: str) -> list[str]:
        ids = [r.xadd("jobd:q", {"payload": "x", "job_id": f"{holder}{i}"}).decode()
               for i in range(200)]  # fmt: skip
        r.xreadgroup("jobd", "me", {"jobd:q": ">"})
        r.hset(ACTIVE, mapping={f"{holder}{i}": f"jobd:q|{m}\n{{}}" for i, m in enumerate(ids)})
        r.xdel("jobd:q", *ids)
        return ids

    def hscans() -> int:  # commands a script calls are counted too
        return r.info("commandstats").get("cmdstat_hscan", {}).get("calls", 0)

    ids = deleted_while_read("renewal")
    r.config_resetstat()
    assert sorted(x.message_id for x in Store(r, "me").renew(q, ids)) == sorted(ids)
    assert not [k for k in r.hkeys(ACTIVE) if k.startswith(b"renewal")]
    assert 1 <= hscans() <= 32, f"{hscans()} HSCAN pages for one call (one pass: ~4)"
    ids, found = deleted_while_read("reclaim"), []
    wait_until(lambda: found.extend(Store(r, "other").reclaim(q, "0-0", 1000).deleted)
               or len(found) == len(ids), what="the deleted entries reclaimed")  # fmt: skip
    assert sorted(found) == sorted(ids)
    assert not [k for k in r.hkeys(ACTIVE) if k.startswith(b"reclaim")]
    assert r.hlen(ACTIVE) == 3000
