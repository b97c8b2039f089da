"""Job safety under faults and hostile entries: each test rebuilds a defect a review confirmed
(issue 16) on a real Redis and real daemons, and checks that nothing is lost, wedged, or run
twice by accident."""

from __future__ import annotations

import contextlib
import datetime
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, outage, pending_count, skewed, wait_until
from support import words as lines

from jobd.config import QueueConfig, load
from jobd.daemon.lease import Holdings, key, lease_clock
from jobd.daemon.reader import Reader
from jobd.daemon.slots import Slots
from jobd.store.reading import Reclaimed
from jobd.store.scripts import Scripts, source
from jobd.web.metrics import Metrics

Daemon = Callable[..., DaemonProcess]

# A stream s's history, history:at, active and events keys (lua/lib/jobs.lua history_at).
HISTORY = ["{s}:history", "{s}:history:at", "{s}:active", "{s}:events"]


def test_a_limited_queue_reads_again_after_a_redis_blip(
    durable_redis, tmp_path: Path, script, daemon: Daemon
) -> None:
    """A connection error while taking the queue's cluster-wide slots used to leak the local
    slots taken before it: an idle daemon lost them all and never read the queue again."""
    script("job.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/done\n")
    config = tmp_path / "jobd.yaml"
    config.write_text(
        f"redis: {{url: '{durable_redis.url}'}}\n"
        "queues:\n  q: {command: [./job.sh], concurrency: 2, limits: {concurrency: 2}}\n"
    )
    d = daemon(config)
    r = redis.Redis(port=durable_redis.port)
    r.xadd("jobd:q", {"payload": "x", "job_id": "before"})
    wait_until(lambda: lines(tmp_path / "done") == Counter(["before"]), what="the first job")
    outage(durable_redis, 3)
    r = redis.Redis(port=durable_redis.port)
    for i in range(3):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"after-{i}"})
    wait_until(lambda: len(lines(tmp_path / "done")) == 4, 30, "the three jobs after the blip")
    wait_until(lambda: pending_count(r, "jobd:q") == 0, what="every entry acked")
    assert d.proc.poll() is None


def test_job_ids_that_are_not_utf8_run_and_dead_letter_and_wedge_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A producer's job id is any bytes. One that is not UTF-8 used to wedge a dedupe queue's
    whole read batch, and on a plain queue its dead letter failed and took the batch's other
    acks with it: good jobs ran again and again."""
    script(
        "job.sh",
        f"#!/bin/sh\necho $JOBD_STREAM/$JOBD_MESSAGE_ID >> {tmp_path}/ran\n"
        'payload=$(cat)\n[ "$payload" = fail ] && exit 64\nexit 0\n',
    )
    write_config(
        "redis: {url: '{redis}'}\n"
        "defaults: {exit_codes: {fail: [64]}, concurrency: 4}\n"
        "queues:\n"
        "  plain: {command: [./job.sh]}\n"
        "  dedupe: {command: [./job.sh], dedupe: {window: 1h}}\n"
    )
    bad = b"\xff\xfe-\x80id"
    ids = {}
    for stream in ("jobd:plain", "jobd:dedupe"):
        pipe = r.pipeline(transaction=False)
        pipe.xadd(stream, {"payload": "fail", "job_id": bad})
        pipe.xadd(stream, {"payload": "ok", "job_id": bad + b"-ok"})
        for i in range(3):
            pipe.xadd(stream, {"payload": "ok", "job_id": f"good-{i}"})
        ids[stream] = [f"{stream}/{x.decode()}" for x in pipe.execute()]
    d = daemon(tmp_path / "jobd.yaml")
    for stream in ids:
        wait_until(lambda s=stream: pending_count(r, s) == 0 and group_done(r, s), 20, stream)
    ran = lines(tmp_path / "ran")
    assert ran == Counter({mid: 1 for mids in ids.values() for mid in mids}), "each ran once"
    for queue in ("plain", "dedupe"):
        dead = r.xrange(f"{{jobd:{queue}}}:dead")
        assert [rec[b"jobd_job_id"] for _, rec in dead] == [bad]
        assert dead[0][1][b"job_id"] == bad
    assert r.get(b"{jobd:dedupe}:job:" + bad + b"-ok") == b"done"
    # The same job id again on the dedupe queue is acknowledged unrun.
    again = (
        "jobd:dedupe/" + r.xadd("jobd:dedupe", {"payload": "ok", "job_id": bad + b"-ok"}).decode()
    )
    wait_until(lambda: pending_count(r, "jobd:dedupe") == 0 and group_done(r, "jobd:dedupe"))
    assert again not in lines(tmp_path / "ran")
    assert d.proc.poll() is None


def log_clock(d: DaemonProcess) -> float:
    """The Unix time of the daemon's first log line, by its own clock."""
    stamp = d.log().split(",", 1)[0]
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()


def group_done(r: redis.Redis, stream: str) -> bool:
    """Every entry of ``stream`` delivered to the group and none pending."""
    groups = r.xinfo_groups(stream) if r.exists(stream) else []
    newest = r.xrevrange(stream, count=1)
    if not groups or not newest:
        return False
    return groups[0]["last-delivered-id"] == newest[0][0] and groups[0]["pending"] == 0


def test_an_outcome_that_cannot_be_written_is_bounded_and_harms_no_other(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A write that fails though Redis answers (here the dead-letter key holds a string, so
    every dead letter of the queue fails) must not discard the batch's other outcomes, must
    not run its job forever, and must not stop the queue: the job runs at most max_deliveries
    times, the poison path cannot write it either and leaves it pending, unrun, and new jobs
    still run."""
    script(
        "job.sh",
        f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/ran\n"
        'payload=$(cat)\n[ "$payload" = fail ] && exit 64\nexit 0\n',
    )
    write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n  q:\n    command: [./job.sh]\n    concurrency: 8\n"
        "    exit_codes: {fail: [64]}\n    max_deliveries: 2\n"
        "    lease: {renew_every: 100ms, reclaim_after: 500ms}\n"
    )
    r.set("{jobd:q}:dead", "not a stream")
    pipe = r.pipeline(transaction=False)
    pipe.xadd("jobd:q", {"payload": "fail", "job_id": "bad"})
    for i in range(6):
        pipe.xadd("jobd:q", {"payload": "ok", "job_id": f"good-{i}"})
    pipe.execute()
    d = daemon(tmp_path / "jobd.yaml")
    wait_until(lambda: "dead-lettering it as poison" in d.log(), 30, "the poison attempt")
    for i in range(3):
        r.xadd("jobd:q", {"payload": "ok", "job_id": f"later-{i}"})
    wait_until(lambda: len(lines(tmp_path / "ran")) == 10, 20, "the jobs enqueued later")
    wait_until(lambda: d.log().count("dead-lettering it as poison") >= 2, 20, "another pass")
    ran = lines(tmp_path / "ran")
    assert ran.pop("bad") <= 2, "runs at most max_deliveries times"
    assert ran == Counter({f"{p}-{i}": 1 for p, n in (("good", 6), ("later", 3)) for i in range(n)})
    assert pending_count(r, "jobd:q") == 1
    assert "cannot record its outcome (dead-letter) after 5 tries" in d.log()
    assert d.proc.poll() is None


def deliveries(r: redis.Redis, stream: str, group: str = "jobd") -> int:
    """The delivery count of the one pending entry of ``stream``."""
    (entry,) = r.xpending_range(stream, group, "-", "+", 10)
    return int(entry["times_delivered"])


def test_rolling_restarts_never_make_a_running_job_poison(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A hand-back ends a delivery with an outcome: it must not count toward max_deliveries.
    It used to: a long job handed back at each graceful restart was dead-lettered as poison,
    unrun, after max_deliveries restarts."""
    script(
        "long.sh",
        f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/started\n"
        f"while [ ! -e {tmp_path}/finish ]; do sleep 0.05; done\n"
        f"echo $JOBD_JOB_ID >> {tmp_path}/done\n",
    )
    config = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 0s\n"
        "queues:\n  q: {command: [./long.sh], max_deliveries: 2, kill_grace: 1s}\n"
    )
    r.xadd("jobd:q", {"payload": "x", "job_id": "long"})
    d = daemon(config)
    for n in range(1, 5):  # rolling restarts: each hands the job back to the next daemon
        wait_until(lambda n=n: lines(tmp_path / "started")["long"] == n, 20, f"start {n}")
        assert d.stop() == 0
        assert deliveries(r, "jobd:q") == 0, "handed back: this delivery had an outcome"
        d = daemon(config)
    (tmp_path / "finish").touch()
    wait_until(lambda: lines(tmp_path / "done") == Counter(["long"]), 20, "the job done")
    wait_until(lambda: pending_count(r, "jobd:q") == 0)
    assert r.xlen("{jobd:q}:dead") == 0


def test_a_job_claimed_back_by_its_own_daemon_is_not_a_new_delivery(
    r: redis.Redis, write_config
) -> None:
    """After an outage longer than reclaim_after, a daemon's reclaim can take back entries it
    is still running: that claim renews them and must not count a delivery (it did, and such a
    job came closer to poison with every outage)."""
    from jobd.config import load
    from jobd.daemon.lease import Holdings, key, lease_clock
    from jobd.daemon.reader import Reader
    from jobd.daemon.slots import Slots
    from jobd.web.metrics import Metrics

    config = load(
        str(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"))
    )
    q = config.queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    mid = r.xadd("jobd:q", {"payload": "x"})
    holdings = Holdings()
    handed: list = []
    reader = Reader(q, config.redis, "me", Slots(1), holdings, lambda q, jobs: handed.extend(jobs),
                    lambda outcomes: None, Metrics())  # fmt: skip
    r.xreadgroup("jobd", "me", {"jobd:q": ">"})  # delivery 1: the daemon runs it
    holdings.add(key(q), [mid.decode()], lease_clock())
    # Its lease lapsed (no renewal reached Redis): idle for longer than reclaim_after.
    r.xclaim("jobd:q", "jobd", "me", 0, [mid], idle=int(q.lease.reclaim_after * 1000) + 1000,
             justid=True)  # fmt: skip
    assert reader.reclaim(q, 1) == 0 and handed == [], "not handed over: it is running"
    assert deliveries(r, "jobd:q") == 1, "not a new delivery"
    assert r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["time_since_delivered"] < 1000
    reader.store.close()


def test_a_dead_letter_is_kept_whatever_the_daemons_clock(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """dead_letter.max_age is measured on Redis's clock. A daemon an hour ahead used to cut at
    its own "now - max_age": it added the record, trimmed it at once, and acked the job."""
    script("fail.sh", "#!/bin/sh\nexit 64\n")
    config = write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n  q:\n    command: [./fail.sh]\n    exit_codes: {fail: [64]}\n"
        "    dead_letter: {max_age: 10m}\n"
    )
    d = daemon(config, env=skewed("+1h"))
    r.xadd("jobd:q", {"payload": "x", "job_id": "doomed"})
    wait_until(lambda: pending_count(r, "jobd:q") == 0 and group_done(r, "jobd:q"))
    assert log_clock(d) > time.time() + 3000, "the daemon's clock was an hour ahead"
    (record,) = r.xrange("{jobd:q}:dead")
    assert record[1][b"jobd_job_id"] == b"doomed"
    redis_ms = int(r.time()[0]) * 1000
    assert abs(int(record[1][b"jobd_failed_at"]) - redis_ms) < 60_000, "Redis's time"
    assert d.proc.poll() is None


def test_wide_entries_are_dead_lettered_unrun_and_the_queue_moves(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """An entry wider than a script can copy (Lua's unpack limit) used to break the dead
    letter and the retry of its job. It is dead-lettered unrun as malformed, its payload and
    job_id kept, and the jobs behind it run."""
    script("job.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/ran\nexit 64\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [./job.sh], exit_codes: {fail: [64]}}\n"
    )
    wide = {"payload": "p", "job_id": "wide", **{f"f{i}": "v" for i in range(5000)}}
    r.xadd("jobd:q", wide)
    r.xadd("jobd:q", {"payload": "p", "job_id": "narrow"})
    d = daemon(config)
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 2, 20, "both dead-lettered")
    records = {rec[b"jobd_job_id"]: rec for _, rec in r.xrange("{jobd:q}:dead")}
    assert records[b"wide"][b"jobd_error"] == b"malformed"
    assert b"an entry of 5002 fields, more than 1000: not read" in records[b"wide"][b"jobd_stderr"]
    assert records[b"wide"][b"payload"] == b"p" and b"f1" not in records[b"wide"]
    assert records[b"narrow"][b"jobd_error"] == b"exit"
    assert lines(tmp_path / "ran") == Counter(["narrow"]), "the wide one never ran"
    assert pending_count(r, "jobd:q") == 0 and d.proc.poll() is None


def test_dead_letter_script_copies_no_more_than_it_can(r: redis.Redis) -> None:
    """The poison path dead-letters an entry it never read through the daemon: the script
    itself must cope with any width."""
    r.xgroup_create("s", "g", id="0", mkstream=True)
    mid = r.xadd("s", {"payload": "p", **{f"f{i}": "v" for i in range(6000)}})
    r.xreadgroup("g", "me", {"s": ">"})
    scripts = Scripts(r)
    note = ["poison", mid, "", b'{"event":"poison"}', 0]  # lua/lib/jobs.lua note_at
    args = ["g", "me", mid, 100, "", 60, "604800000 100 100 s", "", 0, *note, "jobd_error",
            "poison"]  # 0: no on_dead_letter hook  # fmt: skip
    keys = ["s", "{s}:dead", "{s}:stats:1", *HISTORY, "{s}:cancels", "{s}:waiters", "{s}:outbox",
            "{s}:taken"]  # fmt: skip
    record_id = scripts.dead_letter(keys=keys, args=args)
    (record,) = r.xrange("{s}:dead")
    assert record[0] == record_id and record[1][b"jobd_fields"] == b"6001"
    assert set(record[1]) == {b"payload", b"jobd_fields", b"jobd_error", b"jobd_failed_at"}


def test_a_failed_copy_keeps_the_done_mark_of_the_copy_that_succeeded(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Two copies of one job id run at once on a dedupe queue; one succeeds (mark 'done'),
    the other fails for good afterwards. Its dead letter used to delete the 'done' mark: the
    job id could then run a third time within the window."""
    script(
        "job.sh",
        f"#!/bin/sh\npayload=$(cat)\necho $payload >> {tmp_path}/ran\n"
        '[ "$payload" = fail ] && { sleep 0.5; exit 64; }\nexit 0\n',
    )
    config = write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n  q: {command: [./job.sh], concurrency: 2, exit_codes: {fail: [64]}, "
        "dedupe: {window: 1h}}\n"
    )
    r.xadd("jobd:q", {"payload": "fail", "job_id": "J"})
    r.xadd("jobd:q", {"payload": "ok", "job_id": "J"})
    d = daemon(config)
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1 and pending_count(r, "jobd:q") == 0)
    assert r.get("{jobd:q}:job:J") == b"done"
    r.xadd("jobd:q", {"payload": "third", "job_id": "J"})
    wait_until(lambda: group_done(r, "jobd:q"))
    assert lines(tmp_path / "ran") == Counter(["fail", "ok"]), "the third copy did not run"
    assert d.proc.poll() is None


def test_a_lost_lease_is_handled_while_readers_deliver(
    r: redis.Redis, write_config, request: pytest.FixtureRequest
) -> None:
    """Readers add to the loop's deliveries while it handles lost leases. It used to search
    that deque (now a queue only the loop takes from) while they did ("deque mutated during iteration"), and the loop's catch-all
    swallowed the error after the lost report was popped: the job could still be started."""
    import threading

    from jobd.config import load
    from jobd.daemon.lease import Lost, key
    from jobd.daemon.loop import Daemon
    from jobd.job import Job

    config = load(
        str(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"))
    )
    q = config.queues["q"]
    d = Daemon(config)
    # Never opened, so never closed: what it opened when made (its handlers' channel, a socket
    # that warns when collected; its epoll) is closed at the test's end.
    request.addfinalizer(d.running.channel.close)
    request.addfinalizer(d.poller.epoll.close)
    doomed = Job.from_entry("q", b"1-1", {b"payload": b"x"})
    d.inbox.deliver(q, [doomed])
    others = [Job.from_entry("q", f"2-{i}".encode(), {b"payload": b"x"}) for i in range(20000)]
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            d.inbox.deliver(q, others[:200])

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(200):
            d.inbox.report_lost([Lost(key(q), "1-1", "someone")])
            d.on_lost()
    finally:
        done.set()
        thread.join()
    kept = [x for x in d.inbox.deliveries() if x[1] is doomed]
    for x in kept:
        d.inbox.delivered.put(x)
    d.start_delivered()
    assert not d.running and d.freed["q"] == 1, "the job whose lease was lost is not started"
    # A later delivery of the same entry (claimed back after its new owner died) runs.
    d.inbox.report_lost([Lost(key(q), "1-1", "someone")])
    d.on_lost()
    assert d.inbox.lost_before(q, doomed, time.monotonic()) is None


def test_a_group_recreated_under_a_running_daemon_is_said_loudly_and_counted(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A consumer group deleted under a running daemon comes back at the stream's start, and
    every retained entry runs again (jobd cannot tell which ran: the group held that). That
    used to happen with one warning; it is an error in the log and a metric."""
    import urllib.request

    from support import free_port

    port = free_port()
    script("job.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/ran\n")
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "queues:\n  q: {command: [./job.sh]}\n"
    )
    d = daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "once"})
    wait_until(lambda: lines(tmp_path / "ran") == Counter(["once"]))
    wait_until(lambda: group_done(r, "jobd:q"))
    r.xgroup_destroy("jobd:q", "jobd")
    wait_until(lambda: lines(tmp_path / "ran") == Counter({"once": 2}), 20, "the job again")
    assert "vanished and was created again from the stream's start: its 1 retained" in d.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert 'jobd_groups_recreated_total{queue="q"} 1.0' in text


def test_a_reload_that_moves_a_queue_says_what_its_old_stream_still_holds(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Moving a queue to another stream leaves the old stream's undelivered entries and its
    delayed set behind (jobd does not move them: on a cluster they may sit in another slot).
    That used to happen silently; the reload says what is left and where."""

    script("job.sh", "#!/bin/sh\nexit 0\n")
    config = write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [./job.sh]}\n")
    d = daemon(config)
    r.zadd("{jobd:q}:delayed", {b"member-1": 4102444800000, b"member-2": 4102444800000})
    config.write_text(config.read_text().replace("[./job.sh]}", "[./job.sh], stream: moved}"))
    d.signal(signal.SIGHUP)
    d.wait_log(  # said from a thread of its own: the loop never waits on Redis
        "queue q moved from stream 'jobd:q' to 'moved'; 0 entries on the old stream and 2 jobs "
        "in its delayed set '{jobd:q}:delayed' are no longer served"
    )


def test_a_retry_is_due_on_redis_clock_whatever_the_daemons(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A retry's due time is Redis's time plus the backoff. It used to be the daemon's: a host
    an hour ahead put every retry an hour late."""
    script(
        "once.sh",
        f"#!/bin/sh\necho $JOBD_ATTEMPT >> {tmp_path}/attempts\n[ $JOBD_ATTEMPT -ge 2 ]\n",
    )
    config = write_config(
        "redis: {url: '{redis}'}\n"
        "queues:\n  q: {command: [./once.sh], retry: {backoff: 500ms, jitter: 0}}\n"
    )
    d = daemon(config, env=skewed("+1h"))
    r.xadd("jobd:q", {"payload": "x"})
    wait_until(lambda: lines(tmp_path / "attempts") == Counter(["1", "2"]), 15, "the retry")
    assert log_clock(d) > time.time() + 3000, "the daemon's clock was an hour ahead"


def test_a_mark_of_another_type_neither_wedges_nor_poisons_its_batch(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """On a dedupe queue, one job id's mark key held a list (someone else's key): the dedupe
    check failed for the whole read batch, which was never run and climbed to poison."""
    script("job.sh", f"#!/bin/sh\necho $JOBD_JOB_ID >> {tmp_path}/ran\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n    command: [./job.sh]\n    concurrency: 8\n"
        "    dedupe: {window: 1h}\n    lease: {renew_every: 100ms, reclaim_after: 500ms}\n"
    )
    r.rpush("{jobd:q}:job:hostile", "not a mark")
    for name in ("a", "b", "hostile", "c", "d"):
        r.xadd("jobd:q", {"payload": "x", "job_id": name})
    d = daemon(config)
    wait_until(lambda: group_done(r, "jobd:q"), 20, "the batch settled")
    assert lines(tmp_path / "ran") == Counter(["a", "b", "hostile", "c", "d"])
    assert r.xlen("{jobd:q}:dead") == 0 and d.proc.poll() is None


def test_an_entry_repeating_a_field_name_is_dead_lettered(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """XADD accepts the same field name many times; a client's dict keeps one, so the entry
    looked narrow and ran, but its dead letter copied every repeat and failed (Lua's unpack
    limit), and it was reclaimed forever. Its width is counted as it is in the stream (5000
    fields: lua/lib/jobs.lua sized): it is not even read, and dead-lettered unrun."""
    script("fail.sh", f"#!/bin/sh\necho $JOBD_MESSAGE_ID >> {tmp_path}/ran\nexit 64\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [./fail.sh], exit_codes: {fail: [64]}}\n"
    )
    r.execute_command("XADD", "jobd:q", "*", *(["payload", "x"] * 5000))
    d = daemon(config)
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, 20, "the dead letter")
    ((_, record),) = r.xrange("{jobd:q}:dead")
    assert record[b"payload"] == b"x" and record[b"jobd_fields"] == b"5000"
    assert record[b"jobd_error"] == b"malformed"
    assert b"an entry of 5000 fields, more than 1000: not read" in record[b"jobd_stderr"]
    assert not (tmp_path / "ran").exists(), "it never ran"
    assert pending_count(r, "jobd:q") == 0 and d.proc.poll() is None


def test_a_hand_back_sent_again_lowers_the_count_once(r: redis.Redis) -> None:
    """A hand-back whose reply was lost is sent again; it used to lower the entry's delivery
    count a second time, hiding a crash loop from max_deliveries one delivery longer."""
    r.xgroup_create("s", "g", id="0", mkstream=True)
    mid = r.xadd("s", {"payload": "x"})
    for consumer in ("a", "b", "me"):  # three deliveries
        r.xclaim("s", "g", consumer, 0, [mid]) if consumer != "a" else r.xreadgroup(
            "g", consumer, {"s": ">"}
        )
    assert deliveries(r, "s", "g") == 3
    scripts = Scripts(r)
    for _ in range(2):  # the first call, and the same call sent again
        note = ["handed back", mid, "", b'{"event":"handed back"}', 0]
        args = ["g", "me", 60, 0, "604800000 100 100 s", 0, "back", mid, 0, -1, *note, 0]
        keys = ["s", "{s}:stats:1", "{s}:cancels", *HISTORY, "{s}:waiters", "{s}:outbox",
                "{s}:taken"]  # fmt: skip
        scripts.settle(keys=keys, args=args)
    assert deliveries(r, "s", "g") == 2


def test_a_consumer_name_that_is_not_utf8_is_a_lost_lease_like_any_other(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """An operator claimed a running job to a consumer whose name is not UTF-8. Renewal
    failed on the name every tick, so the daemon never stopped its handler: two ran."""
    script("long.sh", f"#!/bin/sh\necho started >> {tmp_path}/ran\nsleep 30\n")
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q:\n    command: [./long.sh]\n    kill_grace: 1s\n"
        "    lease: {renew_every: 100ms, reclaim_after: 500ms}\n"
    )
    mid = r.xadd("jobd:q", {"payload": "x"})
    d = daemon(config)
    wait_until(lambda: lines(tmp_path / "ran")["started"] == 1)
    r.xclaim("jobd:q", "jobd", b"\xff\xfe-operator", 0, [mid], justid=True)
    d.wait_log("lease lost: the entry now belongs to consumer \\xff\\xfe-operator")
    status = jobd_cli("status", "-c", str(config))
    assert status.returncode == 0 and b"consumer \\xff\\xfe-operator" in status.stdout, status


def test_an_outage_between_two_pages_of_a_reclaim_loses_no_claim(
    r: redis.Redis, write_config
) -> None:
    """A reclaim pass follows XAUTOCLAIM's cursor page by page. When Redis went away between
    two pages, the entries claimed on the first were never handed over: their claim counted a
    delivery, and reset their idle time, for a run that never came."""
    config = load(
        str(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"))
    )
    q = config.queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    ids = [r.xadd("jobd:q", {"payload": "x"}) for _ in range(2)]
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"}, count=1)  # ids[0]: another's, lapsed
    r.xreadgroup("jobd", "me", {"jobd:q": ">"}, count=1)  # ids[1]: ours, still running
    idle = int(q.lease.reclaim_after * 1000) + 1000
    for consumer, mid in (("dead-daemon", ids[0]), ("me", ids[1])):
        r.xclaim("jobd:q", "jobd", consumer, 0, [mid], idle=idle, justid=True)
    holdings = Holdings()
    holdings.add(key(q), [ids[1].decode()], lease_clock())
    handed: list = []
    reader = Reader(q, config.redis, "me", Slots(2), holdings, lambda q, jobs: handed.extend(jobs),
                    lambda outcomes: None, Metrics())  # fmt: skip
    real, calls = reader.store.reclaim, []

    def first_page_then_away(q: QueueConfig, cursor: str, count: int, backs=()) -> Reclaimed:
        calls.append(cursor)
        if len(calls) > 1:
            raise redis.ConnectionError("Redis went away between two pages")
        return replace(real(q, cursor, 1, backs), cursor="1-0")  # one entry a page

    reader.store.reclaim = first_page_then_away  # type: ignore[method-assign]
    with contextlib.suppress(redis.ConnectionError):
        reader.reclaim(q, 2)
    reader.store.reclaim = real  # type: ignore[method-assign]
    reader.reclaim(q, 2)
    assert sorted(job.message_id for job in handed) == [ids[0].decode()]
    assert deliveries_of(r, "jobd:q", ids[1]) == 1, "ours: not a new delivery"
    assert deliveries_of(r, "jobd:q", ids[0]) == 2, "theirs: delivered once more, and run"
    reader.store.close()


def deliveries_of(r: redis.Redis, stream: str, mid: bytes) -> int:
    (entry,) = r.xpending_range(stream, "jobd", mid, mid, 1)
    return int(entry["times_delivered"])


def test_a_hand_back_whose_reply_was_lost_is_not_sent_again(
    r: redis.Redis, redis_server, write_config
) -> None:
    """A hand-back applied, its reply was lost, and before the recorder could write again this
    daemon's reader claimed the entry back and started it. The recorder used to send the same
    hand-back again, which gave the new run away (another daemon would run it at once too)."""
    from faultproxy import FaultProxy

    from jobd.daemon.recorder import Recorder
    from jobd.job import Job
    from jobd.outcome import Outcome, Verb

    with FaultProxy(redis_server.port) as proxy:
        config = load(str(write_config(
            f"redis: {{url: '{proxy.url}'}}\nqueues:\n  q: {{command: [/bin/true]}}\n"
        )))  # fmt: skip
        q = config.queues["q"]
        r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
        first, second = (r.xadd("jobd:q", {"payload": "x"}).decode() for _ in range(2))
        r.xreadgroup("jobd", "me", {"jobd:q": ">"})
        holdings = Holdings()
        holdings.add(key(q), [first, second], lease_clock())
        recorder = Recorder(config.redis, "me", holdings)
        recorder.start()
        try:
            for name in ("settle", "release", "observe"):  # loaded: no NOSCRIPT round to cut
                r.script_load(source(name))
            recorder.store.client.ping()
            recorder.store.clock.now("jobd:q")  # Redis's time read: the cut is the hand-back's
            proxy.refuse()  # no new connection: the recorder cannot write again yet
            proxy.cut(after_reply_bytes=1)  # the hand-back applies; its reply is lost
            job = Job("q", first, {b"payload": b"x"}, "first", 1)
            recorder.record([Outcome(Verb.HAND_BACK, q, job)])
            wait_until(lambda: idle_of(r, first) > 10**12, what="the hand-back applied")
            r.xautoclaim("jobd:q", "jobd", "me", 0, "0-0", justid=True)  # taken back: a new run
            claimed, accepted = idle_of(r, first), proxy.accepted
            proxy.restore()
            job = Job("q", second, {b"payload": b"x"}, "second", 1)
            recorder.record([Outcome(Verb.ACK, q, job)])
            wait_until(lambda: not r.xpending_range("jobd:q", "jobd", second, second, 1), 15)
            # Seen failing twice in full runs, never alone nor under load (session 12): what
            # the proxy saw, for the next time.
            seen = (
                f"{claimed} ms idle after the claim, {accepted} connections then, {proxy.cuts} cut"
            )
            assert idle_of(r, first) < 60_000, f"the new run was handed back ({seen})"
        finally:
            recorder.stop()
            recorder.join(10)


def idle_of(r: redis.Redis, mid: str) -> int:
    (entry,) = r.xpending_range("jobd:q", "jobd", mid, mid, 1)
    return int(entry["time_since_delivered"])


def poison_metric(port: int) -> float | None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith('jobd_jobs_dead_lettered_total{error="poison",queue="q"}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_poison_entry_takes_no_slot_and_counts_only_once_written(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """A poison entry whose dead letter cannot be written yet is not held: it never takes one
    of its queue's cluster-wide slots (a held entry's renewal would add it to {S}:running),
    and it is counted as dead-lettered only once its record is written (from the review of
    issue 18: the reader held it and counted it when it decided)."""
    from support import free_port

    port = free_port()
    write_config(
        "redis: {url: '{redis}'}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "queues:\n  q:\n    command: [/bin/true]\n    max_deliveries: 1\n"
        "    limits: {concurrency: 1}\n"
        "    lease: {renew_every: 100ms, reclaim_after: 500ms}\n"
    )
    r.set("{jobd:q}:dead", "not a stream")  # every dead letter of the queue fails for now
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    mid = r.xadd("jobd:q", {"payload": "x", "job_id": "poison"}).decode()
    r.xreadgroup("jobd", "gone", {"jobd:q": ">"})  # delivered once, by a consumer now dead
    d = daemon(tmp_path / "jobd.yaml")
    member = f"|jobd:q|{mid}"

    def slot_taken() -> bool:
        return any(m.decode().endswith(member) for m in r.zrange("{jobd:q}:running", 0, -1))

    def failed_for_good() -> bool:
        assert not slot_taken(), "the poison entry took a cluster-wide slot"
        return "cannot record its outcome (dead-letter) after 5 tries" in d.log()

    wait_until(failed_for_good, 30, "the dead letter to fail 5 times")
    assert "dead-lettering it as poison" in d.log()
    assert not poison_metric(port), "counted though no record was written"
    r.delete("{jobd:q}:dead")  # the next claim's dead letter can be written
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, 30, "the dead letter")
    wait_until(lambda: poison_metric(port) == 1, 10, "the poison counted once written")
    assert "dead-lettered as poison" in d.log()


def test_a_job_id_of_one_queue_never_deletes_another_queues_dead_letters(
    r: redis.Redis, daemon: Daemon, write_config
) -> None:
    """Queue b on stream ``{a}:job`` had its dead letters on ``{a}:job:dead``: queue a's job
    with id 'dead' finished under dedupe, and its 'done' mark (a plain SET) replaced b's whole
    dead-letter stream with a string. Such a config is refused at start and at a reload, so
    a's marks and b's keys never meet."""
    a = "redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true], stream: a"
    config = write_config(a + ", dedupe: {window: 1h}}\n")
    d = daemon(config)
    write_config(a + ", dedupe: {window: 1h}}\n  b: {command: [/bin/false], stream: '{a}:job'}\n")
    started = subprocess.run(
        [sys.executable, "-m", "jobd", "run", str(config)], capture_output=True, timeout=30
    )
    assert started.returncode == 78, started.stderr.decode()
    d.signal(signal.SIGHUP)
    d.wait_log("reload refused: 1 problem(s)")
    r.xadd("a", {"payload": "p", "job_id": "dead"})
    d.wait_log("job=dead attempt=1 exit 0")  # logged before its outcome is written: wait for it
    wait_until(lambda: r.type("{a}:job:dead") == b"string", what="a's 'done' mark, b's never")
