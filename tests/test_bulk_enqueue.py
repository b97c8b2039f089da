"""Bulk enqueue and per-job limits (issue 19, the producer's side): `jobd enqueue --lines` and
`--ndjson` from a file and from stdin, lines refused by number with the others enqueued,
unique and timed jobs in bulk, the jobd_timeout / jobd_max_attempts / jobd_expires_at fields
written exactly, `producer.enqueue_many` from Python, and batches pipelined. A real private
Redis (the session's server, flushed per test)."""

from __future__ import annotations

import argparse
import base64
import datetime
import errno
import io
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from support import LocalCluster, jobd_cli, skewed

from jobd import producer
from jobd.config import Config, load
from jobd.newjob import NewJob

CONFIG = "redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n"
STREAM, DELAYED = "jobd:a", "{jobd:a}:delayed"


@pytest.fixture
def config_path(write_config: Callable[..., Path], r: redis.Redis) -> str:
    return str(write_config(CONFIG))


def entries(r: redis.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in r.xrange(STREAM)]


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def ndjson(*lines: object) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def test_lines_from_a_file_and_from_stdin(config_path: str, r: redis.Redis, tmp_path: Path) -> None:
    source = tmp_path / "jobs.txt"
    source.write_bytes(b"one\ntwo\n\n \t\nthree\r\n\x00\xffbinary\nlast, no newline")
    out = jobd_cli("enqueue", "-c", config_path, "a", "--lines", str(source), "--print-ids")
    assert out.returncode == 0, out.stderr
    payloads = [b"one", b"two", b"three", b"\x00\xffbinary", b"last, no newline"]
    assert entries(r) == [{b"payload": p} for p in payloads], "blank lines skipped, no newline"
    assert out.stdout.decode().split() == [mid.decode() for mid, _ in r.xrange(STREAM)]
    assert out.stderr.decode().startswith("jobd: 5 enqueued, 0 refused in ")
    piped = jobd_cli("enqueue", "-c", config_path, "a", "--lines", "-", stdin=b"four\nfive\n")
    assert piped.returncode == 0 and piped.stdout == b"", "no ids without --print-ids"
    assert [e[b"payload"] for e in entries(r)[-2:]] == [b"four", b"five"]


def test_ndjson_from_a_file_and_from_stdin(
    config_path: str, r: redis.Redis, tmp_path: Path
) -> None:
    source = tmp_path / "jobs.ndjson"
    binary = base64.b64encode(b"\x00\xff").decode()
    source.write_bytes(
        ndjson({"payload": "héllo", "job_id": "j-1", "fields": {"tenant": "acme"}})
        + ndjson({"payload_b64": binary}, {"payload": {"title": "sales", "numbers": [3, 4.5]}})
        + ndjson({"payload": ""})
    )
    out = jobd_cli("enqueue", "-c", config_path, "a", "--ndjson", str(source), "--print-ids")
    assert out.returncode == 0, out.stderr
    assert entries(r) == [
        {b"payload": "héllo".encode(), b"job_id": b"j-1", b"tenant": b"acme"},
        {b"payload": b"\x00\xff"},
        {b"payload": b'{"title":"sales","numbers":[3,4.5]}'},
        {b"payload": b""},
    ]
    assert out.stdout.decode().split()[0] == "j-1"
    piped = jobd_cli("enqueue", "-c", config_path, "a", "--ndjson", "-",
                     stdin=ndjson({"payload": "x", "job_id": "j-2"}))  # fmt: skip
    assert piped.returncode == 0 and entries(r)[-1] == {b"payload": b"x", b"job_id": b"j-2"}


def test_refused_lines_are_named_by_number_and_the_others_enqueued(
    config_path: str, r: redis.Redis, tmp_path: Path
) -> None:
    source = tmp_path / "jobs.ndjson"
    source.write_bytes(
        ndjson(
            {"payload": "ok-1"},
            b"not json",
            {"payload": "x", "delai": "3s"},
            b"",
            {"payload": "x", "fields": {"jobd_attempt": "2"}},
            {"payload": "x", "timeout": "0"},
            {"payload": "x", "expires_at": 1},
            {"payload": "ok-2"},
            b"[1, 2]",
            {"job_id": "no payload"},
        )
    )
    out = jobd_cli("enqueue", "-c", config_path, "a", "--ndjson", str(source))
    assert out.returncode == 65, out.stderr
    assert [e[b"payload"] for e in entries(r)] == [b"ok-1", b"ok-2"]
    said = out.stderr.decode().splitlines()
    assert [line.split(": ", 1)[0] for line in said[:-1]] == [
        f"{source}:{n}" for n in (2, 3, 5, 6, 7, 9, 10)
    ], "in line order, the blank line 4 skipped"
    assert "unknown key 'delai' (did you mean 'delay'?)" in said[1]
    assert "names starting jobd_ are jobd's" in said[2]
    assert "timeout (jobd_timeout) '0'" in said[3] and "already past" in said[4]
    assert said[-1].startswith("jobd: 2 enqueued, 7 refused in ")
    help_text = jobd_cli("enqueue", "--help").stdout.decode()
    assert re.search(r"\b65 .*\(EX_DATAERR\)", help_text), help_text


def test_unique_and_timed_jobs_in_bulk(config_path: str, r: redis.Redis) -> None:
    lines = ndjson(
        {"payload": "u", "job_id": "u-1"},
        {"payload": "u again", "job_id": "u-1"},
        {"payload": "later", "job_id": "d-1", "delay": "1h"},
        {"payload": "past", "at": 1_000_000_000, "unique": False},
        {"payload": "now", "job_id": "n-1", "unique": False},
    )
    args = ("enqueue", "-c", config_path, "a", "--ndjson", "-", "--unique", "--print-ids")
    out = jobd_cli(*args, stdin=lines)
    assert out.returncode == 0, out.stderr
    assert "<stdin>:2: job id 'u-1' is already queued or running" in out.stderr.decode()
    assert "already there (--unique)" in out.stderr.decode().splitlines()[-1]
    printed = out.stdout.decode().split()
    assert printed[:2] == ["u-1", "d-1"] and len(printed) == 4, "ids of the jobs added only"
    assert [e[b"payload"] for e in entries(r)] == [b"u", b"past", b"now"]
    assert entries(r)[0][b"jobd_unique"] == b"1" and b"jobd_unique" not in entries(r)[2]
    assert r.zcard(DELAYED) == 1 and r.get("{jobd:a}:job:u-1") == b"queued"
    again = jobd_cli(*args, stdin=lines[: lines.index(b"\n") + 1])
    assert again.returncode == 0 and "1 already there" in again.stderr.decode()
    # --unique with --lines has no job ids to be unique by
    bad = jobd_cli("enqueue", "-c", config_path, "a", "--lines", "-", "--unique", stdin=b"x\n")
    assert bad.returncode == 2 and b"--unique needs job ids" in bad.stderr


def test_per_job_limit_fields_are_written_exactly(config_path: str, r: redis.Redis) -> None:
    before = redis_ms(r)
    single = jobd_cli("enqueue", "-c", config_path, "a", "one", "--timeout", "2.5s",
                      "--max-attempts", "3", "--expires-in", "10m")  # fmt: skip
    assert single.returncode == 0, single.stderr
    fields = entries(r)[0]
    assert fields[b"jobd_timeout"] == b"2.5" and fields[b"jobd_max_attempts"] == b"3"
    expires = int(fields[b"jobd_expires_at"])
    assert before + 600_000 <= expires <= redis_ms(r) + 600_000, "on Redis's clock"
    soon = redis_ms(r) // 1000 + 86400  # Unix seconds, a day ahead
    iso = datetime.datetime.fromtimestamp(soon, datetime.UTC).isoformat()
    at = jobd_cli("enqueue", "-c", config_path, "a", "two", "--timeout", "250ms",
                  "--expires-at", iso)  # fmt: skip
    assert at.returncode == 0, at.stderr
    assert entries(r)[1] == {b"payload": b"two", b"jobd_timeout": b"0.25",
                             b"jobd_expires_at": b"%d000" % soon}  # fmt: skip
    bulk = jobd_cli(
        "enqueue", "-c", config_path, "a", "--ndjson", "-", "--timeout", "1m", "--max-attempts", "2",
        stdin=ndjson(
            {"payload": "flags"},
            {"payload": "own", "timeout": 1.5, "max_attempts": 7, "expires_at": soon + 0.5},
            {"payload": "raw", "fields": {"jobd_expires_at": f"{soon}000"}},
        ),
    )  # fmt: skip
    assert bulk.returncode == 0, bulk.stderr
    assert [{k: v for k, v in e.items() if k.startswith(b"jobd_")} for e in entries(r)[2:]] == [
        {b"jobd_timeout": b"60", b"jobd_max_attempts": b"2"},
        {b"jobd_timeout": b"1.5", b"jobd_max_attempts": b"7", b"jobd_expires_at": b"%d500" % soon},
        {b"jobd_timeout": b"60", b"jobd_max_attempts": b"2", b"jobd_expires_at": b"%d000" % soon},
    ]
    for flags, said in [
        (("--timeout", "0"), b"timeout (jobd_timeout) '0'"),
        (("--max-attempts", "0"), b"max_attempts (jobd_max_attempts) '0'"),
        (("--expires-at", "2001-01-01T00:00:00+00:00"), b"already past"),
        (("--expires-in", "1m", "--delay", "1h"), b"would expire before it is due"),
        (("--timeout", "400d"), b"give from 1ms to 365d"),
    ]:
        refused = jobd_cli("enqueue", "-c", config_path, "a", "x", *flags)
        assert refused.returncode == 2 and said in refused.stderr, (flags, refused.stderr)
    assert len(entries(r)) == 5, "nothing written for a refused flag"


def test_expiry_counts_on_redis_clock_on_a_host_an_hour_ahead(
    config_path: str, r: redis.Redis
) -> None:
    """The host's clock plays no part: --expires-in counts from Redis's TIME, and an
    --expires-at ten minutes ahead for Redis (fifty minutes ago for the host) is taken."""
    before, at = redis_ms(r), r.time()[0] + 600
    args = ("enqueue", "-c", config_path, "a", "--ndjson", "-")
    lines = ndjson({"payload": "in", "expires_in": "10m"}, {"payload": "at", "expires_at": at})
    out = jobd_cli(*args, stdin=lines, env=skewed("+1h"))
    single = jobd_cli("enqueue", "-c", config_path, "a", "x", "--expires-at", str(at),
                      env=skewed("+1h"))  # fmt: skip
    assert out.returncode == 0 and single.returncode == 0, out.stderr + single.stderr
    expiries = [int(e[b"jobd_expires_at"]) for e in entries(r)]
    assert before + 600_000 <= expiries[0] <= redis_ms(r) + 600_000
    assert expiries[1:] == [at * 1000, at * 1000]


def test_enqueue_many_from_python(config_path: str, r: redis.Redis) -> None:
    config = load(config_path)
    jobs = [
        NewJob(b"a"),
        NewJob(b"b", job_id="b-1", fields={"tenant": b"acme"}, timeout=30),
        NewJob(b"c", fields={"payload": "no"}),
        NewJob(b"d", job_id="d-1", unique=True, delay=3600),
        NewJob(b"e", job_id="d-1", unique=True),
        NewJob(b"f", max_attempts=0),
    ]
    done = producer.enqueue_many(config, "a", jobs)
    assert [(x.index, x.duplicate) for x in done.refused] == [(2, False), (4, True), (5, False)]
    assert "field 'payload': give it as the job's payload" in done.refused[0].reason
    assert done.job_ids[1:] == ["b-1", "d-1"] and done.job_ids[0] == r.xrange(STREAM)[0][0].decode()
    assert entries(r)[1] == {b"payload": b"b", b"job_id": b"b-1", b"tenant": b"acme",
                             b"jobd_timeout": b"30"}  # fmt: skip
    assert r.zcard(DELAYED) == 1
    assert producer.enqueue_many(config, "a", iter([])).job_ids == []


def test_a_large_batch_is_pipelined(
    config_path: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 000 jobs in 50 round trips of 1000 (one TIME for the expiry first), and 1 MiB
    payloads 16 to a round trip: counted at redis-py's pipeline, the way a batch is sent."""
    config: Config = load(config_path)
    sent: list[int] = []
    execute = redis.client.Pipeline.execute

    def counted(self: redis.client.Pipeline, *args: object, **kwargs: object) -> object:
        sent.append(len(self.command_stack))
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counted)
    jobs = (NewJob(b"%d" % i, expires_in=3600) for i in range(50_000))
    done = producer.enqueue_many(config, "a", jobs)
    assert len(done.job_ids) == 50_000 and not done.refused
    assert sent == [1000] * 50
    assert r.xlen(STREAM) == 50_000 and entries(r)[-1][b"payload"] == b"49999"
    sent.clear()  # large payloads: a batch ends at BATCH_BYTES too
    large = [NewJob(b"%d" % i + b"x" * 2**20) for i in range(40)]
    assert len(producer.enqueue_many(config, "a", large).job_ids) == 40
    assert sent == [16, 16, 8] and producer.BATCH_BYTES == 16 * 2**20


def test_the_progress_line_is_drawn_only_on_a_terminal(
    config_path: str, r: redis.Redis, tmp_path: Path
) -> None:
    source = tmp_path / "jobs.txt"
    source.write_bytes(b"".join(b"job %d\n" % i for i in range(3000)))
    args = ("enqueue", "-c", config_path, "a", "--lines", str(source), "--chunk", "500")
    piped = jobd_cli(*args)
    assert piped.returncode == 0 and b"\r" not in piped.stderr and b"\x1b[" not in piped.stderr
    assert piped.stderr.count(b"\n") == 1, "the summary line alone"
    leader, follower = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "jobd", *args], stderr=follower,
                          stdout=subprocess.DEVNULL, timeout=60)  # fmt: skip
    os.close(follower)
    drawn = os.read(leader, 65536)
    os.close(leader)
    assert proc.returncode == 0 and b"\r\x1b[K" in drawn and b" enqueued, " in drawn
    assert r.xlen(STREAM) == 6000


def test_bulk_enqueue_on_a_cluster(tmp_path: Path) -> None:
    """Each batch goes to the node of the queue's slot, scripts and priority levels too: the
    queue's keys all share its stream's slot."""
    cluster = LocalCluster(tmp_path / "cluster")
    cluster.start()
    try:
        config = tmp_path / "cluster.yaml"
        config.write_text(
            "redis:\n  cluster:\n    nodes: [" + ", ".join(cluster.nodes) + "]\n"
            "queues:\n  a:\n    command: [/bin/true]\n    priorities: [high, low]\n"
        )
        lines = ndjson(
            *({"payload": f"p-{i}"} for i in range(2500)),
            {"payload": "u", "job_id": "u-1", "unique": True},
            {"payload": "u", "job_id": "u-1", "unique": True},
            {"payload": "later", "delay": "1h"},
        )
        out = jobd_cli("enqueue", "-c", str(config), "a", "--ndjson", "-", stdin=lines)
        high = jobd_cli("enqueue", "-c", str(config), "a", "--lines", "-", "--priority", "high",
                        stdin=b"h-1\nh-2\n")  # fmt: skip
        assert out.returncode == 0 and high.returncode == 0, out.stderr + high.stderr
        assert b"2502 enqueued, 0 refused, 1 already there" in out.stderr
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.servers[0].port)])
        levels = load(str(config)).queues["a"]
        assert rc.xlen(STREAM) == 2501 and rc.zcard(DELAYED) == 1
        assert rc.xlen(levels.level("high").stream) == 2
        rc.close()
    finally:
        cluster.stop()


def test_bulk_usage_errors_and_unreachable_redis(
    config_path: str, write_config: Callable[..., Path], tmp_path: Path
) -> None:
    for extra in (("x",), ("--job-id", "j"), ("--wait-replicas", "1"), ("--chunk", "0")):
        out = jobd_cli("enqueue", "-c", config_path, "a", "--lines", "-", *extra, stdin=b"x\n")
        assert out.returncode == 2, extra
    missing = jobd_cli("enqueue", "-c", config_path, "a", "--lines", str(tmp_path / "none"))
    assert missing.returncode == 2 and b"cannot read" in missing.stderr
    down = write_config(CONFIG.replace("{redis}", "redis://127.0.0.1:1/0"), "down.yaml")
    out = jobd_cli("enqueue", "-c", str(down), "a", "--lines", "-", stdin=b"x\ny\n")
    assert out.returncode == 69 and b"cannot reach Redis" in out.stderr
    assert b"lines 1 to 2 were being sent" in out.stderr and b"Traceback" not in out.stderr


def test_an_empty_or_nul_job_id_is_refused(config_path: str, r: redis.Redis) -> None:
    """Review finding 12: the daemon runs such a job under its stream id (jobd.job._job_id),
    and a --unique mark under the bad id would stay for the dedupe window."""
    lines = ndjson({"payload": "x", "job_id": "a\0b", "unique": True}, {"payload": "ok"})
    out = jobd_cli("enqueue", "-c", config_path, "a", "--ndjson", "-", stdin=lines)
    assert out.returncode == 65, out.stderr
    assert "<stdin>:1: job_id 'a\\x00b': holds a NUL byte" in out.stderr.decode()
    assert entries(r) == [{b"payload": b"ok"}] and r.keys("{jobd:a}:job:*") == []
    config = load(config_path)
    for bad in ("", "a\0b"):
        with pytest.raises(ValueError, match="job_id"):
            producer.enqueue_job(config, "a", NewJob(b"x", job_id=bad, unique=True))
    refused = producer.enqueue_many(config, "a", [NewJob(b"x", job_id="")]).refused
    assert [x.reason for x in refused] == ["job_id '': give a non-empty job id (or none: the "
                                           "stream id)"]  # fmt: skip
    single = jobd_cli("enqueue", "-c", config_path, "a", "x", "--job-id", "")
    assert single.returncode == 2 and b"give a non-empty job id" in single.stderr
    assert len(entries(r)) == 1 and r.keys("{jobd:a}:job:*") == []


def test_a_due_time_more_than_ten_years_ahead_is_refused(config_path: str, r: redis.Redis) -> None:
    """Review finding 15: a huge delay overflowed the scripts' string.format('%d') and the
    job ran at once. Ten years ahead at most (Redis's clock), as an expiry."""
    ten_years = 10 * 365 * 86400
    for flags in (("--delay", "10000000000000000"), ("--delay", "3651d"), ("--at", "-5")):
        out = jobd_cli("enqueue", "-c", config_path, "a", "x", *flags)
        assert out.returncode == 2, (flags, out.stderr)
        assert b"more than ten years" in out.stderr or b"negative" in out.stderr
    now = int(r.time()[0])
    far, near = now + ten_years + 3600, now + ten_years - 3600
    lines = ndjson(
        {"payload": "1", "delay": 1e300},
        {"payload": "2", "at": 1e300},
        {"payload": "3", "at": far},
        {"payload": "4", "delay": "3649d"},
        {"payload": "5", "at": near},
    )
    out = jobd_cli(
        "enqueue", "-c", config_path, "a", "--ndjson", "-", stdin=lines, env=skewed("-1h")
    )
    assert out.returncode == 65, out.stderr
    said = out.stderr.decode().splitlines()
    assert said[:3] == [
        "<stdin>:1: delay 1e+300: more than ten years",
        "<stdin>:2: at 1e+300: more than ten years ahead",
        f"<stdin>:3: at {float(far)!r}: more than ten years ahead",
    ]
    assert entries(r) == [] and r.zcard(DELAYED) == 2
    assert r.zrange(DELAYED, 0, -1, withscores=True)[-1][1] == near * 1000
    with pytest.raises(ValueError, match="more than ten years"):
        producer.enqueue(load(config_path), "a", b"x", delay=1e300)
    with pytest.raises(ValueError, match="give a number of seconds"):
        producer.enqueue(load(config_path), "a", b"x", at=float("inf"))
    assert r.zcard(DELAYED) == 2 and entries(r) == []


def test_a_payload_above_max_payload_is_refused(
    write_config: Callable[..., Path], r: redis.Redis, tmp_path: Path
) -> None:
    """Review finding 14: such a job was enqueued only to be dead-lettered as malformed (and
    one above Redis's proto-max-bulk-len dropped the connection, stopping the run). A --lines
    line is read through, not held, when longer than the queue takes."""
    path = write_config(CONFIG.replace("/bin/true]}", "/bin/true], max_payload: 1KiB}"))
    source = tmp_path / "jobs.txt"
    source.write_bytes(b"ok-1\n" + b"x" * 1024 + b"\r\n" + b"y" * 1025 + b"\n" + b"z" * (3 * 2**20)
                       + b"\nok-2\n" + b"w" * 1025)  # fmt: skip
    out = jobd_cli("enqueue", "-c", str(path), "a", "--lines", str(source))
    assert out.returncode == 65, out.stderr
    assert [len(e[b"payload"]) for e in entries(r)] == [4, 1024, 4]
    said = out.stderr.decode().splitlines()
    assert (
        said[0]
        == f"{source}:3: payload of 1025 bytes is above the queue's max_payload (1024): jobd would not run it"
    )
    assert (
        said[1]
        == f"{source}:4: a line of {3 * 2**20 + 1} bytes: above the queue's max_payload (1024)"
    )
    assert said[2].startswith(f"{source}:6: payload of 1025 bytes") and len(said) == 4
    big = base64.b64encode(b"\0" * 1025).decode()
    lines = ndjson({"payload_b64": big}, {"payload": "ok-3"})
    out = jobd_cli("enqueue", "-c", str(path), "a", "--ndjson", "-", stdin=lines)
    assert out.returncode == 65 and b"<stdin>:1: payload of 1025 bytes" in out.stderr
    config = load(str(path))
    with pytest.raises(ValueError, match=r"above the queue's max_payload \(1024\)"):
        producer.enqueue_job(config, "a", NewJob(b"x" * 1025))
    done = producer.enqueue_many(config, "a", [NewJob(b"x" * 1025), NewJob(b"ok-4")])
    assert [x.index for x in done.refused] == [0] and len(done.job_ids) == 1
    assert [e[b"payload"] for e in entries(r)][3:] == [b"ok-3", b"ok-4"]


def test_a_run_stopped_early_names_the_lines_not_sent(
    config_path: str, write_config: Callable[..., Path], r: redis.Redis
) -> None:
    """Review finding 13: Redis gone, or stdout a closed pipe, the lines never sent were not
    named. A closed pipe exits 1 (the input or the output failed), with no traceback."""
    down = write_config(CONFIG.replace("{redis}", "redis://127.0.0.1:1/0"), "down.yaml")
    out = jobd_cli("enqueue", "-c", str(down), "a", "--lines", "-", "--chunk", "2",
                   stdin=b"x\ny\nz\n")  # fmt: skip
    assert out.returncode == 69, out.stderr
    assert b"<stdin>: lines 1 to 2 were being sent" in out.stderr
    assert (
        b"<stdin>: lines 3 and after (if any) were not sent: none of them is enqueued" in out.stderr
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobd", "enqueue", "-c", config_path, "a", "--lines", "-",
         "--print-ids", "--chunk", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # nobody reads the ids: the first write of them fails
    _, err = proc.communicate(b"a\nb\nc\nd\ne\n", timeout=60)
    assert proc.returncode == 1, err
    assert err.decode().splitlines()[:2] == [
        "jobd: cannot write the job ids of lines 1 to 2 (settled: enqueued unless named above): "
        "Broken pipe",
        "jobd: <stdin>: lines 3 and after (if any) were not sent: none of them is enqueued",
    ]
    assert b"Traceback" not in err and b"Exception ignored" not in err
    assert [e[b"payload"] for e in entries(r)] == [b"a", b"b"]


def test_an_input_that_fails_midway_names_the_lines_not_sent(
    config_path: str, r: redis.Redis
) -> None:
    """Review finding 13, the input's side: lines read into a batch not yet sent are named."""
    from jobd.cli import bulk

    class Failing(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.data = data

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            if not self.data:
                raise OSError(errno.EIO, "Input/output error")
            size = min(len(buffer), len(self.data))
            buffer[:size], self.data = self.data[:size], self.data[size:]
            return size

    err = io.StringIO()
    report = bulk.Report("in.txt", False, err)
    reader = bulk.Reader(io.BufferedReader(Failing(b"a\nb\nc\n")), NewJob(), report, False, 1024)
    args = argparse.Namespace(queue="a", priority=None, chunk=2)
    assert bulk.send(load(config_path), args, reader, report) == 1
    assert err.getvalue().splitlines()[:2] == [
        "jobd: cannot read line 4: Input/output error",
        "jobd: in.txt: lines 3 and after were not sent: none of them is enqueued",
    ]
    assert [e[b"payload"] for e in entries(r)] == [b"a", b"b"]


@pytest.mark.parametrize("batch", ["1", "100"])
def test_a_time_too_large_for_milliseconds_is_a_refused_line(
    config_path: str, r: redis.Redis, tmp_path: Path, batch: str
) -> None:
    """1e308 seconds is a finite float, but not in milliseconds: a delay, at, expires_in or
    expires_at of 1e308 aborted the bulk run with a traceback (OverflowError) halfway through a
    batch. Each is a line refused with its FILE:LINE; every other line is enqueued once."""
    source = tmp_path / "jobs.ndjson"
    source.write_bytes(
        ndjson(
            {"payload": "ok-1"},
            {"payload": "x", "delay": 1e308},
            {"payload": "x", "at": 1e308},
            {"payload": "x", "expires_in": 1e308},
            {"payload": "x", "expires_at": 1e308},
            {"payload": "ok-2"},
        )
    )
    out = jobd_cli("enqueue", "-c", config_path, "a", "--ndjson", str(source), "--chunk", batch)
    assert out.returncode == 65, out.stderr
    assert b"Traceback" not in out.stderr
    assert [e[b"payload"] for e in entries(r)] == [b"ok-1", b"ok-2"] and r.zcard(DELAYED) == 0
    said = out.stderr.decode().splitlines()
    assert said[:-1] == [
        f"{source}:2: delay 1e+308: more than ten years",
        f"{source}:3: at 1e+308: more than ten years ahead",
        f"{source}:4: expires_in 1e+308: more than ten years",
        f"{source}:5: expires_at 1e+308: more than ten years ahead",
    ]
    one = jobd_cli("enqueue", "-c", config_path, "a", "x", "--at=1e308")
    assert one.returncode == 2 and b"at 1e+308: more than ten years ahead" in one.stderr, one
    assert b"Traceback" not in one.stderr and len(entries(r)) == 2
