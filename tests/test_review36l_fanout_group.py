"""Review 36l of issue 36: two queues reading one stream (jobd's own fan-out, documented in
docs/reference/configuration.md and driven by tests/test_escapes.py) show "idle" on the
overview while jobs wait and no daemon serves them.

Round 36k (ef5885b) reads a queue's group only when it is the stream's only one (XINFO GROUPS
copies every group's name into the script). A fan-out stream always has two or more groups, all
of them jobd's own, so each of its queues' lag, pending count and consumers are now null ("not
read") for good. ``pages._row`` sums the levels' lag as ``level["lag"] or 0``: a backlog of 0,
so the state is "idle" (not "stalled", not "busy") whatever waits: in an incident (the daemon
down, 20 jobs waiting on a fan-out stream) the overview says both queues have nothing to do,
while the same jobs on a queue of its own say "stalled". (Before 36k, XINFO GROUPS gave each
group's lag: the overview said "stalled".) The daemon's status report adds ``report["lag"] or
0`` the same way ("backlog 0" to systemd). The same befalls any queue whose stream keeps a
group it no longer reads: a reload that changes a queue's ``group`` leaves the old one on the
stream (jobd destroys no group; ``queues.warn_if_moved`` only says what it leaves), and the
queue's figures are "not read" from then on.

What should happen: a queue whose lag is not known is never shown "idle" (say "unknown", or
read the group when every group on the stream is one of the config's, whose names are bounded:
XINFO STREAM's count equal to the config's groups of that stream, each found by XPENDING).

Fixed (lib/group.lua): XINFO GROUPS read when every group on the stream is the config's; since
issue 36's threat model (groups can only be made by a client with consumer rights: their names
are not weighed) it is read whatever groups the stream has: a group the config does not name
leaves the queue's figures read too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import dashboard_server, get_json

JOBS = 20


def test_a_fanout_queue_with_jobs_waiting_and_no_daemon_is_not_idle(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a: {stream: shared, group: ga, command: [/bin/true]}\n"
        "  b: {stream: shared, group: gb, command: [/bin/true]}\n"
        "  c: {stream: alone, group: gc, command: [/bin/true]}\n"
    )
    for stream, group in (("shared", "ga"), ("shared", "gb"), ("alone", "gc")):
        r.xgroup_create(stream, group, id="0", mkstream=True)  # as a daemon's start makes them
    for _ in range(JOBS):
        r.xadd("shared", {"payload": "x"})
        r.xadd("alone", {"payload": "x"})
    with dashboard_server(config) as port:
        rows = get_json(port, "/api/summary")["queues"]
    assert rows["c"]["state"] == "stalled", rows["c"]  # the control: a queue of its own
    shown = {name: (rows[name]["state"], rows[name]["backlog"], rows[name]["lag_known"])
             for name in ("a", "b")}  # fmt: skip
    assert all(state != "idle" for state, _, _ in shown.values()), (
        f"{JOBS} jobs wait on the fan-out stream and no daemon serves it; the overview says "
        f"(state, backlog, lag known): {shown} (queue c, the same jobs on a stream of its own: "
        f"{rows['c']['state']}, backlog {rows['c']['backlog']})"
    )


def test_a_fanout_queues_page_reads_its_group(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    """The queue's page and `jobd status` read the group the same way: each queue's lag is
    read, with a group the config does not name on the stream too."""
    from jobd.config import load
    from jobd.store import status

    config = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a: {stream: shared, group: ga, command: [/bin/true]}\n"
        "  b: {stream: shared, group: gb, command: [/bin/true]}\n"
    )
    r.xgroup_create("shared", "ga", id="0", mkstream=True)
    r.xgroup_create("shared", "gb", id="0")
    for _ in range(JOBS):
        r.xadd("shared", {"payload": "x"})
    r.xreadgroup("ga", "c", {"shared": ">"}, count=5)
    with dashboard_server(config) as port:
        page = get_json(port, "/api/queue?queue=a")["status"]
    assert (page["lag"], page["pending"], page["groups"]) == (JOBS - 5, 5, 2), page
    report = status.gather(r, load(str(config)))["queues"]["b"]
    assert (report["lag"], report["pending"], report["groups"]) == (JOBS, 0, 2), report
    r.xgroup_create("shared", "someone-else", id="0")  # a group the config does not name
    report = status.gather(r, load(str(config)))["queues"]["b"]
    assert (report["lag"], report["pending"], report["groups"]) == (JOBS, 0, 3), report
