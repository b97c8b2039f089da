"""Review of issue 36 (second pass): the dashboard's pages by position, and per-minute figures
on the daemon host's clock.

1. The delayed / retrying tab paged by index into the delayed set, the recently-done tab by
   index into the history's time index, the running tab by index into its list: when members
   before the cursor leave (delayed jobs promoted, running jobs ended) or come (jobs ending put
   theirs first in the history) between two page loads, the next page skips or repeats jobs.
   Pages now go on from the last (score, member) shown; a hostile cursor gets a 400.
2. The per-minute counters and histograms (done / failed per minute, run and wait times: the
   charts, `jobd status`) were written into the minute of the writing host's clock: a daemon 10
   minutes ahead put its counts 10 minutes into Redis's future, where no chart looks. They now
   go into Redis's minute (and a job's wait is measured on Redis's clock).

The dashboard's WSGI app is called in-process (as tests/test_dashboard_pages.py does); the daemon
and the CLI of part 2 are real processes whose wall clock libfaketime moves (support.skewed).
"""

from __future__ import annotations

import datetime
import io
import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import redis
from support import acked_all, jobd_cli, skewed, wait_until

TOKEN = "cursors-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
DELAYED = "{jobd:q}:delayed"
HISTORY, HISTORY_AT, ACTIVE = "{jobd:q}:history", "{jobd:q}:history:at", "{jobd:q}:active"
# A delayed member as retry.lua / schedule.lua write it: cmsgpack {unique id, field, value, ...}.
ADD_MEMBER = (
    "return redis.call('ZADD', KEYS[1], ARGV[1], "
    "cmsgpack.pack({ARGV[2], 'job_id', ARGV[3], 'payload', 'secret-payload'}))"
)


class App:
    """The dashboard's WSGI app, called as a server would."""

    def __init__(self, config: Path) -> None:
        from jobd.config import load
        from jobd.web.dashboard import Dashboard

        self.config = load(str(config))
        self.app = Dashboard(self.config)

    def call(self, query: dict[str, str]) -> tuple[int, Any]:
        environ = {
            "REQUEST_METHOD": "GET", "PATH_INFO": "/api/jobs",
            "QUERY_STRING": urllib.parse.urlencode(query), "CONTENT_LENGTH": "0",
            "wsgi.input": io.BytesIO(b""), "REMOTE_ADDR": "127.0.0.1",
            "HTTP_AUTHORIZATION": BEARER["Authorization"],
        }  # fmt: skip
        said: list[str] = []
        reply = b"".join(self.app(environ, lambda code, _headers: said.append(code)))
        return int(said[0].split()[0]), json.loads(reply)

    def page(self, state: str, cursor: str | None = None, **query: str) -> dict[str, Any]:
        asked = {"queue": "q", "state": state, **query}
        if cursor:
            asked["cursor"] = cursor
        code, body = self.call(asked)
        assert code == 200, body
        return body


@pytest.fixture
def app(write_config: Any, tmp_path: Path) -> App:
    (tmp_path / "token").write_text(TOKEN + "\n")
    return App(
        write_config(
            "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true], concurrency: 8}\n"
            "dashboard: {actions: true, token_file: token}\n"
        )
    )


def ids(page: dict[str, Any]) -> list[str]:
    return [job["job_id"] for job in page["jobs"]]


def redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- 1. pages by (score, member) --------------------------------------------------------------


def test_delayed_pages_skip_nothing_when_jobs_before_the_cursor_are_promoted(
    r: redis.Redis, app: App
) -> None:
    from jobd.store.store import Store

    for i in range(10):
        done = jobd_cli("enqueue", "-c", str(app.config.path), "q", "x", "--job-id",
                        f"later-{i:02}", "--delay", f"{i + 1}h")  # fmt: skip
        assert done.returncode == 0, done.stderr
    first = app.page("delayed", count="4")
    assert ids(first) == [f"later-{i:02}" for i in range(4)]
    # The three soonest become due and the daemon's delayed duty promotes them (promote.lua):
    # they leave the set, before the cursor.
    soonest = r.zrange(DELAYED, 0, 2)
    r.zadd(DELAYED, {m: redis_ms(r) - 1000 for m in soonest}, xx=True)
    promoted = Store(r).promote(app.config.queues["q"], 100, 1000)
    assert promoted.moved == 3 and r.xlen("jobd:q") == 3
    second = app.page("delayed", first["cursor"], count="4")
    # Expected: the jobs after the last one shown; by index, later-04 to later-06 were skipped.
    assert ids(second) == [f"later-{i:02}" for i in range(4, 8)]
    assert "secret" not in json.dumps([first, second])


def test_delayed_pages_through_jobs_due_at_the_same_time_as_they_are_promoted(
    r: redis.Redis, app: App
) -> None:
    # 30 jobs due at the same millisecond (`--at` one time): the set orders them by member;
    # each page's jobs are promoted (removed) before the next page is asked for.
    due = redis_ms(r) + 3_600_000
    for i in range(30):
        r.eval(ADD_MEMBER, 1, DELAYED, due, f"{(i * 7919) % 30:04}-uid", f"same-{i:02}")
    r.eval(ADD_MEMBER, 1, DELAYED, due + 1, "0000-uid", "after")
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        page = app.page("delayed", cursor, count="7")
        seen += ids(page)
        shown = r.zrangebyscore(DELAYED, due, due, start=0, num=len(page["jobs"]))
        if shown:
            r.zrem(DELAYED, *shown)
        cursor = page["cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted([f"same-{i:02}" for i in range(30)] + ["after"]), seen
    assert len(seen) == len(set(seen)), "a job shown twice"


def test_recent_pages_repeat_and_skip_nothing_while_jobs_end(r: redis.Redis, app: App) -> None:
    # Jobs by their latest record's time, latest first; several settled in one script call share
    # a millisecond. While the operator reads page one, three more jobs end (theirs come first).
    start = redis_ms(r) - 60_000
    for i in range(12):
        r.zadd(HISTORY_AT, {f"job-{i:02}": start + (i // 3) * 1000})
        r.hset(HISTORY, f"job-{i:02}", json.dumps({"event": "done", "at": start}) + "\n")
    latest = sorted((f"job-{i:02}" for i in range(12)),
                    key=lambda j: (int(j[4:]) // 3, j), reverse=True)  # fmt: skip
    first = app.page("recent", count="4")
    assert ids(first) == latest[:4]
    for i in range(12, 15):
        r.zadd(HISTORY_AT, {f"job-{i:02}": start + 50_000})
        r.hset(HISTORY, f"job-{i:02}", json.dumps({"event": "done"}) + "\n")
    second = app.page("recent", first["cursor"], count="4")
    # Expected: the next four older ones; by index, page two began with three of page one's.
    assert ids(second) == latest[4:8], ids(second)
    r.zrem(HISTORY_AT, *ids(second))  # trimmed meanwhile (history.maxlen): nothing skipped
    third = app.page("recent", second["cursor"], count="4")
    assert ids(third) == latest[8:12] and third["cursor"] is None, ids(third)


def test_running_pages_skip_nothing_when_a_job_before_the_cursor_ends(
    r: redis.Redis, app: App
) -> None:
    # Five jobs running on one daemon (their entries pending on it, their active records as
    # start.lua writes them); the oldest ends between two page loads.
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    entries = [r.xadd("jobd:q", {"job_id": f"run-{i}"}).decode() for i in range(5)]
    r.xreadgroup("jobd", "daemon-1", {"jobd:q": ">"})
    since = redis_ms(r) - 10_000
    for i, entry in enumerate(entries):
        record = {"consumer": "daemon-1", "host": "h", "pid": 100 + i, "since": since + i}
        r.hset(ACTIVE, f"run-{i}", f"jobd:q|{entry}\n{json.dumps(record)}")
    first = app.page("running", count="2")
    assert ids(first) == ["run-0", "run-1"]
    r.xack("jobd:q", "jobd", entries[0])  # settled: settle.lua deletes its record
    r.hdel(ACTIVE, "run-0")
    second = app.page("running", first["cursor"], count="2")
    assert ids(second) == ["run-2", "run-3"], "by index, run-2 was skipped"
    third = app.page("running", second["cursor"], count="2")
    assert ids(third) == ["run-4"] and third["cursor"] is None


HOSTILE = (
    "x", "-1", "5", "1e5", ":", "::", "1:w", "1:q:AAAA", "1:w:A", "nan:w:AAAA", "NaN:p:AAAA",
    "inf:x:AA", "1:w:A=A=", "1:w:!!", "1:w:" + "A" * 5000, "1" * 400 + ":w:AA", "0x10:w:AA",
    "1 :w:AA", "1:w:AA\n", "1:w:AA:", "\x00:w:AA", "١:w:AA", "1.e5:w:AA", "+-1:w:AA",
)  # fmt: skip


def test_hostile_cursors_get_400_never_500(r: redis.Redis, app: App) -> None:
    for i in range(3):
        r.eval(ADD_MEMBER, 1, DELAYED, 1000 + i, f"{i}-uid", f"j-{i}")
        r.zadd(HISTORY_AT, {f"j-{i}": 1000 + i})
    for state in ("delayed", "recent", "running"):
        for cursor in HOSTILE:
            code, body = app.call({"queue": "q", "state": state, "cursor": cursor})
            assert code == 400, (state, cursor, code, body)
            assert body["error"].startswith("cursor is the one the last page gave"), body
    # What a page gives back, and cursors at the ends of the scores, are taken.
    for state in ("delayed", "recent"):
        cursor = app.page(state, count="1")["cursor"]
        assert cursor and app.page(state, cursor, count="1")["jobs"]
        for edge in ("inf:w:", "-inf:p:AA", "1e+300:w:", "-3.5e-05:w:AA", "0:w:" + "_" * 1364):
            assert app.page(state, edge)["jobs"] is not None


# -- 2. per-minute figures on Redis's clock ---------------------------------------------------


def minute_keys(r: redis.Redis, family: str) -> dict[int, dict[bytes, bytes]]:
    """Every per-minute hash of queue q's family (stats, timings), by minute."""
    found = {}
    for key in r.scan_iter(match=f"{{jobd:q}}:{family}:*".replace("{", "[{]"), count=1000):
        found[int(key.decode().rsplit(":", 1)[1])] = r.hgetall(key)
    return found


def test_a_daemon_10_minutes_ahead_counts_in_redis_minutes(
    r: redis.Redis, daemon: Any, write_config: Any
) -> None:
    from jobd.config import load
    from jobd.store import figures

    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  q:\n    command: [sh, -c, 'test \"$(cat)\" != fail']\n    concurrency: 4\n"
        "    retry: {max_attempts: 2, backoff: 100ms, jitter: 0}\n"
    )
    ahead = {**skewed("+600s"), "JOURNAL_STREAM": ""}  # the log's timestamps: its own clock
    d = daemon(config, ahead)
    line = next(x for x in d.log().splitlines() if "jobd running as consumer" in x)
    logged = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert abs(logged - time.time() - 600) < 30, "the daemon's clock is not 10 minutes ahead"
    before = int(r.time()[0]) // 60
    for i in range(10):
        r.xadd("jobd:q", {"payload": "ok" if i < 8 else "fail"})
    wait_until(lambda: acked_all(r, "jobd:q", 12) and r.xlen("{jobd:q}:dead") == 2,
               what="8 jobs done, 2 dead-lettered after a retry")  # fmt: skip
    # A job cancelled by `jobd cancel` run on a host 10 minutes ahead (control.py's count).
    assert jobd_cli("enqueue", "-c", str(config), "q", "x", "--job-id", "later",
                    "--delay", "1h").returncode == 0  # fmt: skip
    cancelled = jobd_cli("cancel", "-c", str(config), "q", "later", env=ahead)
    assert cancelled.returncode == 0, cancelled.stderr
    after = int(r.time()[0]) // 60
    stats, timings = minute_keys(r, "stats"), minute_keys(r, "timings")
    wrong = sorted(m - after for m in [*stats, *timings] if not before <= m <= after)
    assert not wrong, f"minutes written this far from Redis's (minutes): {wrong}"
    total = {name: sum(int(h.get(name.encode(), 0)) for h in stats.values())
             for name in ("done", "failed", "retried", "dead", "cancelled")}  # fmt: skip
    assert total == {"done": 8, "failed": 4, "retried": 2, "dead": 2, "cancelled": 1}, total
    runs = sum(int(v) for h in timings.values() for k, v in h.items() if k.startswith(b"run:"))
    assert runs == 12
    # Each job waited seconds at most (Redis's clock), not the 10 minutes between the clocks.
    waits = {int(k.split(b":")[1]) for h in timings.values() for k in h if k.startswith(b"wait:")}
    assert max(waits) <= figures.bucket(30), f"wait buckets {sorted(waits)}"
    # The chart and `jobd status` see them (both read Redis's minutes).
    hour = figures.last_hour(r, load(str(config)).queues["q"])
    assert (sum(hour["series"]["done"]), sum(hour["series"]["failed"])) == (8, 4)
    status = json.loads(jobd_cli("status", "-c", str(config), "--json", env=ahead).stdout)
    q = status["queues"]["q"]
    assert q["last_minute"]["done"] + q["this_minute"]["done"] == 8 or after - before > 1


def test_figures_keys_take_redis_minutes_only() -> None:
    """keys.py derives a minute's keys from a minute it is given: no default of this host's
    clock left for a caller to fall into."""
    from jobd.store.keys import QueueKeys

    keys = QueueKeys.of("jobd:q")
    with pytest.raises(TypeError):
        keys.stats()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        keys.timings()  # type: ignore[call-arg]
    assert re.fullmatch(r"\{jobd:q\}:stats:29000000", keys.stats(29_000_000))
