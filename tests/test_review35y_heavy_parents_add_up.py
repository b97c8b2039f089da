"""medium: "several parents settled together no longer add up" holds for follow-ups of many fields
only: parents whose follow-ups are few jobs of large payloads (7 jobs of 1 MiB each, inside
the default max_follow_ups_bytes of 8 MiB) still share one settle.lua call, whose Redis time is
then their sum (8 parents: some 56 MiB in one script).

What is wrong. store/outcomes.py ``settle`` gives a parent a settle.lua call of its own when its
follow-ups would take its queue's call past ``CALL_FIELDS`` (4096) *fields*; the bound review
35w set and measured (process/followups.py ``weight``, max_follow_ups_bytes) is in *bytes*,
each field counted as 128 at least, because Redis's time grows with the bytes too (2.5 ns a
byte: 7 MiB of payload is 15-35 ms, docs/workflows.md's table). A parent of 7 jobs of 1 MiB
has 21 follow-up fields, so any number of such parents go into one call: their bytes add up,
which is what the split was for. Any stall of the writes gathers them: the recorder writes its
whole backlog in one ``settle`` (after an outage, a failover, a Redis busy a moment), and
parents ending within its linger do too.

Reproduce (real daemon, one Redis): queue p (concurrency 8), each job writing 7 lines of a
1 MiB payload into queue t; SLOWLOG on every call; 8 jobs of p started and held at a barrier;
CLIENT PAUSE 1500 WRITE, then the barrier opened: the first outcome's write waits, the others
gather, and their write is one settle.lua call: here the 7 others in one call of 832
arguments, 49 MiB, 107 ms of Redis by SLOWLOG, where the parent written alone took 17 ms. With
``concurrency: 64`` the same is some 64 x 15-35 ms: seconds of a Redis that answers no one.

What should happen: docs/workflows.md "Several parents settled together no longer add up": a
settle.lua call holds at most about one max_follow_ups_bytes of follow-ups (or one parent's,
when a single parent's is more). Why it matters: the call blocks every client of that Redis
(every daemon's renewals, every producer) for the sum; the bound's own docs promise 15-35 ms.

Suggested fix: split on the weight, not the field count: ``_load`` returns
``followups.weight`` summed over the job's follow-ups (kept on each FollowUp, computed once in
parse), and a queue's call takes another parent's only while the sum stays under the queue's
max_follow_ups_bytes (or a fixed CALL_BYTES near the default). Tried (not committed): `_load` as
the weight over 128 makes each parent its own call, and this test passes.

Fixed (fixer f35y): each FollowUp carries its ``outcome.weight`` (counted once, where it is
made), and store/outcomes.py ``_one_more_call`` gives a parent a settle.lua call of its own
when its follow-ups would take its queue's call past what one file may hold: the queue's
max_follow_ups_bytes by that weight, or its max_follow_ups jobs (``CALL_FIELDS`` is gone).
Here every parent is a call of its own (99 arguments). Queue t is paused during the test: its
own settles (its jobs' acks, gathered into one call under load: a CI run met one of 451
arguments, 758 µs) are settle.lua calls too, and SLOWLOG cannot tell them apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, jobd_cli, wait_until

from jobd.store.scripts import sha

Daemon = Callable[..., DaemonProcess]

PARENTS, LINES, MIB = 8, 7, 2**20
# settle.lua's arguments for one parent's follow-ups (lib/jobs.lua follow_ups_at): the count,
# then per job queue, stream, delayed set, mark, due, member, job id, n, and 3 name, value pairs
ONE_PARENT = 1 + LINES * (8 + 2 * 3)


def test_parents_with_heavy_payloads_share_one_settle_call(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    lines = tmp_path / "follow-ups"
    lines.write_text("".join(
        json.dumps({"queue": "t", "payload": "x" * (MIB - 64)}) + "\n" for _ in range(LINES)
    ))  # fmt: skip
    parent = script("parent.sh", f"""\
        #!/bin/sh
        cat > /dev/null
        touch {tmp_path}/started.$JOBD_JOB_ID
        while [ ! -e {tmp_path}/go ]; do sleep 0.05; done
        cat {lines} > "$JOBD_ENQUEUE"
        """)  # fmt: skip
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  p:\n    command: [{parent}]\n    concurrency: {PARENTS}\n"
        "  t:\n    command: [/bin/true]\n"
    )
    # t paused: its jobs' own settles (many acks in one call under load) would be counted as
    # wide calls; only the parents' settles are measured (a CI run met one of 451 arguments)
    assert jobd_cli("pause", "-c", str(cfg), "t").returncode == 0
    daemon(cfg)
    for n in range(PARENTS):
        assert jobd_cli("enqueue", "-c", str(cfg), "p", "x", "--job-id", f"p{n}").returncode == 0
    wait_until(lambda: len(list(tmp_path.glob("started.*"))) == PARENTS, 20, what="all started")
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100000)
    r.slowlog_reset()
    r.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    (tmp_path / "go").touch()
    wait_until(lambda: r.xlen("jobd:t") == PARENTS * LINES, 30, what="every follow-up added")
    settle = sha("settle").encode()
    calls = []  # (arguments, µs) of each settle.lua call that wrote follow-ups
    for entry in r.slowlog_get(100000):
        args = entry["command"].split(b" ") if isinstance(entry["command"], bytes) else []
        if len(args) > 1 and args[1] == settle and b"more arguments" in entry["command"]:
            more = int(entry["command"].rsplit(b"(", 1)[1].split(b" ")[0])
            calls.append((31 + more, entry["duration"]))
    assert calls, "no settle.lua call with follow-ups in SLOWLOG"
    widest = max(calls)
    assert widest[0] < 2 * ONE_PARENT, (
        f"one settle.lua call of {widest[0]} arguments (one parent's follow-ups are "
        f"{ONE_PARENT} of them, {LINES} MiB), {widest[1]} µs; all calls: {sorted(calls)}"
    )
