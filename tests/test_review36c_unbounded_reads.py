"""Review of issue 36 (third pass): the dashboard's reads that were still unbounded, each made
to cost more than its stated bound by what a hostile producer (anyone who can XADD or HSET) or
handler wrote:

1. ``/api/events`` read up to 500 whole entries a queue (XREVRANGE, XREAD), and cut them in the
   dashboard: an event of 100 KiB came out of Redis whole.
2. ``/api/job`` HGET a job's whole history and active record, and XRANGE'd whole the entry an
   id shaped like an entry id names (a waiting job's payload).
3. The status every summary reads (``status.py``) HGETALL'd the consumers waiting for a limit,
   the minute's counters, the rate bucket and the pause: fields and values anyone can add.
4. A delayed member that decodes to a msgpack map (or holds a nested array) was charged no
   field: only its bytes; six of 100 000 pairs fit one page's 1 MiB.

What a request moved out of Redis is measured from Redis's own count
(``INFO stats`` ``total_net_output_bytes``), around one request to the real ``jobd dashboard``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from support import dashboard_server, get_json, wait_until
from test_dashboard import headless_chromium, needs_chromium, shown
from test_review36b_budgets import msgpack_array, sent

QUEUES = (
    "redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n  b: {command: [/bin/true]}\n"
)
BIG = 100 * 1024  # bytes of a hostile event's field
OUT = 256 * 1024  # bytes a request may move out of Redis here (it moved MiBs before)


@pytest.fixture
def page(write_config: Any) -> Iterator[Callable[[str], dict]]:
    with dashboard_server(write_config(QUEUES)) as port:
        yield lambda path: get_json(port, path)


def measured(r: redis.Redis, action: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes Redis sent (to every client, the two INFO calls' replies included) while
    ``action`` ran, and what it returned."""
    before = sent(r)
    result = action()
    return sent(r) - before, result


# -- 1. the events feed ---------------------------------------------------------------------


def test_the_events_feed_reads_a_bounded_part_of_huge_events(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """200 events of 100 KiB on one queue (20 MiB): the feed's 500 came out whole (20 MiB
    moved, cut in the dashboard); now 1 MiB is read in Redis a request and each field leaves it
    cut to 256 bytes, marked cut."""
    for n in range(200):
        r.xadd("{jobd:a}:events", {"event": "done", "job": f"j{n}", "blob": "x" * BIG})
    out, feed = measured(r, lambda: page("/api/events?count=500"))
    assert out < OUT, f"the feed moved {out} bytes out of Redis"
    events = feed["events"]
    assert 5 <= len(events) < 200, len(events)  # the newest that 1 MiB holds, one more at most
    assert [e["fields"]["job"] for e in events] == [f"j{n}" for n in range(200 - len(events), 200)]
    assert all(len(e["fields"]["blob"]) == 256 and e["cut"] == ["blob"] for e in events)


def test_a_feed_stopped_at_its_bytes_skips_no_event_of_any_queue(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """Queue a's events are large (its share of the bytes holds a few), b's small, written in
    turn: a feed followed from its start returns every event of both, once, in order, never
    ``skipped``, though each request stops at a's share."""
    written = []
    for n in range(40):
        queue, blob = ("a", "x" * 60_000) if n % 2 else ("b", "")
        written.append(r.xadd(f"{{jobd:{queue}}}:events", {"job": f"j{n}", "blob": blob}).decode())
    after = orjson.dumps({"a": "0-0", "b": "0-0"}).decode()
    seen, requests = [], 0
    while True:
        feed = page(f"/api/events?count=500&after={after}")
        assert not feed["skipped"], feed
        if not feed["events"]:
            break
        seen += [e["id"] for e in feed["events"]]
        after, requests = orjson.dumps(feed["after"]).decode(), requests + 1
    assert seen == written
    assert requests > 1, "every event in one request: the bytes bound did not stop it"


# -- 2. a job's lookup ------------------------------------------------------------------------


def test_a_lookup_does_not_read_a_huge_history_or_running_record(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """8 MiB of records under a job id and 8 MiB as its running record (jobd writes 64 KiB, or
    one record with a result of 1 MiB at most): the lookup moved both out of Redis; now their
    lengths only, and the page says the history was not read."""
    line = orjson.dumps({"event": "retried", "attempt": 1, "stderr": "e" * 8_000_000})
    r.hset("{jobd:a}:history", "big", line)
    r.hset("{jobd:a}:active", "big", b"jobd:a|1-0\n" + b"{" * 8_000_000)
    out, found = measured(r, lambda: page("/api/job?queue=a&id=big"))
    assert out < OUT, f"the lookup moved {out} bytes out of Redis"
    assert (found["records"], found["records_unread"]) == ([], len(line)), found
    assert found["running"] is None


def test_a_lookup_by_entry_id_does_not_read_the_entry_whole(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """A job id shaped like an entry id is looked for at that entry of each stream: the entry
    came out whole (an 8 MiB payload); now only its job id fields, and it is still found
    waiting there (and an entry whose job_id is longer than a job id is no job's)."""
    entry = r.xadd("jobd:a", {"payload": "p" * 8_000_000}).decode()
    r.xgroup_create("jobd:a", "jobd", id="0")
    out, found = measured(r, lambda: page(f"/api/job?queue=a&id={entry}"))
    assert out < OUT, f"the lookup moved {out} bytes out of Redis"
    assert (found["state"], found["entry"], found["stream"]) == ("waiting", entry, "jobd:a")
    named = r.xadd("jobd:a", {"payload": "p", "job_id": "x" * 2000}).decode()
    assert page(f"/api/job?queue=a&id={named}")["state"] == "unknown"


# -- 3. the status's small hashes -----------------------------------------------------------


def test_the_summary_reads_the_queues_small_hashes_to_a_bound(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """50 000 consumers "waiting" for a limit, a minute's counters of 1 MiB values, a pause of
    8 MiB ``by``: every summary HGETALL'd them (over 10 MiB); now a few hundred fields a hash,
    a value over 256 bytes not sent, the pause's known fields only, and the queue still shows
    paused."""
    now = int(r.time()[0])
    r.hset("{jobd:a}:waiting", mapping={f"c{n}": "slots " + "9" * 200 for n in range(50_000)})
    for minute in (now // 60 - 1, now // 60):
        r.hset(f"{{jobd:a}}:stats:{minute}", mapping={"done": 3, "junk": "j" * (1 << 20)})
    r.hset("{jobd:a}:paused", mapping={"since": "1", "by": "b" * 8_000_000})
    r.hset("{jobd:a}:rate", mapping={"tokens": "1", "at": "1", "junk": "j" * 8_000_000})
    out, summary = measured(r, lambda: page("/api/summary"))
    assert out < OUT, f"the summary moved {out} bytes out of Redis"
    row = summary["queues"]["a"]
    assert (row["state"], row["done_per_minute"]) == ("paused", 3), row


def test_a_queue_page_reads_only_jobd_fields_of_its_hour_of_figures(
    r: redis.Redis, page: Callable[[str], dict]
) -> None:
    """The last hour's figures (``figures.last_hour``) were 120 HGETALLs: a minute's counters
    with an 8 MiB field beside them, and its histograms with 50 000 fields added, came out whole
    on every refresh of the queue's page. Now only jobd's fields, each only when short: the
    counts are still there."""
    minute = int(r.time()[0]) // 60 - 5
    r.hset(f"{{jobd:a}}:stats:{minute}", mapping={"done": 7, "junk": "j" * 8_000_000})
    r.hset(
        f"{{jobd:a}}:timings:{minute}", mapping={"run:3": 5, **{f"x{n}": n for n in range(50_000)}}
    )
    r.hset(f"{{jobd:a}}:stats:{minute - 1}", mapping={"done": "1" * 8_000_000, "failed": 2})
    out, found = measured(r, lambda: page("/api/queue?queue=a"))
    assert out < OUT, f"the queue's page moved {out} bytes out of Redis"
    hour = found["status"]["hour"]
    at = hour["minutes"].index(minute * 60)
    assert hour["series"]["done"][at - 1 : at + 1] == [0, 7], hour["series"]["done"]
    assert hour["series"]["failed"][at - 1] == 2 and hour["jobs_timed"] == 5, hour


# -- 4. delayed members of maps and nested arrays -------------------------------------------


def msgpack_map(pairs: int) -> bytes:
    """A msgpack map of ``pairs`` pairs, each 0 -> 0 (two bytes: cmsgpack builds a table of one
    key, after decoding every pair)."""
    return b"\xdf" + struct.pack(">I", pairs) + b"\x00\x00" * pairs


def nested(i: int) -> bytes:
    """An array {unique id, "a", {200 000 empty strings}}: three values at its top."""
    head = bytes([0x93, 0xA0 | len(b"u%d" % i)]) + b"u%d" % i + b"\xa1a"
    return head + msgpack_array([b""] * 200_000)


@pytest.mark.parametrize(
    "member", [lambda i: msgpack_map(100_000 + i), nested], ids=["map", "nested"]
)
def test_a_delayed_member_of_a_map_or_nested_array_counts_its_values(
    r: redis.Redis, page: Callable[[str], dict], member: Callable[[int], bytes]
) -> None:
    """A member decoding to a map of 100 000 pairs (200 KiB), or to an array whose last value is
    an array of 200 000 empty strings: charged its bytes only, five or six fit a page (a million
    values decoded); counted 64 bytes a field, one does, and it is not decoded."""
    for i in range(20):
        r.zadd("{jobd:a}:delayed", {member(i): 1_000_000 + i})
    shown = page("/api/jobs?queue=a&state=delayed")
    assert len(shown["jobs"]) == 1 and shown["cursor"], shown
    assert "more than 1000 fields" in shown["jobs"][0]["bad"], shown["jobs"][0]


def test_a_delayed_job_still_shows(r: redis.Redis, page: Callable[[str], dict]) -> None:
    """The width counted from msgpack's headers leaves a job's member as it was: decoded, shown
    by its job id and attempt."""
    member = msgpack_array([b"u1", b"payload", b"x" * 20, b"job_id", b"j1", b"jobd_attempt", b"2"])
    r.zadd("{jobd:a}:delayed", {member: 1_000_000})
    shown = page("/api/jobs?queue=a&state=delayed")
    assert [(j["job_id"], j["attempt"], j.get("bad")) for j in shown["jobs"]] == [("j1", "2", None)]


@needs_chromium
def test_the_page_marks_what_it_cut_or_did_not_read(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    """In headless Chromium: an event's field cut in Redis ends in "…", its fields left out are
    counted, a cut job id is no link; a job's history too long to read says so."""
    fields = {"event": "done", "job": "j" * 300, "error": "e" * 1000}
    r.xadd("{jobd:a}:events", {**fields, **{f"f{n}": "" for n in range(40)}})
    r.hset("{jobd:a}:history", "big", b"x" * (3 << 20))
    with dashboard_server(write_config(QUEUES)) as port, headless_chromium(tmp_path) as driver:
        url = f"http://127.0.0.1:{port}"
        driver.get(url + "/#/")
        wait_until(lambda: "fields not shown" in shown(driver, "events"), what="the event")
        text = shown(driver, "events")
        assert "… 11 fields not shown" in text and "e" * 256 + "…" in text, text
        assert "j" * 256 + "…" in text, text
        links = "return document.querySelectorAll('#events a').length"
        assert driver.execute_script(links) == 0
        driver.get(url + "/#/job/a/big")
        wait_until(lambda: "not read" in shown(driver, "job"), what="the job's page")
        assert f"its history is {3 << 20} bytes" in shown(driver, "job")
