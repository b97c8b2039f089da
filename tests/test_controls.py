"""Operator controls across daemons, kept in Redis: `jobd pause` / `jobd resume`.

Real daemons on the session's private Redis; each claim is shown against a queue that is not
paused, enqueued after the paused one: once that one is done, the daemons were reading, so a
paused job that has not started did not start because of the pause.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_group, wait_until

Daemon = Callable[..., DaemonProcess]

CONFIG = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
defaults:
  command: [/bin/sh, -c, 'echo "$JOBD_QUEUE $JOBD_JOB_ID" >> {ran}']
  lease: {{renew_every: 200ms, reclaim_after: 1s}}
queues:
  held: {{concurrency: 2}}
  other: {{concurrency: 2}}
"""


def setup(write_config, tmp_path: Path) -> Path:
    return write_config(CONFIG.format(ran=tmp_path / "ran"))


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran"
    return path.read_text().splitlines() if path.exists() else []


def control(*args: str) -> str:
    done = jobd_cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_a_paused_queue_starts_nothing_on_any_daemon_until_resumed_even_across_restarts(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    config = setup(write_config, tmp_path)
    daemons = [daemon(config) for _ in range(3)]
    out = control("pause", "-c", str(config), "held")
    assert "paused held" in out
    assert "already paused" in control("pause", "-c", str(config), "held")
    time.sleep(1.0)  # the claim: a second after `jobd pause` returns, no daemon starts a job
    r.xadd("jobd:held", {"payload": "x", "job_id": "h1"})
    r.xadd("jobd:other", {"payload": "x", "job_id": "o1"})
    wait_until(lambda: "other o1" in ran(tmp_path), what="the queue not paused to run")
    for d in daemons:  # and every daemon has had a reader pass since: the pause held there
        d.wait_log("queue=held paused by ")
    assert "held h1" not in ran(tmp_path)

    report = json.loads(jobd_cli("status", "-c", str(config), "--json").stdout)
    paused = report["queues"]["held"]["paused"]
    assert paused["by"].endswith("@" + __import__("socket").gethostname())
    assert abs(paused["since"] - time.time()) < 60 and report["queues"]["other"]["paused"] is None
    assert "PAUSED since" in jobd_cli("status", "-c", str(config)).stdout.decode()

    for d in daemons:
        assert d.stop() == 0
    fresh = daemon(config)
    r.xadd("jobd:other", {"payload": "x", "job_id": "o2"})
    wait_until(lambda: "other o2" in ran(tmp_path), what="the restarted daemon to run")
    fresh.wait_log("queue=held paused by ")
    assert "held h1" not in ran(tmp_path), "the pause lives in Redis: it survives restarts"

    assert "resumed held" in control("resume", "-c", str(config), "held")
    wait_until(lambda: "held h1" in ran(tmp_path), what="the paused job to run once resumed")
    assert "was not paused" in control("resume", "-c", str(config), "held")
    assert r.exists("{jobd:held}:paused") == 0


def test_running_jobs_finish_and_delayed_jobs_keep_their_time_while_paused(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    slow = script("slow.sh", f'#!/bin/sh\nsleep 1\necho "$JOBD_JOB_ID" >> {tmp_path}/ran\n')
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"queues:\n  held:\n    command: [{slow}]\n    concurrency: 2\n"
    )
    d = daemon(config)
    wait_group(r, "jobd:held")
    r.xadd("jobd:held", {"payload": "x", "job_id": "running"})
    wait_until(lambda: r.xpending("jobd:held", "jobd")["pending"] == 1, what="the job to start")
    control("pause", "-c", str(config), "--all")
    control_at = time.time()
    later = ("enqueue", "-c", str(config), "held", "x", "--job-id", "later", "--delay", "1s")
    assert jobd_cli(*later).returncode == 0
    wait_until(lambda: "running" in ran(tmp_path), what="the running job to finish")
    # The delayed job is promoted to the stream at its time, paused or not, and waits there.
    wait_until(lambda: r.zcard("{jobd:held}:delayed") == 0, what="the delayed job's promotion")
    assert time.time() - control_at < 10
    d.wait_log("queue=held paused by ")
    assert "later" not in ran(tmp_path)
    assert r.xinfo_groups("jobd:held")[0]["lag"] == 1, "waiting in the stream, undelivered"
    control("resume", "-c", str(config), "--all")
    wait_until(lambda: "later" in ran(tmp_path), what="the delayed job to run once resumed")


def test_pause_needs_queues_or_all_and_names_unknown_ones(write_config, tmp_path: Path) -> None:
    config = setup(write_config, tmp_path)
    neither = jobd_cli("pause", "-c", str(config))
    assert neither.returncode == 2 and b"name queues, or --all" in neither.stderr
    unknown = jobd_cli("resume", "-c", str(config), "nope")
    assert unknown.returncode == 2 and b"no queue 'nope'" in unknown.stderr


# -- jobd cancel ---------------------------------------------------------------------------------

CANCEL_CONFIG = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
queues:
  q:
    command: [{handler}]
    concurrency: 2
    lease: {{renew_every: 200ms, reclaim_after: 2s}}
    retry: {{max_attempts: 3, backoff: 100ms}}
"""
HANDLER = """\
#!/bin/sh
echo "start $JOBD_JOB_ID" >> {dir}/ran
trap 'echo "term $JOBD_JOB_ID" >> {dir}/ran; exit 143' TERM
case "$JOBD_JOB_ID" in long*) sleep 60 & wait ;; esac
echo "done $JOBD_JOB_ID" >> {dir}/ran
"""


def cancel_setup(write_config, script, tmp_path: Path) -> Path:
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    return write_config(CANCEL_CONFIG.format(handler=handler))


def test_cancel_stops_a_job_running_on_another_daemon_with_no_renewal_of_its_lease(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """It once asserted a wall time (SIGTERM within renew_every + 2 s of starting `jobd
    cancel`), which failed under load: that time was mostly the CLI's own start (a Python
    process, 0.25 s idle, seconds on a loaded host), then up to a renew_every, as the renewal
    carried the cancel. The guarantee now: the holder's reader polls the cancel generation with
    the pause, so with renew_every 30 s the handler is stopped with no renewal of its entry
    since it started (the entry's idle time in the pending list says so)."""
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    config = write_config(
        CANCEL_CONFIG.format(handler=handler).replace(
            "renew_every: 200ms, reclaim_after: 2s", "renew_every: 30s, reclaim_after: 90s"
        )
    )
    daemons = [daemon(config) for _ in range(3)]
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-1"})
    wait_until(lambda: "start long-1" in ran(tmp_path), what="the long job to start")
    started = time.monotonic()  # after its delivery
    out = jobd_cli("cancel", "-c", str(config), "q", "long-1")
    assert out.returncode == 0 and b"long-1: running on " in out.stdout, out
    # A renewal was 30 s away: the TERM by 15 s is the poll's, and the idle time proves it.
    wait_until(lambda: "term long-1" in ran(tmp_path), 15, "the handler to get SIGTERM")
    idle = [p["time_since_delivered"] for p in r.xpending_range("jobd:q", "jobd", "-", "+", 1)]
    assert not idle or idle[0] >= (time.monotonic() - started) * 1000 - 5, "no renewal since"
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the cancelled ack")
    assert "done long-1" not in ran(tmp_path) and ran(tmp_path).count("start long-1") == 1
    assert r.zcard("{jobd:q}:delayed") == 0 and r.xlen("{jobd:q}:dead") == 0, "no retry, no DLQ"
    report = json.loads(jobd_cli("status", "-c", str(config), "--json").stdout)
    counts = report["queues"]["q"]
    assert (
        counts["this_minute"].get("cancelled", 0) + counts["last_minute"].get("cancelled", 0) == 1
    )
    assert any("cancelled (jobd cancel); stopping the handler" in d.log() for d in daemons)


def test_cancel_removes_a_delayed_job_and_a_waiting_one_never_starts(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config = cancel_setup(write_config, script, tmp_path)
    enqueue = ("enqueue", "-c", str(config), "q", "x")
    assert jobd_cli(*enqueue, "--job-id", "later", "--delay", "1h").returncode == 0
    waiting = r.xadd("jobd:q", {"payload": "x"}).decode()  # its job id is its entry id
    r.xadd("jobd:q", {"payload": "x", "job_id": "named"})  # waiting: found by its job_id
    out = jobd_cli("cancel", "-c", str(config), "q", "later", waiting, "named", "nowhere")
    text = out.stdout.decode()
    assert out.returncode == 0, out
    assert "later: delayed (due " in text and f"{waiting}: waiting (entry {waiting})" in text
    assert "named: waiting (entry " in text and "nowhere: not found" in text
    assert r.zcard("{jobd:q}:delayed") == 0
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "after"})
    wait_until(lambda: "done after" in ran(tmp_path), what="the job after them to run")
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="every ack")
    assert not any(waiting in line or "named" in line for line in ran(tmp_path)), ran(tmp_path)
    assert d.log().count("cancelled (jobd cancel) before it started: acked unrun") == 2


def test_cancel_finds_nothing_anywhere_exits_3(
    r: redis.Redis, write_config, script, tmp_path: Path
) -> None:
    config = cancel_setup(write_config, script, tmp_path)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    out = jobd_cli("cancel", "-c", str(config), "q", "ghost", "--unseen-for", "2s")
    assert out.returncode == 3 and b"ghost: not found" in out.stdout
    assert b"cancelled if it is read or becomes due within 2s" in out.stdout


# -- from the review of issue 19's first part -----------------------------------------------------


def test_cancelling_one_level_s_job_never_stops_another_level_s_job_with_the_same_entry_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"queues:\n  pq:\n    command: [{handler}]\n    concurrency: 4\n"
        "    priorities: [high, low]\n    lease: {renew_every: 200ms, reclaim_after: 2s}\n"
    )
    daemon(config)
    wait_group(r, "{jobd:pq}:priority:high")
    same = "1796000000000-0"
    r.xadd("{jobd:pq}:priority:high", {"payload": "x", "job_id": "long-high"}, id=same)
    r.xadd("jobd:pq", {"payload": "x", "job_id": "long-low"}, id=same)
    wait_until(lambda: {"start long-high", "start long-low"} <= set(ran(tmp_path)))
    assert jobd_cli("cancel", "-c", str(config), "pq", "long-high").returncode == 0
    wait_until(lambda: "term long-high" in ran(tmp_path), what="the cancelled job stopped")
    # The other level's job, same entry id, keeps running: its renewal reports nothing.
    wait_until(lambda: r.xpending("{jobd:pq}:priority:high", "jobd")["pending"] == 0)
    assert "term long-low" not in ran(tmp_path)
    assert r.xpending("jobd:pq", "jobd")["pending"] == 1


def test_a_cancelled_job_s_marks_go_with_it_and_free_its_unique_id(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config = cancel_setup(write_config, script, tmp_path)
    c = str(config)
    enqueue = ("enqueue", "-c", c, "q")
    assert (
        jobd_cli(*enqueue, "x", "--job-id", "u-delayed", "--unique", "--delay", "1h").returncode
        == 0
    )
    assert jobd_cli(*enqueue, "x", "--job-id", "u-waiting", "--unique").returncode == 0
    assert jobd_cli("cancel", "-c", c, "q", "u-delayed", "u-waiting").returncode == 0
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-r"})
    wait_until(lambda: "start long-r" in ran(tmp_path), what="a running job")
    assert jobd_cli("cancel", "-c", c, "q", "long-r").returncode == 0
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="cancels settled")
    d.wait_log("job=u-waiting attempt=1 cancelled (jobd cancel) before it started")
    # Each --unique id is free again (its 'queued' mark went with the job), and no mark is left
    # to cancel a later job of the same id.
    for jid in ("u-delayed", "u-waiting"):
        assert jobd_cli(*enqueue, "x", "--job-id", jid, "--unique").returncode == 0, jid
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-r"})
    wait_until(lambda: {"done u-delayed", "done u-waiting"} <= set(ran(tmp_path)))
    wait_until(lambda: ran(tmp_path).count("start long-r") == 2, what="the same id, again")
    assert r.zcard("{jobd:q}:cancels") == 0


def test_someone_else_s_keys_at_the_control_names_wedge_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A string at {S}:cancels: renewals still report a lost lease (the job is not run twice),
    reads still run jobs. A string at {S}:paused: the queue counts as paused, and `jobd
    resume` clears it."""
    config = cancel_setup(write_config, script, tmp_path)
    r.set("{jobd:q}:cancels", "garbage")
    d = daemon(config)
    wait_group(r, "jobd:q")
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": "long-t"})
    wait_until(lambda: "start long-t" in ran(tmp_path))
    r.xclaim("jobd:q", "jobd", "thief", 0, [mid])
    d.wait_log("lease lost: the entry now belongs to consumer thief")
    r.set("{jobd:q}:paused", "garbage")
    d.wait_log("queue=q paused by ?")
    r.xadd("jobd:q", {"payload": "x", "job_id": "held"})
    r.xadd("jobd:q", {"payload": "x", "job_id": "long-t"})  # a read is due: none happens
    time.sleep(1.0)  # two pause checks pass; the claim is that none of them reads
    assert "start held" not in ran(tmp_path)
    status = json.loads(jobd_cli("status", "-c", str(config), "--json").stdout)
    assert status["queues"]["q"]["paused"] == {"since": 0.0, "by": "?"}
    assert jobd_cli("resume", "-c", str(config), "q").returncode == 0
    wait_until(lambda: "done held" in ran(tmp_path), what="the job, once resumed")


def test_a_cancelled_poison_entry_is_cancelled_not_dead_lettered(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"queues:\n  q:\n    command: [{handler}]\n    max_deliveries: 1\n"
        "    lease: {renew_every: 100ms, reclaim_after: 500ms}\n"
    )
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "x", "job_id": "crashy"})
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"})  # one delivery, no outcome
    assert b"running on dead-daemon" in jobd_cli("cancel", "-c", str(config), "q", "crashy").stdout
    d = daemon(config)
    wait_until(lambda: r.xpending("jobd:q", "jobd")["pending"] == 0, what="the entry settled")
    assert r.xlen("{jobd:q}:dead") == 0, "cancelled, not dead-lettered as poison"
    # The reader acks it in one script call, then says so: Redis may have it before the log.
    d.wait_log("crashy attempt=1 cancelled (jobd cancel) before it started")


def test_reading_a_priority_queue_asks_for_cancellations_in_the_same_round_trip(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """read_levels.lua says whether marks exist; no EXISTS round trip per read (the review
    counted one per read of a priority queue)."""
    config = write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n  pq: {command: [/bin/true], concurrency: 1, priorities: [high, low]}\n"
    )
    daemon(config)
    wait_group(r, "{jobd:pq}:priority:high")

    import threading

    seen: list[str] = []
    stop = threading.Event()
    monitor_client = redis.Redis(port=r.connection_pool.connection_kwargs["port"])

    def watch() -> None:  # MONITOR names a script's own commands with the client "lua"
        with monitor_client.monitor() as m:
            for event in m.listen():
                if event["client_type"] != "lua" and event["command"].startswith("EXISTS"):
                    seen.append(event["command"])
                if stop.is_set():
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.2)  # MONITOR is on before the jobs come (setup, not an assertion)
    for i in range(40):
        r.xadd("jobd:pq" if i % 2 else "{jobd:pq}:priority:high", {"payload": "x"})
    wait_until(lambda: r.xpending("jobd:pq", "jobd")["pending"] == 0
               and r.xinfo_groups("jobd:pq")[0]["lag"] == 0, what="every job read")  # fmt: skip
    stop.set()
    r.ping()
    assert [c for c in seen if "cancels" in c] == [], "no EXISTS round trip per read"


def test_cancel_walks_a_long_pending_list_a_page_per_call(
    r: redis.Redis, write_config, script, tmp_path: Path, monkeypatch
) -> None:
    """A dead daemon's backlog makes a long pending list: cancel.lua looks at one page per
    call (the review measured 0.87 s inside Redis for 200 000 in one call), and still finds a
    job on the last page, and says where the others are on the last call only."""
    from jobd.config import load
    from jobd.store import control
    from jobd.store.store import Store

    monkeypatch.setattr(control, "PENDING_PAGE", 100)
    config = load(str(cancel_setup(write_config, script, tmp_path)))
    q = config.queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(1050):
        pipe.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    pipe.execute()
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"}, count=1050)
    waiting = r.xadd("jobd:q", {"payload": "x"}).decode()
    calls: list[int] = []
    real = Store(r).scripts.cancel

    class Counting:
        def __call__(self, **kwargs: object) -> object:
            calls.append(1)
            return real(**kwargs)

    store = Store(r)
    store.scripts.cancel = Counting()  # type: ignore[assignment]
    found = {
        f.job_id: f for f in store.cancel(q, ["j1049", "j3", waiting, "nowhere"], 60_000, "t@h")
    }
    assert (found["j1049"].where, found["j1049"].consumer) == ("running", "dead-daemon")
    assert found["j3"].where == "running"
    assert (found[waiting].where, found["nowhere"].where) == ("waiting", "marked")
    assert len(calls) == 11, "1050 pending entries, 100 a call, the last call short"


def test_an_idle_reader_asks_the_pause_in_its_read_round_trip(
    redis_server, tmp_path: Path, daemon: Daemon
) -> None:
    """An idle queue's reader blocks (XREAD) for PAUSE_POLL at most, and the pause comes back
    in the same round trip: with its reclaim pass (every RECLAIM_EVERY), three round trips a
    second, where asking the pause apart made five (and reading before each wait, five)."""
    from faultproxy import FaultProxy

    from jobd.daemon.reader import PAUSE_POLL, RECLAIM_EVERY

    with FaultProxy(redis_server.port) as proxy:
        config = tmp_path / "jobd.yaml"
        config.write_text(
            f"redis: {{url: '{proxy.url}'}}\nqueues:\n  q: {{command: [/bin/true]}}\n"
        )
        daemon(config)
        wait_until(lambda: proxy.requests(b"XREAD", 0), what="the reader's first wait")
        since = time.monotonic()
        time.sleep(3.0)  # the measure: how many round trips an idle reader makes in 3 s
        (trips,) = proxy.requests(b"XREAD", since)
    assert trips <= 3.0 * (1 / PAUSE_POLL + 1 / RECLAIM_EVERY) + 2, f"{trips} round trips in 3 s"


def test_a_paused_queue_s_reader_reads_nothing_while_paused(
    r: redis.Redis, redis_server, tmp_path: Path, daemon: Daemon
) -> None:
    """While its queue is paused a reader reads nothing: it only asks, every PAUSE_POLL,
    whether the pause holds. Reading on would not run the jobs (the loop starts nothing of a
    paused queue) but deliver each to a daemon that hands it back: a delivery for nothing,
    toward max_deliveries, over and over. (A probe that removed the reader's check passed
    every test: the jobs still did not run.)"""
    from faultproxy import FaultProxy

    with FaultProxy(redis_server.port) as proxy:
        config = tmp_path / "jobd.yaml"
        config.write_text(
            f"redis: {{url: '{proxy.url}'}}\nqueues:\n  held:\n"
            f"    command: [/bin/sh, -c, 'echo \"$JOBD_QUEUE $JOBD_JOB_ID\" >> {tmp_path}/ran']\n"
        )
        d = daemon(config)
        wait_group(r, "jobd:held")
        control("pause", "-c", str(config), "held")
        d.wait_log("queue=held paused by ")
        since = time.monotonic()
        r.xadd("jobd:held", {"payload": "x", "job_id": "h1"})

        def trips() -> int:  # the reader's round trips since the job was added
            (n,) = proxy.requests(b"XREAD", since)  # one connection waits for entries: the reader's
            return n

        # Three round trips: at least two began after the job was there to read.
        wait_until(lambda: trips() >= 3, what="the reader to ask the pause three times")
        (group,) = r.xinfo_groups("jobd:held")
        assert group["last-delivered-id"] == b"0-0" and group["pending"] == 0, "read nothing"
        control("resume", "-c", str(config), "held")
        wait_until(lambda: "held h1" in ran(tmp_path), what="the job to run once resumed")
