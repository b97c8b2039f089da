"""Per-job limits (issue 19): a producer's ``jobd_timeout``, ``jobd_max_attempts`` and
``jobd_expires_at``, each capped by the queue's own, and the queue's ``max_wait``.

First the parsing and the policy on their own (no Redis), then real `jobd run` daemons against
the session's private Redis: handlers write a file when they run, so "dead-lettered unrun" is
proven by the file, and expiry is checked with daemons whose wall clock is skewed by
libfaketime (``support.skewed``): the decision is on Redis's clock, not the daemon's.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import support
from support import DaemonProcess, queue_config, wait_until
from test_skew import clock_of

from jobd.config import QueueConfig, load
from jobd.job import Job, Limits
from jobd.outcome import EXIT, EXPIRED, MALFORMED, TIMEOUT, Verb
from jobd.process import policy
from jobd.process.handler import ExitStatus

Daemon = Callable[..., DaemonProcess]
STREAM, DEAD = "jobd:q", "{jobd:q}:dead"
NOW = 1_800_000_000.0  # a fixed "now" for the policy's own tests (Unix seconds)
NOW_ID = f"{int(NOW * 1000)}-0"  # an entry added at NOW


# -- parsing -------------------------------------------------------------------------------------


def entry(**fields: str) -> dict[bytes, bytes]:
    return {b"payload": b"x", **{f"jobd_{k}".encode(): v.encode() for k, v in fields.items()}}


@pytest.mark.parametrize(
    ("fields", "limits"),
    [
        ({}, Limits()),
        ({"timeout": "2.5"}, Limits(timeout=2.5)),
        ({"timeout": "30"}, Limits(timeout=30.0)),
        ({"timeout": "1e+06"}, Limits(timeout=1e6)),  # Python's repr, printf %g
        ({"max_attempts": "3"}, Limits(max_attempts=3)),
        ({"expires_at": "1796000000000"}, Limits(expires_at=1_796_000_000.0)),
        (
            {"timeout": "0.5", "max_attempts": "1", "expires_at": "1800000000123"},
            Limits(0.5, 1, 1_800_000_000.123),
        ),
    ],
)
def test_usable_limits_are_read(fields: dict[str, str], limits: Limits) -> None:
    assert Job.from_entry("q", b"1-0", entry(**fields)).limits == limits


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("timeout", "nan"),
        ("timeout", "inf"),
        ("timeout", "-1"),
        ("timeout", "0"),
        ("timeout", "1e999"),  # infinite once read
        ("timeout", " 2"),
        ("timeout", "1_0"),
        ("timeout", "soon"),
        ("timeout", ""),
        ("max_attempts", "0"),
        ("max_attempts", "-3"),
        ("max_attempts", "2.0"),
        ("max_attempts", "9" * 5000),  # int() itself refuses this many digits
        ("expires_at", "1796000000"),  # Unix seconds, not ms: 1970-01-21
        ("expires_at", "0"),
        ("expires_at", "1.7e12"),
        ("expires_at", "99999999999999999"),  # after the year 9999
        ("expires_at", "\xff\x00"),
    ],
)
def test_an_unusable_value_is_ignored_with_one_warning(
    name: str, raw: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger("jobd"), "propagate", True)  # logs.setup turns it off
    with caplog.at_level(logging.WARNING, "jobd.job"):
        job = Job.from_entry("q", b"1-0", entry(**{name: raw}))
    assert job.limits == Limits()
    [warning] = caplog.records
    assert f"ignoring jobd_{name}" in warning.getMessage()
    assert f"jobd_{name}".encode() not in job.next_attempt_fields(), "not carried to a retry"


def test_each_limit_is_capped_by_the_queues(tmp_path: Path) -> None:
    q = queue(tmp_path, "timeout: 10s\n    retry: {max_attempts: 5}")
    own = Job.from_entry("q", b"1-0", entry(timeout="2.5", max_attempts="2"))
    more = Job.from_entry("q", b"1-0", entry(timeout="3600", max_attempts="50"))
    none = Job.from_entry("q", b"1-0", entry())
    assert (own.timeout(q), own.max_attempts(q)) == (2.5, 2)
    assert (more.timeout(q), more.max_attempts(q)) == (10, 5)
    assert (none.timeout(q), none.max_attempts(q)) == (10, 5)


def test_a_retry_carries_the_usable_limits_as_written() -> None:
    job = Job.from_entry(
        "q", b"1-0", entry(timeout="2.50", max_attempts="3", expires_at="1796000000000")
    )
    fields = job.next_attempt_fields()
    assert fields[b"jobd_timeout"] == b"2.50" and fields[b"jobd_max_attempts"] == b"3"
    assert fields[b"jobd_expires_at"] == b"1796000000000" and fields[b"jobd_attempt"] == b"2"
    mixed = Job.from_entry("q", b"1-0", entry(timeout="nan", max_attempts="3"))
    assert b"jobd_timeout" not in mixed.next_attempt_fields()
    assert mixed.next_attempt_fields()[b"jobd_max_attempts"] == b"3"


# -- the policy ----------------------------------------------------------------------------------


def queue(tmp_path: Path, settings: str = "") -> QueueConfig:
    path = tmp_path / "c.yaml"
    extra = f"\n    {settings}" if settings else ""
    path.write_text(f"queues:\n  q:\n    command: [/bin/true]{extra}\n")
    return load(str(path)).queues["q"]


def job_at(message_id: str = NOW_ID, offset: float | None = 0.0, attempt: int = 1,
           **fields: str) -> Job:  # fmt: skip
    """A job read with Redis's clock ``offset`` seconds from this host's (None: unmeasured)."""
    read = Job.from_entry("q", message_id.encode(), entry(**fields))
    return Job(read.queue, read.message_id, read.fields, read.job_id, attempt, read.limits, offset)


def test_an_expired_job_is_refused_on_redis_clock(tmp_path: Path) -> None:
    q = queue(tmp_path)
    expires = str(int(NOW * 1000) + 10_000)  # 10 s after NOW, on Redis's clock
    assert policy.refusal(q, job_at(expires_at=expires), now=NOW + 9) is None
    dead = policy.refusal(q, job_at(expires_at=expires), now=NOW + 10)
    assert dead is not None and (dead.verb, dead.error, dead.attempts) == (
        Verb.DEAD_LETTER,
        EXPIRED,
        0,
    )
    assert b"jobd_expires_at" in dead.detail
    # This host 5 min ahead of Redis: its NOW + 300 is Redis's NOW; 5 min behind, the reverse.
    assert policy.refusal(q, job_at(offset=-300, expires_at=expires), now=NOW + 300) is None
    assert policy.refusal(q, job_at(offset=300, expires_at=expires), now=NOW - 290) is not None
    unmeasured = job_at(offset=None, expires_at=expires)
    assert policy.refusal(q, unmeasured, now=NOW + 3600) is None, "no clock, no expiry: it runs"


def test_max_wait_counts_from_the_entrys_id_on_redis_clock(tmp_path: Path) -> None:
    q = queue(tmp_path, "max_wait: 1m")
    assert q.max_wait == 60
    assert policy.refusal(q, job_at(), now=NOW + 59) is None
    dead = policy.refusal(q, job_at(attempt=3), now=NOW + 61)
    assert dead is not None and (dead.error, dead.attempts) == (EXPIRED, 2), "2 attempts ran"
    assert b"max_wait (60s)" in dead.detail
    assert policy.refusal(q, job_at(offset=-300), now=NOW + 300 + 59) is None, "host ahead"
    assert policy.refusal(q, job_at(offset=300), now=NOW - 300 + 61) is not None, "host behind"
    assert policy.refusal(q, job_at("5-1"), now=NOW) is None, "an id chosen by hand: no time"
    assert policy.refusal(queue(tmp_path), job_at(), now=NOW + 86400) is None, "no max_wait"


def test_malformed_comes_before_expired(tmp_path: Path) -> None:
    q = queue(tmp_path, "max_wait: 1s\n    max_payload: 1")
    dead = policy.refusal(q, job_at(), now=NOW + 60)
    assert dead is not None and dead.error == EXPIRED, "a one-byte payload fits"
    big = Job("q", NOW_ID, {b"payload": b"xx"}, "j", 1, Limits(), 0.0)  # above max_payload
    dead = policy.refusal(q, big, now=NOW + 60)
    assert dead is not None and (dead.error, dead.attempts) == (MALFORMED, 1)


def test_the_jobs_own_max_attempts_decides_retries(tmp_path: Path) -> None:
    q = queue(tmp_path, "retry: {max_attempts: 5, backoff: 1s, jitter: 0}")
    failed = ExitStatus(1, None, False)
    assert policy.decide(q, job_at(max_attempts="1"), failed).verb is Verb.DEAD_LETTER
    assert policy.decide(q, job_at(max_attempts="2"), failed).verb is Verb.RETRY
    assert policy.decide(q, job_at(attempt=2, max_attempts="2"), failed).verb is Verb.DEAD_LETTER
    assert policy.decide(q, job_at(attempt=4, max_attempts="50"), failed).verb is Verb.RETRY
    capped = policy.decide(q, job_at(attempt=5, max_attempts="50"), failed)
    assert (capped.verb, capped.attempts) == (Verb.DEAD_LETTER, 5)


def test_a_retry_that_would_come_after_the_expiry_is_a_dead_letter_of_its_own_failure(
    tmp_path: Path,
) -> None:
    q = queue(tmp_path, "retry: {max_attempts: 5, backoff: 10s, jitter: 0}")
    expires = str(int(NOW * 1000) + 5_000)  # sooner than the 10 s backoff
    timed_out = ExitStatus(None, 15, True)
    job = job_at(offset=NOW - time.time(), expires_at=expires)  # Redis's clock is at NOW
    outcome = policy.decide(q, job, timed_out, detail=b"the stderr tail")
    assert (outcome.verb, outcome.error, outcome.detail) == (
        Verb.DEAD_LETTER,
        TIMEOUT,
        b"the stderr tail",
    )
    later = job_at(offset=NOW - time.time(), expires_at=str(int(NOW * 1000) + 60_000))
    assert policy.decide(q, later, ExitStatus(1, None, False)).verb is Verb.RETRY
    assert policy.decide(q, later, ExitStatus(1, None, False)).error == EXIT


def test_jobd_validate_takes_max_wait_and_points_at_a_bad_one(write_config) -> None:
    good = support.jobd_cli(
        "validate", str(write_config(queue_config("[/bin/true]", max_wait="5m")))
    )
    assert good.returncode == 0, good.stderr
    path = write_config(queue_config("[/bin/true]", max_wait="0"))
    bad = support.jobd_cli("validate", str(path))
    assert bad.returncode == 78
    assert f"{path}:5:15: error: queues.q.max_wait: must be longer than zero" in bad.stdout.decode()


# -- real daemons --------------------------------------------------------------------------------

RECORD = """\
#!/bin/sh
p=$(cat)
echo "$p $JOBD_ATTEMPT $JOBD_DEADLINE $(date +%s)" >> {dir}/ran
{then}
"""


def ran(tmp_path: Path) -> list[list[str]]:
    """Each run of a RECORD handler: payload, attempt, deadline, start (Unix s)."""
    path = tmp_path / "ran"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def payloads(tmp_path: Path) -> list[str]:
    return [run[0] for run in ran(tmp_path)]


def dead_letters(r: redis.Redis) -> dict[str, dict[str, str]]:
    """The dead-letter records by payload."""
    records = r.xrange(DEAD) if r.exists(DEAD) else []
    return {
        f[b"payload"].decode(): {k.decode(): v.decode(errors="replace") for k, v in f.items()}
        for _, f in records
    }


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def test_the_jobs_own_timeout_stops_it_and_a_longer_one_is_capped(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", RECORD.format(dir=tmp_path, then="exec sleep 30"))
    config = write_config(
        queue_config("[./h.sh]", concurrency=2, timeout="2s", kill_grace="1s",
                     retry="{max_attempts: 1}")
    )  # fmt: skip
    d = daemon(config)
    short = r.xadd(STREAM, {"payload": "short", "jobd_timeout": "0.3"}).decode()
    long = r.xadd(STREAM, {"payload": "long", "jobd_timeout": "3600"}).decode()
    wait_until(lambda: len(dead_letters(r)) == 2, what="both dead-lettered")
    dead = dead_letters(r)
    assert dead["short"]["jobd_error"] == dead["long"]["jobd_error"] == TIMEOUT
    log = d.log()  # a handler's timeout is logged before its outcome is written

    def ran_for(job: str) -> float:  # the log says how long it ran when SIGTERMed
        found = re.search(rf"job={job} attempt=1 timed out after ([0-9.]+)s; SIGTERM", log)
        assert found, log
        return float(found.group(1))

    assert 0.3 <= ran_for(short) < 2, "the job's own timeout, before the queue's 2 s"
    assert 2 <= ran_for(long) < 3, "3600 s capped by the queue's 2 s"
    runs = {run[0]: run for run in ran(tmp_path)}
    assert int(runs["short"][2]) - int(runs["short"][3]) in (0, 1), "JOBD_DEADLINE: +0.3 s"
    assert int(runs["long"][2]) - int(runs["long"][3]) in (1, 2, 3), "JOBD_DEADLINE: +2 s"


def test_the_jobs_own_max_attempts_is_carried_by_retries_and_capped(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", RECORD.format(dir=tmp_path, then="exit 1"))
    config = write_config(
        queue_config("[./h.sh]", concurrency=3,
                     retry="{max_attempts: 5, backoff: 50ms, max_backoff: 200ms, jitter: 0}")
    )  # fmt: skip
    daemon(config)
    r.xadd(STREAM, {"payload": "one", "jobd_max_attempts": "1"})
    r.xadd(STREAM, {"payload": "two", "jobd_max_attempts": "2"})
    r.xadd(STREAM, {"payload": "many", "jobd_max_attempts": "50"})
    wait_until(lambda: len(dead_letters(r)) == 3, what="all three dead-lettered")
    assert payloads(tmp_path).count("one") == 1, "the queue allows 5; it asked for 1"
    assert payloads(tmp_path).count("two") == 2, "the retry carried jobd_max_attempts"
    assert payloads(tmp_path).count("many") == 5, "50 capped by the queue's 5"
    dead = dead_letters(r)
    assert [dead[p]["jobd_attempts"] for p in ("one", "two", "many")] == ["1", "2", "5"]
    assert all(dead[p]["jobd_error"] == EXIT for p in dead)


def test_an_expired_job_is_dead_lettered_unrun(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", RECORD.format(dir=tmp_path, then=""))
    daemon(write_config(queue_config("[./h.sh]")))
    now = redis_ms(r)
    r.xadd(STREAM, {"payload": "stale", "job_id": "stale-1", "jobd_expires_at": str(now - 1)})
    r.xadd(STREAM, {"payload": "fresh", "jobd_expires_at": str(now + 600_000)})
    wait_until(lambda: "fresh" in payloads(tmp_path), what="the unexpired job to run")
    wait_until(lambda: "stale" in dead_letters(r), what="the expired job's dead letter")
    assert payloads(tmp_path) == ["fresh"], "the expired job never ran"
    record = dead_letters(r)["stale"]
    assert (record["jobd_error"], record["jobd_job_id"], record["jobd_attempts"]) == (
        EXPIRED,
        "stale-1",
        "0",
    )
    assert "jobd_expires_at" in record["jobd_stderr"]
    # The fresh job's ack may still be on its way (the recorder writes after the handler ends).
    wait_until(lambda: support.pending_count(r, STREAM) == 0, what="nothing pending")


def test_max_wait_expires_a_job_that_waited_behind_a_long_one(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", RECORD.format(dir=tmp_path, then='[ "$p" = long ] && sleep 2.5; exit 0'))
    daemon(write_config(queue_config("[./h.sh]", concurrency=1, max_wait="1s")))
    r.xadd(STREAM, {"payload": "long"})
    wait_until(lambda: "long" in payloads(tmp_path), what="the long job to start")
    r.xadd(STREAM, {"payload": "late"})  # waits 2.5 s for the only slot: more than max_wait
    wait_until(lambda: "late" in dead_letters(r), what="the late job's dead letter")
    r.xadd(STREAM, {"payload": "next"})  # the slot is free now: starts at once
    wait_until(lambda: "next" in payloads(tmp_path), what="the next job to run")
    assert payloads(tmp_path) == ["long", "next"], "the late job never ran"
    record = dead_letters(r)["late"]
    assert record["jobd_error"] == EXPIRED and "more than max_wait (1s)" in record["jobd_stderr"]


def test_garbage_limits_run_the_job_under_the_queues(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", RECORD.format(dir=tmp_path, then="exit 1"))
    config = write_config(
        queue_config("[./h.sh]", timeout="30s", max_wait="1h",
                     retry="{max_attempts: 2, backoff: 50ms, jitter: 0}")
    )  # fmt: skip
    d = daemon(config)
    garbage = {"jobd_timeout": "NaN", "jobd_max_attempts": "-1", "jobd_expires_at": "1796000000"}
    r.xadd(STREAM, {"payload": "junk", **garbage})
    wait_until(lambda: "junk" in dead_letters(r), what="the job to run out of attempts")
    runs = ran(tmp_path)
    assert [run[1] for run in runs] == ["1", "2"], "ran twice: the queue's max_attempts"
    assert all(int(deadline) - int(start) >= 29 for _, _, deadline, start in runs), "30 s"
    assert dead_letters(r)["junk"]["jobd_error"] == EXIT
    for name in garbage:
        assert d.log().count(f"ignoring {name}") == 1, "one warning, not one per attempt"
    assert "Traceback" not in d.log()


@pytest.mark.parametrize("offset", ["+5m", "-5m"])
def test_a_skewed_daemon_decides_expiry_on_redis_clock(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path, offset: str
) -> None:
    # 5 min ahead, this host's clock would expire every fresh job (max_wait 1m; expiry 1 min
    # away); 5 min behind, it would run the expired ones. Redis's clock says which is which.
    script("h.sh", RECORD.format(dir=tmp_path, then=""))
    config = write_config(queue_config("[./h.sh]", concurrency=4, max_wait="1m"))
    d = daemon(config, {**support.skewed(offset), "JOURNAL_STREAM": ""})  # timestamps: clock_of
    assert abs(clock_of(d) - (300 if offset == "+5m" else -300)) < 5, "the skew is real"
    now = redis_ms(r)
    r.xadd(STREAM, {"payload": "old"}, id=f"{now - 120_000}-0")  # enqueued 2 min ago
    r.xadd(STREAM, {"payload": "fresh"})
    r.xadd(STREAM, {"payload": "soon", "jobd_expires_at": str(now + 60_000)})
    r.xadd(STREAM, {"payload": "gone", "jobd_expires_at": str(now - 1_000)})
    wait_until(lambda: len(payloads(tmp_path)) + len(dead_letters(r)) == 4, what="4 outcomes")
    assert sorted(payloads(tmp_path)) == ["fresh", "soon"]
    dead = dead_letters(r)
    assert sorted(dead) == ["gone", "old"] and {x["jobd_error"] for x in dead.values()} == {EXPIRED}
    assert "max_wait" in dead["old"]["jobd_stderr"]
