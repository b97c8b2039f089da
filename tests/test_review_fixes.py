"""Review 16's findings F6, F7, F10, F11 and F12, each against a real redis-server: a shared
dead-letter stream is refused; a delay counts from Redis's clock and an absolute time is
judged by it; a periodic schedule survives its state key holding another type, and a failing
duty does not flood the log; retention survives a garbage cursor; a malformed delayed member
that cannot be dead-lettered does not block the jobs behind it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from support import jobd_cli, queue_config, skewed, wait_until

from jobd import exitcodes
from jobd.config import ConfigError, QueueConfig, load
from jobd.daemon import delayed, duties
from jobd.store.keys import UNIQUE_TTL
from jobd.store.scripts import Scripts
from jobd.store.store import Store

STREAM = "jobd:q"
DELAYED = "{jobd:q}:delayed"
DEAD = "{jobd:q}:dead"
TEN_MINUTES_MS = 600_000
SLACK_MS = 5_000  # a subprocess start and a round trip, with room to spare on a busy host


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def due_times(r: redis.Redis, queue: QueueConfig) -> dict[bytes, int]:
    """Each waiting job's due time (Unix ms), by job id."""
    return {w.fields[b"job_id"]: w.due_ms for w in Store(r).delayed_list(queue)}


@pytest.fixture
def config(write_config) -> Path:
    return write_config(queue_config("[/bin/true]"))


@pytest.fixture
def queue(config: Path) -> QueueConfig:
    return load(str(config)).queues["q"]


# -- F6: one dead-letter stream for two queues ------------------------------------------------


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(str(path), {"PATH": os.environ["PATH"]})
    return [p.format("f") for p in info.value.problems]


SHARED = """\
queues:
  invoices:
    stream: inv
    command: [/bin/true]
    dead_letter: {stream: shared-dead}
  purge_user:
    stream: purge
    command: [/bin/true]
    dead_letter: {stream: shared-dead}
"""


def test_a_dead_letter_stream_named_by_two_queues_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobd.yaml"
    path.write_text(SHARED)
    [line] = problems(path)
    assert line.startswith(
        "f:9:27: error: queues.purge_user.dead_letter.stream: the dead-letter stream "
        "'shared-dead' is queue 'invoices''s too;"
    )
    assert "requeue the other's jobs" in line and "e.g. '{purge}:dead' (the default)" in line
    run = jobd_cli("validate", "-c", str(path))
    assert run.returncode == exitcodes.CONFIG
    assert f"{path}:9:27: error: queues.purge_user.dead_letter.stream" in run.stdout.decode()


def test_a_dead_letter_stream_shared_through_defaults_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobd.yaml"
    path.write_text(
        "defaults:\n  dead_letter: {stream: all-dead}\nqueues:\n"
        "  a: {stream: a, command: [/bin/true]}\n  b: {stream: b, command: [/bin/true]}\n"
    )
    [line] = problems(path)
    assert line.startswith("f:2:25: error: queues.b.dead_letter.stream: ")
    assert "queue 'a''s too (value set in defaults);" in line


def test_a_queues_default_dead_letter_stream_named_by_another_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobd.yaml"
    path.write_text(
        "queues:\n  a: {stream: a, command: [/bin/true], dead_letter: {stream: '{b}:dead'}}\n"
        "  b: {stream: b, command: [/bin/true]}\n"
    )
    [line] = problems(path)
    assert line.startswith("f:3:3: error: queues.b.dead_letter.stream: ")
    assert line.endswith("name another for queue 'a'")


def test_two_groups_on_one_stream_may_still_share_its_dead_letters(tmp_path: Path) -> None:
    path = tmp_path / "jobd.yaml"
    path.write_text(
        "queues:\n  a: {stream: s, command: [/bin/true]}\n"
        "  b: {stream: s, group: g2, command: [/bin/true]}\n"
    )
    cfg = load(str(path), {"PATH": os.environ["PATH"]})
    assert cfg.queues["a"].dead_letter.stream == cfg.queues["b"].dead_letter.stream


# -- F7: --delay and --at on Redis's clock ----------------------------------------------------

PRODUCE = """
import sys
from jobd import producer
from jobd.config import load
config, job_id, delay, unique = sys.argv[1:]
print(producer.enqueue(load(config), "q", b"x", job_id=job_id, delay=float(delay),
                       unique=unique == "unique"))
"""


def produce(config: Path, offset: str, job_id: str, delay: float, unique: bool = False) -> None:
    """producer.enqueue(delay=...) in a process whose wall clock is ``offset`` off."""
    argv = [
        sys.executable,
        "-c",
        PRODUCE,
        str(config),
        job_id,
        str(delay),
        str(unique and "unique"),
    ]
    run = subprocess.run(
        argv, capture_output=True, timeout=60, env={**os.environ, **skewed(offset)}
    )
    assert run.returncode == 0, run.stderr.decode()


@pytest.mark.parametrize("offset", ["+1h", "-1h"])
def test_a_delay_counts_from_redis_clock_not_the_producers(
    r: redis.Redis, config: Path, queue: QueueConfig, offset: str
) -> None:
    before = redis_ms(r)
    produce(config, offset, "later", 600)
    due = due_times(r, queue)[b"later"]
    assert before + TEN_MINUTES_MS <= due <= redis_ms(r) + TEN_MINUTES_MS
    assert r.xlen(STREAM) == 0


def test_cli_delay_counts_from_redis_clock_on_a_host_an_hour_ahead(
    r: redis.Redis, config: Path, queue: QueueConfig
) -> None:
    before = redis_ms(r)
    run = jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "d", "--delay", "10m",
                   env=skewed("+1h"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert before + TEN_MINUTES_MS <= due_times(r, queue)[b"d"] <= redis_ms(r) + TEN_MINUTES_MS


def test_cli_at_in_the_future_waits_on_a_host_whose_clock_is_past_it(
    r: redis.Redis, config: Path, queue: QueueConfig
) -> None:
    at = r.time()[0] + 600  # ten minutes ahead for Redis; fifty minutes ago for this host
    run = jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "a", "--at", str(at),
                   env=skewed("+1h"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert r.xlen(STREAM) == 0, "a job due in ten minutes ran now"
    assert due_times(r, queue) == {b"a": at * 1000}


def test_cli_at_in_the_past_goes_to_the_stream_now_on_a_host_whose_clock_is_before_it(
    r: redis.Redis, config: Path
) -> None:
    at = r.time()[0] - 600  # ten minutes ago for Redis; fifty minutes ahead for this host
    run = jobd_cli("enqueue", "-c", str(config), "q", "x", "--at", str(at), env=skewed("-1h"))
    assert run.returncode == 0, run.stderr
    assert r.zcard(DELAYED) == 0, "a job already due waits in the delayed set"
    [(_, fields)] = r.xrange(STREAM)
    assert fields[b"job_id"] == run.stdout.strip() and len(fields[b"job_id"]) == 32


def test_a_unique_jobs_due_time_and_mark_count_from_redis_clock(
    r: redis.Redis, config: Path, queue: QueueConfig
) -> None:
    before = redis_ms(r)
    produce(config, "+1h", "u-delay", 600, unique=True)
    at = r.time()[0] + 600
    run = jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "u-at", "--unique",
                   "--at", str(at), env=skewed("+1h"))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert r.xlen(STREAM) == 0
    due = due_times(r, queue)
    assert before + TEN_MINUTES_MS <= due[b"u-delay"] <= redis_ms(r) + TEN_MINUTES_MS
    assert due[b"u-at"] == at * 1000
    # The marks were set since ``before``: their time to live is down by that much at most
    # (a fixed slack failed on a loaded machine, where the skewed CLIs took long to start).
    mark_ms, elapsed = UNIQUE_TTL * 1000 + TEN_MINUTES_MS, redis_ms(r) - before
    for job_id in ("u-delay", "u-at"):
        assert mark_ms - elapsed - SLACK_MS < r.pttl("{jobd:q}:job:" + job_id) <= mark_ms


def test_schedule_lua_takes_a_delay_and_keeps_its_absolute_form(r: redis.Redis) -> None:
    scripts = Scripts(r)
    before = redis_ms(r)
    assert scripts.schedule(keys=[DELAYED], args=["+600000", "t1", "job_id", "rel"]) == 1
    assert scripts.schedule(keys=[DELAYED], args=[1000, "t2", "job_id", "abs"]) == 1
    scores = {m[-3:]: s for m, s in r.zrange(DELAYED, 0, -1, withscores=True)}
    assert before + TEN_MINUTES_MS <= scores[b"rel"] <= redis_ms(r) + TEN_MINUTES_MS
    assert scores[b"abs"] == 1000, "without the stream key, a past time still waits in the set"
    for due in (1000, "+0"):
        entry = scripts.schedule(keys=[DELAYED, STREAM], args=[due, "t", "job_id", "now"])
        assert r.xrange(STREAM)[-1] == (entry, {b"job_id": b"now"})
    with pytest.raises(redis.ResponseError, match="the due time must be"):
        scripts.schedule(keys=[DELAYED, STREAM], args=["soon", "t", "job_id", "x"])
    assert r.zcard(DELAYED) == 2 and r.xlen(STREAM) == 2


# -- F10: a periodic schedule's state key of another type; a failing duty's log ---------------

EVERY_SECOND = "[{cron: '* * * * * *', name: every}]"


def test_a_schedule_whose_state_key_holds_another_type_runs_anyway(
    r: redis.Redis, write_config, daemon
) -> None:
    last = "{jobd:q}:schedule:every"
    r.hset(last, "x", "y")
    d = daemon(write_config(queue_config("[/bin/true]", schedule=EVERY_SECOND)))
    wait_until(lambda: r.xlen(STREAM) >= 2, 20, "two periodic jobs enqueued")
    assert r.type(last) == b"string"
    assert "Traceback" not in d.log()


def test_tick_lua_overwrites_a_latest_tick_of_another_type(r: redis.Redis) -> None:
    last, tick = "{jobd:q}:schedule:every", "{jobd:q}:tick:every:100"
    r.rpush(last, "x")
    reply = Scripts(r).tick(
        keys=[STREAM, tick, last], args=[60_000, 100, -1, "payload", "x", "job_id", "every@100"]
    )
    assert reply[0] == b"added" and r.xlen(STREAM) == 1
    assert r.get(last) == b"100"


@dataclass
class ReadsAString:
    """A duty that reads ``key`` as a string: it fails while the key holds another type."""

    r: redis.Redis
    key: str
    name: str = "reading a string"
    interval: float = 0.2

    def tick(self) -> None:
        self.r.get(self.key)


def duty_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [rec for rec in caplog.records if rec.name == "jobd.duties"]


def test_a_duty_failing_the_same_way_logs_once_until_it_changes_or_recovers(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "jobd.duties")
    r.hset("k", "x", "y")
    ticker = duties.Ticker([ReadsAString(r, "k")])
    for n in range(50):  # ten seconds of ticks
        ticker.run_due(float(n))
    [first] = duty_records(caplog)
    assert first.exc_info and "WRONGTYPE" in str(first.exc_info[1])
    r.delete("k")
    r.rpush("k", "x")  # the same error again: not logged again
    ticker.run_due(50.0)
    assert len(duty_records(caplog)) == 1
    r.delete("k")
    ticker.run_due(51.0)
    recovered = duty_records(caplog)[-1]
    assert recovered.levelno == logging.INFO
    assert "works again, after failing 51 time(s)" in recovered.getMessage()


def test_a_duty_failing_for_long_is_logged_now_and_then_without_its_traceback(
    r: redis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(duties, "REPEAT_LOG_EVERY", 0.0, raising=False)  # every repeat is due
    r.hset("k", "x", "y")
    ticker = duties.Ticker([ReadsAString(r, "k")])
    for n in range(3):
        ticker.run_due(float(n))
    records = duty_records(caplog)
    assert [bool(rec.exc_info) for rec in records] == [True, False, False]
    assert "still failing (1 more time(s), 3 in all)" in records[-1].getMessage()


# -- F11: a garbage retention cursor ----------------------------------------------------------

BAD_CURSORS = [b"18446744073709551615-18446744073709551615", b"99999999999999999999-0", "list"]


@pytest.mark.parametrize("bad", BAD_CURSORS, ids=["largest-id", "out-of-range", "a-list"])
def test_retention_deletes_a_garbage_cursor_and_walks_from_the_start(
    r: redis.Redis, write_config, bad: bytes | str
) -> None:
    q = load(str(write_config(queue_config("[/bin/true]", retention="{maxlen: 5}")))).queues["q"]
    r.xgroup_create(STREAM, "jobd", id="0", mkstream=True)
    for _ in range(30):
        r.xadd(STREAM, {"payload": "x"})
    [[_, [(long_running, _)]]] = r.xreadgroup("jobd", "me", {STREAM: ">"}, count=1)
    [[_, rest]] = r.xreadgroup("jobd", "me", {STREAM: ">"}, count=100)
    r.xack(STREAM, "jobd", *[mid for mid, _ in rest])
    cursor = q.keys.trim_cursor()
    r.rpush(cursor, "x") if bad == "list" else r.set(cursor, bad)
    removed, _more = Store(r).trim(q, 5, 1000)
    assert removed == 25 and r.xlen(STREAM) == 5
    assert r.xrange(STREAM)[0][0] == long_running, "the pending entry stays"
    assert r.type(cursor) == b"string" and r.get(cursor) in {m for m, _ in rest}


# -- F12: a malformed delayed member that cannot be dead-lettered ------------------------------


def test_a_malformed_member_that_cannot_be_dead_lettered_does_not_block_the_set(
    r: redis.Redis, queue: QueueConfig
) -> None:
    store = Store(r)
    r.set(DEAD, "not a stream")
    now = redis_ms(r)
    r.zadd(DELAYED, {b"\xc1garbage": now - 5000})  # malformed, due first
    for n in range(2):
        store.schedule(queue, {b"payload": b"retry-%d" % n}, now - 1000 + n)
    forwarder = delayed.Forwarder(store, queue)
    assert forwarder.tick() == 2
    assert [f[b"payload"] for _, f in r.xrange(STREAM)] == [b"retry-0", b"retry-1"]
    [(member, score)] = r.zrange(DELAYED, 0, -1, withscores=True)
    assert member == b"\xc1garbage" and score >= now + 50_000, "held back, not lost"
    store.schedule(queue, {b"payload": b"later"}, redis_ms(r) - 1)
    assert forwarder.tick() == 1, "the held member does not block the jobs behind it"
    # Once the dead-letter stream can be written, the member goes there when its hold ends.
    r.delete(DEAD)
    r.zadd(DELAYED, {member: now - 5000}, xx=True)
    assert forwarder.tick() == 0 and r.zcard(DELAYED) == 0
    [(_, record)] = r.xrange(DEAD)
    assert record[b"jobd_error"] == b"malformed" and record[b"jobd_member"] == member


def test_a_batch_full_of_held_members_ends_and_moves_the_job_behind_it(
    r: redis.Redis, queue: QueueConfig
) -> None:
    store = Store(r)
    r.set(DEAD, "not a stream")
    now = redis_ms(r)
    r.zadd(
        DELAYED, {b"\xc1bad %d" % n: now - 60_000 + n for n in range(delayed.FORWARD_BATCH + 100)}
    )
    store.schedule(queue, {b"payload": b"behind"}, now - 1)
    assert delayed.Forwarder(store, queue).tick() == 1
    assert r.zcard(DELAYED) == delayed.FORWARD_BATCH + 100
