"""Leases and crash recovery, by breaking things on purpose: real daemons, real signals."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from support import (
    DaemonProcess,
    acked_all,
    kill_with_handlers,
    pending_count,
    queue_config,
    wait_group,
    wait_until,
)

from jobd.config import load
from jobd.daemon.duties import Ticker
from jobd.daemon.lease import Holdings, Renewal
from jobd.store import notes
from jobd.store.scripts import Batch, Scripts
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]


def starts(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().splitlines())


# -- the renewal script, against a real Redis --------------------------------------------------


@pytest.fixture
def queue(tmp_path: Path, redis_server):
    path = tmp_path / "c.yaml"
    path.write_text(
        f"redis: {{url: '{redis_server.url}'}}\nqueues:\n  q: {{command: [/bin/true]}}\n"
    )
    return load(str(path)).queues["q"]


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_renewal_is_one_round_trip_and_keeps_the_delivery_count(r: redis.Redis, queue) -> None:
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for i in range(1000):
        r.xadd("jobd:q", {"payload": str(i)})
    ids = [mid.decode() for mid, _ in r.xreadgroup("jobd", "me", {"jobd:q": ">"}, count=1000)[0][1]]
    store = Store(r, "me")
    assert store.renew(queue, ids[:1]) == []  # loads the script
    time.sleep(0.05)  # let the entries age, so a renewal is visible as a reset idle time
    before = evalsha_calls(r)
    assert store.renew(queue, ids) == []
    assert evalsha_calls(r) - before == 1, "one script call for 1000 entries"
    entries = r.xpending_range("jobd:q", "jobd", "-", "+", 1000)
    assert {e["times_delivered"] for e in entries} == {1}
    assert max(e["time_since_delivered"] for e in entries) < 50


def command_calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_batch_asks_nothing_before_its_calls_and_reloads_flushed_scripts(
    r: redis.Redis, queue
) -> None:
    """Outcomes are written in one pipeline of EVALSHA: no SCRIPT EXISTS round trip before it
    (redis-py's pipelined Script asks one on every batch), and a server that lost its scripts
    (restart, failover) gets them loaded and the refused calls sent again."""
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for i in range(6):
        r.xadd("jobd:q", {"payload": str(i)})
    ids = [mid.decode() for mid, _ in r.xreadgroup("jobd", "me", {"jobd:q": ">"}, count=6)[0][1]]
    scripts = Scripts(r)

    def settle(some: list[str]) -> list[object]:
        batch = Batch()
        for mid in some:
            keys = ["jobd:q", queue.keys.stats(), queue.keys.cancels, *notes.keys(queue)]
            note = ["done", mid, "", b'{"event":"done"}', 0]  # lua/lib/jobs.lua note_at
            args = ["jobd", "me", 60, 0, notes.settings(queue), "ack", mid, 0, -1, *note]
            batch.add(scripts.settle, keys, args)
        return batch.run(r)

    r.script_flush()
    exists, loads = command_calls(r, "script|exists"), command_calls(r, "script|load")
    assert settle(ids[:3]) == [[], [], []]
    assert command_calls(r, "script|load") == loads + 1, "loaded once for three calls"
    before = command_calls(r, "evalsha")
    assert settle(ids[3:]) == [[], [], []]
    assert command_calls(r, "evalsha") == before + 3
    assert command_calls(r, "script|exists") == exists, "no SCRIPT EXISTS before a batch"
    assert pending_count(r, "jobd:q") == 0


def test_renewal_reports_acked_stolen_and_trimmed_entries(r: redis.Redis, queue) -> None:
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for i in range(4):
        r.xadd("jobd:q", {"payload": str(i)})
    ids = [mid.decode() for mid, _ in r.xreadgroup("jobd", "me", {"jobd:q": ">"}, count=4)[0][1]]
    kept, acked, stolen, trimmed = ids
    r.xack("jobd:q", "jobd", acked)
    r.xclaim("jobd:q", "jobd", "other", 0, [stolen], justid=True)
    r.xdel("jobd:q", trimmed)
    lost = Store(r, "me").renew(queue, ids)
    assert {(x.message_id, x.owner) for x in lost} == {
        (acked, ""),
        (stolen, "other"),
        (trimmed, ""),
    }
    [entry] = [
        e for e in r.xpending_range("jobd:q", "jobd", "-", "+", 10) if e["consumer"] == b"me"
    ]
    assert entry["message_id"].decode() == kept
    assert r.xpending_range("jobd:q", "jobd", "-", "+", 10, "other")[0]["times_delivered"] == 1


def test_a_renewal_that_cannot_reach_redis_is_not_a_loss(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("redis: {url: 'redis://127.0.0.1:1/0'}\nqueues:\n  q: {command: [/bin/true]}\n")
    config = load(str(path))
    holdings = Holdings()
    holdings.add(("jobd:q", "jobd"), ["1-0", "2-0"])
    reported: list = []
    store = Store.open(config.redis, "test", "me")
    ticker = Ticker([Renewal(store, config.queues["q"], holdings, reported.extend)])
    ticker.run_due(time.monotonic())
    assert reported == [] and sorted(holdings.snapshot(("jobd:q", "jobd"))) == ["1-0", "2-0"]


# -- real daemons --------------------------------------------------------------------------------


LONG_JOB = """
    #!/bin/sh
    echo "$JOBD_MESSAGE_ID $$" >> {dir}/starts
    i=0
    while [ $i -lt {steps} ]; do sleep 0.1; i=$((i+1)); [ $i -eq {half} ] && touch {dir}/half.$JOBD_MESSAGE_ID; done
    echo "$JOBD_MESSAGE_ID $$" >> {dir}/done
"""


def long_job(script, tmp_path: Path, seconds: float) -> None:
    steps = int(seconds * 10)
    script("long.sh", LONG_JOB.format(dir=tmp_path, steps=steps, half=int(steps * 0.7)))


def test_long_jobs_run_once_under_short_leases(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    long_job(script, tmp_path, 6)
    config = write_config(
        queue_config("[./long.sh]", concurrency=2, lease="{renew_every: 500ms, reclaim_after: 2s}")
    )
    daemon(config), daemon(config)
    ids = [r.xadd("jobd:q", {"payload": str(i)}).decode() for i in range(4)]
    # Past 70% of each job, more than twice reclaim_after has gone by since it was delivered.
    wait_until(lambda: len(list(tmp_path.glob("half.*"))) == 4, what="all four jobs at 70%")
    pending = r.xpending_range("jobd:q", "jobd", "-", "+", 10)
    assert [e["times_delivered"] for e in pending] == [1, 1, 1, 1]
    wait_until(lambda: acked_all(r, "jobd:q", 4), what="all acked")
    assert starts(tmp_path / "starts") == Counter(dict.fromkeys(ids, 1))
    assert starts(tmp_path / "done") == Counter(dict.fromkeys(ids, 1))


def test_a_killed_daemons_job_is_taken_over_within_reclaim_after(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f"""
        #!/bin/sh
        echo "$JOBD_MESSAGE_ID $(date +%s.%N)" >> {tmp_path}/starts
        [ -e {tmp_path}/second ] || sleep 300
        """,
    )
    config = write_config(queue_config("[./h.sh]", lease="{renew_every: 500ms, reclaim_after: 2s}"))
    first = daemon(config)
    mid = r.xadd("jobd:q", {"payload": "x"}).decode()
    wait_until(lambda: starts(tmp_path / "starts")[mid] == 1)
    (tmp_path / "second").touch()
    daemon(config)
    killed_at = time.time()
    kill_with_handlers(first)
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job done by the second daemon")
    restarted = float((tmp_path / "starts").read_text().splitlines()[1].split()[1])
    assert restarted - killed_at <= 2 + 1.5, (
        f"taken over {restarted - killed_at:.2f}s after the kill"
    )
    assert pending_count(r, "jobd:q") == 0


def test_a_stalled_daemon_loses_its_lease_and_stops_its_stale_handler(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    long_job(script, tmp_path, 6)
    config = write_config(
        queue_config("[./long.sh]", lease="{renew_every: 300ms, reclaim_after: 1s}")
    )
    stalled = daemon(config)
    mid = r.xadd("jobd:q", {"payload": "x"}).decode()
    wait_until(lambda: starts(tmp_path / "starts")[mid] == 1)
    stalled.signal(signal.SIGSTOP)
    try:
        healthy = daemon(config)
        wait_until(lambda: starts(tmp_path / "starts")[mid] == 2, what="the takeover")
    finally:
        stalled.signal(signal.SIGCONT)
    stalled.wait_log("lease lost: the entry now belongs to consumer")
    wait_until(lambda: acked_all(r, "jobd:q", 1))
    first_pid, second_pid = (
        int(line.split()[1]) for line in (tmp_path / "starts").read_text().splitlines()
    )
    assert [int(line.split()[1]) for line in (tmp_path / "done").read_text().splitlines()] == [
        second_pid
    ]
    assert not psutil.pid_exists(first_pid), "the stale handler was stopped before it finished"
    assert "outcome not recorded" not in healthy.log()


def test_crash_loop_loses_nothing(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\nsleep 0.01\necho $JOBD_MESSAGE_ID >> {tmp_path}/done\n")
    config = write_config(
        queue_config("[./h.sh]", concurrency=8, lease="{renew_every: 300ms, reclaim_after: 1s}")
    )
    pipe = r.pipeline(transaction=False)
    for i in range(2000):
        pipe.xadd("jobd:q", {"payload": str(i)})
    ids = {mid.decode() for mid in pipe.execute()}

    def done() -> Counter[str]:
        return starts(tmp_path / "done")

    for crash in range(5):
        d = daemon(config)
        before = len(done())
        wait_until(
            lambda b=before: len(done()) >= b + 150, what=f"progress before crash {crash + 1}"
        )
        kill_with_handlers(d)
    daemon(config)
    wait_until(lambda: acked_all(r, "jobd:q", 2000), 120, "every job acked")
    counts = done()
    print(
        f"crash test: done {len(counts)}, lost {len(ids - set(counts))}, "
        f"duplicates {sum(counts.values()) - len(counts)}, pending {pending_count(r, 'jobd:q')}"
    )
    assert set(counts) == ids
    assert pending_count(r, "jobd:q") == 0


def test_graceful_stop_hands_jobs_to_another_daemon_at_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f'#!/bin/sh\necho "$JOBD_MESSAGE_ID $$" >> {tmp_path}/starts\nexec sleep 300\n')
    config = write_config(
        queue_config(
            "[./h.sh]",
            concurrency=2,
            kill_grace="1s",
            lease="{renew_every: 10s, reclaim_after: 30s}",
        )
        + "shutdown_grace: 300ms\n"
    )
    stopping = daemon(config)
    ids = [r.xadd("jobd:q", {"payload": str(i)}).decode() for i in range(2)]
    wait_until(lambda: set(starts(tmp_path / "starts")) == set(ids))
    daemon(config)
    stopping.signal(signal.SIGTERM)
    assert stopping.proc.wait(30) == 0
    stopped_at = time.monotonic()
    wait_until(
        lambda: sum(starts(tmp_path / "starts").values()) == 4,
        2.0,
        "the second daemon to start both handed-back jobs within 2 s",
    )
    assert time.monotonic() - stopped_at <= 2.0


def test_poison_entry_is_dead_lettered_without_running(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    config = write_config(
        queue_config(
            "[./h.sh]", max_deliveries=3, lease="{renew_every: 100ms, reclaim_after: 300ms}"
        )
    )
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    mid = r.xadd("jobd:q", {"payload": "boom", "job_id": "p-1", "jobd_attempt": "2"})
    r.xreadgroup("jobd", "crashed-1", {"jobd:q": ">"})
    for n in range(2, 4):  # three deliveries so far: each daemon that took it died mid-job
        r.xclaim("jobd:q", "jobd", f"crashed-{n}", 0, [mid])
    daemon(config)
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1, what="the dead letter")
    [(_, record)] = r.xrange("{jobd:q}:dead")
    assert record[b"payload"] == b"boom" and record[b"job_id"] == b"p-1"
    assert record[b"jobd_error"] == b"poison" and record[b"jobd_attempts"] == b"4"
    assert record[b"jobd_original_id"] == mid and record[b"jobd_job_id"] == b"p-1"
    assert record[b"jobd_queue"] == b"q" and b"jobd_attempt" not in record
    assert pending_count(r, "jobd:q") == 0
    assert not (tmp_path / "ran").exists()


def test_trimmed_entry_stops_its_handler_and_nothing_wedges(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f'#!/bin/sh\necho "$(cat) $$" >> {tmp_path}/starts\n[ "$(cat {tmp_path}/starts | wc -l)" -gt 1 ] || exec sleep 300\n',
    )
    d = daemon(
        write_config(queue_config("[./h.sh]", lease="{renew_every: 200ms, reclaim_after: 1s}"))
    )
    mid = r.xadd("jobd:q", {"payload": "first"})
    wait_until(lambda: (tmp_path / "starts").exists())
    pid = int((tmp_path / "starts").read_text().split()[1])
    r.xdel("jobd:q", mid)
    d.wait_log("lease lost: the entry now belongs to nobody")
    wait_until(lambda: not psutil.pid_exists(pid), what="the handler of the trimmed entry to stop")
    r.xadd("jobd:q", {"payload": "second"})
    wait_until(lambda: "second" in (tmp_path / "starts").read_text())
    wait_until(lambda: pending_count(r, "jobd:q") == 0)


def test_consumers_holding_entries_are_never_removed(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    script(
        "h.sh",
        f"#!/bin/sh\necho $(cat) >> {tmp_path}/ran\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n",
    )
    # reclaim_after 300ms: consumers idle 3 s and empty are removed. The daemon's only slot is
    # busy with "long" before the ghost takes its entry (the daemon reads nothing ahead), so
    # nothing reclaims that entry until the gate opens.
    lease = "{renew_every: 100ms, reclaim_after: 300ms}"
    d = daemon(write_config(queue_config("[./h.sh]", lease=lease, prefetch=0)))
    r.xadd("jobd:q", {"payload": "long"})
    wait_until(lambda: (tmp_path / "ran").exists(), what="the long job running")
    r.xadd("jobd:q", {"payload": "held-by-ghost"})
    assert r.xreadgroup("jobd", "ghost-holding", {"jobd:q": ">"}), "the ghost got the entry"
    r.xgroup_createconsumer("jobd:q", "jobd", "ghost-empty")

    def consumers() -> dict[str, int]:
        return {c["name"].decode(): c["pending"] for c in r.xinfo_consumers("jobd:q", "jobd")}

    wait_until(lambda: "ghost-empty" not in consumers(), what="the empty ghost removed")
    assert consumers()["ghost-holding"] == 1
    gate.touch()
    wait_until(lambda: acked_all(r, "jobd:q", 2) and pending_count(r, "jobd:q") == 0)
    assert sorted((tmp_path / "ran").read_text().split()) == ["held-by-ghost", "long"]
    # The janitor logs after its script removed the consumer: wait for the line, not Redis.
    d.wait_log("removed consumer ghost-holding")
    assert "ghost-holding" not in consumers()


def test_group_of_a_queue_is_renewed_per_queue(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Two queues, each with its own lease settings: both keep their long jobs."""
    long_job(script, tmp_path, 3)
    config = write_config(
        """
        redis: {url: '{redis}'}
        queues:
          a: {command: [./long.sh], lease: {renew_every: 200ms, reclaim_after: 1s}}
          b: {command: [./long.sh], lease: {renew_every: 300ms, reclaim_after: 1s}}
        """
    )
    daemon(config), daemon(config)
    wait_group(r, "jobd:a"), wait_group(r, "jobd:b")
    r.xadd("jobd:a", {"payload": "a"})
    r.xadd("jobd:b", {"payload": "b"})
    wait_until(lambda: acked_all(r, "jobd:a", 1) and acked_all(r, "jobd:b", 1))
    assert sum(starts(tmp_path / "starts").values()) == 2


def test_reclaimed_entries_run_before_new_ones(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $(cat) >> {tmp_path}/ran\n")
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xadd("jobd:q", {"payload": "orphan"})
    r.xreadgroup("jobd", "dead-daemon", {"jobd:q": ">"})
    for i in range(3):
        r.xadd("jobd:q", {"payload": f"new-{i}"})
    wait_until(
        lambda: r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["time_since_delivered"] >= 300,
        what="the orphan's lease to lapse",
    )
    daemon(
        write_config(queue_config("[./h.sh]", lease="{renew_every: 100ms, reclaim_after: 300ms}"))
    )
    wait_until(lambda: acked_all(r, "jobd:q", 4) and pending_count(r, "jobd:q") == 0)
    assert (tmp_path / "ran").read_text().split() == ["orphan", "new-0", "new-1", "new-2"]
