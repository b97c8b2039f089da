"""Review 36h of issue 36: every summary and queue page reads a group's consumers (and the
stream's groups) whole.

``status._read`` (``jobd status``, ``/api/summary`` every 5 s of an open overview, for every
queue; ``/api/queue``; the daemon's status report every tick) sends ``XINFO CONSUMERS stream
group`` and ``XINFO GROUPS stream`` with no bound, and ``/api/queue`` then sends every consumer
to the browser, its name whole, to be drawn as one table row each. A consumer is made by anyone
who can write to Redis (``XGROUP CREATECONSUMER``, an ``XREADGROUP`` or ``XCLAIM`` with any
name), and its name may be of any length: 16 consumers of 1 MiB names made one summary move
16 MiB out of Redis and one queue page send 16 MiB of JSON to the browser; 50 000 consumers
of short names, about 4 MiB a summary and a table of 50 000 rows. Every other read of these
pages is bounded (review 36c measured the same way, ``OUT`` = 256 KiB a request; the waiting
consumers' hash is read to 256 fields and 64 KiB).

What should happen: the consumers are read to a bound (a number of them and bytes of names, in
Redis: a script can page XINFO CONSUMERS only whole, so e.g. count them and read them only when
few and short, else say how many there are), and the page says what it did not show, as it
does for the running records (``running_at_most``) and a wide entry. It matters because the
overview is polled by every open tab and its cost is the issue's stated budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import redis
from support import dashboard_server, get_json
from test_review36b_budgets import sent

from jobd import config as jobd_config

QUEUES = (
    "redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n  b: {command: [/bin/true]}\n"
)
OUT = 256 * 1024  # bytes a request may move out of Redis (tests/test_review36c_*.py's bound)
REPLY = 1 << 20  # bytes of JSON a queue page may send the browser


def measured(r: redis.Redis, action: Callable[[], Any]) -> tuple[int, Any]:
    before = sent(r)
    result = action()
    return sent(r) - before, result


def _queue(write_config: Any) -> tuple[Any, Any]:
    config = write_config(QUEUES)
    return config, jobd_config.load(str(config)).queues["a"]


def test_long_consumer_names_are_read_whole_by_every_summary(
    r: redis.Redis, write_config: Any
) -> None:
    config, q = _queue(write_config)
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    for n in range(16):
        r.xgroup_createconsumer(q.stream, q.group, f"{n:02d}" + "c" * (1 << 20))
    with dashboard_server(config) as port:
        out, summary = measured(r, lambda: get_json(port, "/api/summary"))
        page_out, page = measured(r, lambda: get_json(port, "/api/queue?queue=a"))
    assert summary["queues"]["a"]["state"] == "idle", summary["queues"]["a"]
    assert out < OUT, f"one summary moved {out} bytes out of Redis"
    assert page_out < OUT, f"one queue page moved {page_out} bytes out of Redis"
    reply = len(orjson.dumps(page))
    assert reply < REPLY, f"one queue page sent the browser {reply} bytes"


def test_many_consumers_are_read_whole_by_every_summary(r: redis.Redis, write_config: Any) -> None:
    config, q = _queue(write_config)
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for n in range(50_000):
        pipe.xgroup_createconsumer(q.stream, q.group, f"c{n}")
    pipe.execute()
    with dashboard_server(config) as port:
        out, _ = measured(r, lambda: get_json(port, "/api/summary"))
        page_out, page = measured(r, lambda: get_json(port, "/api/queue?queue=a"))
    assert out < OUT, f"one summary moved {out} bytes out of Redis"
    assert page_out < OUT, f"one queue page moved {page_out} bytes out of Redis"
    shown = len(page["status"]["consumers"])
    assert shown <= 1000, f"one queue page listed {shown} consumers"


def test_long_group_names_are_read_whole_by_every_summary(
    r: redis.Redis, write_config: Any
) -> None:
    """The same read's sibling: ``XINFO GROUPS`` (every group of the stream, its name whole),
    in ``status._read`` and again in the waiting tab (``pages._waiting``)."""
    config, q = _queue(write_config)
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    for n in range(16):
        r.xgroup_create(q.stream, f"{n:02d}" + "g" * (1 << 20), id="0")
    with dashboard_server(config) as port:
        out, summary = measured(r, lambda: get_json(port, "/api/summary"))
        tab_out, _ = measured(r, lambda: get_json(port, "/api/jobs?queue=a&state=waiting"))
    assert summary["queues"]["a"]["state"] == "idle", summary["queues"]["a"]
    assert out < OUT, f"one summary moved {out} bytes out of Redis"
    assert tab_out < OUT, f"one page of the waiting tab moved {tab_out} bytes out of Redis"


def test_long_group_names_are_not_read_by_a_job_lookup(r: redis.Redis, write_config: Any) -> None:
    """The job lookup's probe of a waiting entry (``HistoryOps._probes``) asked for the
    stream's groups whole too (XINFO GROUPS) to find its group's last delivered id."""
    config, q = _queue(write_config)
    r.xadd(q.stream, {"payload": "x"}, id="1-0")
    r.xgroup_create(q.stream, q.group, id="0")
    for n in range(16):
        r.xgroup_create(q.stream, f"{n:02d}" + "g" * (1 << 20), id="0")
    with dashboard_server(config) as port:
        out, job = measured(r, lambda: get_json(port, "/api/job?queue=a&id=1-0"))
    assert (job["state"], job["entry"]) == ("waiting", "1-0"), job
    assert out < OUT, f"one lookup moved {out} bytes out of Redis"
