"""Review 35w of issue 35 (high): a JOBD_ENQUEUE line whose job has some 4 000 fields or more
makes settle.lua fail half-way, after it added the follow-ups before it: the parent is never
acknowledged, each of the recorder's tries and each run again after its lease lapses adds
those follow-ups once more (40 copies of p1.1 in 15 s here), with no end.

What is wrong: process/followups.py takes any number of fields for a follow-up (``fields`` in
its line; ``newjob.prepare`` has no bound), unlike a job read from a stream (policy.refused:
more than jobd.job.MAX_FIELDS, 1 000, is dead-lettered malformed). settle.lua's ``follow``
checks each target's type first, then adds each follow-up with lib/jobs.lua ``add_job``, whose
``redis.call('XADD', unpack(args))`` fails ("too many results to unpack": Lua's C stack, about
8 000 values) for a job of about 4 000 fields. The script has written the follow-ups before
that one and stops before XACK: a script's writes are not undone. The recorder tries 5 times
(5 copies), leaves the parent pending, it is taken over after reclaim_after and run again, and
so on: exactly once is broken and the pipeline below the parent floods. On a cluster the same
line passes settle.lua (its follow-ups go into the outbox whole, cmsgpack) and follow_up.lua
then fails on it at every move, holding back the follow-ups grouped with it (same target).
A follow-up of 1 000 to some 4 000 fields is added, and its own queue then dead-letters it
unrun (policy.refused: "more than jobd can retry or dead-letter"): the parent is done, its
follow-up never runs.

Reproduce: a parent handler that writes two lines into $JOBD_ENQUEUE, `{"queue": "t",
"payload": "x"}` and a job of 5 000 fields into t; one daemon; `jobd enqueue p x --job-id p1`.

What should happen: docs/workflows.md: a file jobd will not take dead-letters the parent at
once (`jobd_error=enqueue`, "a line that is no job (its number and why)") and none of its jobs
is enqueued; a done parent's follow-ups are added exactly once. Suggested fix: refuse in
``followups._follow_up`` a job wider than jobd reads one (``len(entry.fields) > MAX_FIELDS``
once jobd's own fields are in, as producer.check_width refuses a producer's job: the line's
number and "more than 1000 fields"); the producer's check already keeps a held job, released
by the same ``add_job``, within it.

Fixed (fixer f35wa): process/followups.py ``parse`` refuses a line whose job, jobd_parent
included, has more than MAX_FIELDS fields, with the check jobd.producer makes
(``newjob.too_wide``): the parent is dead-lettered `enqueue` ("JOBD_ENQUEUE line 2: a job has
at most 1000 fields …"), none of its follow-ups added; settle.lua (and an outbox) never gets
such a job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, acked_all, jobd_cli, wait_until
from test_after_batches import RUNS

Daemon = Callable[..., DaemonProcess]


def test_a_wide_follow_up_is_refused_not_added_again_and_again(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    wide = {"queue": "t", "payload": "w", "fields": {f"f{i}": "v" for i in range(5000)}}
    lines = tmp_path / "follow-ups"
    lines.write_text('{"queue": "t", "payload": "x"}\n' + json.dumps(wide) + "\n")
    parent = script("parent.sh", f'#!/bin/sh\ncat > /dev/null\ncat {lines} > "$JOBD_ENQUEUE"\n')
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  p:\n    command: [{parent}]\n"
        "    lease: {renew_every: 200ms, reclaim_after: 1s}\n"
        f"  t:\n    command: [{script('runs.sh', RUNS)}]\n"
    )
    daemon(cfg)
    assert jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", "p1").returncode == 0

    def settled() -> bool:  # p1 read, then acknowledged or dead-lettered: nothing of p pending
        return acked_all(r, "jobd:p", 1)  # "none pending" alone holds before p1 is read

    wait_until(lambda: settled() or r.xlen("jobd:t") > 2, 20, what="p1 settled")
    assert r.xlen("jobd:t") <= 2, f"{r.xlen('jobd:t')} follow-ups of p1 (2 at most: once each)"
    dead = r.xrange("{jobd:p}:dead")  # the file refused: p1 dead-lettered, nothing of it added
    assert len(dead) == 1 and dead[0][1][b"jobd_error"] == b"enqueue", dead
    assert r.xlen("jobd:t") == 0
