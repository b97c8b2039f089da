"""Review of issue 35 (workflows), round 35i: `jobd job` of a job still held loses what it
waits for once the history's bounds pass over its `waiting` record.

What is wrong: a held job's state and what it waits for are read from its history records
only (store/history.py ``_state``: the latest record `waiting` says "held"; records.links
``after``), never from the held hash where it waits. The history is trimmed by its bounds
(lib/jobs.lua trim_history: `history.max_age` from the job's latest record, 7 days by
default, and `history.maxlen` jobs): a job held longer than that (docs/workflows.md: "with
neither, it waits as long as it takes (`jobd job` shows what it waits for; `jobd cancel`
ends it)"), or overtaken by `maxlen` other jobs' records while it waits, is still in
`{T}:held`, yet `jobd job` says it knows nothing of it, and `jobd job --json` has `after`
null. The issue asks that `jobd job` say "waiting for 2 of 3: a, b".

What should happen: `jobd job` of a job in the held hash says it is held and what it still
waits for (the after hash holds it: `deps` left, `all`), whatever the history kept; one HGET
of `{T}:held`/`{T}:after` by job id, as cheap as the record's. (Or the history keeps a held
job's records while it is held.)

Why it matters: the one place an operator looks to see why a job has not run says it does
not exist, while it sits waiting (possibly for a job that was never enqueued) and will run
later; that is the case `jobd job` on a held job exists for. No daemon: holds alone fill the
history past `maxlen`."""

from __future__ import annotations

import json

import redis
from support import jobd_cli

CONFIG = """\
redis: {url: '{redis}'}
queues:
  a:
    command: [/bin/true]
    history: {maxlen: 5}
"""


def test_jobd_job_of_a_held_job_says_what_it_waits_for_after_the_history_moved_on(
    r: redis.Redis, write_config
) -> None:
    c = str(write_config(CONFIG))
    out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", "h", "--after", "x", "--after", "y")
    assert out.returncode == 0, out.stderr
    for i in range(10):  # ten more jobs held: the history keeps the latest five jobs' records
        out = jobd_cli("enqueue", "-c", c, "a", "p", "--job-id", f"o{i}", "--after", "x")
        assert out.returncode == 0, out.stderr
    assert r.hexists("{jobd:a}:held", "h"), "h is still held, waiting for x and y"
    shown = jobd_cli("job", "-c", c, "a", "h")
    text = shown.stdout.decode(errors="replace") + shown.stderr.decode(errors="replace")
    assert shown.returncode == 0 and "waiting for 2 of 2" in text, (
        f"jobd job of a held job (exit {shown.returncode}): {text!r}"
    )
    shown = jobd_cli("job", "-c", c, "a", "h", "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view.get("after") is not None, f"--json after: {view.get('after')!r}"
