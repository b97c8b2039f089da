"""Cluster-wide limits and aging with daemons whose clocks are off: real `jobd run` daemons
whose wall clock is really skewed by libfaketime (``support.skewed``), against one Redis.
Handlers do not inherit LD_PRELOAD (jobd passes them a small environment), so a handler's
`date` is the real time.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import support
from support import DaemonProcess, acked_all, kill_with_handlers, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]


@pytest.fixture
def skewed(daemon: Daemon) -> Callable[[Path, int], DaemonProcess]:
    """Start a daemon whose clock is ``offset`` seconds off the real one; checked by its log's
    timestamps (its own clock)."""

    def start(config: Path, offset: int) -> DaemonProcess:
        env = {**support.skewed(f"{offset:+d}s"), "JOURNAL_STREAM": ""}  # timestamps in the log
        d = daemon(config, env)
        assert abs(clock_of(d) - offset) < 5, f"the daemon's clock is not {offset:+d}s off"
        return d

    return start


def clock_of(d: DaemonProcess) -> float:
    """How far the daemon's clock is from this one, seconds: its start line's timestamp."""
    line = next(x for x in d.log().splitlines() if "jobd running as consumer" in x)
    logged = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return logged - time.time()


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# -- rate ------------------------------------------------------------------------------------


def test_a_rate_limit_holds_across_daemons_whose_clocks_disagree(
    r: redis.Redis, write_config, script, skewed, tmp_path: Path
) -> None:
    # One host 30 s ahead, one 30 s behind: each refilled the bucket by its own clock, so the
    # one ahead found a minute's worth of tokens every time after the other.
    script("h.sh", f"#!/bin/sh\ndate +%s.%N >> {tmp_path}/starts\n")
    config = write_config(queue_config("[./h.sh]", concurrency=8, limits="{rate: 10/1s}"))
    ahead, behind = skewed(config, +30), skewed(config, -30)
    enqueued = time.time()
    pipe = r.pipeline(transaction=False)
    for i in range(60):
        pipe.xadd("jobd:q", {"payload": str(i)})
    pipe.execute()
    wait_until(lambda: acked_all(r, "jobd:q", 60), timeout=20, what="every job done")
    times = sorted(float(x) for x in lines(tmp_path / "starts"))
    took = times[-1] - enqueued
    print(f"rate 10/1s, burst 10, hosts +30 s and -30 s: 60 starts over {took:.2f}s")
    assert took >= 4.5, f"60 starts in {took:.2f}s: 10 at once, then 10 a second takes 5 s"
    busiest = max(sum(1 for t in times if s <= t < s + 1) for s in times)
    assert busiest <= 10 + 10 + 2, f"{busiest} starts in one second (burst 10 + 10/s)"
    assert all("exit 0 after" in d.log() for d in (ahead, behind)), "both daemons started jobs"


# -- concurrency -----------------------------------------------------------------------------

SLOW = "#!/bin/sh\necho $(cat) >> {dir}/ran\nsleep 30\n"


def limited_config(write_config) -> Path:
    return write_config(
        queue_config(
            "[./h.sh]", concurrency=2, limits="{concurrency: 2}",
            lease="{renew_every: 200ms, reclaim_after: 2s}",
        )
    )  # fmt: skip


def slot_scores(r: redis.Redis) -> list[float]:
    return [s for _, s in r.zrange("{jobd:q}:running", 0, -1, withscores=True)]


def bound(r: redis.Redis) -> int:
    """Slots bound to entries (not the ones a reader takes for the moment of a read)."""
    return sum(not m.startswith(b"wait:") for m in r.zrange("{jobd:q}:running", 0, -1))


def refused(r: redis.Redis, d: DaemonProcess, ran: Path) -> bool:
    """Whether ``d`` asked for a slot and was told to wait (or, wrongly, got one)."""
    return r.hget("{jobd:q}:waiting", d.consumer()) is not None or len(lines(ran)) > 2


def test_a_host_behind_does_not_make_its_live_slots_look_expired(
    r: redis.Redis, write_config, script, daemon: Daemon, skewed, tmp_path: Path
) -> None:
    script("h.sh", SLOW.format(dir=tmp_path))
    config = limited_config(write_config)
    ran = tmp_path / "ran"
    behind = skewed(config, -300)
    r.xadd("jobd:q", {"payload": "a"})
    r.xadd("jobd:q", {"payload": "b"})
    wait_until(lambda: len(lines(ran)) == 2 and bound(r) == 2, what="a and b running")
    first = slot_scores(r)
    other = daemon(config)
    r.xadd("jobd:q", {"payload": "c"})
    wait_until(lambda: refused(r, other, ran), what="the other daemon to ask for a slot")
    assert sorted(lines(ran)) == ["a", "b"], "the other daemon started c: 3 running, limit 2"
    # Renewed by the host behind, alive for everyone the whole time: by Redis's clock.
    assert min(first) > redis_ms(r) - 1000, "the slots of running jobs looked expired"
    wait_until(lambda: min(slot_scores(r)) > max(first), what="both slots renewed")
    assert sorted(lines(ran)) == ["a", "b"]
    assert r.hget("{jobd:q}:waiting", other.consumer()).startswith(b"slot ")
    assert min(slot_scores(r)) > redis_ms(r)
    # Once it is dead, its slots expire with its leases (by Redis's clock) and c starts.
    kill_with_handlers(behind)
    wait_until(lambda: len(lines(ran)) == 4, timeout=15, what="the other daemon taking over")


def test_a_dead_host_aheads_slots_expire_with_its_leases(
    r: redis.Redis, write_config, script, daemon: Daemon, skewed, tmp_path: Path
) -> None:
    script("h.sh", SLOW.format(dir=tmp_path))
    config = limited_config(write_config)
    ran = tmp_path / "ran"
    ahead = skewed(config, +300)
    r.xadd("jobd:q", {"payload": "a"})
    r.xadd("jobd:q", {"payload": "b"})
    wait_until(lambda: len(lines(ran)) == 2 and bound(r) == 2, what="a and b running")
    other = daemon(config)
    r.xadd("jobd:q", {"payload": "c"})
    wait_until(lambda: refused(r, other, ran), what="the other daemon to ask for a slot")
    assert sorted(lines(ran)) == ["a", "b"]
    scores, now = slot_scores(r), redis_ms(r)
    kill_with_handlers(ahead)
    # Its slots expire within its lease (2 s), not 5 minutes later: the other daemon takes two
    # of a, b, c.
    wait_until(lambda: len(lines(ran)) == 4, timeout=15, what="the other daemon taking over")
    assert max(scores) <= now + 2000 + 1000, "its slots expired 5 minutes in the future"


# -- aging -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "starvation_after", "low_age_ms", "first"),
    [
        (+300, "1m", 0, "high0"),  # a fresh low job has not waited 1 minute, whatever the host
        (-300, "1s", 5000, "low-old"),  # a 5 s old one has waited 1 s, whatever the host
    ],
)
def test_aging_counts_the_wait_by_redis_clock(
    r: redis.Redis, write_config, script, skewed, tmp_path: Path,
    offset: int, starvation_after: str, low_age_ms: int, first: str,
) -> None:  # fmt: skip
    script("h.sh", f"#!/bin/sh\necho $(cat) >> {tmp_path}/starts\nsleep 0.1\n")
    config = write_config(
        queue_config(
            "[./h.sh]", concurrency=1, priorities="[high, low]",
            starvation_after=starvation_after,
        )
    )  # fmt: skip
    born = redis_ms(r) - low_age_ms
    r.xadd("jobd:q", {"payload": "low-old" if low_age_ms else "low-new"}, id=f"{born}-0")
    for i in range(3):
        r.xadd("{jobd:q}:priority:high", {"payload": f"high{i}"})
    skewed(config, offset)
    wait_until(lambda: len(lines(tmp_path / "starts")) == 4, what="every job")
    assert lines(tmp_path / "starts")[0] == first
