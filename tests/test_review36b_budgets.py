"""Review of issue 36 (second pass): the dashboard's reads are bounded (docs/operations/
dashboard.md: "Every read is bounded in bytes too … 1 MiB"), but four reads were not:

1. ``recent.lua`` took a job's last history record with an unanchored ``string.match(blob,
   '([^\\n]*)\\n?$')``: Lua tries the pattern at every position, each try running to the end of
   its line, so the cost is the sum of the squares of the lines' lengths. One job with a long
   history (thousands of records, or a few MiB someone wrote) blocked Redis for seconds each
   time its page of recent jobs was drawn (every 5 s while the tab is open).
2. ``lib/shown.lua`` counted an entry's bytes, not its fields: an entry of 100 000 empty fields
   holds a few bytes, so a page read 50 (or 200) of them whole, millions of fields copied into
   the script while Redis served nobody.
3. ``registry.LISTED`` kept the 1 000 *oldest* beats: with more entries (anyone who can write
   to Redis can add them), the live daemons were the ones left out.
4. The overview (``/api/summary``), the queue page and the running tab read each queue's active
   hash with HGETALL, one XPENDING and one ZSCORE per record: with 100 000 records (running
   jobs, or someone else's) that is tens of MiB through the dashboard and 200 000 commands.

Real Redis, the real ``jobd dashboard`` (and a real daemon where one is listed); Redis being
blocked is measured from a second client (the longest a PING waited for its PONG), what a
request moved out of Redis from its own count (``total_net_output_bytes``).
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from support import dashboard_server, get_json, queue_config, wait_until
from test_dashboard import headless_chromium, needs_chromium, shown

from jobd.store import browse, registry, scripts

QUEUE = "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"
HISTORY, HISTORY_AT = "{jobd:q}:history", "{jobd:q}:history:at"
BLOCKED = 1.0  # seconds Redis may keep a PING waiting while a page is drawn (2 to 5+ before)


def now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def sent(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_output_bytes"])


def worst_ping_during(r: redis.Redis, action: Callable[[], Any]) -> tuple[float, Any]:
    """The longest a PING waited for its PONG (a BUSY reply is no PONG: it is sent again)
    while ``action`` ran, and what ``action`` returned. A script still running after the
    action (the server gave up on it) is killed."""
    client = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
    worst, done = [0.0], threading.Event()

    def ping() -> None:
        while not done.is_set():
            sent_at = time.monotonic()
            while True:
                try:
                    client.ping()
                    break
                except redis.ResponseError:  # BUSY: a script runs past busy-reply-threshold
                    time.sleep(0.01)
            worst[0] = max(worst[0], time.monotonic() - sent_at)
            time.sleep(0.01)

    thread = threading.Thread(target=ping)
    thread.start()
    try:
        result = action()
    finally:
        time.sleep(0.2)  # the PING waiting behind a script comes back now
        done.set()
        thread.join(60)
        with_kill(client)
        client.close()
    return worst[0], result


def with_kill(client: redis.Redis) -> None:
    with contextlib.suppress(redis.ResponseError):  # NOTBUSY
        client.script_kill()


@pytest.fixture
def config(write_config: Any) -> Path:
    return write_config(QUEUE)


@pytest.fixture
def page(config: Path) -> Iterator[Callable[[str], dict]]:
    with dashboard_server(config) as port:
        yield lambda path: get_json(port, path)


# -- 1. the last record of a long history ---------------------------------------------------


def history(records: int, size: int, last: str = "done") -> bytes:
    """A job's records as the settling scripts write them: one JSON object a line, oldest
    first, each about ``size`` bytes (its stderr tail), the last one ``last``."""
    line = {"event": "retried", "attempt": 1, "stderr": "e" * size, "consumer": "c"}
    lines = [orjson.dumps(line)] * (records - 1)
    lines.append(orjson.dumps({**line, "event": last, "attempt": records}))
    return b"\n".join(lines)


def test_a_page_of_recent_jobs_with_a_long_history_does_not_block_redis(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """850 records of 1 060 bytes (stderr tails; 900 KiB, under the page's 1 MiB: read): Lua's
    unanchored match cost about 850 × 1 060² steps; finding the last newline backwards, 1 060."""
    r.hset(HISTORY, "long", history(850, 1000))
    r.zadd(HISTORY_AT, {"long": now_ms(r)})
    blocked, shown = worst_ping_during(r, lambda: page("/api/jobs?queue=q&state=recent"))
    assert [(j["job_id"], j["event"], j["attempt"]) for j in shown["jobs"]] == [
        ("long", "done", "850")
    ], shown
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during one page"


def test_a_history_of_a_few_mib_is_not_read_and_the_page_goes_on(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """2 MiB of records under one job (jobd keeps 64 KiB a job: someone else wrote them) beside
    two jobs of 700 KiB: the big one is said, not read; the two do not fit one 1 MiB page, the
    cursor goes on to the second."""
    at = now_ms(r)
    r.hset(HISTORY, mapping={"big": history(2000, 1000), "a": history(2000, 300, "expired"),
                             "b": history(2000, 300, "poison")})  # fmt: skip
    r.zadd(HISTORY_AT, {"big": at, "a": at - 1, "b": at - 2})
    blocked, first = worst_ping_during(r, lambda: page("/api/jobs?queue=q&state=recent"))
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during one page"
    rows = [(j["job_id"], j["event"]) for j in first["jobs"]]
    assert rows == [("big", ""), ("a", "expired")] and first["cursor"], first
    assert "bytes, more than a page reads" in first["jobs"][0]["bad"], first["jobs"][0]
    second = page(f"/api/jobs?queue=q&state=recent&cursor={first['cursor']}")
    assert [(j["job_id"], j["event"]) for j in second["jobs"]] == [("b", "poison")], second
    assert second["cursor"] is None


# -- 2. entries of many empty fields ---------------------------------------------------------


def xadd_raw(r: redis.Redis, key: str, entries: int, pairs: list[bytes]) -> None:
    """``entries`` entries of ``pairs`` (name, value, …) on ``key``, sent as raw RESP: an
    argument list of 200 000 empty strings packs in no time that way."""
    head = [b"XADD", key.encode(), b"*"]
    command = b"*%d\r\n" % (len(head) + len(pairs))
    command += b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in head + pairs)
    kwargs = r.connection_pool.connection_kwargs
    with socket.create_connection((kwargs.get("host", "127.0.0.1"), kwargs["port"])) as sock:
        for _ in range(entries):
            sock.sendall(command)
        reader = sock.makefile("rb")
        replies = [reader.readline() + reader.readline() for _ in range(entries)]
    assert all(reply.startswith(b"$") for reply in replies), replies[:3]


def dead_letter_fields(n: int) -> list[bytes]:
    jobd = {b"jobd_job_id": b"wide", b"jobd_queue": b"q", b"jobd_error": b"exit",
            b"jobd_exit_code": b"1", b"jobd_attempts": b"1", b"jobd_failed_at": b"1795960000000",
            b"jobd_stderr": b"boom"}  # fmt: skip
    return [x for pair in jobd.items() for x in pair] + [b""] * (2 * n)


@pytest.mark.parametrize(("fields", "count", "fits"), [(100_000, 50, 1), (10_000, 200, 2)])
def test_a_page_of_entries_of_many_empty_fields_is_bounded(
    r: redis.Redis, page: Callable[[str], dict], fields: int, count: int, fits: int
) -> None:
    """``count`` dead letters of ``fields`` empty fields besides jobd's (a few bytes each, so
    the byte budget took all ``count``): a page reads those that fit 1 MiB counting a field 64
    bytes (``fits``: the one that passes it too), and says how many fields of each it does
    not show."""
    xadd_raw(r, "{jobd:q}:dead", count, dead_letter_fields(fields))
    blocked, shown = worst_ping_during(
        r, lambda: page(f"/api/jobs?queue=q&state=dead&count={count}")
    )
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during one page"
    assert len(shown["jobs"]) == fits and shown["cursor"], (len(shown["jobs"]), fits)
    assert [j.get("fields_not_shown") for j in shown["jobs"]] == [fields + 1] * fits
    assert {j["job_id"] for j in shown["jobs"]} == {"wide"}


def test_a_waiting_entry_of_many_empty_fields_is_marked(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """The waiting tab reads entries the same way: one of 100 000 empty fields besides its
    payload and job id is shown, its fields not shown counted; the page stops after it."""
    xadd_raw(r, "jobd:q", 3, [b"payload", b"x", b"job_id", b"w"] + [b""] * 200_000)
    shown = page("/api/jobs?queue=q&state=waiting")
    assert [(j["job_id"], j.get("fields_not_shown")) for j in shown["jobs"]] == [("w", 100_001)]
    assert shown["cursor"], shown


def msgpack_array(values: list[bytes]) -> bytes:
    """A msgpack array of short strings (< 32 bytes each), as cmsgpack reads it."""
    body = b"".join(bytes([0xA0 | len(v)]) + v for v in values)
    return b"\xdd" + struct.pack(">I", len(values)) + body


def test_a_delayed_member_of_many_fields_counts_them(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """A delayed member decoding to 100 000 empty fields is 200 KiB of msgpack: six of them
    fit the byte budget, 1.2 million values decoded; counted 64 bytes a field, one does."""
    for i in range(20):
        member = msgpack_array([b"u%d" % i] + [b""] * 200_000)
        r.zadd("{jobd:q}:delayed", {member: 1_000_000 + i})
    shown = page("/api/jobs?queue=q&state=delayed")
    assert len(shown["jobs"]) == 1 and shown["cursor"], shown
    assert "more than 1000 fields" in shown["jobs"][0]["bad"]


def test_the_field_cost_is_one_number() -> None:
    text = scripts.source("entries_shown")
    found = re.search(r"^local FIELD_COST = (\d+) -- jobd\.store\.browse\.FIELD_COST$", text, re.M)
    assert found and int(found[1]) == browse.FIELD_COST


def test_a_null_lag_over_entries_of_many_fields_reads_none(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """Once Redis cannot say the lag (an entry deleted by hand after the group's last delivered
    one), the summary counts the entries in Redis (``count_after.lua``), 10 000 at most: 100 of
    100 000 empty fields were 10 million fields read; now it stops at 16 MiB, counted 64 bytes
    a field, and says the backlog is at least what it counted."""
    first = r.xadd("jobd:q", {"payload": "x"})
    r.xgroup_create("jobd:q", "jobd", id=first)
    gone = r.xadd("jobd:q", {"payload": "x"})
    xadd_raw(r, "jobd:q", 100, [b"payload", b"x"] + [b""] * 200_000)
    r.xdel("jobd:q", gone)
    blocked, shown = worst_ping_during(r, lambda: page("/api/summary"))
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during one summary"
    row = shown["queues"]["q"]
    # Fixer's notes: 36l's group read weighed the stream (46 MiB) and read nothing of it
    # ("unknown"); issue 36's copies no entry, and since review 36o a null lag is not counted
    # (that read the entries): "unknown", never "idle".
    assert (row["lag_known"], row["state"]) == (False, "unknown"), row


# -- 3. the daemon registry holding more than LISTED entries ---------------------------------


def test_more_than_1000_registry_entries_never_hide_the_live_daemon(
    r: redis.Redis, daemon: Any, write_config: Any
) -> None:
    """1 500 entries someone wrote, beating an hour ago, and 1 500 at +inf: the live daemon,
    which beats now, is listed; what is not listed is said."""
    config = write_config(queue_config("[/bin/true]"))
    d = daemon(config)
    name = d.consumer()
    wait_until(lambda: name in {x["name"] for x in registry.listing(r)["daemons"]},
               what="the daemon listed")  # fmt: skip
    old = now_ms(r) - 3_600_000
    pipe = r.pipeline(transaction=False)
    for i in range(1500):
        pipe.zadd("{jobd:daemons}", {f"fake-{i}": old + i, f"inf-{i}": float("inf")})
        pipe.hset(f"{{jobd:daemons}}:daemon:fake-{i}", mapping={
            "host": "h", "pid": "1", "version": "v", "running": "0", "slots": "1",
            "beat_every": "5000", "lease": "60000", "queues": "[]", "state": "running",
            "started": str(old)})  # fmt: skip
    pipe.execute()
    listed = registry.listing(r)
    names = [x["name"] for x in listed["daemons"]]
    assert name in names, f"the live daemon is not among the {len(names)} listed"
    assert len(names) == registry.LISTED and names[-1] == name, names[-3:]
    assert "fake-0" not in names and not any(n.startswith("inf-") for n in names)
    assert listed["error"] == (
        f"1501 daemons in the registry: the {registry.LISTED} newest beats listed; 1500 entries "
        "beat ahead of Redis's clock (+inf, or a time to come: written by no daemon): not listed"
    )


# -- 4. the active hash of 100 000 records ---------------------------------------------------


def fill_active(r: redis.Redis, records: int) -> None:
    """``records`` active records of jobs of entries that were never delivered (stale, or
    someone else's), each ~250 bytes, as jobd writes one."""
    body = orjson.dumps({"consumer": "ghost", "host": "h", "pid": 1, "attempt": 1,
                         "since": 1795960000000, "deadline": 1795960060000, "status": "s" * 100})  # fmt: skip
    pipe = r.pipeline(transaction=False)
    for start in range(0, records, 5000):
        pipe.hset("{jobd:q}:active", mapping={
            f"job-{i}": b"jobd:q|%d-0\n" % (i + 1) + body for i in range(start, min(start + 5000, records))})  # fmt: skip
    pipe.execute()


@pytest.mark.parametrize("path", [
    "/api/summary", "/api/queue?queue=q", "/api/jobs?queue=q&state=running", "/api/overview"])  # fmt: skip
def test_an_active_hash_of_100_000_records_is_read_within_the_page_budget(
    r: redis.Redis, page: Callable[[str], dict], path: str
) -> None:
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    fill_active(r, 100_000)
    before = sent(r)
    blocked, reply = worst_ping_during(r, lambda: page(path))
    moved = sent(r) - before
    assert moved < 2 * browse.READ_BUDGET, f"{path} moved {moved / 2**20:.1f} MiB out of Redis"
    assert blocked < BLOCKED, f"Redis answered nobody for {blocked:.2f} s during {path}"
    if path == "/api/summary":
        row = reply["queues"]["q"]
        assert (row["running"], row["running_at_most"]) == (100_000, True), row
    elif path == "/api/queue?queue=q":
        status = reply["status"]
        assert (status["running_count"], status["running_at_most"]) == (100_000, True)
    elif path.startswith("/api/jobs"):
        # Fixer's note (36l): more than 10 000 records: no name read (lib/shown.lua hash_read)
        assert reply["jobs"] == [] and reply["unread"] == 100_000, reply


def test_an_active_record_of_32_mib_is_not_sent(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """One value of 32 MiB in the active hash (someone else's) beside a record: the hash holds
    two records, neither read (fixer's note, 36l: the hash weighs 32 MiB, and Redis cannot tell
    a heavy value from a heavy name, which HRANDFIELD would copy: lib/shown.lua hash_read),
    the long one never sent: at most 2 run."""
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    fill_active(r, 1)
    r.hset("{jobd:q}:active", "huge", b"jobd:q|9-0\n" + b"x" * (32 << 20))
    before = sent(r)
    status = page("/api/queue?queue=q")["status"]
    moved = sent(r) - before
    assert moved < browse.READ_BUDGET, f"one queue page moved {moved / 2**20:.1f} MiB"
    assert (status["running_count"], status["running_at_most"]) == (2, True), status


# -- what the page shows of each bound -------------------------------------------------------


@needs_chromium
def test_the_page_says_what_it_did_not_read(r: redis.Redis, config: Path, tmp_path: Path) -> None:
    """In headless Chromium: a dead letter of 100 000 empty fields says how many it does not
    show, a history too long to read says so, the overview and the queue say "≤ N" running,
    the running tab how many records it did not read."""
    xadd_raw(r, "{jobd:q}:dead", 1, dead_letter_fields(100_000))
    r.hset(HISTORY, "big", history(4000, 1000))
    r.zadd(HISTORY_AT, {"big": now_ms(r)})
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    fill_active(r, 5000)
    with dashboard_server(config) as port, headless_chromium(tmp_path) as driver:
        url = f"http://127.0.0.1:{port}"
        driver.get(url + "/#/")
        wait_until(lambda: "≤ 5000 / 0" in shown(driver, "queues"), what="≤ N running")
        expected = {
            "dead": "… 100001 fields not shown",
            "recent": "its records are 4",  # 4 MiB: … bytes, more than a page reads
            "running": "running records not read",
        }
        for tab, text in expected.items():
            driver.get(f"{url}/#/queue/q/{tab}")
            wait_until(lambda text=text: text in shown(driver, "jobs"), what=f"the {tab} tab")
        assert "≤ 5000 / " in shown(driver, "queues"), shown(driver, "queues")
