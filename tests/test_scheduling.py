"""Scheduling controls across daemons: duplicate suppression and unique jobs (real daemons on
one Redis)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import (
    DaemonProcess,
    acked_all,
    jobd_cli,
    kill_with_handlers,
    queue_config,
    wait_until,
)

Daemon = Callable[..., DaemonProcess]

# Each start is a line "<job id> <attempt>"; a payload "flaky" fails its first attempt.
HANDLER = """
    #!/bin/sh
    p=$(cat)
    echo "$JOBD_JOB_ID $JOBD_ATTEMPT" >> {dir}/starts
    [ "$p" = flaky ] && [ "$JOBD_ATTEMPT" = 1 ] && exit 1
    [ "$p" = bad ] && exit 65
    exit 0
"""


def starts(tmp_path: Path) -> list[str]:
    path = tmp_path / "starts"
    return path.read_text().splitlines() if path.exists() else []


def test_a_job_id_done_within_the_dedupe_window_is_not_run_again(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", HANDLER.format(dir=tmp_path))
    config = write_config(queue_config("[./h.sh]", dedupe="{window: 1h}"))
    daemon(config)
    r.xadd("jobd:q", {"payload": "x", "job_id": "order-1"})
    wait_until(lambda: acked_all(r, "jobd:q", 1), what="the first copy done")
    assert r.get("{jobd:q}:job:order-1") == b"done"
    assert 3590_000 < r.pttl("{jobd:q}:job:order-1") <= 3600_000
    # The producer re-sends it twice (say after a timeout), then sends another job.
    r.xadd("jobd:q", {"payload": "x", "job_id": "order-1"})
    r.xadd("jobd:q", {"payload": "x", "job_id": "order-1"})
    r.xadd("jobd:q", {"payload": "x", "job_id": "order-2"})
    wait_until(lambda: acked_all(r, "jobd:q", 4), what="every copy acked")
    assert starts(tmp_path) == ["order-1 1", "order-2 1"]
    status = jobd_cli("status", "-c", str(config), "--json")
    assert b'"deduped": 2' in status.stdout


def test_dedupe_marks_only_success_and_survives_retries(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", HANDLER.format(dir=tmp_path))
    config = write_config(queue_config("[./h.sh]", dedupe="{window: 1h}", retry="{backoff: 50ms}"))
    daemon(config)
    r.xadd("jobd:q", {"payload": "flaky", "job_id": "f"})
    r.xadd("jobd:q", {"payload": "bad", "job_id": "b"})
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1 and r.get("{jobd:q}:job:f") == b"done")
    assert r.exists("{jobd:q}:job:b") == 0, "a dead-lettered job is not done"
    r.xadd("jobd:q", {"payload": "bad", "job_id": "b"})  # may run again: it never succeeded
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 2)
    assert sorted(starts(tmp_path)) == ["b 1", "b 1", "f 1", "f 2"]


def test_enqueue_unique_refuses_a_job_id_queued_running_or_done(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", HANDLER.format(dir=tmp_path))
    plain = write_config(queue_config("[./h.sh]", retry="{backoff: 50ms}"), "plain.yaml")
    c = str(plain)

    def enqueue(*args: str) -> int:
        return jobd_cli("enqueue", "-c", c, "q", *args).returncode

    assert enqueue("flaky", "--job-id", "u-1", "--unique") == 0
    refused = jobd_cli("enqueue", "-c", c, "q", "x", "--job-id", "u-1", "--unique")
    assert refused.returncode == 3 and refused.stdout == b""
    assert b"job id 'u-1' is already queued or running in queue 'q': not added" in refused.stderr
    assert enqueue("x", "--job-id", "u-2", "--unique", "--delay", "1h") == 0
    assert enqueue("x", "--job-id", "u-2", "--unique") == 3, "a delayed job is queued too"
    assert enqueue("x", "--unique") == 2, "--unique needs --job-id"
    assert r.xlen("jobd:q") == 1
    # The job fails once (its retry keeps it unique), then succeeds: its mark is cleared.
    first = daemon(plain)
    wait_until(lambda: "u-1 2" in starts(tmp_path), what="the retry")
    wait_until(lambda: r.exists("{jobd:q}:job:u-1") == 0, what="the mark cleared with the ack")
    assert enqueue("bad", "--job-id", "u-1", "--unique") == 0
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 1)
    assert r.exists("{jobd:q}:job:u-1") == 0, "dead-lettering clears the mark too"
    # With a dedupe window, a done job id stays refused for the window.
    assert first.stop() == 0
    dedupe = write_config(queue_config("[./h.sh]", dedupe="{window: 1h}"), "dedupe.yaml")
    d = str(dedupe)
    assert jobd_cli("enqueue", "-c", d, "q", "x", "--job-id", "u-3", "--unique").returncode == 0
    daemon(dedupe)
    wait_until(lambda: r.get("{jobd:q}:job:u-3") == b"done")
    again = jobd_cli("enqueue", "-c", d, "q", "x", "--job-id", "u-3", "--unique")
    assert again.returncode == 3 and b"done within the dedupe window" in again.stderr


# -- periodic jobs -----------------------------------------------------------------------------


def tick_ids(r: redis.Redis, stream: str = "jobd:q") -> list[str]:
    return [f[b"job_id"].decode() for _, f in r.xrange(stream) if b"job_id" in f]


def seconds_of(ids: list[str]) -> list[int]:
    """The tick times (Unix seconds) in job ids like every-second@2026-11-29T12:00:05Z."""
    import datetime

    return sorted(
        int(datetime.datetime.strptime(i.split("@")[1], "%Y-%m-%dT%H:%M:%S%z").timestamp())
        for i in ids
    )


def test_three_daemons_enqueue_each_tick_once_and_a_restart_skips_none(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", "#!/bin/sh\nsleep 0.3\n")  # so that a kill likely finds a tick running
    config = write_config(
        queue_config(
            "[./h.sh]",
            schedule="[{cron: '* * * * * *', name: every-second, payload: tick}]",
            # A tick running when its daemon is killed is taken over a second later.
            lease="{renew_every: 200ms, reclaim_after: 1s}",
        )
    )
    daemons = [daemon(config) for _ in range(3)]
    wait_until(lambda: len(tick_ids(r)) >= 3, what="three ticks")
    # Every daemon down for about three ticks, then one back: it catches up what was missed.
    for d in daemons:
        kill_with_handlers(d)
    down_at = time.time()
    wait_until(lambda: time.time() > down_at + 3, what="three ticks with no daemon")
    assert len(set(tick_ids(r))) == len(tick_ids(r))
    daemons = [daemon(config), daemon(config)]
    wait_until(lambda: seconds_of(tick_ids(r))[-1] >= down_at + 6, what="ticks after the restart")
    ids = tick_ids(r)
    assert len(ids) == len(set(ids)), f"a tick enqueued twice: {sorted(ids)}"
    seconds = seconds_of(ids)
    assert seconds == list(range(seconds[0], seconds[-1] + 1)), f"a tick skipped: {seconds}"
    assert all(i.startswith("every-second@") for i in ids)
    assert {f[b"payload"] for _, f in r.xrange("jobd:q")} == {b"tick"}
    wait_until(lambda: acked_all(r, "jobd:q", r.xlen("jobd:q")), what="the ticks run")
    status = jobd_cli("status", "-c", str(config))
    assert b"schedule every-second  '* * * * * *' (UTC)  next tick" in status.stdout


def test_a_schedule_never_run_before_starts_from_now(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(
        queue_config("[/bin/true]", schedule="[{cron: '* * * * * *', catch_up: 1h}]")
    )
    started = time.time()
    daemon(config)
    wait_until(lambda: len(tick_ids(r)) >= 2, what="two ticks")
    assert seconds_of(tick_ids(r))[0] >= int(started), "no backfill on a first start"


# -- cluster-wide limits -----------------------------------------------------------------------


def test_three_daemons_never_run_more_than_the_cluster_wide_concurrency(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    # Each handler counts the handlers running at its start (a file per running handler).
    running = tmp_path / "running"
    running.mkdir()
    script(
        "h.sh",
        f"""
        #!/bin/sh
        touch {running}/$JOBD_MESSAGE_ID
        ls {running} | wc -l >> {tmp_path}/seen
        sleep 0.3
        rm {running}/$JOBD_MESSAGE_ID
        """,
    )
    config = write_config(
        queue_config(
            "[./h.sh]", concurrency=4, limits="{concurrency: 4}",
            lease="{renew_every: 100ms, reclaim_after: 1s}",
        )
    )  # fmt: skip
    daemons = [daemon(config) for _ in range(3)]
    for i in range(40):
        r.xadd("jobd:q", {"payload": str(i)})
    wait_until(lambda: acked_all(r, "jobd:q", 40), what="every job done")
    seen = [int(x) for x in (tmp_path / "seen").read_text().split()]
    assert len(seen) == 40
    assert max(seen) <= 4, f"more than 4 handlers at once: {max(seen)}"
    assert max(seen) >= 3, "the limit is the cluster's, not less"
    assert sum(d.log().count("exit 0 after") > 0 for d in daemons) >= 2, "shared by the daemons"

    # Every slot freed; status counts slots held, with those an idle reader takes for the few
    # milliseconds of a read (then frees): polled, not sampled once.
    def slots() -> dict:
        status = json.loads(jobd_cli("status", "-c", str(config), "--json").stdout)
        return status["queues"]["q"]["limits"]["slots"]

    wait_until(lambda: slots() == {"limit": 4, "used": 0}, what="every slot freed")


def test_a_dead_daemons_slots_expire_with_its_leases(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $(cat) >> {tmp_path}/ran\nsleep 30\n")
    config = write_config(
        queue_config(
            "[./h.sh]", concurrency=2, limits="{concurrency: 2}",
            lease="{renew_every: 200ms, reclaim_after: 1s}",
        )
    )  # fmt: skip
    first = daemon(config)
    r.xadd("jobd:q", {"payload": "a"})
    r.xadd("jobd:q", {"payload": "b"})
    wait_until(lambda: r.zcard("{jobd:q}:running") == 2, what="both slots held")
    second = daemon(config)
    r.xadd("jobd:q", {"payload": "c"})
    # The second daemon waits for a slot, says so, and holds no entry meanwhile.
    wait_until(lambda: r.hlen("{jobd:q}:waiting") == 1, what="the second daemon waiting")
    assert r.xpending("jobd:q", "jobd")["pending"] == 2
    status = jobd_cli("status", "-c", str(config))
    assert b"waiting for a slot" in status.stdout and b"slots 2/2 in use" in status.stdout
    kill_with_handlers(first)
    # The dead daemon's slots expire with its leases: the second starts two jobs (a and b taken
    # over, or c, whichever it reaches first once a slot is free), and the third waits, since
    # both slots are taken again.
    ran = lambda: (tmp_path / "ran").read_text().split()  # noqa: E731
    wait_until(lambda: len(ran()) == 4, what="the takeover")
    assert sorted(ran()[:2]) == ["a", "b"] and len(set(ran()[2:]) & {"a", "b", "c"}) == 2
    holder = second.consumer()
    members = [m.decode() for m in r.zrange("{jobd:q}:running", 0, -1)]
    assert len(members) == 2 and all(m.startswith(holder + "|jobd:q|") for m in members), members
    second.kill()


def test_a_rate_limit_holds_across_daemons(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\ndate +%s.%N >> {tmp_path}/starts\n")
    config = write_config(queue_config("[./h.sh]", concurrency=8, limits="{rate: 20/1s}"))
    daemon(config)
    daemon(config)
    # In whole milliseconds, as the limiter counts time (acquire.lua): its first grant may
    # come within the same millisecond, and a bound in finer time would then be off by that.
    enqueued = int(time.time() * 1000) / 1000
    pipe = r.pipeline(transaction=False)
    for i in range(200):
        pipe.xadd("jobd:q", {"payload": str(i)})
    pipe.execute()
    wait_until(lambda: acked_all(r, "jobd:q", 200), timeout=20, what="every job done")
    times = sorted(float(x) for x in (tmp_path / "starts").read_text().split())
    took = times[-1] - enqueued
    print(f"rate 20/1s, burst 20, 2 daemons: 200 jobs started over {took:.2f}s")
    assert 9 <= took <= 12
    # No window of one second holds more than the burst plus a second's worth.
    assert max(sum(1 for t in times if s <= t < s + 1) for s in times) <= 20 + 20


# -- priorities --------------------------------------------------------------------------------


def test_a_free_slot_takes_the_highest_non_empty_level_first(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script(
        "h.sh",
        f"""
        #!/bin/sh
        p=$(cat)
        echo "$p $JOBD_STREAM" >> {tmp_path}/starts
        if [ "$p" = slow ]; then sleep 2; fi
        """,
    )
    config = write_config(
        queue_config(
            "[./h.sh]", priorities="[high, normal, low]", default_priority="normal",
            limits="{concurrency: 1}",  # levels share the queue's one slot
        )
    )  # fmt: skip
    c = str(config)
    low, high = "{jobd:q}:priority:low", "{jobd:q}:priority:high"
    # A backlog in low (the first by `jobd enqueue --priority`), then the daemon starts.
    assert jobd_cli("enqueue", "-c", c, "q", "slow", "--priority", "low").returncode == 0
    for i in range(1, 4):
        r.xadd(low, {"payload": f"low{i}"})
    daemon(config)
    wait_until(lambda: starts(tmp_path) == ["slow " + low], what="the slow low job")
    r.xadd("jobd:q", {"payload": "normal0"})  # a plain XADD to the stream: the default level
    r.xadd(high, {"payload": "high0"})
    r.xadd(high, {"payload": "high1"})
    wait_until(lambda: len(starts(tmp_path)) == 7, what="every job")
    assert [line.split()[0] for line in starts(tmp_path)] == [
        "slow", "high0", "high1", "normal0", "low1", "low2", "low3",
    ]  # fmt: skip
    assert [line.split()[1] for line in starts(tmp_path)][1:4] == [high, high, "jobd:q"]

    def held() -> list[bytes]:  # slots bound to entries (not an idle reader's brief ones)
        return [m for m in r.zrange("{jobd:q}:running", 0, -1) if not m.startswith(b"wait:")]

    wait_until(lambda: not held(), what="the last slot freed")
    status = json.loads(jobd_cli("status", "-c", c, "--json").stdout)["queues"]["q"]
    assert list(status["levels"]) == ["high", "normal", "low"]
    assert status["levels"]["low"]["stream"] == low
    bad = jobd_cli("enqueue", "-c", c, "q", "x", "--priority", "urgent")
    assert bad.returncode == 2 and b"the levels high, normal, low" in bad.stderr


def test_starvation_after_lets_a_long_waiting_lower_job_go_first(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", f"#!/bin/sh\necho $(cat) >> {tmp_path}/starts\nsleep 0.1\n")
    config = write_config(queue_config("[./h.sh]", priorities="[high, low]", starvation_after="1s"))
    high = "{jobd:q}:priority:high"
    now = int(time.time() * 1000)
    r.xadd("jobd:q", {"payload": "low-old"}, id=f"{now - 5000}-0")  # waiting 5 s already
    # Added a minute from now, as its id says (an age is Redis's clock minus the id's time): it
    # cannot have waited a second however long the daemon takes to start (over 1 s under load:
    # low-new went first, starving too).
    r.xadd("jobd:q", {"payload": "low-new"}, id=f"{now + 60_000}-0")
    for i in range(5):
        r.xadd(high, {"payload": f"high{i}"})
    daemon(config)
    wait_until(lambda: len(starts(tmp_path)) == 7, what="every job")
    order = starts(tmp_path)
    # The old low job goes first (aging); the new one waits for the high ones like before.
    assert order[:2] == ["low-old", "high0"], order


WEEK_MS = 7 * 86400 * 1000  # keys.UNIQUE_TTL: how long a 'queued' mark outlasts its job's due time


def test_a_unique_mark_lasts_while_its_job_runs_and_past_its_retry(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    """A --unique job's mark was set to expire 7 days after the job was due, and nothing
    kept it: a job running longer (or retried past that) lost it, and the same job id was
    enqueued again while the first still ran. The daemon running it keeps it (each lease
    renewal), and a retry's mark lasts 7 days past the retry's due time. The 7 days are
    not waited: the mark is given the few seconds it would have left after them."""
    gate = tmp_path / "gate"
    script(
        "slow.sh",
        f'#!/bin/sh\necho "$JOBD_ATTEMPT" >> {tmp_path}/attempts\n'
        f"while [ ! -e {gate} ]; do sleep 0.05; done\nexit 1\n",
    )
    config = write_config(
        queue_config(
            "[./slow.sh]",
            lease="{renew_every: 200ms, reclaim_after: 1s}",
            retry="{max_attempts: 2, backoff: 30d, max_backoff: 30d, jitter: 0}",
        )
    )
    mark = "{jobd:q}:job:u-1"

    def enqueue() -> int:
        return jobd_cli(
            "enqueue", "-c", str(config), "q", "x", "--job-id", "u-1", "--unique"
        ).returncode

    assert enqueue() == 0
    daemon(config)
    wait_until(lambda: (tmp_path / "attempts").exists(), what="the job to run")
    r.pexpire(mark, 2000)  # as if it had run for 7 days, less 2 s
    wait_until(
        lambda: not r.exists(mark) or r.pttl(mark) > WEEK_MS - 60_000,
        what="the mark kept, or gone",
    )
    assert r.get(mark) == b"queued", "the mark of a running job expired"
    assert enqueue() == 3, "the same job id enqueued again while it runs"
    gate.touch()  # it fails: its retry is due in 30 days
    wait_until(lambda: r.zcard("{jobd:q}:delayed") == 1, what="the retry scheduled")
    assert r.pttl(mark) > 30 * 86400 * 1000 + WEEK_MS - 60_000, "the mark ends before the retry"
    assert enqueue() == 3
