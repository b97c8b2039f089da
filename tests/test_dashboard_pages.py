"""The dashboard's overview and queue pages' API (issue 36): every queue's row, the daemons, one
queue's figures, and pages of its jobs by state, read in bounded steps; the bulk actions they
offer. The WSGI app called in-process on the session's Redis (the browser tests drive a real
server: test_dashboard_ui.py)."""

from __future__ import annotations

import io
import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import redis
from support import jobd_cli

TOKEN = "pages-token-0123456789"


class App:
    """The dashboard's WSGI app, called as a server would."""

    def __init__(self, config: Path) -> None:
        from jobd.config import load
        from jobd.web.dashboard import Dashboard

        self.config = load(str(config))
        self.app = Dashboard(self.config)

    def call(
        self, method: str, path: str, body: dict | None = None, headers: dict | None = None
    ) -> tuple[int, Any]:
        raw = json.dumps(body).encode() if body is not None else b""
        path, _, query = path.partition("?")
        environ = {
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query,
            "CONTENT_LENGTH": str(len(raw)), "wsgi.input": io.BytesIO(raw),
            "REMOTE_ADDR": "127.0.0.1",
        }  # fmt: skip
        for name, value in (headers or {}).items():
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        said: list[str] = []
        reply = b"".join(self.app(environ, lambda code, _headers: said.append(code)))
        return int(said[0].split()[0]), json.loads(reply)

    def get(self, path: str, **query: str) -> Any:
        code, body = self.call("GET", f"{path}?{urllib.parse.urlencode(query)}", None, BEARER)
        assert code == 200, body
        return body

    def headers(self) -> dict[str, str]:
        return {**BEARER, "X-Jobd-CSRF": self.get("/api/summary")["csrf"]}


BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def app(write_config, tmp_path: Path) -> App:
    (tmp_path / "token").write_text(TOKEN + "\n")
    return App(
        write_config(
            "redis: {url: '{redis}'}\nqueues:\n"
            "  q: {command: [/bin/true], concurrency: 3}\n"
            "  other: {command: [/bin/true], priorities: [high, low]}\n"
            "dashboard: {actions: true, token_file: token}\n"
        )
    )


def waiting_page(app: App, **query: str) -> dict[str, Any]:
    return app.get("/api/jobs", queue="q", state="waiting", **query)


def test_waiting_jobs_page_through_500_and_a_search_finds_one(r: redis.Redis, app: App) -> None:
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline()
    for i in range(500):
        pipe.xadd("jobd:q", {"payload": "p" * 100, "job_id": f"job-{i:03}"})
    pipe.execute()
    r.xreadgroup("jobd", "someone", {"jobd:q": ">"}, count=10)  # delivered: not waiting
    seen, cursor, pages = [], "", 0
    while True:
        page = waiting_page(app, count="200", **({"cursor": cursor} if cursor else {}))
        seen += [job["job_id"] for job in page["jobs"]]
        pages += 1
        assert len(page["jobs"]) <= 200 and "payload" not in json.dumps(page)
        if page["cursor"] is None:
            break
        cursor = page["cursor"]
    assert seen == [f"job-{i:03}" for i in range(10, 500)] and pages == 3
    found = waiting_page(app, find="job-377")["jobs"]
    assert [job["job_id"] for job in found] == ["job-377"]
    assert found[0]["attempt"] == "1" and found[0]["enqueued"] > time.time() - 60
    assert waiting_page(app, find="nope")["jobs"] == []


def test_a_search_looks_at_a_bounded_number_of_entries_and_goes_on_from_its_cursor(
    r: redis.Redis, app: App
) -> None:
    from jobd.web.pages import SCAN

    pipe = r.pipeline()
    for i in range(SCAN + 5):
        pipe.xadd("jobd:q", {"job_id": f"j{i}"})
    pipe.execute()
    page = waiting_page(app, find=f"j{SCAN + 2}")
    assert page["jobs"] == [] and page["cursor"] is not None, "stopped at its bound"
    page = waiting_page(app, find=f"j{SCAN + 2}", cursor=page["cursor"])
    assert [job["job_id"] for job in page["jobs"]] == [f"j{SCAN + 2}"]


def test_dead_letters_page_newest_first_and_a_bulk_requeue_of_three(
    r: redis.Redis, app: App
) -> None:
    ids = [
        r.xadd("{jobd:q}:dead", {
            "payload": "secret", "jobd_job_id": f"dead-{i}", "jobd_error": "exit",
            "jobd_exit_code": "3", "jobd_attempts": "2", "jobd_failed_at": "1795960000000",
            "jobd_stderr": "x" * 5000,
        }).decode()
        for i in range(7)
    ]  # fmt: skip
    page = app.get("/api/jobs", queue="q", state="dead", count="5")
    assert [d["job_id"] for d in page["jobs"]] == [f"dead-{i}" for i in range(6, 1, -1)]
    assert "payload" not in page["jobs"][0] and page["jobs"][0]["cut"] == ["stderr"]
    rest = app.get("/api/jobs", queue="q", state="dead", cursor=page["cursor"])
    assert [d["job_id"] for d in rest["jobs"]] == ["dead-1", "dead-0"] and rest["cursor"] is None
    assert [d["id"] for d in app.get("/api/jobs", queue="q", state="dead", find="-4")["jobs"]] == [
        ids[4]
    ]
    chosen = {"queue": "q", "ids": ids[1:4]}
    code, body = app.call("POST", "/api/dead-letters/requeue", chosen, BEARER)  # forged: no CSRF
    assert code == 403 and "CSRF" in body["error"] and r.xlen("{jobd:q}:dead") == 7
    code, body = app.call("POST", "/api/dead-letters/requeue", chosen, app.headers())
    assert code == 200 and body["requeued"] == ids[1:4]
    assert r.xlen("{jobd:q}:dead") == 4 and r.xlen("jobd:q") == 3


def test_delayed_jobs_page_by_index_and_the_recent_list_reads_the_history(
    r: redis.Redis, app: App, tmp_path: Path
) -> None:
    for i in range(12):
        enqueue = ("enqueue", "-c", str(app.config.path), "q", "x", "--job-id", f"later-{i:02}",
                   "--delay", f"{i + 1}h")  # fmt: skip
        assert jobd_cli(*enqueue).returncode == 0
    page = app.get("/api/jobs", queue="q", state="delayed", count="5")
    assert [j["job_id"] for j in page["jobs"]] == [f"later-{i:02}" for i in range(5)]
    page = app.get("/api/jobs", queue="q", state="delayed", count="5", cursor=page["cursor"])
    assert [j["job_id"] for j in page["jobs"]] == [f"later-{i:02}" for i in range(5, 10)]
    dues = [j["due"] for j in page["jobs"]]
    assert dues == sorted(dues) and "secret" not in json.dumps(page)
    found = app.get("/api/jobs", queue="q", state="delayed", find="later-11")["jobs"]
    assert [j["job_id"] for j in found] == ["later-11"]
    recent = app.get("/api/jobs", queue="q", state="recent", count="5")
    assert recent["total"] == 12 and len(recent["jobs"]) == 5
    assert recent["jobs"][0]["event"] == "scheduled", recent
    assert app.get("/api/jobs", queue="q", state="recent", find="later-03")["jobs"][0][
        "job_id"
    ] == ("later-03")


def test_the_summary_has_a_row_per_queue_and_redis_figures(r: redis.Redis, app: App) -> None:
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    for _ in range(4):
        r.xadd("jobd:q", {"payload": "x"})
    r.hset("{jobd:q}:paused", mapping={"since": int(time.time() * 1000), "by": "op@host"})
    summary = app.get("/api/summary")
    assert set(summary["queues"]) == {"q", "other"}
    row = summary["queues"]["q"]
    assert (row["state"], row["backlog"], row["dead_lettered"]) == ("paused", 4, 0)
    assert row["paused"]["by"] == "op@host" and row["concurrency"] == 0
    assert summary["queues"]["other"]["levels"] == ["high", "low"]
    server = summary["server"]
    assert server["redis_version"] and server["role"] == "master" and server["used_memory"] > 0
    assert summary["daemons"] == [] and app.get("/api/daemons")["daemons"] == []


def test_bad_page_queries_get_400(app: App) -> None:
    for query, why in (
        ({"queue": "nope", "state": "waiting"}, "give a known queue"),
        ({"queue": "q", "state": "nowhere"}, "state is one of"),
        ({"queue": "q", "state": "waiting", "count": "0"}, "count is a number from 1 to 200"),
        ({"queue": "q", "state": "waiting", "count": "201"}, "count is a number"),
        ({"queue": "q", "state": "waiting", "cursor": "x"}, "cursor is the one"),
        ({"queue": "q", "state": "delayed", "cursor": "-1"}, "cursor is the one"),
        ({"queue": "other", "state": "waiting", "level": "mid"}, "level is one of"),
        ({"queue": "q", "state": "waiting", "find": "x" * 1025}, "find is at most"),
    ):
        code, body = app.call("GET", "/api/jobs?" + urllib.parse.urlencode(query), None, BEARER)
        assert code == 400 and body["error"].startswith(why), (query, body)
    assert app.call("GET", "/api/jobs?queue=q&state=waiting")[0] == 401


def test_percentiles_are_interpolated_within_their_bucket() -> None:
    from jobd.store.figures import BUCKETS, interpolated

    counts = [0] * (len(BUCKETS) + 1)
    counts[BUCKETS.index(1)] = 10  # ten jobs between 0.5 s and 1 s
    assert interpolated(counts, 50) == pytest.approx(0.75)
    assert interpolated(counts, 90) == pytest.approx(0.95)
    counts[-1] = 90  # most above the last bound: that bound, as histogram_quantile says
    assert interpolated(counts, 99) == BUCKETS[-1]
    assert interpolated([0] * len(counts), 50) is None


def test_the_queue_page_has_the_hours_latency_per_minute(r: redis.Redis, app: App) -> None:
    q = app.config.queues["q"]
    minute = int(time.time() // 60)
    r.hset(q.keys.stats(minute), mapping={"done": 7, "failed": 2})
    r.hset(q.keys.timings(minute), mapping={"run:8": 4})  # 4 jobs of 1 s to 2.5 s
    page = app.get("/api/queue", queue="q")["status"]
    hour = page["hour"]
    assert hour["series"]["done"][-1] == 7 and hour["series"]["failed"][-1] == 2
    assert hour["latency"]["p50"][-1] == pytest.approx(1.75) and hour["latency"]["p50"][0] is None
    assert len(hour["latency"]["p99"]) == 60 and page["concurrency"] == 3


def test_a_running_job_jobd_cancel_marked_says_cancelling(r: redis.Redis, app: App) -> None:
    """A job being cancelled said "running" until its handler stopped: its active record and
    the pending list say it runs, the cancel mark that it is being stopped."""
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    entries = [r.xadd("jobd:q", {"job_id": name}).decode() for name in ("stays", "goes")]
    r.xreadgroup("jobd", "host-1-abcd", {"jobd:q": ">"}, count=2)
    for name, entry in zip(("stays", "goes"), entries, strict=True):
        record = {"consumer": "host-1-abcd", "host": "host", "pid": 1, "since": 1, "attempt": 1}
        r.hset("{jobd:q}:active", name, f"jobd:q|{entry}\n".encode() + json.dumps(record).encode())
    page = app.get("/api/jobs", queue="q", state="running")
    assert [(j["job_id"], j["cancelling"]) for j in page["jobs"]] == [
        ("goes", False),
        ("stays", False),
    ]
    r.zadd("{jobd:q}:cancels", {f"id:jobd:q|{entries[1]}": int(time.time() * 1000)})
    page = app.get("/api/jobs", queue="q", state="running")
    assert {j["job_id"]: j["cancelling"] for j in page["jobs"]} == {"goes": True, "stays": False}
    assert app.get("/api/job", queue="q", id="goes")["state"] == "cancelling"


def test_a_page_stops_at_its_bytes_bound_and_its_cursor_goes_on(r: redis.Redis, app: App) -> None:
    """An entry is read whole in Redis: a page reads no entry once those read hold
    READ_BUDGET bytes (one more at most), the cursor carrying on; nothing is lost or repeated."""
    from jobd.store.browse import READ_BUDGET

    big = b"x" * (READ_BUDGET // 3)
    for i in range(10):
        r.xadd("jobd:q", {"payload": big, "job_id": f"w-{i}"})
        r.eval("redis.call('ZADD', KEYS[1], ARGV[1], cmsgpack.pack({ARGV[2], 'payload', ARGV[3], "
               "'job_id', ARGV[2]}))", 1, "{jobd:q}:delayed", 2e12 + i, f"d-{i}", big)  # fmt: skip
    for state, prefix in (("waiting", "w"), ("delayed", "d")):
        seen, sizes, cursor = [], [], ""
        while cursor is not None:
            page = app.get(
                "/api/jobs", queue="q", state=state, **({"cursor": cursor} if cursor else {})
            )
            seen += [job["job_id"] for job in page["jobs"]]
            sizes.append(len(page["jobs"]))
            cursor = page["cursor"]
        assert seen == [f"{prefix}-{i}" for i in range(10)], state
        assert max(sizes) == 3, (state, sizes)  # 3 entries hold the budget: the 3rd passes it


def test_the_page_knows_the_apis_limits_for_a_selection() -> None:
    """The page sends a larger selection in requests of the API's limits."""
    import re
    from importlib import resources

    from jobd.web import actions

    script = resources.files("jobd.web").joinpath("static", "dashboard.js").read_text()
    limits = dict(re.findall(r"const (CANCEL_MAX|REQUEUE_MAX) = (\d+);", script))
    assert limits == {"CANCEL_MAX": str(actions.MAX_JOB_IDS), "REQUEUE_MAX": str(actions.MAX_IDS)}
