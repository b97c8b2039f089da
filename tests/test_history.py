"""Job history, the running set and the events stream, read back (`jobd job`, `jobd events`).

The first part writes the keys itself, exactly as docs/concepts/history.md says the scripts do (and
garbage beside them), and reads them with the store and the command line; the second runs real
daemons and reads what they wrote. All on the session's private Redis.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, outage, wait_group, wait_until

from jobd.config import QueueConfig, load
from jobd.store.records import parse_records
from jobd.store.store import Store

Daemon = Callable[..., DaemonProcess]

CONFIG = """\
redis: {url: '{redis}'}
queues:
  q: {command: [/bin/true]}
  other: {command: [/bin/true]}
  pq: {command: [/bin/true], priorities: [high, low]}
"""
HISTORY, ACTIVE, EVENTS = "{jobd:q}:history", "{jobd:q}:active", "{jobd:q}:events"


@pytest.fixture
def setup(r: redis.Redis, write_config) -> tuple[Path, dict[str, QueueConfig], Store]:
    path = write_config(CONFIG)
    return path, load(str(path)).queues, Store(r)


def line(event: str, at: int, **fields: object) -> bytes:
    """A history record as the scripts write it: ``at`` first, then ``event``, then the rest."""
    return json.dumps({"at": at, "event": event, **fields}).encode()


def active(stream: str, entry: str, consumer: str, since: int = 1, **more: object) -> bytes:
    body = {"stream": stream, "entry": entry, "consumer": consumer, "host": "h1", "pid": 4242,
            "since": since, "attempt": 2, "deadline": since + 30_000, **more}  # fmt: skip
    return f"{stream}|{entry}\n".encode() + json.dumps(body).encode()


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def deliver(r: redis.Redis, stream: str, consumer: str, fields: dict, id: str = "*") -> str:
    """An entry read by ``consumer`` (pending on it), as a daemon's read leaves it."""
    entry = r.xadd(stream, fields, id=id).decode()
    r.xreadgroup("jobd", consumer, {stream: ">"}, count=1)
    return entry


# -- reading what the contract says is there -----------------------------------------------------


def test_lines_that_are_no_record_are_skipped_and_wrong_types_are_not_known() -> None:
    blob = b"\n".join([
        line("retried", 1, attempt=1, exit_code=1, due=5, error="exit", stdout="a\nb"),
        b"not json", b"[1, 2]", b'"a string"', b"", b'{"at": 2, "event": "x"',
        b'{"event": "\\ud800"}',  # a lone surrogate: no JSON text
        b'{"at": 3.0, "event": "done", "attempt": "2", "pid": true, "consumer": "c\xff"}',
    ])  # fmt: skip
    records, skipped = parse_records(blob)
    assert skipped == 5
    first, done = records
    assert (first.event, first.attempt, first.exit_code, first.due_ms) == ("retried", 1, 1, 5)
    assert first.stdout == "a\nb" and first.signal is None and first.raw["error"] == "exit"
    assert (done.at_ms, done.attempt, done.pid) == (3, None, None), "wrong types are not known"
    assert done.consumer == "c\\xff", "bytes that are not UTF-8 are kept, escaped"


def test_a_done_job_with_a_job_id_that_is_not_utf8_and_garbage_in_its_history(
    r: redis.Redis, setup
) -> None:
    config, queues, store = setup
    jid = b"j\xff\x1b[2J"
    attempt = dict(entry="1-0", stream="jobd:q", consumer="c1", host="h1", pid=77)
    r.hset(HISTORY, jid, b"\n".join([
        line("retried", 1000, attempt=1, exit_code=3, error="exit", duration_ms=1500, due=2000,
             started_at=0, stderr="boom\n\x1b]0;title\x07", **attempt),
        b"\xff\xfe garbage",
        line("done", 3000, attempt=2, exit_code=0, duration_ms=20, started_at=2980,
             stdout="out 1\nout 2\n", **attempt),
        line("lease lost", 10**17, signal=10**6, due=-(10**17), pid=1e30),  # no date, no signal
    ]))  # fmt: skip
    view = store.job(queues["q"], os.fsdecode(jid))
    assert (view.state, view.skipped, len(view.records)) == ("unknown", 1, 3)
    hostile = jobd_cli("job", "-c", str(config), "q", os.fsdecode(jid))
    assert hostile.returncode == 3, hostile  # a lease lost, its entry nowhere: not known now
    assert f"{10**17}ms  lease lost  killed by signal 1000000  due -{10**17}ms" in str(
        hostile.stdout
    )
    r.hset(HISTORY, jid, r.hget(HISTORY, jid).rsplit(b"\n", 1)[0])  # the last record gone
    view = store.job(queues["q"], os.fsdecode(jid))
    assert (view.state, view.skipped, len(view.records)) == ("done", 1, 2)
    assert view.now_ms >= redis_ms(r) - 5_000

    out = jobd_cli("job", "-c", str(config), "q", os.fsdecode(jid))
    text = out.stdout.decode()
    assert out.returncode == 0, out
    assert text.splitlines()[0] == "job j\\xff\\x1b[2J of queue q: done"
    assert "\x1b" not in text and "\\x1b]0;title\\x07" in text, "a terminal is never driven"
    assert "1970-01-01T00:00:00.000Z  retried  attempt 1  on c1 (host h1, pid 77)  exit 3" in text
    assert "after 1.500s  error: exit  due 1970-01-01T00:00:02.000Z" in text
    assert "  stdout:\n    out 1\n    out 2\n" in text and "  stderr:\n    boom\n" in text
    assert "1 line(s) of its history were no record" in text

    as_json = json.loads(jobd_cli("job", "-c", str(config), "q", "--json", os.fsdecode(jid)).stdout)
    assert as_json["job"] == "j\\xff\x1b[2J" and as_json["state"] == "done"
    assert [rec["event"] for rec in as_json["records"]] == ["retried", "done"]
    assert as_json["records"][1]["stdout"] == "out 1\nout 2\n"


def test_a_running_job_and_a_stale_active_record(r: redis.Redis, setup) -> None:
    config, queues, store = setup
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    entry = deliver(r, "jobd:q", "c1", {"payload": "x", "job_id": "run"})
    r.hset(ACTIVE, "run", active("jobd:q", entry, "c1", since=1_000))
    stale = deliver(r, "jobd:q", "c2", {"payload": "x", "job_id": "stale"})
    r.hset(ACTIVE, "stale", active("jobd:q", stale, "killed-9"))  # pending on another: stale
    acked = deliver(r, "jobd:q", "c1", {"payload": "x", "job_id": "gone"})
    r.xack("jobd:q", "jobd", acked)
    r.hset(ACTIVE, "gone", active("jobd:q", acked, "c1"))  # no longer pending: stale
    r.hset(ACTIVE, "elsewhere", active("jobd:other", entry, "c1"))  # not this queue's stream
    r.hset(ACTIVE, "junk", b"no newline, no JSON")

    view = store.job(queues["q"], "run")
    assert view.state == "running" and view.running is not None
    assert (view.running.consumer, view.running.host, view.running.pid) == ("c1", "h1", 4242)
    assert (view.running.since_ms, view.running.deadline_ms, view.running.attempt) == (
        1_000, 31_000, 2)  # fmt: skip
    assert [j.job_id for j in store.running(queues["q"])] == ["run"]
    stale_view = store.job(queues["q"], "stale")
    assert stale_view.state == "unknown" and stale_view.running is None
    assert store.job(queues["q"], "gone").state == "unknown"

    out = jobd_cli("job", "-c", str(config), "q", "run")
    assert out.returncode == 0
    assert out.stdout.decode().startswith(
        "job run of queue q: running on c1 (host h1, pid 4242) since 1970-01-01T00:00:01.000Z, "
        "attempt 2, deadline 1970-01-01T00:00:31.000Z"
    )
    unknown = jobd_cli("job", "-c", str(config), "q", "stale")
    assert unknown.returncode == 3 and b"found only by its entry id" in unknown.stdout


def test_delayed_on_redis_s_clock_then_waiting_when_due(r: redis.Redis, setup) -> None:
    config, queues, store = setup
    now = redis_ms(r)
    r.hset(HISTORY, "later", line("retried", now, attempt=1, due=now + 3_600_000))
    r.hset(HISTORY, "due", line("scheduled", now - 10, due=now - 5))
    later = store.job(queues["q"], "later")
    assert (later.state, later.due_ms) == ("delayed", now + 3_600_000)
    assert store.job(queues["q"], "due").state == "waiting"
    text = jobd_cli("job", "-c", str(config), "q", "later").stdout.decode()
    assert re.search(r"delayed: due \S+ \(in 3[56][0-9][0-9]\.[0-9]{3}s\)", text), text


def test_a_job_id_shaped_like_an_entry_id_is_found_waiting_on_any_level(
    r: redis.Redis, setup
) -> None:
    config, queues, store = setup
    high, low = "{jobd:pq}:priority:high", "jobd:pq"
    for stream in (high, low):
        r.xgroup_create(stream, "jobd", id="0", mkstream=True)
    # Each level's stream has ids of its own (the same id may stand on two: the highest wins).
    waiting = r.xadd(high, {"payload": "x"}, id="1000-1").decode()
    delivered = deliver(r, low, "c9", {"payload": "x"}, id="1000-2")
    done = deliver(r, low, "c9", {"payload": "x"}, id="1000-3")
    r.xack(low, "jobd", done)
    named = r.xadd(low, {"payload": "x", "job_id": "other"}, id="1000-4").decode()
    later = r.xadd(low, {"payload": "x"}, id="1000-5").decode()  # after the group's last read

    view = store.job(queues["pq"], waiting)
    assert (view.state, view.stream, view.entry, view.consumer) == ("waiting", high, waiting, "")
    held = store.job(queues["pq"], delivered)
    assert (held.state, held.stream, held.consumer) == ("waiting", low, "c9")
    assert store.job(queues["pq"], named).state == "unknown", "another job's entry"
    assert store.job(queues["pq"], later).entry == later
    assert store.job(queues["pq"], done).state == "unknown", "acked: no longer waiting"
    assert store.job(queues["pq"], "99999999999999999999999-0").state == "unknown"

    text = jobd_cli("job", "-c", str(config), "pq", waiting).stdout.decode()
    assert f"waiting: entry {waiting} of {high}, not delivered yet" in text
    text = jobd_cli("job", "-c", str(config), "pq", delivered).stdout.decode()
    assert f"entry {delivered} of {low} delivered to c9, not running" in text


def test_a_running_job_on_a_priority_level_and_a_promoted_one(r: redis.Redis, setup) -> None:
    _, queues, store = setup
    high = "{jobd:pq}:priority:high"
    r.xgroup_create(high, "jobd", id="0", mkstream=True)
    entry = deliver(r, high, "c1", {"payload": "x", "job_id": "p1"})
    r.hset("{jobd:pq}:active", "p1", active(high, entry, "c1"))
    assert store.job(queues["pq"], "p1").state == "running"
    assert [j.stream for j in store.running(queues["pq"])] == [high]

    new = r.xadd(high, {"payload": "x", "jobd_job_id": "p2", "jobd_attempt": "2"}).decode()
    r.hset("{jobd:pq}:history", "p2", b"\n".join([
        line("retried", 1, attempt=1, due=2, stream=high, entry="1-1"),
        line("promoted", 3, stream=high, new_entry=new),
    ]))  # fmt: skip
    view = store.job(queues["pq"], "p2")
    assert (view.state, view.entry, view.stream) == ("waiting", new, high)
    r.hset("{jobd:pq}:history", "p3", line("requeued", 3, by="ops@h", new_entry="5-5"))
    assert store.job(queues["pq"], "p3").state == "unknown", "its new entry is nowhere"


def test_reading_a_job_takes_two_round_trips_whatever_the_stream_holds(
    r: redis.Redis, setup
) -> None:
    _, queues, store = setup
    pipe = r.pipeline(transaction=False)
    for i in range(5000):
        pipe.xadd("jobd:q", {"payload": "x", "job_id": f"j{i}"})
    pipe.execute()
    r.xgroup_create("jobd:q", "jobd", id="$")
    entry = deliver(r, "jobd:q", "c1", {"payload": "x"})
    r.hset(ACTIVE, entry, active("jobd:q", entry, "c1"))
    rounds: list[int] = []
    real = store._pipelined

    def counting(calls: list) -> list:
        if calls:
            rounds.append(len(calls))
        return real(calls)

    store._pipelined = counting  # type: ignore[method-assign]
    assert store.job(queues["q"], entry).state == "running"
    assert store.job(queues["q"], "j4999").state == "unknown", "no scan finds a named job"
    assert len(rounds) == 3 and max(rounds) <= 6


# -- the events stream ----------------------------------------------------------------------------


def test_events_of_several_queues_merged_by_time_with_count_and_after(
    r: redis.Redis, setup
) -> None:
    config, queues, store = setup
    for ms, key, event in (
        (1000, EVENTS, "done"),
        (2000, "{jobd:other}:events", "pause"),
        (3000, EVENTS, "retried"),
        (4000, "{jobd:other}:events", "resume"),
    ):
        r.xadd(key, {"event": event, "queue": "x", "job": "j", "by": "u@h"}, id=f"{ms}-0")
    both = [queues["q"], queues["other"]]
    assert [e.fields["event"] for e in store.events(both, None, 10)] == [
        "done", "pause", "retried", "resume"]  # fmt: skip
    assert [e.id for e in store.events(both, None, 2)] == ["3000-0", "4000-0"]
    after = store.events(both, {"q": "1000-0", "other": "2000-0"}, 10)
    assert [(e.queue, e.id) for e in after] == [("q", "3000-0"), ("other", "4000-0")]
    assert store.events(both, {"q": "0-0", "other": "0-0"}, 1)[0].id == "1000-0"

    out = jobd_cli("events", "-c", str(config), "q", "other", "--json", "--after", "1500")
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert out.returncode == 0 and [x["id"] for x in rows] == ["2000-0", "3000-0", "4000-0"]
    assert rows[0] == {"event": "pause", "queue": "other", "job": "j", "by": "u@h",
                       "id": "2000-0", "at": 2000, "after": "q=1500-0,other=2000-0"}  # fmt: skip
    per_queue = jobd_cli("events", "-c", str(config), "q", "other", "--json",
                         "--after", "other=3000", "--after", "0")  # fmt: skip
    assert [json.loads(x)["id"] for x in per_queue.stdout.splitlines()] == [
        "1000-0", "3000-0", "4000-0"]  # fmt: skip
    bad = jobd_cli("events", "-c", str(config), "--after", "1-x")
    assert bad.returncode == 2 and b"QUEUE=ID of a queue read" in bad.stderr


@pytest.mark.parametrize("after", ["99999999999999999999-0", "1-18446744073709551616",
                                   "q=18446744073709551616"])  # fmt: skip
def test_events_refuses_an_after_id_redis_cannot_take(setup, after: str) -> None:
    """``--after 99999999999999999999-0`` passed the 20-digit pattern but is no stream id
    (over 2**64-1): `jobd events` printed nothing with exit 0, and `--follow` asked Redis ~20
    times a second, each read failing, never showing an event."""
    config, _, _ = setup
    done = jobd_cli("events", "-c", str(config), "--after", after, "--follow")
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert b"each part of an event id is at most 18446744073709551615" in done.stderr
    assert (
        jobd_cli("events", "-c", str(config), "--after", "18446744073709551615-0").returncode == 0
    )


def test_events_resume_from_a_cursor_naming_queues_not_read(r: redis.Redis, setup) -> None:
    """A --json event's ``after`` names every queue read (``q=ID,other=ID``): resuming one of
    them with it, or after a queue left the config, was refused (exit 2). The queues not read
    are left out; one not in the config any more is said on stderr."""
    config, _, _ = setup
    r.xadd(EVENTS, {"event": "done", "job": "old"}, id="1000-0")
    r.xadd(EVENTS, {"event": "done", "job": "new"}, id="2000-0")
    out = jobd_cli("events", "-c", str(config), "q", "--json", "--after", "q=1000-0,other=5-0")
    assert out.returncode == 0, out
    assert [json.loads(x)["job"] for x in out.stdout.splitlines()] == ["new"]
    assert out.stderr == b""
    out = jobd_cli("events", "-c", str(config), "q", "--after", "q=1000-0,gone=7-0")
    assert out.returncode == 0, out
    assert out.stdout.count(b"  done  new") == 1 and b"old" not in out.stdout
    assert b"--after gone=7-0: no queue 'gone' in the config; left out" in out.stderr


def test_a_reader_resuming_from_the_last_event_it_handled_misses_none_of_another_queue(
    r: redis.Redis, setup
) -> None:
    """Two queues' events are two streams, each numbering its own: an event written into
    'other' after one of 'q' in the same millisecond can have a smaller id, or the same. A
    reader that resumes with the id of the last event it handled would skip it; the event's
    `after` (every queue's position) misses nothing and shows nothing twice."""
    config, _, _ = setup

    def read(after: str, count: int = 20) -> list[dict]:
        out = jobd_cli("events", "-c", str(config), "q", "other", "--json", "--after", after,
                       "--count", str(count))  # fmt: skip
        assert out.returncode == 0, out
        return [json.loads(x) for x in out.stdout.splitlines()]

    r.xadd(EVENTS, {"event": "done", "job": "first"}, id="1000-5")
    (row,) = read("0")
    assert row["job"] == "first"
    r.xadd("{jobd:other}:events", {"event": "done", "job": "same-ms"}, id="1000-2")
    r.xadd(EVENTS, {"event": "done", "job": "tie-q"}, id="2000-0")
    r.xadd("{jobd:other}:events", {"event": "done", "job": "tie-other"}, id="2000-0")
    seen = []
    for _ in range(3):  # one at a time, as a reader stopped after each line would
        (row,) = read(row.get("after", row["id"]), count=1)
        seen.append(row["job"])
    assert seen == ["same-ms", "tie-other", "tie-q"]  # ties: by queue name
    assert read(row.get("after", row["id"])) == []


def test_an_event_line_escapes_and_names_who(r: redis.Redis, setup) -> None:
    config, _, _ = setup
    r.xadd(EVENTS, {"event": "dead-lettered", "queue": "q", "job": b"j\xff\x1b", "consumer": "c1",
                    "attempt": "3", "error": "exit", "exit_code": "1", "due": "60000"},
           id="5-1")  # fmt: skip
    out = jobd_cli("events", "-c", str(config), "q")
    assert out.stdout.decode() == (
        "1970-01-01T00:00:00.005Z  q  dead-lettered  j\\xff\\x1b  c1  attempt=3  error=exit  "
        "exit_code=1  due=1970-01-01T00:01:00.000Z\n"
    )
    row = json.loads(jobd_cli("events", "-c", str(config), "q", "--json").stdout)
    assert (row["job"], row["attempt"], row["exit_code"], row["id"]) == ("j\\xff\x1b", 3, 1, "5-1")
    hostile = {"event": "x", "due": "9" * 17, "count": "9" * 20, "attempt": "²", "exit_code": "-1"}
    r.xadd(EVENTS, hostile, id="6-0")  # numbers no date holds, digits int() refuses
    out = jobd_cli("events", "-c", str(config), "q")
    assert out.returncode == 0 and f"due={'9' * 17}ms  count=" in out.stdout.decode(), out
    out = jobd_cli("events", "-c", str(config), "q", "--json")
    row = json.loads(out.stdout.split()[-1])
    assert out.returncode == 0, out
    assert (row["attempt"], row["exit_code"], row["count"]) == ("²", -1, "9" * 20)


def test_someone_else_s_key_at_an_events_name_reads_as_no_events(r: redis.Redis, setup) -> None:
    _, queues, store = setup
    r.set(EVENTS, "garbage")
    r.hset(HISTORY, "x", "y")
    r.delete(HISTORY)
    r.set(HISTORY, "garbage")
    r.xadd("{jobd:other}:events", {"event": "pause", "queue": "other"}, id="7-0")
    both = [queues["q"], queues["other"]]
    assert [e.id for e in store.events(both, None, 5)] == ["7-0"]
    assert store.events(both, {"q": "0-0", "other": "7-0"}, 5, block_ms=50) == []
    assert store.job(queues["q"], "x").state == "unknown"


def test_a_blocking_read_returns_an_event_written_while_it_waits(r: redis.Redis, setup) -> None:
    _, queues, store = setup
    r.xadd(EVENTS, {"event": "done"}, id="1-0")
    later = threading.Timer(0.3, lambda: r.xadd("{jobd:other}:events", {"event": "pause"}))
    later.start()
    found = store.events([queues["q"], queues["other"]], {"q": "1-0"}, 10, block_ms=5000)
    later.join()
    assert [e.fields["event"] for e in found] == ["pause"]


class Follow:
    """`jobd events --follow --json` running, its lines read as they come."""

    def __init__(self, config: Path, *args: str) -> None:
        command = [sys.executable, "-m", "jobd", "events", "-c", str(config), "--follow", "--json"]
        self.proc = subprocess.Popen(
            [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.lines.extend(json.loads(x) for x in self.proc.stdout)

    def stop(self) -> tuple[int, str]:
        """SIGTERM; its exit status and stderr."""
        self.proc.send_signal(signal.SIGTERM)
        status = self.proc.wait(10)
        self.reader.join(10)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        err = self.proc.stderr.read().decode()
        self.proc.stderr.close()
        return status, err


def test_follow_prints_the_last_events_then_each_new_one_and_exits_0_on_sigterm(
    r: redis.Redis, setup
) -> None:
    config, _, _ = setup
    r.xadd(EVENTS, {"event": "done", "queue": "q", "job": "old"})
    follow = Follow(config)
    wait_until(lambda: [x["job"] for x in follow.lines] == ["old"], what="the last events first")
    r.xadd("{jobd:pq}:events", {"event": "pause", "queue": "pq", "by": "u@h"})
    r.xadd(EVENTS, {"event": "done", "queue": "q", "job": "new"})
    wait_until(lambda: len(follow.lines) == 3, what="the events written after it started")
    assert [x.get("job") or x["event"] for x in follow.lines] == ["old", "pause", "new"]
    assert follow.stop() == (0, "")


def test_follow_survives_a_redis_outage_and_goes_on_from_the_last_event_shown(
    durable_redis, tmp_path: Path
) -> None:
    config = tmp_path / "jobd.yaml"
    config.write_text(CONFIG.replace("{redis}", durable_redis.url))
    r = redis.Redis(port=durable_redis.port)
    r.xadd(EVENTS, {"event": "done", "queue": "q", "job": "before"})
    follow = Follow(config, "q")
    wait_until(lambda: len(follow.lines) == 1, what="the event before the outage")
    r.close()
    outage(durable_redis, 1.0)
    r = redis.Redis(port=durable_redis.port)
    r.xadd(EVENTS, {"event": "done", "queue": "q", "job": "after"})
    wait_until(lambda: len(follow.lines) == 2, what="the event after the outage")
    assert [x["job"] for x in follow.lines] == ["before", "after"], "nothing shown twice"
    status, err = follow.stop()
    r.close()
    assert status == 0
    assert err.count("Redis unreachable") == 1 and "Redis reachable again" in err, err


# -- what real daemons write ----------------------------------------------------------------------

E2E = """\
redis: {{url: '{{redis}}'}}
shutdown_grace: 2s
queues:
  q:
    command: [{handler}]
    concurrency: {concurrency}
    timeout: 60s
    lease: {{renew_every: 200ms, reclaim_after: 2s}}
    retry: {{max_attempts: 3, backoff: 100ms}}
"""
HANDLER = """\
#!/bin/sh
echo "out of $JOBD_JOB_ID attempt $JOBD_ATTEMPT"
echo "err of $JOBD_JOB_ID" >&2
case "$JOBD_JOB_ID" in
  fail*) exit 3 ;;
  long*) while [ ! -e {dir}/release ]; do sleep 0.05; done ;;
esac
exit 0
"""


def e2e(write_config, script, tmp_path: Path, concurrency: int = 4) -> tuple[Path, QueueConfig]:
    handler = script("h.sh", HANDLER.format(dir=tmp_path))
    path = write_config(E2E.format(handler=handler, concurrency=concurrency))
    return path, load(str(path)).queues["q"]


def job_json(config: Path, job_id: str) -> dict:
    out = jobd_cli("job", "-c", str(config), "q", job_id, "--json")
    assert out.returncode in (0, 3), out
    return json.loads(out.stdout)


def test_a_done_job_shows_its_attempt_and_output_tails(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config, q = e2e(write_config, script, tmp_path)
    d = daemon(config)
    assert jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "ok-1").returncode == 0
    wait_until(lambda: Store(r).job(q, "ok-1").state == "done", what="the job done")
    out = jobd_cli("job", "-c", str(config), "q", "ok-1")
    text = out.stdout.decode()
    assert out.returncode == 0, out
    assert text.startswith("job ok-1 of queue q: done\n")
    assert f"  done  attempt 1  on {d.consumer()} (host " in text and "  exit 0  after " in text
    assert "  stdout:\n    out of ok-1 attempt 1\n  stderr:\n    err of ok-1\n" in text
    view = job_json(config, "ok-1")
    (record,) = view["records"]
    assert record["pid"] > 0 and record["consumer"] == d.consumer() and record["exit_code"] == 0
    assert record["started_at"] <= record["at"] and record["entry"] and record["stream"] == "jobd:q"


def test_a_failing_job_shows_each_attempt_until_it_is_dead_lettered(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config, q = e2e(write_config, script, tmp_path)
    daemon(config)
    assert jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "fail-1").returncode == 0
    wait_until(lambda: Store(r).job(q, "fail-1").state == "dead-lettered", what="dead-lettered")
    view = job_json(config, "fail-1")
    attempts = [x for x in view["records"] if "exit_code" in x]
    assert [(x["event"], x["attempt"], x["exit_code"]) for x in attempts] == [
        ("retried", 1, 3), ("retried", 2, 3), ("dead-lettered", 3, 3)]  # fmt: skip
    assert all(x["stdout"] == f"out of fail-1 attempt {x['attempt']}\n" for x in attempts)
    assert attempts[0]["due"] > attempts[0]["at"], "due after its backoff (with jitter)"
    text = jobd_cli("job", "-c", str(config), "q", "fail-1").stdout.decode()
    assert text.startswith("job fail-1 of queue q: dead-lettered\n")
    for n in (1, 2, 3):
        assert f"attempt {n}  on " in text and f"    out of fail-1 attempt {n}\n" in text

    events = [json.loads(x) for x in jobd_cli("events", "-c", str(config), "--json").stdout.split()]
    mine = [(e["event"], e.get("attempt")) for e in events if e.get("job") == "fail-1"]
    assert [e for e in mine if e[0] != "promoted"] == [
        ("retried", 1), ("retried", 2), ("dead-lettered", 3)]  # fmt: skip
    assert all(e["queue"] == "q" and "-" in e["id"] for e in events)


def test_a_running_job_shows_where_it_runs_and_its_deadline(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config, q = e2e(write_config, script, tmp_path)
    d = daemon(config)
    assert jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "long-1").returncode == 0
    wait_until(lambda: Store(r).job(q, "long-1").state == "running", what="its active record")
    view = job_json(config, "long-1")
    running = view["running"]
    assert view["state"] == "running" and running["consumer"] == d.consumer()
    assert Path(f"/proc/{running['pid']}").exists(), "the handler's pid"
    assert running["deadline"] == running["since"] + 60_000 and running["attempt"] == 1
    text = jobd_cli("job", "-c", str(config), "q", "long-1").stdout.decode()
    assert f"running on {d.consumer()} (host " in text and f"pid {running['pid']})" in text
    assert [j.job_id for j in Store(r).running(q)] == ["long-1"]
    (tmp_path / "release").touch()
    wait_until(lambda: Store(r).job(q, "long-1").state == "done", what="the job done")
    assert Store(r).running(q) == [] and r.hlen("{jobd:q}:active") == 0


def test_events_show_outcomes_and_an_operator_s_pause_and_resume(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config, _ = e2e(write_config, script, tmp_path)
    daemon(config)
    follow = Follow(config)
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    assert jobd_cli("resume", "-c", str(config), "q").returncode == 0
    assert jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "ok-2").returncode == 0
    wait_until(lambda: any(x.get("job") == "ok-2" for x in follow.lines), what="the done event")
    assert follow.stop()[0] == 0
    done = next(x for x in follow.lines if x.get("job") == "ok-2")
    assert done["event"] == "done" and done["attempt"] == 1 and done["exit_code"] == 0
    by = [(x["event"], x.get("by", "")) for x in follow.lines if x["event"] in ("pause", "resume")]
    assert [e for e, _ in by] == ["pause", "resume"]
    assert all(who.endswith("@" + __import__("socket").gethostname()) for _, who in by), by
    ids = [x["id"] for x in follow.lines]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    again = jobd_cli("events", "-c", str(config), "--json", "--after", ids[0])
    assert [json.loads(x)["id"] for x in again.stdout.split()] == ids[1:], "resumed by id"


def test_three_daemons_one_job_each_show_three_consumers(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    config, q = e2e(write_config, script, tmp_path, concurrency=1)
    daemons = [daemon(config) for _ in range(3)]
    wait_group(r, "jobd:q")
    for n in range(3):
        r.xadd("jobd:q", {"payload": "x", "job_id": f"long-{n}"})
    store = Store(r)
    wait_until(lambda: len(store.running(q)) == 3, what="three jobs running")
    views = [job_json(config, f"long-{n}") for n in range(3)]
    assert {v["running"]["consumer"] for v in views} == {d.consumer() for d in daemons}
    (tmp_path / "release").touch()
    wait_until(lambda: all(store.job(q, f"long-{n}").state == "done" for n in range(3)))
    done = {job_json(config, f"long-{n}")["records"][-1]["consumer"] for n in range(3)}
    assert done == {d.consumer() for d in daemons}


def test_pause_resume_and_requeue_escape_what_others_wrote(r: redis.Redis, setup) -> None:
    """`jobd pause` (already paused), `jobd resume` and `jobd dlq requeue` print text held in
    Redis (who paused, why a record stays): a terminal escape or a newline in it is escaped."""
    config, _, _ = setup
    evil = "\x1b]52;c;cm0gLXJmIH4=\x07\nFORGED\x9b2J"
    r.hset("{jobd:q}:paused", mapping={"since": "1000", "by": evil})
    r.xadd("{jobd:q}:dead", {"payload": "x", "jobd_job_id": "j", "jobd_fields": evil})
    runs = [
        jobd_cli("pause", "-c", str(config), "q"),
        jobd_cli("resume", "-c", str(config), "q"),
        jobd_cli("dlq", "-c", str(config), "q", "requeue", "--all"),
    ]
    for run in runs:
        out = run.stdout + run.stderr
        assert b"\\x1b]52" in out, run
        assert b"\x1b" not in out and b"\x07" not in out and "\x9b".encode() not in out, out
        assert not any(line.startswith(b"FORGED") for line in out.splitlines()), out
    r.xadd("{jobd:q}:dead", {"payload": "x", "job_id": "victim\u00a0x", "jobd_job_id": "v\u200b"})
    shown = jobd_cli("dlq", "-c", str(config), "q", "show", "v\u200b").stdout.decode()
    assert "job_id: victim\\xa0x\n" in shown and "jobd_job_id: v\\u200b\n" in shown, shown


def test_job_and_events_json_escape_c1_controls(r: redis.Redis, setup) -> None:
    """JSON may carry C1 controls raw (U+009B is a terminal's CSI, U+0085 a newline) and the
    line separators U+2028/9: `jobd job --json` and `jobd events --json` escape them."""
    config, _, _ = setup
    jid = "j\x85\x9b"
    r.hset(HISTORY, jid, line("done", 3000, attempt=1, exit_code=0, stderr="a\x9b2J\u2028b"))
    r.xadd(EVENTS, {"event": "done", "queue": "q", "job": jid, "consumer": "c\x90"}, id="5-1")
    job = jobd_cli("job", "-c", str(config), "q", "--json", jid)
    events = jobd_cli("events", "-c", str(config), "q", "--json")
    for run in (job, events):
        assert run.returncode == 0, run
        assert not re.search(rb"\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]", run.stdout), run.stdout
    assert json.loads(job.stdout)["records"][0]["stderr"] == "a\x9b2J\u2028b"
    assert b'"j\\u0085\\u009b"' in job.stdout
    row = json.loads(events.stdout)
    assert (row["job"], row["consumer"]) == (jid, "c\x90")
