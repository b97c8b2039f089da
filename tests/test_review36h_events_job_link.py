"""Review 36h of issue 36: the events feed links a job whose id is not UTF-8 to another job.

A job id is any bytes a producer gave (jobd runs them). The events feed (``/api/events``,
``events_shown.lua`` → ``records.Event``) decodes each field with ``backslashreplace`` and
returns it unmarked: the events of a job whose id is the byte 0xFF say ``job: "\\xff"``, the
same text as those of the job whose id is the four characters ``\\xff``. The page
(``jobLink``) links both to ``#/job/q/%5Cxff``, the second job's page, with its Cancel button:
an operator following the feed during an incident opens, and can cancel, a job that is not the
one the event is about. Review 36 fixed this for the tabs ("Job ids named exactly": an id not
UTF-8 is shown marked, never offered for a cancel) and the recently settled tab marks the first
job ``inexact`` here; the feed was left out.

What should happen: an event whose job id is not UTF-8 says so (``inexact``, or ``job`` among
its ``cut`` fields, which the page already shows as text, not a link), so the page never links
it to the job its escaped text names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from support import DaemonProcess, acked_all, dashboard_server, get_json, queue_config, wait_until

from jobd import config as jobd_config

Daemon = Callable[..., DaemonProcess]


def _marked(event: dict[str, Any]) -> bool:
    """Whether the page can tell the event's job id is not exact (it then shows it as text)."""
    return "job" in event.get("cut", []) or any(
        "inexact" in key and value for key, value in event.items()
    )


def test_an_event_of_a_job_whose_id_is_not_utf8_is_marked(
    r: redis.Redis, write_config: Any, daemon: Daemon
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    daemon(config)
    raw = r.xadd("jobd:q", {"job_id": b"\xff", "payload": "x"}).decode()
    literal = r.xadd("jobd:q", {"job_id": b"\\xff", "payload": "x"}).decode()
    wait_until(lambda: acked_all(r, "jobd:q", 2), what="both jobs to run")
    with dashboard_server(config) as port:
        events = get_json(port, "/api/events")["events"]
        recent = get_json(port, "/api/jobs?queue=q&state=recent")["jobs"]
    by_entry = {e["fields"].get("entry"): e for e in events}
    assert {raw, literal} <= set(by_entry), events
    # The recently settled tab tells them apart already (one of the two is inexact).
    assert sorted(bool(j.get("inexact")) for j in recent) == [False, True], recent
    assert by_entry[raw]["fields"]["job"] == by_entry[literal]["fields"]["job"] == "\\xff"
    assert not _marked(by_entry[literal]), by_entry[literal]
    assert _marked(by_entry[raw]), (
        f"the event of job b'\\xff' is shown as job {by_entry[raw]['fields']['job']!r}, unmarked:"
        " the page links it to the job whose id is those four characters"
    )


def test_a_job_pages_parent_and_follow_ups_not_utf8_are_marked(
    r: redis.Redis, write_config: Any
) -> None:
    """The job page's links (parent, follow-ups, what it waits for) are read from its records,
    whose bytes that are not UTF-8 are escaped likewise: a name escaped is listed in
    ``links_inexact`` (the page shows it as text), one of those characters is not."""
    config = write_config(queue_config("[/bin/true]"))
    q = jobd_config.load(str(config)).queues["q"]
    raw = b'{"event":"done","at":1,"parent":"q \xff","follow_ups":1,"follow_up_jobs":["q \xff.1"]}'
    literal = (
        b'{"event":"done","at":1,"parent":"q \\\\xff","follow_ups":1,"follow_up_jobs":["q a"]}'
    )
    r.hset(q.keys.history, mapping={"raw-child": raw, "literal-child": literal})
    with dashboard_server(config) as port:
        marked = get_json(port, "/api/job?queue=q&id=raw-child")
        plain = get_json(port, "/api/job?queue=q&id=literal-child")
    assert (marked["parent"], plain["parent"]) == ("q \\xff", "q \\xff")
    assert marked["links_inexact"] == ["q \\xff", "q \\xff.1"], marked
    assert plain["links_inexact"] == [], plain
