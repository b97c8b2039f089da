"""Review of issue 36: the waiting tab shows a job id of 257 to 1024 bytes cut to 256, as exact;
its link and "Cancel selected" name a job that does not exist, and the job runs.

A job id may be 1 to 1024 bytes (``jobd.job.MAX_JOB_ID``, ``actions.MAX_JOB_ID``). The waiting
tab asks ``entries_shown.lua`` for the job id cut to ``shown.FIELD_SHOWN`` (256) bytes with its
whole length, but ``pages._waiting`` drops the length (``for v, _ in values``) and calls
``shown.job_id_shown`` on the cut text, which marks it exact: the page links it and offers it
for a cancel (the dead-letters tab marks a cut id ``inexact``; the waiting tab does not). The
cancel the page then sends names the first 256 bytes: ``where: marked`` ("cancelled if read
within 1h"), and the real job runs when its queue is resumed.

A real daemon serving the page with actions on, queue q paused, one job enqueued with a job id
of 300 characters by `jobd enqueue --job-id`; the page's own calls, over HTTP.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import redis
from support import free_port, jobd_cli, wait_until

TOKEN = "review36-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def call(url: str, path: str, body: dict | None = None, headers: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={**BEARER, **(headers or {})})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_a_long_job_id_is_shown_cut_as_exact_and_its_cancel_misses_the_job(
    r: redis.Redis, daemon: Any, write_config: Any, tmp_path: Path, script: Any
) -> None:
    ran = tmp_path / "ran"
    script("handler.sh", f'#!/bin/sh\necho "$JOBD_JOB_ID" >> {ran}\n')
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "dashboard: {actions: true, token_file: token}\n"
        "queues:\n  q: {command: [./handler.sh]}\n"
    )
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    daemon(config)
    url = f"http://127.0.0.1:{port}"
    job_id = "order-" + "x" * 294  # 300 characters: a valid job id
    done = jobd_cli("enqueue", "-c", str(config), "--job-id", job_id, "q", "payload")
    assert done.returncode == 0, done.stderr

    page = call(url, "/api/jobs?queue=q&state=waiting")
    [row] = page["jobs"]
    shown = row["job_id"]
    # What the page does with it: a link to #/job/q/SHOWN, and a box for "Cancel selected"
    # (jobsTable: key = j.inexact || !j.job_id ? null : j.job_id).
    csrf = call(url, "/api/summary")["csrf"]
    cancel = call(url, "/api/cancel", {"queue": "q", "job_ids": [shown]},
                  {"X-Jobd-CSRF": csrf, "Content-Type": "application/json"})  # fmt: skip
    assert jobd_cli("resume", "-c", str(config), "q").returncode == 0
    wait_until(lambda: ran.exists() or r.hlen("{jobd:q}:history") > 0, what="the job settled")
    ran_ids = ran.read_text().split() if ran.exists() else []
    # Expected: the id shown whole or marked inexact (not offered), or the cancel finding it.
    assert (len(shown), row.get("inexact"), [f["where"] for f in cancel["found"]], ran_ids) == (
        300,
        None,
        ["waiting"],
        [],
    ), (
        f"shown {len(shown)} of 300 characters as exact; cancel said "
        f"{cancel['found'][0]['said']!r}; the job ran: {ran_ids == [job_id]}"
    )


def test_the_delayed_tab_cuts_too_and_a_nul_job_id_is_offered_as_exact(
    r: redis.Redis, daemon: Any, write_config: Any, tmp_path: Path
) -> None:
    """The delayed tab (``shown.delayed``: ``job_id[:FIELD_SHOWN]``, no ``inexact``) shows the
    same cut id as exact. A waiting entry whose job_id field holds a NUL byte runs under its
    entry id (``jobd.job._job_id``, lib/jobs.lua job_id_of), but the tab offers the field's
    text; a cancel of it finds nothing ("marked") and the job would run."""
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    config = write_config(
        "redis: {url: '{redis}'}\n"
        f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
        "dashboard: {actions: true, token_file: token}\n"
        "queues:\n  q: {command: [/bin/true]}\n"
    )
    assert jobd_cli("pause", "-c", str(config), "q").returncode == 0
    daemon(config)
    url = f"http://127.0.0.1:{port}"
    job_id = "order-" + "x" * 294
    done = jobd_cli("enqueue", "-c", str(config), "--delay", "1h", "--job-id", job_id, "q", "p")
    assert done.returncode == 0, done.stderr
    r.xadd("jobd:q", {"payload": "p", "job_id": "a\0b"})  # runs as its entry id

    [delayed] = call(url, "/api/jobs?queue=q&state=delayed")["jobs"]
    [waiting] = call(url, "/api/jobs?queue=q&state=waiting")["jobs"]
    csrf = call(url, "/api/summary")["csrf"]
    cancel = call(url, "/api/cancel", {"queue": "q", "job_ids": [waiting["job_id"]]},
                  {"X-Jobd-CSRF": csrf, "Content-Type": "application/json"})  # fmt: skip
    seen = {
        "delayed id": (len(delayed["job_id"]), delayed.get("inexact")),
        "waiting id offered": (waiting["job_id"], waiting.get("inexact")),
        "cancel found": [f["where"] for f in cancel["found"]],
    }
    # Expected: a cut id never offered as exact; a job offered for a cancel is the one cancelled.
    assert seen == {
        "delayed id": (300, None),
        "waiting id offered": (waiting["entry"], None),
        "cancel found": ["waiting"],
    }, seen
