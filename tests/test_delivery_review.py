"""Deliveries, from their review: one entry never has two handlers in one daemon (its lease
lost and claimed back while its first handler still ends, or its group made anew), a hand-back
sent again never hands back a later delivery, and Redis busy (BUSY) or a connection lost never
drops an outcome: each test rebuilds a reviewer's reproduction on a real Redis and daemons."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from support import (
    DaemonProcess,
    RedisServer,
    answers_busy,
    pending_count,
    wait_group,
    wait_until,
)

Daemon = Callable[..., DaemonProcess]

HISTORY = "{jobd:q}:history"
DEAD = "{jobd:q}:dead"
LEASE = "lease: {renew_every: 300ms, reclaim_after: 1500ms}"


def config(write_config, handler: Path, *settings: str) -> Path:
    """One queue `q` running ``handler``, leases of 1.5 s renewed every 0.3 s."""
    lines = "".join(f"    {s}\n" for s in (f"command: [{handler}]", LEASE, *settings))
    return write_config(f"redis: {{url: '{{redis}}'}}\nshutdown_grace: 1s\nqueues:\n  q:\n{lines}")


def events(out: Path) -> list[tuple[str, str, str]]:
    """The lines handlers appended: (what, job, pid), e.g. ("start", "X", "1234")."""
    if not out.exists():
        return []
    return [tuple(line.split()) for line in out.read_text().splitlines() if line.strip()]  # type: ignore[misc]


def count(out: Path, what: str, job: str) -> int:
    return sum(1 for w, j, _ in events(out) if (w, j) == (what, job))


def most_at_once(out: Path, job: str) -> int:
    """How many handlers of ``job`` ran at the same time at most, by their start and end lines."""
    running: set[str] = set()
    most = 0
    for what, j, pid in events(out):
        if j != job:
            continue
        if what == "start":
            running.add(pid)
            most = max(most, len(running))
        elif what == "end":
            running.discard(pid)
    return most


def done(r: redis.Redis, job_id: str) -> bool:
    record = r.hget(HISTORY, job_id)
    return record is not None and b'"event":"done"' in record.splitlines()[-1]


def history(r: redis.Redis, job_id: str) -> list[str]:
    """The events of a job's history, oldest first ("reclaimed", "handed back", "done")."""
    record = r.hget(HISTORY, job_id) or b""
    return [json.loads(line)["event"] for line in record.splitlines()]


def dead_letters(r: redis.Redis) -> list[tuple[bytes | None, bytes | None]]:
    return [(f.get(b"job_id"), f.get(b"jobd_error")) for _, f in r.xrange(DEAD)]


# A script that keeps Redis busy ARGV[1] seconds: past busy-reply-threshold Redis answers BUSY
# to every other client (a redis-py connection being set up included) until it ends.
BUSY = """
local t = redis.call('TIME'); local start = tonumber(t[1]) + tonumber(t[2]) / 1e6
while true do
  t = redis.call('TIME')
  if tonumber(t[1]) + tonumber(t[2]) / 1e6 - start > tonumber(ARGV[1]) then break end
end
return 1
"""


@contextlib.contextmanager
def busy_redis(r: redis.Redis, server: RedisServer, seconds: float) -> Iterator[None]:
    """Redis answers BUSY (another client's script) from when this enters, for ``seconds`` at
    most; usable again (the script killed), and back to its busy-reply-threshold, when this
    leaves."""
    r.config_set("busy-reply-threshold", 100)
    slow = redis.Redis(port=server.port, socket_timeout=60)

    def run() -> None:
        with contextlib.suppress(redis.ResponseError):  # killed by SCRIPT KILL
            slow.eval(BUSY, 0, seconds)

    spell = threading.Thread(target=run)
    spell.start()
    try:
        wait_until(lambda: answers_busy(r), 10, "Redis to answer BUSY")
        yield
    finally:
        with contextlib.suppress(redis.ResponseError):  # NOTBUSY: it ended by itself
            r.script_kill()
        spell.join(10)
        slow.close()
        wait_until(lambda: not answers_busy(r), 10, "Redis to answer again")
        r.config_set("busy-reply-threshold", 5000)


def recorder_connections(r: redis.Redis, cmd: str | None = None) -> list[dict]:
    return [
        c
        for c in r.client_list()
        if c.get("name") == "jobd-recorder" and (cmd is None or c.get("cmd") == cmd)
    ]


def hand_back_w_while_busy(
    r: redis.Redis, server: RedisServer, d: DaemonProcess, out: Path
) -> None:
    """With one slot and one read ahead: W waits behind `long` and is handed back as Redis
    turns BUSY for 3 s (its hand-back kept); returns once Redis answers again."""
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "warm", "job_id": "warm"})  # the recorder connects now
    wait_until(lambda: done(r, "warm"), what="warm done")
    r.xadd("jobd:q", {"payload": "long", "job_id": "long"})
    wait_until(lambda: count(out, "start", "long") == 1, what="long to start")
    r.xadd("jobd:q", {"payload": "W", "job_id": "W"})
    d.wait_log("job=W attempt=1 read ahead: waits for a slot")
    with busy_redis(r, server, 3.0):
        d.wait_log("job=W attempt=1 read as no slot freed in time: handed back")
        wait_until(lambda: not answers_busy(r), 10, "the 3 s busy spell to end")


def test_an_entry_claimed_back_while_its_first_handler_ends_never_runs_twice_at_once(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """X's lease is lost (claimed to a consumer `ghost` that never renews) while its handler
    ignores SIGTERM (kill_grace 20 s); after reclaim_after this daemon claims X back. It used
    to start a second handler for X beside the first; then a KeyError froze the main loop for
    good ("internal error in the main loop"): X was never settled and nothing else started.
    Now the new delivery is handed back until the first handler has ended: X runs again only
    then, is acked, and a later job Y runs."""
    out = tmp_path / "ran"
    handler = script("h.sh", f"""
        #!/bin/sh
        trap '' TERM
        p=$(cat)
        echo "start $p $$" >> {out}
        case "$p" in
          X) if [ ! -e {tmp_path}/first ]; then touch {tmp_path}/first; sleep 4; else sleep 0.3; fi ;;
          *) sleep 0.1 ;;
        esac
        echo "end $p $$" >> {out}
    """)  # fmt: skip
    d = daemon(config(write_config, handler, "concurrency: 2", "kill_grace: 20s"))
    wait_group(r, "jobd:q")
    mid = r.xadd("jobd:q", {"payload": "X", "job_id": "X"})
    wait_until(lambda: count(out, "start", "X") == 1, what="X to start")
    r.xclaim("jobd:q", "jobd", "ghost", 0, [mid], justid=True)
    d.wait_log("lease lost: the entry now belongs to consumer ghost")
    wait_until(lambda: count(out, "end", "X") == 2, 20, "X to run twice, to its end")
    assert most_at_once(out, "X") == 1, f"two handlers of X at once:\n{out.read_text()}"
    r.xadd("jobd:q", {"payload": "Y", "job_id": "Y"})
    wait_until(lambda: done(r, "Y"), 10, "Y to run after X")
    wait_until(lambda: done(r, "X") and pending_count(r, "jobd:q") == 0, 10, "X acked")
    assert "internal error in the main loop" not in d.log()


def test_an_entry_delivered_again_by_a_recreated_group_stops_its_first_handler(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """The consumer group is deleted and made anew while X runs: the reader reads X again.
    It used to start a second handler for X and never tell the first (two ran at once), and
    the main loop then froze on a KeyError. Now the first is stopped as its lease is lost
    (SIGTERM), the new delivery handed back until it has ended, X runs again only then, and a
    later job Y runs."""
    out = tmp_path / "ran"
    handler = script("h.sh", f"""
        #!/bin/sh
        p=$(cat)
        echo "start $p $$" >> {out}
        trap 'echo "term $p $$" >> {out}; sleep 1; echo "end $p $$" >> {out}; exit 1' TERM
        case "$p" in
          X) if [ ! -e {tmp_path}/first ]; then touch {tmp_path}/first; sleep 4; else sleep 0.3; fi ;;
          *) sleep 0.1 ;;
        esac &
        wait
        echo "end $p $$" >> {out}
    """)  # fmt: skip
    d = daemon(config(write_config, handler, "concurrency: 2"))
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "X", "job_id": "X"})
    wait_until(lambda: count(out, "start", "X") == 1, what="X to start")
    (first,) = (pid for what, job, pid in events(out) if (what, job) == ("start", "X"))
    r.xgroup_destroy("jobd:q", "jobd")
    wait_until(lambda: count(out, "end", "X") == 2, 20, "X to run twice, to its end")
    assert most_at_once(out, "X") == 1, f"two handlers of X at once:\n{out.read_text()}"
    assert ("term", "X", first) in events(out), "the first handler was never told"
    r.xadd("jobd:q", {"payload": "Y", "job_id": "Y"})
    wait_until(lambda: done(r, "Y"), 10, "Y to run after X")
    wait_until(lambda: done(r, "X") and pending_count(r, "jobd:q") == 0, 10, "X acked")
    assert "internal error in the main loop" not in d.log()


def test_a_hand_back_kept_while_redis_was_busy_spares_the_run_claimed_since(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """One slot, one read ahead: W waits behind `long` and is handed back as Redis turns BUSY
    for 3 s; the hand-back is kept. W, forgotten, lapses meanwhile, and this daemon claims it
    back and starts it as Redis answers again. The kept hand-back, sent then, used to hand that
    new run back (in W's history, "handed back" after the claim that started it): its renewal
    found it lost and killed it, and W ran twice (or, would the reader claim it back first,
    another daemon could have taken it over). Now the hand-back leaves alone an entry delivered
    since it was first sent: W runs once, to its end."""
    out = tmp_path / "ran"
    handler = script("h.sh", f"""
        #!/bin/sh
        p=$(cat)
        echo "start $p $$" >> {out}
        trap 'echo "term $p $$" >> {out}; exit 1' TERM
        case "$p" in long) sleep 2.5 ;; W) sleep 3 ;; esac &
        wait
        echo "end $p $$" >> {out}
    """)  # fmt: skip
    conf = config(write_config, handler, "concurrency: 1", "prefetch: 1", "kill_grace: 2s")
    d = daemon(conf)
    hand_back_w_while_busy(r, redis_server, d, out)
    wait_until(lambda: done(r, "W"), 20, "W done")
    seen = history(r, "W")
    since = seen[seen.index("reclaimed") :]  # from the claim that started W's run
    assert "handed back" not in since, f"W's run was handed back: {seen}"
    assert count(out, "start", "W") == 1, f"W ran more than once:\n{out.read_text()}"
    assert count(out, "term", "W") == 0, f"W's run was stopped:\n{out.read_text()}"
    assert pending_count(r, "jobd:q") == 0


def test_an_ack_refused_busy_as_the_recorder_connects_is_kept_not_dropped(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A's handler exits 0 while Redis is BUSY, and the recorder's connection was cut just
    before: it connects again to write the ack, and redis-py raises BUSY as it sets the
    connection up. That used to count as the ack's own failure: dropped after 5 tries, A
    (max_deliveries 1) was then reclaimed and dead-lettered as poison though it succeeded.
    Now the ack is kept and written once Redis answers. And the reader does not take a BUSY
    answer to its pause check for a pause."""
    out = tmp_path / "ran"
    go = tmp_path / "go"
    handler = script("h.sh", f"""
        #!/bin/sh
        p=$(cat)
        echo "start $p $$" >> {out}
        while [ ! -e {go} ]; do sleep 0.05; done
        echo "end $p $$" >> {out}
    """)  # fmt: skip
    d = daemon(config(write_config, handler, "concurrency: 1", "max_deliveries: 1"))
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "A", "job_id": "A"})
    wait_until(lambda: r.hexists("{jobd:q}:active", "A"), what="A's active record written")
    connections = recorder_connections(r)
    assert connections, "the recorder has no connection to cut"
    for c in connections:  # the ack needs a new connection, set up while Redis is busy
        r.client_kill_filter(_id=c["id"])
    with busy_redis(r, redis_server, 10.0):
        go.touch()
        wait_until(lambda: count(out, "end", "A") == 1, 10, "A to end, Redis busy")
        end = time.monotonic() + 1.5  # longer than the 5 tries, 0.2 s apart, it used to give
        wait_until(lambda: time.monotonic() >= end, 5, "the recorder to try while busy")
    wait_until(lambda: pending_count(r, "jobd:q") == 0, 15, "A settled")
    assert dead_letters(r) == [], "A exited 0 and was dead-lettered"
    assert done(r, "A") and count(out, "start", "A") == 1, out.read_text()
    assert "paused by ?" not in d.log()


def test_a_hand_back_lost_with_its_connection_is_sent_again(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """One slot, one read ahead, max_deliveries 1: W waits behind `long` and is handed back,
    while Redis holds writes (CLIENT PAUSE WRITE) and the recorder's connection is cut as it
    waits on the hand-back's script. The hand-back used to be given up (it might have applied):
    W, not renewed, was claimed again after reclaim_after, a delivery that counted, and was
    dead-lettered as poison without ever running. Now it is sent again, and W runs."""
    out = tmp_path / "ran"
    handler = script("h.sh", f"""
        #!/bin/sh
        p=$(cat)
        echo "start $p $$" >> {out}
        case "$p" in long) sleep 3 ;; *) sleep 0.1 ;; esac
        echo "end $p $$" >> {out}
    """)  # fmt: skip
    conf = config(write_config, handler, "concurrency: 1", "prefetch: 1", "max_deliveries: 1")
    d = daemon(conf)
    wait_group(r, "jobd:q")
    r.xadd("jobd:q", {"payload": "long", "job_id": "long"})
    wait_until(lambda: count(out, "start", "long") == 1, what="long to start")
    r.xadd("jobd:q", {"payload": "W", "job_id": "W"})
    d.wait_log("job=W attempt=1 read ahead: waits for a slot")
    killed = 0
    r.execute_command("CLIENT", "PAUSE", 4000, "WRITE")
    try:
        d.wait_log("job=W attempt=1 read as no slot freed in time: handed back")
        end = time.monotonic() + 1.5

        def cut() -> bool:  # each connection the recorder waits on a script with
            nonlocal killed
            for c in recorder_connections(r, "evalsha"):
                with contextlib.suppress(redis.ResponseError):  # gone meanwhile
                    r.client_kill_filter(_id=c["id"])
                    killed += 1
            return time.monotonic() >= end

        wait_until(cut, 5, "1.5 s of cutting the recorder's connections")
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    assert killed, "no recorder connection was cut as it waited on the hand-back"
    wait_until(lambda: done(r, "W") or r.exists(DEAD), 15, "W run or dead-lettered")
    assert dead_letters(r) == [], f"W was dead-lettered unrun:\n{out.read_text()}"
    assert count(out, "start", "W") == 1


def test_a_hand_back_kept_through_an_outage_longer_than_reclaim_after_costs_no_delivery(
    r: redis.Redis, redis_server: RedisServer, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """One slot, one read ahead, max_deliveries 1: W waits behind `long` and is handed back as
    Redis turns BUSY for 3 s, longer than reclaim_after (1.5 s); the hand-back is kept. When
    Redis answers again the reader's reclaim takes W before the recorder sends the hand-back
    again (which then leaves alone an entry delivered since): that claim used to count a
    delivery the hand-back was meant to take back, and W was dead-lettered as poison without
    ever running. Now the reclaim counts it as the hand-back's claim, and W runs."""
    out = tmp_path / "ran"
    handler = script("h.sh", f"""
        #!/bin/sh
        p=$(cat)
        echo "start $p $$" >> {out}
        case "$p" in long) sleep 2.5 ;; *) sleep 0.05 ;; esac
    """)  # fmt: skip
    conf = config(write_config, handler, "concurrency: 1", "prefetch: 1", "max_deliveries: 1")
    d = daemon(conf)
    hand_back_w_while_busy(r, redis_server, d, out)
    wait_until(lambda: done(r, "W") or r.exists(DEAD), 15, "W run or dead-lettered")
    assert dead_letters(r) == [], f"W was dead-lettered unrun:\n{out.read_text()}"
    assert count(out, "start", "W") == 1
