"""medium: a JOBD_ENQUEUE line whose job has 998 to 1 000 fields (jobd_parent included) passes
the width check review 35w added, is added with its parent's acknowledgement, and its queue
then dead-letters it unrun as malformed ("1003 fields with jobd's: more than jobd can retry or
dead-letter (1000)"): the parent is done, its follow-up never runs, and no refusal said so.

What is wrong. process/followups.py ``parse`` refuses a follow-up whose fields are more than
jobd.job.MAX_FIELDS (``newjob.too_wide``: ``len(fields) > 1000``), counting the fields the
entry is written with. The daemon that reads the entry counts another way: policy.refused
dead-letters a job whose *next attempt* is wider than MAX_FIELDS (``Job.too_wide``:
``next_attempt_fields``, which adds jobd_job_id, jobd_attempt and jobd_origin to the job's own
fields and keeps jobd_parent). A follow-up of K fields of its own has payload, job_id,
jobd_parent and the K: K + 3 written, K + 6 counted by the reader, so K from 995 to 997 passes
parse and is refused unrun. Review 35w described exactly this ("a follow-up of 1 000 to some
4 000 fields is added, and its own queue then dead-letters it unrun: the parent is done, its
follow-up never runs") and asked for the bound "once jobd's own fields are in"; the fix counts
those the entry has, not those the reader adds. (jobd.producer's check_width, which the fix
shares, lets a producer's job of 997 to 999 own fields through the same way, refused unrun by
the daemon: the same bound, counted twice differently.)

Reproduce (real daemon, one Redis): a parent handler that writes one line into $JOBD_ENQUEUE,
a job into queue t with 997 fields of its own; `jobd enqueue p x --job-id p1`. p1 is acked
(done), p1.1 is added to t, and t's daemon dead-letters it: jobd_error malformed, "1003 fields
with jobd's: more than jobd can retry or dead-letter (1000)". It never runs.

What should happen: docs/workflows.md (and the module docstring: "a job wider than jobd runs
one (``job.MAX_FIELDS``, jobd's fields counted)") — a line jobd will not run is refused with
the file: p1 dead-lettered at once (jobd_error enqueue, "JOBD_ENQUEUE line 1: …"), none of its
jobs added. Why it matters: a handler's follow-up that can never run is accepted silently and
its parent is counted done; the pipeline stage below loses the job (the malformed dead letter
is the only trace, and requeued it would be as wide, refused again).

Suggested fix: one bound, counted as the reader counts it: ``too_wide`` (or parse) compares
``len(fields)`` plus the jobd fields a first read adds and a retry writes (jobd_job_id,
jobd_attempt, jobd_origin: those of ``job.KEPT`` not in the fields yet) with MAX_FIELDS; or
build the ``Job`` the reader would and ask ``Job.too_wide``. The producer's check_width the
same, so that `jobd enqueue` never adds a job its daemon refuses to run.

Fixed (fixer f35y): ``newjob.too_wide`` counts as the reader counts: past the fields no job
can make wide (``MAX_FIELDS - len(KEPT)``) it builds the ``Job`` the daemon would read and asks
``Job.too_wide`` (its own fields and jobd's a retry carries, jobd_job_id, jobd_attempt and
jobd_origin added). process/followups.py and producer.check_width share it: p1 is
dead-lettered `enqueue` ("JOBD_ENQUEUE line 1: a job has at most 1000 fields with jobd's own
…"), nothing added; `jobd enqueue` refuses a payload and 997 fields the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until
from test_after_batches import RUNS, runs

Daemon = Callable[..., DaemonProcess]


def test_a_follow_up_parse_takes_is_one_its_daemon_runs(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    line = {"queue": "t", "payload": "w", "fields": {f"f{i}": "v" for i in range(997)}}
    lines = tmp_path / "follow-ups"
    lines.write_text(json.dumps(line) + "\n")
    parent = script("parent.sh", f'#!/bin/sh\ncat > /dev/null\ncat {lines} > "$JOBD_ENQUEUE"\n')
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  p:\n    command: [{parent}]\n"
        f"  t:\n    command: [{script('runs.sh', RUNS)}]\n"
    )
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1").returncode == 0

    def parent_dead() -> bool:
        return r.xlen("{jobd:p}:dead") > 0

    def child_ended() -> bool:
        return "p1.1" in runs(tmp_path) or r.xlen("{jobd:t}:dead") > 0

    wait_until(lambda: parent_dead() or child_ended(), 20, what="p1 refused, or p1.1 ended")
    if parent_dead():  # the file refused whole: what the docs promise for a job jobd won't run
        (_, record), *_ = r.xrange("{jobd:p}:dead")
        assert record[b"jobd_error"] == b"enqueue", record
        assert r.xlen("jobd:t") == 0
        return
    dead = [f for _, f in r.xrange("{jobd:t}:dead")]
    shown = [(f.get(b"jobd_error"), f.get(b"jobd_stderr", b"")[-120:]) for f in dead]
    assert not dead, f"p1 done, its follow-up p1.1 dead-lettered unrun: {shown}"
    assert "p1.1" in runs(tmp_path)
