"""Leases and crash recovery, by breaking things on purpose: real daemons, real signals."""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import redis
from faultproxy import FaultProxy
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
from jobd.daemon.lease import Holdings, Renewal, lease_clock
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
    renewed_at = time.monotonic()
    assert store.renew(queue, ids) == []
    assert evalsha_calls(r) - before == 1, "one script call for 1000 entries"
    entries = r.xpending_range("jobd:q", "jobd", "-", "+", 1000)
    since_ms = (time.monotonic() - renewed_at) * 1000
    assert {e["times_delivered"] for e in entries} == {1}
    # Renewed: idle no longer than since the renewal began (not renewed: 50 ms more than that)
    assert max(e["time_since_delivered"] for e in entries) <= since_ms + 1


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
            keys = ["jobd:q", queue.keys.stats(int(r.time()[0]) // 60), queue.keys.cancels, *notes.keys(queue),
                    queue.keys.waiters, queue.keys.outbox, queue.keys.taken]  # fmt: skip
            note = ["done", mid, "", b'{"event":"done"}', 0]  # lua/lib/jobs.lua note_at
            # 0 after the settings: no outbox; 0 after the note: no follow-ups (store/outcomes.py)
            args = ["jobd", "me", 60, 0, notes.settings(queue), 0, "ack", mid, 0, -1, *note, 0]
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


def test_reclaim_flags_handed_back_entries_reading_only_the_rows_it_may_claim(
    r: redis.Redis, queue
) -> None:
    """reclaim.lua flags an entry handed back (idle since 1970: settle.lua 'back') from the
    rows of the pending entries XAUTOCLAIM looks at (count x 10 from the cursor, read before the
    claim), not from a scan of the rest of the pending list on every call (10 000 entries
    here). With count 1: nine entries a live consumer holds, one handed back (the window's
    last), one whose lease lapsed, one handed back, then 10 000 held."""
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline()
    for i in range(10_012):
        pipe.xadd("jobd:q", {"payload": str(i)})
    ids = pipe.execute()
    r.xreadgroup("jobd", "live", {"jobd:q": ">"}, count=len(ids))
    lapsed = int(queue.lease.reclaim_after * 1000) * 2
    r.xclaim("jobd:q", "jobd", "dead", 0, [ids[9], ids[11]], time=1, justid=True)
    r.xclaim("jobd:q", "jobd", "dead", 0, [ids[10]], idle=lapsed, justid=True)
    store, cursor, seen = Store(r), "0-0", []
    for _ in range(4):
        page = store.reclaim(queue, cursor, 1)
        seen += [(mid, back) for mid, _fields, _deliveries, back in page.claimed]
        cursor = page.cursor
    assert seen == [(ids[9], True), (ids[10], False), (ids[11], True)]
    assert cursor == ids[22].decode()  # the fourth call looked at ten held entries


def test_a_renewal_that_cannot_reach_redis_is_not_a_loss(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("redis: {url: 'redis://127.0.0.1:1/0'}\nqueues:\n  q: {command: [/bin/true]}\n")
    config = load(str(path))
    holdings = Holdings()
    holdings.add(("jobd:q", "jobd"), ["1-0", "2-0"], lease_clock())
    reported: list = []
    store = Store.open(config.redis, "test", "me")
    ticker = Ticker([Renewal(store, config.queues["q"], holdings, reported.extend)])
    ticker.run_due(time.monotonic())
    assert reported == [] and sorted(holdings.snapshot(("jobd:q", "jobd"))) == ["1-0", "2-0"]


def test_a_renewal_confirms_the_leases_it_kept_as_of_before_it_was_sent(
    r: redis.Redis, queue
) -> None:
    """What a start checks (``Admission.lease_held``): a renewal moves an entry's confirmation
    to the moment before it was sent, only for the entries it kept and only while held by the
    same delivery; an entry lost is held no more, so it has no confirmation at all."""
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for i in range(2):
        r.xadd("jobd:q", {"payload": str(i)})
    ids = [mid.decode() for mid, _ in r.xreadgroup("jobd", "me", {"jobd:q": ">"})[0][1]]
    holdings, k, old = Holdings(), ("jobd:q", "jobd"), lease_clock() - 100
    numbers = holdings.add(k, ids, old)
    r.xclaim("jobd:q", "jobd", "other", 0, [ids[1]], justid=True)  # taken over
    lost: list = []
    before = lease_clock()
    Renewal(Store(r, "me"), queue, holdings, lost.extend).tick()
    kept = holdings.confirmed(k, ids[0], numbers[0])
    assert kept is not None and before <= kept <= lease_clock()
    assert holdings.confirmed(k, ids[1], numbers[1]) is None and [x.message_id for x in lost] == [
        ids[1]
    ]
    assert holdings.confirmed(k, ids[0], numbers[0] + 7) is None, "another delivery's: none"


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


# -- a daemon that comes back never starts a job another one took over ------------------------

# The handler writes its payload to `starts` when it starts; "slow…" then runs 0.4 s and
# writes it to `ended`.
STARTS = """\
#!/bin/sh
p=$(cat)
echo "$p" >> {dir}/starts
case "$p" in slow*) sleep 0.4; echo "$p" >> {dir}/ended ;; esac
"""
SHORT_LEASE = "{renew_every: 300ms, reclaim_after: 1s}"


def owner(r: redis.Redis, mid: str) -> str | None:
    """The consumer entry ``mid`` is pending for; None when it is pending for no one."""
    rows = r.xpending_range("jobd:q", "jobd", mid, mid, 1)
    return rows[0]["consumer"].decode() if rows else None


def delivered_while_away(
    r: redis.Redis, a: DaemonProcess, proxy: FaultProxy, away: Callable[[], None], payload: str
) -> str:
    """A job delivered to daemon ``a`` (behind ``proxy``) while it is away (``away``: stopped,
    or cut off): the reply of the read script that delivered it is held in the proxy until
    ``a`` is away, then let go (into ``a``'s socket, or into the partition). Returns the job's
    entry id, ``a`` still away: pending on ``a``'s consumer, whose reply ``a`` has not seen."""
    proxy.hold_reply(payload.encode(), to=b"EVAL")
    mid = r.xadd("jobd:q", {"payload": payload, "job_id": payload}).decode()
    wait_until(lambda: owner(r, mid) == a.consumer() and proxy.holding(),
               what="the job read by A, the reply held")  # fmt: skip
    away()
    proxy.release()
    return mid


def stop(a: DaemonProcess) -> None:
    """SIGSTOP ``a``; returns once it is stopped."""
    a.signal(signal.SIGSTOP)
    process = psutil.Process(a.proc.pid)
    wait_until(lambda: process.status() == psutil.STATUS_STOPPED, what="A stopped")


def started_by(tmp_path: Path, name: str = "starts") -> Counter[str]:
    path = tmp_path / name
    return Counter(path.read_text().split()) if path.exists() else Counter()


def spawned(a: DaemonProcess, payload: str) -> bool:
    """Whether daemon ``a`` says it started a handler for the job (one stopped before it wrote
    to `starts` included)."""
    return any(f"job={payload} " in line and "started pid" in line for line in a.log().splitlines())


def came_back(a: DaemonProcess, payload: str, tmp_path: Path) -> bool:
    """Whether ``a``, back, has dealt with the job: started it a second time (the defect), or
    said it did not start it (handed back unstarted, or its lease reported lost)."""
    if started_by(tmp_path)[payload] >= 2:
        return True
    words = ("unstarted", "not started", "handed back", "lease lost")
    lines = a.log().splitlines()
    return any(f"job={payload} " in line and any(w in line for w in words) for line in lines)


def test_a_stalled_daemon_never_starts_a_job_delivered_to_it_while_stopped(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Issue 32: A is SIGSTOPped with the reply of the read that delivered a job on its way
    (held in the proxy, then let into A's socket); B takes the job over after reclaim_after
    and runs it. A, continued, finds the reply of its read: it must not start the job (it did,
    and ran it in full)."""
    script("h.sh", STARTS.format(dir=tmp_path))
    text = queue_config("[./h.sh]", prefetch=0, lease=SHORT_LEASE)
    direct = write_config(text)
    with FaultProxy(redis_server.port) as proxy:
        a = daemon(write_config(text.replace("{redis}", proxy.url), name="a.yaml"))
        wait_group(r, "jobd:q")
        payload = "delivered-while-away"
        mid = delivered_while_away(r, a, proxy, lambda: stop(a), payload)
        try:
            b = daemon(direct)
            wait_until(lambda: owner(r, mid) is None, what="B to take the job over and run it")
        finally:
            a.signal(signal.SIGCONT)
        assert started_by(tmp_path)[payload] == 1 and f"job={payload} " in b.log()
        wait_until(lambda: came_back(a, payload, tmp_path), what="A to deal with the stale reply")
    assert started_by(tmp_path)[payload] == 1, "started once, by B only"
    assert not spawned(a, payload), "A started no handler for it (one stopped at once too)"


def test_a_round_trip_too_long_for_reclaim_after_is_one_clear_error(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """With the round trip to Redis (0.5s) above half of reclaim_after (0.4s), each read's reply
    arrives with its lease's confirmation already too old to start: the job is handed back
    unstarted, reclaimed, handed back again, forever, with only warnings. One ERROR (a minute
    apart at most) says the round trip is too long and to raise lease.reclaim_after."""
    script("h.sh", STARTS.format(dir=tmp_path))
    text = queue_config("[./h.sh]", prefetch=0, lease="{renew_every: 100ms, reclaim_after: 400ms}")
    said = "the round trip to Redis is too long for reclaim_after"
    with FaultProxy(redis_server.port) as proxy:
        a = daemon(write_config(text.replace("{redis}", proxy.url), name="a.yaml"))
        wait_group(r, "jobd:q")
        # Each way: a reply the XADD wakes comes 0.25s late even to a read sent before this.
        proxy.latency(0.25)
        r.xadd("jobd:q", {"payload": "x0", "job_id": "x0"})
        a.wait_log(said)
        assert "raise lease.reclaim_after" in a.log()
        proxy.restore()
        wait_until(lambda: started_by(tmp_path)["x0"] == 1, what="x0 to start, Redis near again")
    assert a.log().count(said) == 1, "said once a minute at most"


def test_a_daemon_cut_off_never_starts_a_job_delivered_to_it_meanwhile(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The same with no stall: A is cut off from Redis (the proxy's blackhole, a partition)
    for longer than reclaim_after, the reply of its read held up in the network."""
    script("h.sh", STARTS.format(dir=tmp_path))
    text = queue_config("[./h.sh]", prefetch=0, lease=SHORT_LEASE)
    direct = write_config(text)
    with FaultProxy(redis_server.port) as proxy:
        a = daemon(write_config(text.replace("{redis}", proxy.url), name="a.yaml"))
        wait_group(r, "jobd:q")
        payload = "delivered-while-away"
        mid = delivered_while_away(r, a, proxy, lambda: proxy.blackhole(None), payload)
        try:
            daemon(direct)
            wait_until(lambda: owner(r, mid) is None, what="B to take the job over and run it")
        finally:
            proxy.restore()
        assert started_by(tmp_path)[payload] == 1
        wait_until(lambda: came_back(a, payload, tmp_path), what="A to deal with the late reply")
    assert started_by(tmp_path)[payload] == 1, "started once, by B only"
    assert not spawned(a, payload), "A started no handler for it (one stopped at once too)"


def test_a_stalled_daemon_never_starts_a_job_it_read_ahead_while_stopped(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Read ahead: A (one slot, one read ahead) runs `slow`; its reader reads `x` ahead, and
    A is stopped before the reply reaches it. B takes both over and runs them. When A
    continues, the read's reply hands it `x`, and a slot frees as `slow`'s exit is seen: A
    must not start `x` in it. A comes back cut off from Redis, so that no renewal can report
    the loss first: only the check made before a start stops it."""
    script("h.sh", STARTS.format(dir=tmp_path))
    text = queue_config("[./h.sh]", prefetch=1, lease=SHORT_LEASE)
    direct = write_config(text)
    with FaultProxy(redis_server.port) as proxy:
        a = daemon(write_config(text.replace("{redis}", proxy.url), name="a.yaml"))
        wait_group(r, "jobd:q")
        r.xadd("jobd:q", {"payload": "slow", "job_id": "slow"})
        wait_until(lambda: started_by(tmp_path)["slow"] == 1, what="slow to start")
        payload = "delivered-while-away"
        mid = delivered_while_away(r, a, proxy, lambda: stop(a), payload)
        try:
            daemon(direct)
            wait_until(lambda: owner(r, mid) is None, what="B to take both over and run them")
            proxy.blackhole(None)
        finally:
            a.signal(signal.SIGCONT)
        try:
            wait_until(lambda: came_back(a, payload, tmp_path), what="A to deal with it")
        finally:
            proxy.restore()
    assert started_by(tmp_path)[payload] == 1, "started once, by B only"
    assert not spawned(a, payload), "A started no handler for it (one stopped at once too)"


def test_a_stalled_daemon_never_starts_a_job_waiting_for_a_slot(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Read ahead: A (one slot, one read ahead) holds `slowN` running and `xN` waiting for the
    slot when it is stopped; B takes both over and runs them. When A continues, `slowN` has
    ended and its slot is free: A must not start `xN` (it did, one read-ahead entry in four
    under load). A comes back cut off from Redis, so that its renewal cannot report the loss
    first: only the checks made before a start keep it from running."""
    script("h.sh", STARTS.format(dir=tmp_path))
    text = queue_config("[./h.sh]", prefetch=1, lease=SHORT_LEASE)
    direct = write_config(text)
    with FaultProxy(redis_server.port) as proxy:
        a = daemon(write_config(text.replace("{redis}", proxy.url), name="a.yaml"))
        wait_group(r, "jobd:q")
        for attempt in range(20):
            pipe = r.pipeline(transaction=True)  # read together: one runs, one waits
            for payload in (f"slow{attempt}", f"x{attempt}"):
                pipe.xadd("jobd:q", {"payload": payload, "job_id": payload})
            mid = pipe.execute()[1].decode()
            wait_until(lambda m=mid: owner(r, m) == a.consumer(), what="x read")
            a.signal(signal.SIGSTOP)
            # Stopped while slow ran (so x cannot have started) and x waited (not handed back
            # yet: not idle for decades)?
            idle = r.xpending_range("jobd:q", "jobd", mid, mid, 1)[0]["time_since_delivered"]
            if started_by(tmp_path, "ended")[f"slow{attempt}"] == 0 and idle < 10_000:
                break
            a.signal(signal.SIGCONT)  # too late: again
            wait_until(lambda m=mid, n=attempt: owner(r, m) is None
                       and started_by(tmp_path)[f"x{n}"] == 1, what="both to run")  # fmt: skip
        else:
            raise AssertionError("never stopped with an entry read ahead")
        payload = f"x{attempt}"
        try:
            daemon(direct)
            wait_until(lambda: owner(r, mid) is None, what="B to take both over and run them")
            proxy.blackhole(None)
        finally:
            a.signal(signal.SIGCONT)
        try:
            wait_until(lambda: came_back(a, payload, tmp_path), what="A to deal with it")
        finally:
            proxy.restore()
    assert started_by(tmp_path)[payload] == 1, "started once, by B only"
    assert not spawned(a, payload), "A started no handler for it (one stopped at once too)"


STALL = 4.0  # seconds the stalled daemon's spawn is held after its lease check passed


def in_clone(pid: int) -> bool:
    """Whether ``pid``'s main thread is in clone(2) or clone3(2) now (held there by strace)."""
    try:
        number = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return number in ("56", "435")  # x86-64


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (.ci/run installs it)")
def test_a_daemon_stalled_between_its_lease_check_and_the_exec_never_starts_a_job_taken_over(
    r: redis.Redis, redis_server, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """Issue 32, a review's reproduction: the check a start makes (``Admission.lease_held``)
    runs before the spawn, and a stall of the daemon after it (the spawn lock, the OOM step,
    GIL hand-offs, the clone itself: p99 2.5-8 ms under load; a SIGSTOP or a VM pause landed
    there 7 times in about 150) started a job another daemon had taken over. Deterministic:
    strace delays every clone(2) of A's main thread (its handler's spawn, after the check) by
    STALL, and A's link to Redis is blackholed once the job is delivered to it, so its renewals
    stop as in a SIGSTOP; B takes the job over and runs it. When A's clone goes through, the
    child, past its start's deadline, must not exec: the job is handed back unstarted."""
    script("h.sh", STARTS.format(dir=tmp_path))
    text = queue_config("[./h.sh]", prefetch=0, lease=SHORT_LEASE)
    direct = write_config(text)
    with FaultProxy(redis_server.port) as proxy:
        strace = ["strace", "-o", str(tmp_path / "strace.out"), "-e", "trace=clone",
                  "-e", f"inject=clone:delay_enter={int(STALL * 1e6)}"]  # fmt: skip
        a = daemon(write_config(text.replace("{redis}", proxy.url), name="a.yaml"), prefix=strace)
        wait_group(r, "jobd:q")
        mid = r.xadd("jobd:q", {"payload": "x0", "job_id": "x0"}).decode()
        # Delivered (XPENDING says A's) is not yet received: the reply may still be on its way
        # through the proxy, and a blackhole now would keep it from A. A's main thread held in
        # clone(2) is past the read and the (local) check: only then is its link cut.
        jobd = psutil.Process(a.proc.pid).children()[0].pid  # strace's child: the daemon
        wait_until(lambda: owner(r, mid) == a.consumer() and in_clone(jobd),
                   what="x0 received by A, its spawn held in clone")  # fmt: skip
        proxy.blackhole(None)  # A's renewals stop: its lease on x0 lapses after reclaim_after
        try:
            b = daemon(direct)
            wait_until(lambda: "job=x0 " in b.log() and started_by(tmp_path)["x0"] == 1,
                       what="B to take x0 over and run it")  # fmt: skip
            # A's spawn, held since before B's takeover, goes through STALL after the check.
            ends = ("job=x0 attempt=1 lease lapsed before exec", "job=x0 attempt=1 exit")
            wait_until(lambda: any(end in a.log() for end in ends), STALL + 10,
                       "A's start of x0 to end")  # fmt: skip
        finally:
            proxy.restore()
    assert started_by(tmp_path)["x0"] == 1, "x0 started once, by B only"
    assert "job=x0 attempt=1 exit" not in a.log(), "A's handler never ran"
    assert "job=x0 attempt=1 lease lapsed before exec: handed back unstarted" in a.log()


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
        lambda: r.xpending_range("jobd:q", "jobd", "-", "+", 1)[0]["time_since_delivered"] >= 1000,
        what="the orphan's lease to lapse",
    )
    # reclaim_after 1 s, not 300 ms: a start must exec within a share of it (else it is handed
    # back unstarted, and runs later: the stop CI's load stalled one spawn past 300 ms's share)
    daemon(write_config(queue_config("[./h.sh]", lease="{renew_every: 300ms, reclaim_after: 1s}")))
    wait_until(lambda: acked_all(r, "jobd:q", 4) and pending_count(r, "jobd:q") == 0)
    assert (tmp_path / "ran").read_text().split() == ["orphan", "new-0", "new-1", "new-2"]
