"""Review 36i of issue 36: a dead letter whose job id is not UTF-8 is linked to another job.

A job id is any bytes a producer gave, and a job that fails for good keeps it in its dead
letter's ``jobd_job_id``. The dashboard's dead letters (the queue page's ``dead`` tab,
``/api/jobs?state=dead``, and the overview's ``dead_letters``, ``/api/overview``) read that field
with ``shown.dead_letter``, which decodes it with ``backslashreplace`` and marks it only when it
was cut: the dead letter of the job whose id is the byte 0xFF says ``job_id: "\\xff"``, the
same text as the one of the job whose id is the four characters ``\\xff``, and neither is
marked. The page (``ROW.dead`` → ``jobLink``) links both to ``#/job/q/%5Cxff``, the second
job's page, with its history and Cancel button. Review 36h marked such ids in the events feed
and the job page's links (``inexact``, ``links_inexact``); every other tab marks them through
``shown.job_id_shown``; the dead letters were left out.

What should happen: a dead letter whose job id is not UTF-8 says so (``inexact``, or
``job_id`` among its ``cut`` fields, which the page already shows as text), so the page never
links it to the job its escaped text names. Why it matters: in an incident an operator goes
from the dead letters to the job's page to see its attempts, and lands on another job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from support import DaemonProcess, dashboard_server, get_json, queue_config, wait_until

from jobd import config as jobd_config

Daemon = Callable[..., DaemonProcess]


def _marked(row: dict[str, Any]) -> bool:
    """Whether the page can tell the row's job id is not exact (it then shows it as text)."""
    return bool(row.get("inexact")) or "job_id" in row.get("cut", [])


def test_a_dead_letter_whose_job_id_is_not_utf8_is_marked(
    r: redis.Redis, write_config: Any, daemon: Daemon
) -> None:
    config = write_config(queue_config("[/bin/false]", retry="{max_attempts: 1}"))
    q = jobd_config.load(str(config)).queues["q"]
    daemon(config)
    r.xadd(q.stream, {"job_id": b"\xff", "payload": "x"})
    r.xadd(q.stream, {"job_id": b"\\xff", "payload": "x"})
    wait_until(lambda: r.xlen(q.dead_letter.stream) == 2, what="both jobs dead-lettered")
    ids = {f[b"jobd_job_id"]: i.decode() for i, f in r.xrange(q.dead_letter.stream)}
    raw, literal = ids[b"\xff"], ids[b"\\xff"]
    with dashboard_server(config) as port:
        tab = get_json(port, "/api/jobs?queue=q&state=dead")["jobs"]
        panel = get_json(port, "/api/overview")["queues"]["q"]
    by_id = {row["id"]: row for row in tab}
    assert {raw, literal} <= set(by_id), tab
    assert by_id[raw]["job_id"] == by_id[literal]["job_id"] == "\\xff"
    assert not _marked(by_id[literal]), by_id[literal]
    assert _marked(by_id[raw]), (
        "the dead letter of job b'\\xff' is shown as job '\\\\xff', unmarked: the page links it "
        f"to the job whose id is those four characters: {by_id[raw]}"
    )
    dead = {row["id"]: row for row in panel["dead_letters"]}
    assert _marked(dead[raw]), dead[raw]
