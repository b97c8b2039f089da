"""Follow-ups (issue 35) and the daemon's loop: reading and parsing a handler's JOBD_ENQUEUE
file is not the loop's work. A file of 10 000 lines cost the loop about a second in the
handler's end (finish -> policy.of_handler -> followups.collected), during which no queue
started or ended a job, queues that use no workflow included.

Real daemon, real handlers, a private Redis: a queue ``fast`` runs short shell jobs, each
noting when it started (/proc/uptime: CLOCK_BOOTTIME, read by the shell itself), while a handler
of queue ``wf`` exits 0 having written 10 000 follow-ups (delayed an hour: they stay in
``sink``'s delayed set). From the parent's exit until its follow-ups are in Redis, ``fast``
goes on starting jobs: its longest gap between two starts is a fraction of that time, where
before the loop stopped for nearly all of it."""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from support import DaemonProcess, wait_until

from jobd.config import load

Daemon = Callable[..., DaemonProcess]
LINES = 10_000

PARENT = r"""
import json, os, sys, time
tmp = sys.argv[1]
line = json.dumps({"queue": "sink", "payload": "x" * 100, "delay": "1h"}).encode() + b"\n"
with open(os.environ["JOBD_ENQUEUE"], "wb") as f:
    f.write(line * int(sys.argv[2]))
starts = f"{tmp}/starts"
while not os.path.exists(starts) or os.path.getsize(starts) < 2000:  # fast is running
    time.sleep(0.01)
with open(f"{tmp}/exit", "w") as f:
    f.write(repr(time.clock_gettime(time.CLOCK_BOOTTIME)))
"""

FAST = "read up _ < /proc/uptime; echo $up >> {starts}"


def test_a_parent_with_10000_follow_ups_does_not_stall_other_queues(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    starts = tmp_path / "starts"
    cfg = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        f"  wf:\n    command: ['{sys.executable}', '{parent}', '{tmp_path}',"
        f" '{LINES}']\n"
        f"  fast:\n    command: [/bin/sh, -c, '{FAST.format(starts=starts)}']\n"
        "    concurrency: 2\n"
        "  sink:\n    command: [/bin/true]\n"
    )
    config = load(str(cfg))
    fast, sink = config.queues["fast"], config.queues["sink"]
    pipe = r.pipeline(transaction=False)
    for n in range(5_000):  # more than run meanwhile
        pipe.xadd(fast.stream, {"payload": "", "job_id": f"f{n}"})
    pipe.execute()
    daemon(cfg)
    r.xadd(config.queues["wf"].stream, {"payload": "", "job_id": "parent"})
    delayed = sink.keys.delayed

    def enqueued() -> bool:
        return r.exists(delayed) and r.zcard(delayed) == LINES

    wait_until(lambda: (tmp_path / "exit").exists(), 60, what="the parent's exit")
    wait_until(enqueued, 60, what="the parent's 10 000 follow-ups")
    written = time.clock_gettime(time.CLOCK_BOOTTIME)
    exited = float((tmp_path / "exit").read_text())
    window = written - exited  # the parse, the parent's settling, and the polls' delay
    seen = sorted(float(t) for t in starts.read_text().split())
    during = [t for t in seen if exited - 0.05 <= t <= written]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    # the gap that spans the parent's exit, if none started in between
    before, after = [t for t in seen if t < exited], [t for t in seen if t > exited]
    spans = (after[0] - before[-1]) if before and after else window
    longest = max([*gaps, spans])
    print(json.dumps({"window": round(window, 3), "starts": len(during),
                      "longest_gap": round(longest, 3)}))  # fmt: skip
    assert len(during) >= 3 and longest < window / 2, (
        f"queue fast stalled {longest:.3f}s ({len(during)} starts) in the {window:.3f}s from the "
        "parent's exit until its follow-ups were written: the loop parsed its JOBD_ENQUEUE"
    )


def test_a_stop_waits_for_a_parse_under_way(r: redis.Redis, write_config) -> None:
    """In-process: a stop begun while a parent's file is parsed on the thread ends the loop
    only once the parent is decided: it is acked with its follow-ups, not left unsettled."""
    from test_loop import STREAM, Loop

    line = json.dumps({"queue": "sink", "payload": "x"})
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 10s\nqueues:\n"
        f"  q:\n    stream: {STREAM}\n    command: [/bin/sh, -c, "
        f"'yes {json.dumps(line)} | head -n {LINES} > \"$JOBD_ENQUEUE\"']\n"
        "  sink:\n    command: [/bin/true]\n"
    )
    loop = Loop(cfg)
    try:
        r.xadd(STREAM, {"payload": ""})
        loop.until(lambda: loop.daemon.endings.pending or loop.outcomes, "the parent's end")
        assert loop.daemon.endings.pending, "inconclusive: the file was parsed in the same pass"
        loop.daemon.begin_stop("the test")
        loop.until(loop.daemon.finished, "the loop to finish")
        # The parent's: a sink read in flight at the stop may deliver a follow-up, handed back.
        (outcome,) = [o for o in loop.outcomes if o.queue.name == "q"]
        assert outcome.verb.value == "ack" and len(outcome.follow_ups) == LINES, outcome.verb
    finally:
        loop.stop()
