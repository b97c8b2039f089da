"""Periodic jobs across restarts, reloads and skewed clocks; retention behind pending entries
(issue 16: defects 4, 7 and 14). Real redis-servers and real daemons.

A daemon whose clock is off runs under libfaketime (``support.skewed``). Hours pass without
waiting for them with ``Clock``: Redis must follow too (its expiries), and libfaketime (Debian's
0.9.10 and python-libfaketime's build alike) stops redis-server 7 at startup ("Unexpected
recursive calls to clock_gettime()"), so a tiny LD_PRELOAD library, compiled here, adds a
shared, movable offset to CLOCK_REALTIME, gettimeofday and time() of the processes started
with it. Monotonic clocks stay real, so sleeps, timeouts and polls are real.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import (
    DaemonProcess,
    RedisServer,
    jobd_cli,
    paused_behind_hostile,
    queue_config,
    skewed,
    wait_group,
    wait_until,
)

from jobd.config import load
from jobd.daemon import retention
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]

SHIFT_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* The wall clock plus the int64 nanoseconds in the file $JOBD_TEST_CLOCK_SHIFT, read through a
   shared mapping on every call, so the test moves every process's clock at once. */
static int64_t no_shift;
static volatile int64_t *shift;

static int64_t shift_ns(void) {
    if (!shift) {
        const char *path = getenv("JOBD_TEST_CLOCK_SHIFT");
        int fd = path ? open(path, O_RDONLY) : -1;
        void *p = fd < 0 ? MAP_FAILED : mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
        if (fd >= 0) close(fd);
        shift = p == MAP_FAILED ? &no_shift : p;
    }
    return *shift;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + shift_ns();
        ts->tv_sec = ns / 1000000000;
        ts->tv_nsec = ns % 1000000000;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    clock_gettime(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


class Clock:
    """A wall clock shifted for the processes started with ``env()``; the test's own is real."""

    def __init__(self, library: Path, path: Path) -> None:
        self.library, self.path = library, path
        self.shift = 0.0
        path.write_bytes(struct.pack("q", 0))

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "JOBD_TEST_CLOCK_SHIFT": str(self.path)}

    def now(self) -> float:
        return time.time() + self.shift

    def set(self, moment: float) -> None:
        """Every shifted process's clock reads ``moment`` now, and runs on from there."""
        self.shift = moment - time.time()
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, struct.pack("q", int(self.shift * 1e9)), 0)
        finally:
            os.close(fd)


@pytest.fixture(scope="session")
def shift_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the clock-shifting library")
    folder = tmp_path_factory.mktemp("clock")
    (folder / "shift.c").write_text(SHIFT_SOURCE)
    library = folder / "libshift.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(folder / "shift.c"), "-ldl"],
        check=True,
    )
    return library


@pytest.fixture
def clock(shift_library: Path, tmp_path: Path) -> Clock:
    return Clock(shift_library, tmp_path / "clock-shift")


def start_shifted(server: RedisServer, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        for name, value in clock.env().items():
            m.setenv(name, value)
        server.start()


@pytest.fixture
def shifted_redis(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RedisServer]:
    """A redis-server of this test's own on the shifted clock (its expiries and TIME follow
    it), with an append-only file so that it can be restarted without losing a write."""
    server = RedisServer(tmp_path / "redis", ("--appendonly", "yes", "--appendfsync", "always"))
    start_shifted(server, clock, monkeypatch)
    yield server
    server.stop()


# -- periodic jobs -----------------------------------------------------------------------------

DAY = "2031-06-01"


def at(hms: str) -> float:
    return datetime.datetime.fromisoformat(f"{DAY}T{hms}+00:00").timestamp()


def tick_ids(client: redis.Redis, schedule: str) -> list[str]:
    ids = [f.get(b"job_id", b"").decode() for _, f in client.xrange("jobd:q")]
    return [i for i in ids if i.startswith(f"{schedule}@")]


def tick_seconds(client: redis.Redis, schedule: str) -> list[int]:
    """The tick times (Unix seconds) of the schedule's jobs, as their ids say."""
    return sorted(
        int(datetime.datetime.strptime(i.split("@")[1], "%Y-%m-%dT%H:%M:%S%z").timestamp())
        for i in tick_ids(client, schedule)
    )


def beat_since(client: redis.Redis, moment: float) -> bool:
    """Whether the every-second schedule has a tick at ``moment`` or later: the daemon has
    evaluated its schedules since then (the hourly one first, being listed first)."""
    seconds = tick_seconds(client, "beat")
    return bool(seconds) and seconds[-1] >= moment


def hourly_config(url: str) -> str:
    return (
        "redis: {url: 'URL'}\nqueues:\n  q:\n    command: [/bin/true]\n    schedule:\n"
        "      - {cron: '0 * * * *', name: hourly, catch_up: 1m}\n"
        "      - {cron: '* * * * * *', name: beat, catch_up: 1s}\n"
    ).replace("URL", url)


def run_until_the_11_oclock_tick(
    clock: Clock, server: RedisServer, write_config, daemon: Daemon
) -> tuple[redis.Redis, Path, DaemonProcess]:
    """A daemon on the shifted clock, moved to just before 11:00; returns once 11:00 is in."""
    client = redis.Redis(port=server.port)
    config = write_config(hourly_config(server.url))
    clock.set(at("10:50:00"))
    d = daemon(config, env=clock.env())
    clock.set(at("10:59:58"))
    wait_until(lambda: tick_ids(client, "hourly"), what="the 11:00 tick")
    assert tick_ids(client, "hourly") == [f"hourly@{DAY}T11:00:00Z"]
    return client, config, d


def test_a_restart_within_catch_up_enqueues_the_hourly_tick_due_while_no_daemon_ran(
    clock: Clock, shifted_redis: RedisServer, write_config, daemon: Daemon
) -> None:
    client, config, d = run_until_the_11_oclock_tick(clock, shifted_redis, write_config, daemon)
    assert d.stop() == 0
    stopped = clock.now()
    clock.set(at("12:00:15"))  # the daemon was down over 12:00; back within catch_up (1m)
    restarted = clock.now()
    again = daemon(config, env=clock.env())
    wait_until(lambda: beat_since(client, restarted), what="a tick after the restart")
    assert tick_ids(client, "hourly") == [f"hourly@{DAY}T11:00:00Z", f"hourly@{DAY}T12:00:00Z"]
    assert client.ttl("{jobd:q}:schedule:hourly") == -1, "kept however long the interval"
    # The every-second schedule's catch_up is 1s: the hour of ticks it missed stays missed.
    assert not [t for t in tick_seconds(client, "beat") if stopped < t < restarted - 2]
    # Said by the duty that enqueues the ticks, maybe after the tick the wait above saw.
    again.wait_log("older than catch_up (1s) on Redis's clock not enqueued")


def test_a_reload_enqueues_the_hourly_tick_missed_while_redis_was_away(
    clock: Clock,
    shifted_redis: RedisServer,
    write_config,
    daemon: Daemon,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, _, d = run_until_the_11_oclock_tick(clock, shifted_redis, write_config, daemon)
    shifted_redis.stop()  # away over 12:00, so this daemon cannot enqueue that tick itself
    clock.set(at("12:00:15"))
    d.signal(signal.SIGHUP)
    d.wait_log("reload done")
    reloaded = clock.now()
    start_shifted(shifted_redis, clock, monkeypatch)
    wait_until(lambda: beat_since(client, reloaded), what="a tick after the reload")
    assert tick_ids(client, "hourly") == [f"hourly@{DAY}T11:00:00Z", f"hourly@{DAY}T12:00:00Z"]


def test_a_running_daemon_enqueues_every_tick_even_with_a_catch_up_of_1ms(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    """catch_up bounds what a starting daemon catches up, not the ticks due while it runs: each
    is checked up to 0.2 s after it is due (later behind a slow duty). Bounding live ticks by
    catch_up enqueued one only when a check happened to fall within 1 ms after it."""
    config = write_config(
        queue_config("[/bin/true]", schedule="[{cron: '* * * * * *', name: beat, catch_up: 1ms}]")
    )
    daemon(config)
    wait_until(lambda: len(tick_ids(r, "beat")) >= 3, 10, "three ticks")
    seconds = tick_seconds(r, "beat")
    assert seconds == list(range(seconds[0], seconds[-1] + 1)), f"a tick skipped: {seconds}"


def test_two_daemons_with_clocks_30s_apart_enqueue_each_tick_once(
    r: redis.Redis, write_config, daemon: Daemon
) -> None:
    config = write_config(
        queue_config("[/bin/true]", schedule="[{cron: '* * * * * *', name: beat, catch_up: 20s}]")
    )
    behind = daemon(config)  # on the true clock, as Redis is
    wait_until(lambda: len(tick_ids(r, "beat")) >= 2, what="two ticks")
    # The behind one stops; the ahead one starts at once: it thinks the last tick enqueued is
    # 31 s old, more than catch_up, but on Redis's clock it is 1 s old: nothing may be skipped.
    assert behind.stop() == 0
    stopped = time.time()
    daemon(config, env=skewed("+30s"))
    wait_until(lambda: tick_seconds(r, "beat")[-1] >= stopped + 30, what="the ahead daemon's ticks")
    # The behind one starts again: the latest tick enqueued is 30 s ahead of its clock, and it
    # must enqueue none of the ticks it reaches (the ahead daemon has).
    again = daemon(config)
    restarted = time.time()
    wait_until(lambda: time.time() > restarted + 3, what="three ticks with both daemons")
    ids, seconds = tick_ids(r, "beat"), tick_seconds(r, "beat")
    assert len(ids) == len(set(ids)), f"a tick enqueued twice: {sorted(ids)}"
    assert seconds == list(range(seconds[0], seconds[-1] + 1)), f"a tick skipped: {seconds}"
    assert "enqueued for its tick" not in again.log()


# -- retention -----------------------------------------------------------------------------------


def test_retention_deletes_acked_entries_behind_1500_pending_ones(
    r: redis.Redis, write_config
) -> None:
    """Another group on the queue's stream (a queue of the config reading it with group
    'analytics', or another application: trim.lua reads every group) holds the first 1500
    entries pending: more than one trim call can look at, so
    a walk that starts at the stream's start each time never gets past. The daemon's trimmer,
    a tick at a time (each up to MAX_CALLS_PER_TICK calls)."""
    r.xgroup_create("jobd:q", "analytics", id="0", mkstream=True)
    pipe = r.pipeline()
    for i in range(6200):
        pipe.xadd("jobd:q", {"payload": str(i)})
    ids = pipe.execute()
    r.xreadgroup("analytics", "a1", {"jobd:q": ">"}, count=6200)
    r.xack("jobd:q", "analytics", *ids[1500:])
    undelivered = [r.xadd("jobd:q", {"payload": "later"}) for _ in range(10)]
    r.xgroup_create("jobd:q", "jobd", id="$")  # jobd's own group has nothing left to run
    config = load(str(write_config(queue_config("[/bin/true]", retention="{maxlen: 100}"))))
    store = Store(r)
    trimmer = retention.Trimmer(store, config.queues["q"], 100)
    # and the last entry analytics read: never XDELed while a group's last delivered (review 36o)
    must_stay = [*ids[:1500], ids[-1], *undelivered]

    def ticks_until(length: int) -> None:
        for _ in range(100):
            trimmer.tick()
            if r.xlen("jobd:q") == length:
                return
        pytest.fail(f"{r.xlen('jobd:q')} entries left after 100 ticks, expected {length}")

    ticks_until(len(must_stay))
    assert [mid for mid, _ in r.xrange("jobd:q")] == must_stay
    r.xack("jobd:q", "analytics", *ids[:1500])
    ticks_until(100)
    assert [mid for mid, _ in r.xrange("jobd:q")][-10:] == undelivered


def _acked_stream(r: redis.Redis, entries: int) -> None:
    """Group jobd on jobd:q, every one of ``entries`` entries delivered and acknowledged."""
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for i in range(entries):
        r.xadd("jobd:q", {"payload": str(i)})
    r.xreadgroup("jobd", "c", {"jobd:q": ">"})
    r.xack("jobd:q", "jobd", *[mid for mid, _ in r.xrange("jobd:q")])


def test_retention_trims_a_stream_with_another_applications_group_as_far_as_it_has_read(
    r: redis.Redis, write_config
) -> None:
    """Another application's group on the queue's stream (the config does not name it): the
    script reads every group on the stream (XINFO GROUPS), so the stream is trimmed as far as
    that group has read, nothing it has pending nor what it has not been delivered yet. (Until
    issue 36's threat model the script read only the groups it was given, and the daemon read
    the others from its client; docs/security.md: groups are consumer-role data.)"""
    _acked_stream(r, 20)
    r.xgroup_create("jobd:q", "audit", id="0")
    audit = r.xreadgroup("audit", "a", {"jobd:q": ">"}, count=12)[0][1]
    r.xack("jobd:q", "audit", *[mid for mid, _ in audit[:8]])  # 8-11 pending, 12-19 not read
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    ids = [mid for mid, _ in r.xrange("jobd:q")]
    trimmer = retention.Trimmer(Store(r), queue, 5)
    trimmer.tick()
    trimmer.tick()
    assert [mid for mid, _ in r.xrange("jobd:q")] == ids[8:]
    r.xreadgroup("audit", "a", {"jobd:q": ">"})
    r.xack("jobd:q", "audit", *ids[8:])  # all read and acknowledged
    trimmer.tick()
    assert [mid for mid, _ in r.xrange("jobd:q")] == ids[15:]


def test_retention_trims_as_far_as_a_group_made_between_two_ticks_has_read(
    r: redis.Redis, write_config
) -> None:
    """A group made after a tick (here from the stream's start: nothing delivered to it yet)
    bounds the next: each call reads the groups there are then. (Until issue 36's threat
    model, the daemon read foreign groups between calls, and a group made between that read and
    the script skipped the tick.)"""
    _acked_stream(r, 20)
    r.xgroup_create("jobd:q", "audit", id="$")
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    trimmer = retention.Trimmer(Store(r), queue, 5)
    trimmer.tick()
    assert r.xlen("jobd:q") == 5
    for i in range(10):
        r.xadd("jobd:q", {"payload": f"more {i}"})
    r.xreadgroup("jobd", "c", {"jobd:q": ">"})
    r.xack("jobd:q", "jobd", *[mid for mid, _ in r.xrange("jobd:q")])
    r.xreadgroup("audit", "a", {"jobd:q": ">"})
    r.xack("jobd:q", "audit", *[mid for mid, _ in r.xrange("jobd:q")])
    r.xgroup_create("jobd:q", "late", id="0")
    trimmer.tick()
    assert r.xlen("jobd:q") == 15, "trimmed what the late group has not been delivered"
    r.xreadgroup("late", "l", {"jobd:q": ">"})
    r.xack("jobd:q", "late", *[mid for mid, _ in r.xrange("jobd:q")])
    trimmer.tick()
    assert r.xlen("jobd:q") == 5


def test_retention_trims_a_stream_with_a_long_named_or_many_foreign_groups_as_far_as_they_read(
    r: redis.Redis, write_config
) -> None:
    """A foreign group's name of 1 MiB, and 17 more foreign groups (until issue 36's threat
    model: a name over 256 bytes or more than 16 such groups, and the stream was not trimmed at
    all): all read by the script (XINFO GROUPS; groups are consumer-role data, docs/security.md,
    read whatever their names' length), and the stream is trimmed as far as every group has
    read: nothing the long-named group has pending or not yet been delivered."""
    _acked_stream(r, 20)
    ids = [mid for mid, _ in r.xrange("jobd:q")]
    long_name = b"g" * (1 << 20)
    r.xgroup_create("jobd:q", long_name, id="0")
    r.xgroup_create("jobd:q", "audit", id="$")
    r.xreadgroup(long_name, "c", {"jobd:q": ">"}, count=3)  # 0-2 pending, 3-19 not delivered
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    trimmer = retention.Trimmer(Store(r), queue, 5)
    trimmer.tick()
    assert r.xlen("jobd:q") == 20
    r.xack("jobd:q", long_name, ids[0], ids[1])
    trimmer.tick()
    assert [mid for mid, _ in r.xrange("jobd:q")] == ids[2:]
    r.xreadgroup(long_name, "c", {"jobd:q": ">"})
    r.xack("jobd:q", long_name, *ids)
    trimmer.tick()
    assert r.xlen("jobd:q") == 5
    for i in range(17):
        r.xgroup_create("jobd:q", f"many-{i}", id="$")
    more = r.xadd("jobd:q", {"payload": "more"})  # delivered to no group: kept
    trimmer.tick()
    assert [mid for mid, _ in r.xrange("jobd:q")] == [*ids[16:], more]


def test_trim_calls_walk_past_any_pending_head_and_start_again_at_the_end(
    r: redis.Redis, write_config
) -> None:
    """Group jobd (the queue's own: without it nothing is trimmed): entries 0-1199 pending,
    then every 7th of 1200-2499, 2500-2999 undelivered; group b (another queue's of the
    config): two others pending. Calls of
    100 at most remove every other entry below 2500."""
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    store = Store(r)
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    r.xgroup_create("jobd:q", "b", id="0")
    pipe = r.pipeline()
    for i in range(3000):
        pipe.xadd("jobd:q", {"payload": str(i)})
    ids = pipe.execute()
    r.xreadgroup("jobd", "a1", {"jobd:q": ">"}, count=2500)
    a_pending = set(ids[:1200]) | {ids[i] for i in range(1200, 2500, 7)}
    r.xack("jobd:q", "jobd", *(set(ids[:2500]) - a_pending))
    r.xreadgroup("b", "b1", {"jobd:q": ">"}, count=3000)
    b_pending = {ids[1501], ids[2222]}
    r.xack("jobd:q", "b", *(set(ids) - b_pending))
    r.set("{jobd:q}:trim", "not an id")  # a cursor another client garbled: ignored
    # ids[2499], jobd's last delivered: kept while it is (review 36o: no tombstone at it)
    must_stay = a_pending | b_pending | set(ids[2499:])

    def converge(expected: set[bytes]) -> None:
        for _ in range(100):
            removed, _more = store.trim(queue, 10, 100)
            assert removed <= 100
            left = {mid for mid, _ in r.xrange("jobd:q")}
            assert must_stay <= left, "a pending or undelivered entry was removed"
            if left == expected:
                return
        pytest.fail(f"{len(left)} entries left after 100 calls, expected {len(expected)}")

    converge(must_stay)
    # Jobs at the head and further on finish: the next walks, from the start again, find them.
    done = {ids[5], ids[1207], ids[2002]}
    r.xack("jobd:q", "jobd", *done)
    must_stay -= done
    converge(must_stay)


# -- stream ids past 2**53 (review 3 of issue 32) ------------------------------------------------

# A producer may add an entry with an explicit id of any sequence up to 2**64 - 1; XADD * then
# goes on from it. trim.lua must neither compare nor step such ids as Lua numbers (doubles).
HOSTILE_RETENTION = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
defaults:
  command: [/bin/sh, -c, 'echo "$JOBD_JOB_ID" >> {ran}']
  lease: {{renew_every: 200ms, reclaim_after: 1s}}
queues:
  q: {{concurrency: 2, retention: {{maxlen: 1}}}}
"""


def ran_jobs(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran"
    return path.read_text().splitlines() if path.exists() else []


def run_cli(*args: str) -> None:
    done = jobd_cli(*args)
    assert done.returncode == 0, done.stderr


def test_retention_trims_a_normal_entry_not_yet_delivered_behind_a_hostile_ids_sequence(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """One hostile producer's entry with an explicit id whose sequence is past 2**53 (dated an
    hour ahead) makes every normal XADD * of that hour take the same millisecond and the next
    sequence. trim.lua stepped and compared ids as Lua doubles: after(last delivered) rounded
    up past the next, undelivered entry, so retention removed it, never delivered, never run and
    never dead-lettered (here the queue is paused: a backlog does the same)."""
    config = write_config(HOSTILE_RETENTION.format(ran=tmp_path / "ran"))
    d = daemon(config)
    victim = paused_behind_hostile(r, d, config, 2**53 + 2)  # victim: a normal producer's
    wait_until(lambda: r.xlen("jobd:q") <= 1, what="the trimmer to bring the stream to maxlen")
    assert r.xrange("jobd:q", victim, victim), "an entry never delivered was trimmed"
    run_cli("resume", "-c", str(config), "q")
    wait_until(lambda: "victim" in ran_jobs(tmp_path), what="the victim to run once resumed")


def test_retention_goes_on_behind_an_entry_whose_id_sequence_is_the_largest(
    r: redis.Redis, write_config
) -> None:
    """An entry with the id sequence 2**64 - 1 delivered and acknowledged: trim.lua formatted
    its sequence + 1 with %d (out of range), then failed on every call, and retention stopped
    for the stream. Every entry up to it goes; the one not delivered after it stays."""
    queue = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    older = [r.xadd("jobd:q", {"payload": str(i)}) for i in range(5)]
    ahead = int(time.time() * 1000) + 3_600_000
    hostile = r.xadd("jobd:q", {"payload": "x"}, id=f"{ahead}-{2**64 - 1}")
    r.xreadgroup("jobd", "c", {"jobd:q": ">"}, count=10)
    r.xack("jobd:q", "jobd", *older, hostile)
    waiting = r.xadd("jobd:q", {"payload": "waiting"})  # XADD * after it: the next millisecond
    assert waiting == f"{ahead + 1}-0".encode()
    assert Store(r).trim(queue, 1, 100) == (6, False)  # the hostile one was acknowledged too
    assert [mid for mid, _ in r.xrange("jobd:q")] == [waiting]


# -- jobd's group missing (review 5 of issue 32) -------------------------------------------------


def test_retention_never_trims_waiting_jobs_while_jobds_group_is_missing(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    """Retention's promise: never an entry not yet delivered, whichever application's group.
    Another application's group on the queue's stream ('audit', which has read everything),
    the queue paused with five jobs waiting, and jobd's group gone (XGROUP DESTROY; the reader
    makes it again, from the stream's start, at its next read: none while paused). trim.lua
    took the groups it found as all there are: 'audit' had had every entry, so they went (the
    daemon's trimmer within a second; here a call of its own, not to wait on a race), and on
    resume the group made again found nothing to run."""
    config = write_config(HOSTILE_RETENTION.format(ran=tmp_path / "ran"))
    run_cli("pause", "-c", str(config), "q")
    daemon(config)
    wait_group(r, "jobd:q")
    ids = [r.xadd("jobd:q", {"payload": "x"}).decode() for _ in range(5)]
    r.xgroup_create("jobd:q", "audit", id="0")
    r.xreadgroup("audit", "a", {"jobd:q": ">"})
    r.xack("jobd:q", "audit", *ids)
    r.xgroup_destroy("jobd:q", "jobd")
    queue = load(str(config)).queues["q"]
    assert Store(r).trim(queue, 1, 100) == (0, False)  # what the daemon's trimmer calls
    assert r.xlen("jobd:q") == 5, "waiting jobs were trimmed"
    run_cli("resume", "-c", str(config), "q")
    wait_until(lambda: sorted(ran_jobs(tmp_path)) == sorted(ids), what="all five jobs to run")
