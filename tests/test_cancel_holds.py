"""`jobd cancel` holds for as long as the job can run anywhere, reaches a running job within a
reader's poll (not at its next lease renewal), says 'cancelling' until it stops, and `--wait`
returns once it has stopped (issue 32, points 2 and 3).

Real daemons on the session's private Redis. The marks are made with ``jobd.cancel.cancel``
(what `jobd cancel` calls) where a test must outlive the time a job found nowhere stays
cancelled: its last arguments, the milliseconds and who cancels, are the same before and after
the change, so each test also runs against the code before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import (
    DEADLINE,
    DaemonProcess,
    acked_all,
    group_info,
    interruptible,
    jobd_cli,
    paused_behind_hostile,
    pending_count,
    wait_group,
    wait_until,
)

from jobd.config import load

Daemon = Callable[..., DaemonProcess]

CONFIG = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
queues:
  q:
    command: [{handler}]
    concurrency: 2
    kill_grace: 30s
    lease: {{renew_every: {renew}, reclaim_after: {reclaim}}}
    retry: {{max_attempts: 3, backoff: 100ms}}
"""
# A long job traps TERM, says so, and ends only once the test lets it (``release``): the test
# sees the cancelled job between its SIGTERM and its end.
HANDLER = """\
#!/bin/sh
echo "start $JOBD_JOB_ID" >> {dir}/ran
trap 'echo "term $JOBD_JOB_ID" >> {dir}/ran
      while [ ! -e {dir}/release ]; do sleep 0.05; done; exit 143' TERM
case "$JOBD_JOB_ID" in long*) sleep 120 & wait ;; esac
echo "done $JOBD_JOB_ID" >> {dir}/ran
"""


def setup(
    write_config, script, tmp_path: Path, renew: str = "200ms", reclaim: str = "2s", extra: str = ""
) -> Path:
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    return write_config(CONFIG.format(handler=handler, renew=renew, reclaim=reclaim) + extra)


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran"
    return path.read_text().splitlines() if path.exists() else []


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def store_and_queue(config: Path, r: redis.Redis):
    from jobd.config import load
    from jobd.store.store import Store

    return Store(r), load(str(config)).queues["q"]


def job_state(config: Path, job_id: str) -> str:
    out = jobd_cli("job", "-c", str(config), "q", job_id, "--json")
    return json.loads(out.stdout)["state"] if out.stdout else ""


def outlive_the_unseen_marks(r: redis.Redis) -> None:
    """Wait until every mark with an expiry has expired on Redis's clock."""
    scores = [s for _, s in r.zrange("{jobd:q}:cancels", 0, -1, withscores=True)]
    latest = max((s for s in scores if s != float("inf")), default=0)
    wait_until(lambda: redis_ms(r) > latest, what="the marks' expiry on Redis's clock")


# -- a cancel holds (point 2) ---------------------------------------------------------------------


def test_a_waiting_job_cancelled_while_paused_never_runs_however_late_it_is_resumed(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Paused, cancelled, resumed after the time a job found nowhere stays cancelled: the jobs
    found waiting, by their entry id or by the job_id their producer gave, are still
    acknowledged unrun (they ran before: their marks had expired; a named one was not even
    looked for among the waiting entries)."""
    from jobd.cancel import cancel

    config = setup(write_config, script, tmp_path)
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    d = daemon(config)
    wait_group(r, "jobd:q")
    waiting = r.xadd("jobd:q", {"payload": "x"}).decode()  # its job id is its entry id
    r.xadd("jobd:q", {"payload": "x", "job_id": "named"})  # found by reading the waiting ones
    store, q = store_and_queue(config, r)
    found = cancel(store, q, [waiting, "named"], 1000, "test@host")
    assert [f.where for f in found] == ["waiting", "waiting"]
    outlive_the_unseen_marks(r)
    assert jobd_cli("resume", "-c", str(config), "q").returncode == 0
    r.xadd("jobd:q", {"payload": "x", "job_id": "after"})
    wait_until(lambda: "done after" in ran(tmp_path), what="the job after it to run")
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="every ack")
    assert f"start {waiting}" not in ran(tmp_path) and "start named" not in ran(tmp_path)
    d.wait_log(f"job={waiting} attempt=1 cancelled (jobd cancel) before it started")
    d.wait_log("job=named attempt=1 cancelled (jobd cancel) before it started")
    assert r.zcard("{jobd:q}:cancels") == 0, "their held marks went with them"


def test_a_cancelled_job_of_a_dead_daemon_is_never_run_by_the_one_that_takes_it_over(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A job running on a daemon that died, cancelled: taken over after reclaim_after, and
    after the unseen marks expired, it is acked unrun as cancelled."""
    from jobd.cancel import cancel

    config = setup(write_config, script, tmp_path, reclaim="1s")
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "x", "job_id": "orphan"})
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"})  # delivered; its daemon is gone
    store, q = store_and_queue(config, r)
    (found,) = cancel(store, q, ["orphan"], 1000, "test@host")
    assert (found.where, found.consumer) == ("running", "dead-daemon")
    outlive_the_unseen_marks(r)
    d = daemon(config)
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the entry settled")
    d.wait_log("job=orphan attempt=1 cancelled (jobd cancel) before it started")
    assert "start orphan" not in ran(tmp_path)
    assert r.zcard("{jobd:q}:cancels") == 0


def test_held_marks_whose_entry_is_gone_are_swept_and_a_waiting_one_s_is_kept(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """Marks held until their entry is settled cannot leak: one whose entry was acked by hand,
    or deleted, goes at the next cancel or read of its stream; a waiting entry's stays."""
    from jobd.cancel import cancel

    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    acked = r.xadd("jobd:q", {"payload": "x", "job_id": "acked"}).decode()
    deleted = r.xadd("jobd:q", {"payload": "x", "job_id": "deleted"}).decode()
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"})
    waiting = r.xadd("jobd:q", {"payload": "x"}).decode()
    store, q = store_and_queue(config, r)
    assert [f.where for f in cancel(store, q, ["acked", "deleted", waiting], 1000, "t@h")] == [
        "running", "running", "waiting",
    ]  # fmt: skip
    held = {f"id:jobd:q|{e}".encode() for e in (acked, deleted, waiting)}
    assert held <= set(r.zrange("{jobd:q}:cancels", 0, -1))
    r.xack("jobd:q", "jobd", acked)  # settled by hand, by no script that knows of marks
    r.xack("jobd:q", "jobd", deleted)
    r.xdel("jobd:q", deleted)
    cancel(store, q, ["another"], 1000, "t@h")  # any cancel of the queue sweeps a few
    left = {m for m in r.zrange("{jobd:q}:cancels", 0, -1) if m.startswith(b"id:")}
    assert left == {f"id:jobd:q|{waiting}".encode()}


# -- a cancel is quick, and says 'cancelling' meanwhile (point 2) -------------------------------


@pytest.mark.parametrize("levels", ["", "    priorities: [high, low]\n"], ids=["plain", "levels"])
def test_cancel_stops_a_running_job_before_any_renewal_and_says_cancelling_until_it_ends(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path, levels: str
) -> None:
    """renew_every 30s: the handler gets its SIGTERM from the reader's poll, with no lease
    renewal of its entry since it started (its idle time in the pending list says so); `jobd
    job` says 'cancelling' until the handler ends, then 'cancelled'. A queue with priority
    levels polls apart from its reads (jobd:q is its low level's stream)."""
    config = setup(write_config, script, tmp_path, renew="30s", reclaim="90s", extra=levels)
    d = daemon(config)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-1"})
    wait_until(lambda: "start long-1" in ran(tmp_path), what="the long job to start")
    started = time.monotonic()  # after its delivery: no renewal since makes its idle longer
    wait_until(lambda: job_state(config, "long-1") == "running", what="its active record")
    out = jobd_cli("cancel", "-c", str(config), "q", "long-1")
    assert out.returncode == 0 and b"long-1: running on " in out.stdout, out
    wait_until(lambda: "term long-1" in ran(tmp_path), 15, "the handler to get SIGTERM")
    (entry,) = r.xpending_range("jobd:q", "jobd", "-", "+", 1)
    since = time.monotonic() - started
    assert entry["time_since_delivered"] >= since * 1000 - 5, (
        "stopped with no renewal of its lease since it started: by the reader's poll"
    )
    assert job_state(config, "long-1") == "cancelling"
    from jobd.config import load
    from jobd.store.store import Store
    from jobd.web.dashboard import job_lookup

    shown = job_lookup(Store(r), load(str(config)), {"queue": ["q"], "id": ["long-1"]})
    assert shown["state"] == "cancelling" and shown["running"], "the dashboard's job view too"
    (tmp_path / "release").touch()
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the cancelled ack")
    assert job_state(config, "long-1") == "cancelled"
    assert "done long-1" not in ran(tmp_path) and ran(tmp_path).count("start long-1") == 1
    assert "cancelled (jobd cancel); stopping the handler" in d.log()


def test_cancel_wait_returns_once_the_job_stopped_and_says_when_it_did_not(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """`--wait DURATION` exits 75 while the handler has not ended; `--wait` alone returns once
    it has (its outcome written: nothing pending), exit 0."""
    config = setup(write_config, script, tmp_path)
    daemon(config)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-w"})
    wait_until(lambda: "start long-w" in ran(tmp_path), what="the long job to start")
    short = jobd_cli("cancel", "-c", str(config), "q", "long-w", "--wait", "300ms")
    assert short.returncode == 75, short
    assert b"long-w: still running" in short.stdout
    wait_until(lambda: "term long-w" in ran(tmp_path), what="its SIGTERM")
    said = tmp_path / "said"
    with said.open("wb") as out:
        waiting = subprocess.Popen(
            [sys.executable, "-m", "jobd", "cancel", "-c", str(config), "q", "long-w", "--wait"],
            stdout=out,
        )
        wait_until(lambda: b"long-w: running on" in said.read_bytes(), what="the cancel")
        assert waiting.poll() is None, "it waits while the handler has not ended"
        (tmp_path / "release").touch()
        assert waiting.wait(DEADLINE) == 0, said.read_bytes()
    assert r.xpending("jobd:q", "jobd")["pending"] == 0, "returned only once it had stopped"
    assert job_state(config, "long-w") == "cancelled"
    assert b"long-w: stopped" in said.read_bytes()


def test_cancel_options_are_checked(r: redis.Redis, write_config, script, tmp_path: Path) -> None:
    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    bad = jobd_cli("cancel", "-c", str(config), "q", "ghost", "--unseen-for", "0")
    assert bad.returncode == 2 and b"--unseen-for 0: must be more than 0" in bad.stderr
    nowhere = jobd_cli("cancel", "-c", str(config), "q", "ghost", "--wait", "1s")
    assert nowhere.returncode == 3, "found nowhere: nothing to wait for"


# -- no cancel script fails after a write (point 3) ----------------------------------------------


def test_a_unique_mark_of_another_type_never_runs_a_cancelled_waiting_job(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """cancelled.lua read the --unique mark with GET after XACK: someone else's hash there
    failed the script half-way (acked, no record) and the reader ran the whole batch."""
    config = setup(write_config, script, tmp_path)
    c = str(config)
    assert jobd_cli("enqueue", "-c", c, "q", "x", "--job-id", "u1", "--unique").returncode == 0
    assert jobd_cli("enqueue", "-c", c, "q", "x", "--job-id", "other").returncode == 0
    # Found waiting (by reading the entries not delivered yet), or, before that walk, marked
    # by job id: either way its reader acknowledges it unrun, the --unique mark read after.
    assert jobd_cli("cancel", "-c", c, "q", "u1").returncode in (0, 3)
    r.delete("{jobd:q}:job:u1")
    r.hset("{jobd:q}:job:u1", "someone", "else")
    d = daemon(config)
    wait_until(lambda: "done other" in ran(tmp_path), what="the other job to run")
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="every ack")
    assert "start u1" not in ran(tmp_path), ran(tmp_path)
    d.wait_log("job=u1 attempt=1 cancelled (jobd cancel) before it started")
    assert job_state(config, "u1") == "cancelled", "its record written with the ack"
    assert r.type("{jobd:q}:job:u1") == b"hash", "someone else's key is left alone"


def test_a_unique_mark_of_another_type_still_settles_a_cancelled_running_job_with_its_record(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """settle.lua's cancel branch read the mark with GET after XACK: the entry was acked with
    no record and no count."""
    config = setup(write_config, script, tmp_path)
    c = str(config)
    daemon(config)
    wait_group(r, "jobd:q")
    assert jobd_cli("enqueue", "-c", c, "q", "x", "--job-id", "long-u", "--unique").returncode == 0
    wait_until(lambda: "start long-u" in ran(tmp_path), what="the job to start")
    r.delete("{jobd:q}:job:long-u")
    r.hset("{jobd:q}:job:long-u", "someone", "else")
    (tmp_path / "release").touch()
    assert jobd_cli("cancel", "-c", c, "q", "long-u").returncode == 0
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the cancelled ack")
    wait_until(lambda: job_state(config, "long-u") == "cancelled", what="its record")
    report = json.loads(jobd_cli("status", "-c", c, "--json").stdout)["queues"]["q"]
    assert report["this_minute"].get("cancelled", 0) + report["last_minute"].get("cancelled", 0)


def test_a_unique_mark_of_another_type_still_records_a_cancelled_delayed_job(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """cancel_delayed.lua read the mark with GET after ZREM: the job left the delayed set with
    no record, and `jobd cancel` failed."""
    config = setup(write_config, script, tmp_path)
    c = str(config)
    enqueue = ("enqueue", "-c", c, "q", "x", "--job-id", "u-later", "--unique", "--delay", "1h")
    assert jobd_cli(*enqueue).returncode == 0
    r.delete("{jobd:q}:job:u-later")
    r.hset("{jobd:q}:job:u-later", "someone", "else")
    out = jobd_cli("cancel", "-c", c, "q", "u-later")
    assert out.returncode == 0 and b"u-later: delayed (due " in out.stdout, out
    assert r.zcard("{jobd:q}:delayed") == 0
    assert job_state(config, "u-later") == "cancelled"


def test_someone_else_s_key_at_the_stream_s_name_fails_no_cancel_half_way(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """cancel.lua wrote a job's mark, then read the stream with XRANGE: a key of another type
    there failed the script with the mark written and the others not."""
    config = setup(write_config, script, tmp_path)
    r.set("jobd:q", "someone else's")
    out = jobd_cli("cancel", "-c", str(config), "q", "1-1", "2-1")
    assert out.returncode == 3, out
    assert b"1-1: not found" in out.stdout and b"2-1: not found" in out.stdout
    assert r.zcard("{jobd:q}:cancels") == 2


def test_the_reader_s_cancellation_check_on_a_group_gone_writes_nothing_and_fails_nothing(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """cancelled.lua removed expired marks (and swept held ones), then asked XPENDING of each
    marked entry: with the group gone (deleted since the read) the script failed after those
    writes. Now it asks for the group before any write: no group, nothing pending here."""
    from jobd.job import Job

    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    entry = r.xadd("jobd:q", {"payload": "x", "job_id": "g1"})
    r.zadd("{jobd:q}:cancels", {f"id:jobd:q|{entry.decode()}": float("inf"), "job:old": 1})
    r.xgroup_destroy("jobd:q", "jobd")
    store, q = store_and_queue(config, r)
    job = Job.from_entry("q", entry, {b"payload": b"x", b"job_id": b"g1"})
    assert store.cancelled(q, [job]) == set()
    assert r.zscore("{jobd:q}:cancels", "job:old") == 1, "no write: the expired mark is left"


def test_a_named_waiting_job_is_found_a_page_at_a_time_up_to_a_bound(
    r: redis.Redis, write_config, script, tmp_path: Path, monkeypatch
) -> None:
    """A job id its producer chose is found by reading the entries no daemon has read yet, a
    page per script call; past WAITING_SCAN entries a job keeps its mark by job id only (it is
    reported 'marked', cancelled if read within --unseen-for)."""
    from jobd.cancel import cancel
    from jobd.store import control

    monkeypatch.setattr(control, "WAITING_PAGE", 100)
    monkeypatch.setattr(control, "WAITING_SCAN", 300)
    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "x", "job_id": "read"})
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"})  # delivered: not among the waiting
    r.xack("jobd:q", "jobd", r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["message_id"])
    pipe = r.pipeline(transaction=False)
    for i in range(400):
        pipe.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    pipe.execute()
    store, q = store_and_queue(config, r)
    found = {f.job_id: f for f in cancel(store, q, ["j0", "j250", "j350", "read"], 60_000, "t@h")}
    assert (found["j0"].where, found["j250"].where) == ("waiting", "waiting")
    assert found["j350"].where == "marked", "beyond WAITING_SCAN: by job id only"
    assert found["read"].where == "marked", "delivered and acked: no longer waiting"
    held = {m for m in r.zrange("{jobd:q}:cancels", 0, -1) if m.startswith(b"id:")}
    assert held == {f"id:jobd:q|{found[j].entry}".encode() for j in ("j0", "j250")}


def test_a_cancelled_job_that_failed_before_its_sigterm_gets_no_next_attempt(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The handler fails on its own (exit 1) while its daemon is stopped, and `jobd cancel`
    marks it then: the daemon, continued, writes no retry (a retry due after --unseen-for would
    have run the job again); the job is cancelled, nothing waits in the delayed set."""
    import signal

    import psutil

    body = (
        "#!/bin/sh\n"
        f'echo "start $JOBD_JOB_ID $$" >> {tmp_path}/ran\n'
        f"while [ ! -e {tmp_path}/fail ]; do sleep 0.05; done\n"
        "exit 1\n"
    )
    handler = script("f.sh", body)
    config = write_config(
        CONFIG.format(handler=handler, renew="30s", reclaim="90s").replace(
            "backoff: 100ms", "backoff: 1h, max_backoff: 2h"
        )
    )
    d = daemon(config)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "fails"})
    line = wait_until(lambda: [x for x in ran(tmp_path) if x.startswith("start fails")])
    pid = int(line[0].split()[2])
    d.signal(signal.SIGSTOP)
    try:
        (tmp_path / "fail").touch()
        wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, what="its exit")
        out = jobd_cli("cancel", "-c", str(config), "q", "fails")
        assert b"fails: running on " in out.stdout, out
    finally:
        d.signal(signal.SIGCONT)
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="its outcome")
    assert r.zcard("{jobd:q}:delayed") == 0, "no next attempt"
    assert job_state(config, "fails") == "cancelled"
    assert r.zcard("{jobd:q}:cancels") == 0


# -- a cancel holds through Redis refusing, dead letters, promotions, removed levels -------------


def test_a_delayed_job_promoted_while_the_cancel_walks_the_streams_is_cancelled_for_good(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """``jobd.cancel.cancel`` asks every stream (pending, then waiting), then the delayed sets.
    A delayed job a daemon's forwarder moves to the stream in between is found nowhere; it
    must not run once the 'job:' mark expired: promote.lua removes a due job whose job id is
    marked, recorded cancelled. The steps of ``cancel`` run here one by one with the real
    promote between them (what a forwarder may do at any moment). Before, the job was moved
    and ran once the mark had expired."""
    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    out = jobd_cli("enqueue", "-c", str(config), "--job-id", "victim", "--delay", "300ms", "q",
                   "x")  # fmt: skip
    assert out.returncode == 0, out
    store, q = store_and_queue(config, r)
    (level,) = q.all_levels()
    # jobd.cancel.cancel, step 1: the streams (cancel.lua, cancel_waiting.lua)
    found = store.cancel(level, ["victim"], 1000, "t@h")
    assert [f.where for f in found] == ["marked"]
    # a daemon's forwarder moves the due job to the stream now
    due = redis_ms(r) + 400
    wait_until(lambda: redis_ms(r) > due, what="the job due")
    store.promote(q, 100, 1000)  # removed as cancelled (moved to the stream before)
    assert r.zcard(q.keys.delayed) == 0, "the job left the delayed set"
    # jobd.cancel.cancel, step 2: the delayed sets, for the jobs found nowhere
    assert store.cancel_delayed(level, ["victim"], "t@h") == []
    outlive_the_unseen_marks(r)
    daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "after"})  # behind the victim, if it was moved
    wait_until(lambda: "done after" in ran(tmp_path), what="the job after it to run")
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="every outcome")
    assert "start victim" not in ran(tmp_path), "a job delayed when it was cancelled ran"
    assert job_state(config, "victim") == "cancelled"


def via_proxy(write_config, tmp_path: Path, url: str, name: str, renew: str, reclaim: str) -> Path:
    text = CONFIG.format(handler=tmp_path / "h.sh", renew=renew, reclaim=reclaim)
    return write_config(text.replace("{redis}", url), name)


def test_cancel_wait_never_says_stopped_of_a_job_settled_by_another_daemon(
    r: redis.Redis, redis_server, write_config, script, daemon, tmp_path: Path
) -> None:
    """Daemon A runs the job and is cut off from Redis (blackhole); `jobd cancel --wait 20s`;
    after reclaim_after daemon B takes the entry over and acks it unrun (cancelled.lua). Redis
    cannot show A's handler end (A stops it once it reaches Redis again), so --wait says the
    job is settled by B, not confirmed stopped, and exits 4, while A's handler still runs.
    Before, it said 'stopped' and exited 0."""
    from faultproxy import FaultProxy

    direct = setup(write_config, script, tmp_path, renew="200ms", reclaim="2s")
    with FaultProxy(redis_server.port) as proxy:
        daemon(via_proxy(write_config, tmp_path, proxy.url, "a.yaml", "200ms", "2s"))
        wait_group(r, "jobd:q")
        r.xadd("jobd:q", {"payload": "x", "job_id": "long-w"})
        wait_until(lambda: "start long-w" in ran(tmp_path), what="the job to start on A")
        proxy.blackhole(None)
        # The cancel lands first (its held mark written), B starts after: B, once the lease
        # lapsed, finds the entry cancelled and acks it unrun. (B started first could take the
        # job over and run it before the cancel, 2 s after the blackhole, under load.)
        cancel = subprocess.Popen(
            [sys.executable, "-m", "jobd", "cancel", "-c", str(direct), "q", "long-w",
             "--wait", "20s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_until(
                lambda: any(m.startswith(b"id:") for m in r.zrange("{jobd:q}:cancels", 0, -1)),
                what="the cancel's held mark",
            )
            daemon(direct)  # B
            stdout, stderr = cancel.communicate(timeout=60)
            still = "term long-w" not in ran(tmp_path)
        finally:
            cancel.kill()
            proxy.restore()
        (tmp_path / "release").touch()
    assert still, "A's handler still ran (A cut off from Redis) when --wait returned"
    assert cancel.returncode == 4, (stdout, stderr)  # settled, not confirmed stopped
    assert b"long-w: settled by " in stdout and b"not confirmed stopped" in stdout, stdout
    assert b"long-w: stopped" not in stdout


def test_held_marks_of_a_priority_level_removed_from_the_config_are_swept(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """Jobs waiting on priority level 'high' are cancelled (held marks, no expiry); the level is
    then removed from the config, and one of its entries deleted by hand. Its mark must be
    swept by the reads and cancels of the queue as it is now (they look at every held mark,
    each against its own stream), not kept for ever (sweep_held looked only at marks of the
    stream it was called for, so the marks key existed for ever and every read of the queue
    paid a cancelled.lua call). The mark of the job still waiting in the level's stream is
    kept: the job would run if the level came back."""
    from jobd.cancel import cancel

    levels = setup(write_config, script, tmp_path, extra="    priorities: [high, low]\n")
    assert jobd_cli("pause", "-c", str(levels), "q").returncode == 0
    d = daemon(levels)
    high = "{jobd:q}:priority:high"
    wait_group(r, high)
    gone = r.xadd(high, {"payload": "x", "job_id": "h1"}).decode()
    kept = r.xadd(high, {"payload": "x", "job_id": "h2"}).decode()
    store, q = store_and_queue(levels, r)
    assert [f.where for f in cancel(store, q, ["h1", "h2"], 1000, "t@h")] == ["waiting"] * 2
    d.stop()
    r.xdel(high, gone)  # deleted by hand: h1 can no longer run anywhere
    plain = setup(write_config, script, tmp_path)  # the same queue, no levels now
    assert jobd_cli("resume", "-c", str(plain), "q").returncode == 0
    daemon(plain)
    wait_group(r, "jobd:q")
    store, q = store_and_queue(plain, r)
    for i in range(30):  # reads and cancels of the queue: each sweeps a few held marks
        r.xadd("jobd:q", {"payload": "x", "job_id": f"n{i}"})
        cancel(store, q, [f"other{i}"], 1, "t@h")
    wait_until(lambda: "done n29" in ran(tmp_path), what="the jobs read since")
    outlive_the_unseen_marks(r)
    r.xadd("jobd:q", {"payload": "x", "job_id": "last"})
    wait_until(lambda: "done last" in ran(tmp_path), what="a read after the marks expired")
    left = r.zrange("{jobd:q}:cancels", 0, -1)
    assert left == [f"id:{high}|{kept}".encode()], f"entry {gone} deleted, {kept} waiting"


FAILS_ON_ITS_OWN = """\
#!/bin/sh
echo "start $JOBD_JOB_ID" >> {dir}/ran
while [ ! -e {dir}/fail ]; do sleep 0.05; done
echo "exit $JOBD_JOB_ID" >> {dir}/ran
exit 1
"""


def fail_as_it_is_cancelled(r, redis_server, write_config, script, daemon, tmp_path: Path):
    """A job on its last attempt (--max-attempts 1) fails on its own while its daemon is cut
    off from Redis (fault proxy blackhole: the daemon has decided its outcome, a dead letter,
    and cannot write it yet); jobd cancel marks it meanwhile (found running); then the link
    comes back. Returns the config and the daemon."""
    from faultproxy import FaultProxy

    handler = script("f.sh", FAILS_ON_ITS_OWN.format(dir=tmp_path))
    direct = write_config(CONFIG.format(handler=handler, renew="200ms", reclaim="20s"))
    with FaultProxy(redis_server.port) as proxy:
        text = CONFIG.format(handler=handler, renew="200ms", reclaim="20s")
        d = daemon(write_config(text.replace("{redis}", proxy.url), "via.yaml"))
        wait_group(r, "jobd:q")
        out = jobd_cli("enqueue", "-c", str(direct), "--job-id", "f1", "--max-attempts", "1", "q")
        assert out.returncode == 0, out
        wait_until(lambda: "start f1" in ran(tmp_path), what="the job to start")
        proxy.blackhole(None)
        try:
            (tmp_path / "fail").touch()
            wait_until(lambda: "exit f1" in ran(tmp_path), what="the handler to fail")
            d.wait_log("job=f1 attempt=1 exit 1")
            out = jobd_cli("cancel", "-c", str(direct), "q", "f1")
            assert b"f1: running on" in out.stdout, out
        finally:
            proxy.restore()
        wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the outcome")
    return direct, d


def test_a_job_failing_on_its_last_attempt_as_it_is_cancelled_is_cancelled_not_dead(
    r: redis.Redis, redis_server, write_config, script, daemon, tmp_path: Path
) -> None:
    """README: 'one that fails on its own meanwhile is cancelled, not retried, and not
    dead-lettered on its last attempt'. dead_letter.lua honours the marks as retry.lua does,
    and clears them (the held one, and 'job:f1', which would cancel a later enqueue or
    requeue of f1) in the same step. Before, it was dead-lettered and its marks stayed."""
    config, _ = fail_as_it_is_cancelled(r, redis_server, write_config, script, daemon, tmp_path)
    view = json.loads(jobd_cli("job", "-c", str(config), "q", "f1", "--json").stdout)
    assert view["state"] == "cancelled", (view["state"], r.zrange("{jobd:q}:cancels", 0, -1))
    assert r.zrange("{jobd:q}:cancels", 0, -1) == [], "its marks went with it"
    assert r.xlen("{jobd:q}:dead") == 0


BUSY = """local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2]
while true do local u = redis.call('TIME')
  if u[1] * 1000000 + u[2] - s > 1500000 then return 1 end end"""


def test_a_cancelled_waiting_job_never_runs_when_redis_is_busy_as_it_is_read(
    r: redis.Redis, redis_server, write_config, script, daemon, tmp_path: Path
) -> None:
    """jobd cancel found the job waiting (held mark). Someone else's slow script makes Redis
    answer BUSY just after a reader read the job, when it asks cancelled.lua whether it was
    cancelled: Redis away for a while (connection.away) says nothing of the batch, which is
    checked again, never run unchecked (before, any ResponseError ran the batch). The daemon
    reaches Redis through the fault proxy (200 ms each way), so its cancelled.lua call comes
    400 ms after its read; the slow script starts as soon as the entry is seen delivered (BUSY
    replies after 5 ms, for 1.5 s)."""
    from faultproxy import FaultProxy

    direct = setup(write_config, script, tmp_path)
    with FaultProxy(redis_server.port) as proxy:
        text = CONFIG.format(handler=tmp_path / "h.sh", renew="200ms", reclaim="5s")
        assert jobd_cli("pause", "-c", str(direct), "q").returncode == 0
        d = daemon(write_config(text.replace("{redis}", proxy.url), "via.yaml"))
        wait_group(r, "jobd:q")
        r.xadd("jobd:q", {"payload": "x", "job_id": "c1"})
        out = jobd_cli("cancel", "-c", str(direct), "q", "c1")
        assert b"c1: waiting" in out.stdout, out
        proxy.latency(0.2)
        r.config_set("busy-reply-threshold", 5)
        other = redis.Redis(port=redis_server.port)
        try:
            assert jobd_cli("resume", "-c", str(direct), "q").returncode == 0
            wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 1, what="the read")
            other.eval(BUSY, 0)
        finally:
            r.config_set("busy-reply-threshold", 5000)
            proxy.restore()
        wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the outcome")
        assert "start c1" not in ran(tmp_path), d.log()[-2000:]
    assert job_state(direct, "c1") == "cancelled"


def test_a_dead_letter_requeued_runs_though_a_cancel_found_its_job_nowhere(
    r: redis.Redis, write_config, script, daemon, tmp_path: Path
) -> None:
    """`jobd cancel q d1` while d1 is a dead letter finds it nowhere: a 'job:d1' mark, for
    --unseen-for. An operator's `jobd dlq requeue` within that time is a new decision: the
    requeued job runs (requeue.lua removes the mark), it is not acknowledged unrun."""
    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("{jobd:q}:dead", {"payload": "x", "job_id": "d1", "jobd_job_id": "d1"})
    out = jobd_cli("cancel", "-c", str(config), "q", "d1", "--unseen-for", "1h")
    assert b"d1: not found" in out.stdout, out
    out = jobd_cli("dlq", "-c", str(config), "q", "requeue", "--all")
    assert out.returncode == 0 and b"requeued 1" in out.stdout, out
    assert r.zrange("{jobd:q}:cancels", 0, -1) == []
    daemon(config)
    wait_until(lambda: "done d1" in ran(tmp_path), what="the requeued job to run")


def test_cancel_into_a_closed_pipe_cancels_every_job_and_does_not_blame_redis(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """`jobd cancel q a b c | head -0`: stdout is closed before anything is written (a pipe
    whose reader is gone). Every job is still cancelled, nothing says Redis is away, and the
    exit status is the cancel's (0: one was found), not 69 (EX_UNAVAILABLE)."""
    import os

    config = setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "x", "job_id": "a"})
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "jobd", "cancel", "-c", str(config), "q", "a", "b", "c"],
            stdout=write_end, stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert b"cannot reach Redis" not in done.stderr and b"Traceback" not in done.stderr, done
    assert done.returncode == 0, done
    marks = {m.decode().split("|")[0] for m in r.zrange("{jobd:q}:cancels", 0, -1)}
    assert marks >= {"id:jobd:q", "job:a", "job:b", "job:c"}, marks


def test_ctrl_c_during_the_cancel_itself_says_the_cancel_may_be_incomplete(
    r: redis.Redis, redis_server, write_config, script, tmp_path: Path
) -> None:
    """SIGINT while `jobd cancel` (no --wait) is still asking Redis (its calls held by the
    fault proxy's blackhole): it says the cancel may be incomplete, not that a stop is
    unconfirmed (there was no --wait), and exits 75."""
    import signal

    from faultproxy import FaultProxy

    setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    with FaultProxy(redis_server.port) as proxy:
        via = via_proxy(write_config, tmp_path, proxy.url, "via.yaml", "200ms", "2s")
        proxy.blackhole(None)
        with interruptible():  # as from a terminal, whatever this test was started with
            cli = subprocess.Popen(
                [sys.executable, "-m", "jobd", "cancel", "-c", str(via), "q", "a"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        try:
            wait_until(lambda: proxy.connections() >= 1, what="the cancel's call to Redis")
            cli.send_signal(signal.SIGINT)
            out, err = cli.communicate(timeout=30)
        finally:
            cli.kill()
            proxy.restore()
    assert cli.returncode == 75, (out, err)
    assert b"the cancel may be incomplete" in err and b"not confirmed" not in err, err


# -- every copy of a job id; a job id no stream id; Redis refusing (review1) -----------------------


# A stream id Redis refuses (its milliseconds above 2**64 - 1): it matches cancel.lua's
# '^%d+%-%d+$', so the script asks XRANGE for it (before: after it wrote the ids' marks).
OVERFLOWING_ID = "99999999999999999999-0"


def test_a_cancel_with_an_overflowing_numeric_job_id_still_stops_the_running_job(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd cancel q long-1 99999999999999999999-0`: the second id is a job id like any other
    (found nowhere, marked). cancel.lua wrote long-1's held mark, then failed on XRANGE of the
    second id: the generation was never bumped, the command failed with a traceback, and the
    running handler was not stopped within a second (only at its next lease renewal, 30 s
    here). Now that XRANGE is a pcall, asked before any write."""
    config = setup(write_config, script, tmp_path, renew="30s", reclaim="90s")
    daemon(config)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-1"})
    wait_until(lambda: "start long-1" in ran(tmp_path), what="the long job to start")
    out = jobd_cli("cancel", "-c", str(config), "q", "long-1", OVERFLOWING_ID)
    returned = time.monotonic()
    try:
        wait_until(lambda: "term long-1" in ran(tmp_path), 5, "the handler to get SIGTERM")
        assert time.monotonic() - returned < 2, "SIGTERM within a second of the cancel"
        assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr[-400:]
    finally:
        (tmp_path / "release").touch()


# Each line names the entry: two copies of one job id are told apart.
ENTRY_HANDLER = """\
#!/bin/sh
echo "start $JOBD_MESSAGE_ID" >> {dir}/ran
trap 'echo "term $JOBD_MESSAGE_ID" >> {dir}/ran; exit 143' TERM
sleep 120 & wait
echo "done $JOBD_MESSAGE_ID" >> {dir}/ran
"""


def test_a_cancel_stops_every_running_copy_of_a_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Two entries with one job id (a producer that sent it twice), both running (concurrency
    2): `jobd cancel q dup` must stop both. cancel.lua kept one entry per job id of a page
    (``running[jid]``, the last one seen) and held only that one's mark; the other copy had
    only the 'job:' mark, which neither the reader's poll nor renew.lua looks at: it ran on
    (to its end), and that 'job:' mark went with the cancelled copy's outcome."""
    handler = script("h.sh", ENTRY_HANDLER.format(dir=tmp_path))
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    concurrency: 2\n"
        "    lease: {renew_every: 30s, reclaim_after: 90s}\n"
    )
    daemon(config)
    wait_group(r, "jobd:q")
    first = r.xadd("jobd:q", {"payload": "x", "job_id": "dup"}).decode()
    second = r.xadd("jobd:q", {"payload": "x", "job_id": "dup"}).decode()
    wait_until(
        lambda: {f"start {first}", f"start {second}"} <= set(ran(tmp_path)), what="both to start"
    )
    out = jobd_cli("cancel", "-c", str(config), "q", "dup")
    assert out.returncode == 0, out.stderr[-400:]
    wait_until(lambda: any(x.startswith("term") for x in ran(tmp_path)), 5, "a first SIGTERM")
    wait_until(
        lambda: {f"term {first}", f"term {second}"} <= set(ran(tmp_path)),
        5,
        f"both copies to get SIGTERM: {out.stdout!r}",
    )


def test_a_cancel_of_a_running_job_also_cancels_its_waiting_copy(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """One copy of job id 'dup' runs, a second waits behind it (concurrency 1, no read-ahead).
    `jobd cancel q dup` says 'running' and stops the first; the second must not run (a waiting
    job is acked unrun whenever it is read; every job id also gets a mark for --unseen-for).
    The cancel did not look for waiting copies of a job id it found running, and settle.lua
    removes the 'job:' mark with the cancelled copy's outcome: the waiting copy ran next."""
    handler = script("h.sh", ENTRY_HANDLER.format(dir=tmp_path))
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    concurrency: 1\n    prefetch: 0\n"
        "    lease: {renew_every: 30s, reclaim_after: 90s}\n"
    )
    d = daemon(config)
    wait_group(r, "jobd:q")
    first = r.xadd("jobd:q", {"payload": "x", "job_id": "dup"}).decode()
    second = r.xadd("jobd:q", {"payload": "x", "job_id": "dup"}).decode()
    wait_until(lambda: f"start {first}" in ran(tmp_path), what="the first copy to start")
    # Paused: the second copy stays waiting while the first is cancelled and settled.
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    out = jobd_cli("cancel", "-c", str(config), "q", "dup")
    assert out.returncode == 0, out.stderr[-400:]
    wait_until(lambda: f"term {first}" in ran(tmp_path), 5, "the first copy's SIGTERM")
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="its outcome")
    assert jobd_cli("resume", "-c", str(config), "q").returncode == 0

    def second_settled_or_started() -> bool:
        read = group_info(r, "jobd:q")["last-delivered-id"].decode() == second
        return f"start {second}" in ran(tmp_path) or (read and pending_count(r, "jobd:q") == 0)

    wait_until(second_settled_or_started, what="the second copy read")
    assert f"start {second}" not in ran(tmp_path), (out.stdout, ran(tmp_path), d.log()[-800:])


def test_cancel_wait_waits_for_every_running_copy_of_a_job_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd cancel --wait` on a job id two entries run under: it says each one stopped, by
    its entry, and returns once both are settled (before, it saw one of them)."""
    handler = script("h.sh", ENTRY_HANDLER.format(dir=tmp_path))
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n"
        f"    command: [{handler}]\n    concurrency: 2\n"
        "    lease: {renew_every: 30s, reclaim_after: 90s}\n"
    )
    daemon(config)
    wait_group(r, "jobd:q")
    entries = [r.xadd("jobd:q", {"payload": "x", "job_id": "dup"}).decode() for _ in range(2)]
    wait_until(lambda: {f"start {e}" for e in entries} <= set(ran(tmp_path)), what="both")
    out = jobd_cli("cancel", "-c", str(config), "q", "dup", "--wait", "20s")
    assert out.returncode == 0, out
    lines = out.stdout.decode().splitlines()
    for e in entries:
        assert any(x.startswith("dup: running on ") and f"(entry {e})" in x for x in lines), lines
        assert f"dup: stopped (entry {e})" in lines, lines
    assert r.xpending("jobd:q", "jobd")["pending"] == 0


def test_cancel_says_an_error_redis_answered_without_a_traceback(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    """Someone else's key at the delayed set's name: Redis answers cancel_delayed.lua's ZRANGE
    with an error. `jobd cancel` says so in one line and exits 1 (before: a traceback)."""
    config = setup(write_config, script, tmp_path)
    r.set("{jobd:q}:delayed", "someone else's")
    out = jobd_cli("cancel", "-c", str(config), "q", "nowhere")
    assert out.returncode == 1, out
    assert b"Traceback" not in out.stderr, out.stderr
    assert b"jobd cancel: Redis answered with an error: WRONGTYPE" in out.stderr, out.stderr
    assert b"run it again" in out.stderr


# A producer may add an entry with an explicit id of any sequence up to 2**64 - 1; XADD * then
# goes on from it (review 3 of issue 32).
HOSTILE = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
defaults:
  command: [/bin/sh, -c, 'echo "$JOBD_JOB_ID" >> {ran}']
  lease: {{renew_every: 200ms, reclaim_after: 1s}}
queues:
  q: {{concurrency: 2}}
"""


def run_cli(*args: str) -> None:
    done = jobd_cli(*args)
    assert done.returncode == 0, done.stderr


def test_a_cancelled_waiting_job_runs_once_its_held_mark_is_swept_behind_a_hostile_ids_sequence(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd cancel` of a job waiting in a paused queue holds it cancelled "until it is
    settled" (a held 'id:' mark). sweep_held (lib/jobs.lua id_after) compared the entry's id
    with the group's last delivered one as Lua doubles: behind one hostile entry whose id
    sequence is 2**53, the waiting entry's (2**53 + 1, the next XADD * of that millisecond)
    reads as not after it, its held mark is swept as the mark of an entry gone, and once the
    'job:' mark (--unseen-for) has expired, by the next cancel (of any job), the cancelled job
    runs when the queue is resumed."""
    config = write_config(HOSTILE.format(ran=tmp_path / "ran"))
    d = daemon(config)
    victim = paused_behind_hostile(r, d, config, 2**53)  # victim: a normal producer's
    run_cli("cancel", "-c", str(config), "q", "victim", "--unseen-for", "1s")
    marks = load(str(config)).queues["q"].keys.cancels
    assert r.zscore(marks, f"id:jobd:q|{victim.decode()}") == float("inf"), "held: found waiting"
    expiry = r.zscore(marks, "job:victim")
    assert expiry is not None

    wait_until(lambda: redis_ms(r) > expiry + 100, what="the job id's mark to expire")
    other = jobd_cli("cancel", "-c", str(config), "q", "another")  # any cancel sweeps marks
    assert other.returncode == 3, other.stderr  # 3: found nowhere (marked)
    run_cli("resume", "-c", str(config), "q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "after"})  # read with or after the victim
    wait_until(lambda: "after" in ran(tmp_path), what="the job behind the victim to run")
    wait_until(lambda: acked_all(r, "jobd:q", 3), what="every entry settled")
    assert "victim" not in ran(tmp_path), "a job cancelled while waiting ran"


# -- an entry id spelt otherwise (review 5) -------------------------------------------------------


def test_a_waiting_job_cancelled_by_its_entry_id_with_leading_zeros_is_not_said_cancelled(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """`jobd cancel q 0<entry id>`: Redis reads the text as the entry's id (XRANGE takes leading
    zeros), but the entry's job id is its id as Redis spells it, the one its reader looks up.
    cancel.lua said 'waiting … acknowledged unrun' and marked 'id:STREAM|0<entry id>', which no
    reader ever looks up: on resume the job ran. The text is another job id: found nowhere
    (exit 3, only marked), and the job runs, as jobd said."""
    config = setup(write_config, script, tmp_path)
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    daemon(config)
    wait_group(r, "jobd:q")
    entry = r.xadd("jobd:q", {"payload": "x"}).decode()  # its job id is its entry id
    out = jobd_cli("cancel", "-c", str(config), "q", "0" + entry)
    said = (out.stdout + out.stderr).decode()
    assert out.returncode == 3 and "not found" in said, said  # 3: found nowhere
    assert r.zrangebyscore("{jobd:q}:cancels", "+inf", "+inf") == [], "no held mark"
    assert jobd_cli("resume", "-c", str(config), "q").returncode == 0
    wait_until(lambda: f"done {entry}" in ran(tmp_path), what="the job to run")
