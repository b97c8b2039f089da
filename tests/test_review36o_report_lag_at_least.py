"""Review 36o of issue 36: a daemon's ``STATUS=`` line says a lower bound as the backlog. When
Redis says a queue's lag is null, ``status.count_after`` counts it, stopping at LAG_COUNT_CAP
(10 000 entries) or at the request's 16 MiB (then one entry a queue: "at least 1"), and the
report says so (``lag_at_least``: the dashboard shows "≥ 10000", docs/operations/dashboard.md).
``daemon.report.StatusReport.tick`` adds ``report["lag"]`` and drops ``lag_at_least``: the line
reads ``backlog 10000`` where 12 000 jobs wait (and, the budget spent on an earlier queue,
``backlog 1`` for a queue of thousands), as exact as a real count.

Redis says null after jobd's own retention: a long job holds the stream's first entry, a done
one behind it is XDELed by ``trim.lua``'s step 2 while it is the group's last delivered entry;
every entry added after it then has no lag from Redis until the group reads past it (a queue
whose slot is busy, or paused).

What should happen: the line says the backlog is a lower bound where it is one (e.g. "backlog
≥ 10000"), as the dashboard does, or "backlog unknown". Suggested fix: ``StatusReport.tick``
keeps whether any queue's lag was ``lag_at_least`` and ``status_line`` says "≥".

Fixed (jobd/daemon/report.py), then overtaken (f36a): ``StatusReport.tick`` kept whether a
count stopped at its bound and said ``backlog at least N``. Since f36a a null lag is no longer
counted (counting read a producer's entries whole) and jobd's retention no longer makes one
(trim.lua keeps each group's last delivered entry): Redis says null only after someone's XDEL
ahead of the group. The test now makes that null with an operator's XDEL and checks the line
says the backlog is not known, never a number as if exact. ``lag_at_least`` (always false since
then) is no longer in the status (nor ``backlog_at_least`` in the overview's rows).
"""

from __future__ import annotations

import socket
from pathlib import Path

import redis
from support import queue_config

from jobd.config import load
from jobd.daemon.notify import Notifier
from jobd.daemon.report import LoopView, StatusReport
from jobd.web.metrics import Metrics

WAITING = 12_000


def test_a_null_lag_is_said_unknown_never_as_exact(
    r: redis.Redis, write_config, tmp_path: Path
) -> None:
    q = load(str(write_config(queue_config("[/bin/true]")))).queues["q"]
    r.xgroup_create(q.stream, q.group, id="0", mkstream=True)
    r.xadd(q.stream, {"payload": "p", "job_id": "long"})  # runs for hours
    done = r.xadd(q.stream, {"payload": "p", "job_id": "quick"})
    r.xreadgroup(q.group, "host-1-abcdabcdabcdabcd", {q.stream: ">"}, count=2)
    r.xack(q.stream, q.group, done)
    assert r.xdel(q.stream, done) == 1  # an operator's XDEL of the last delivered entry
    pipe = r.pipeline(transaction=False)
    for i in range(WAITING):
        pipe.xadd(q.stream, {"payload": "p", "job_id": f"w{i}"})
    pipe.execute()
    assert r.xinfo_groups(q.stream)[0]["lag"] is None, "Redis says null"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    with listener:
        view = LoopView(queues=(q,), running=1, slots=1, live=True)
        notifier = Notifier(str(tmp_path / "notify"))
        StatusReport(r, Metrics(), notifier, lambda: view, False).tick()
        if notifier._sock is not None:  # its socket, made at its first send
            notifier._sock.close()
        listener.settimeout(5)
        line = listener.recv(4096)
    assert b"backlog unknown (1 queue(s) not read, 0 waiting in the rest)" in line, (
        f"{WAITING} jobs wait (Redis's lag null); the daemon's STATUS= says {line!r}"
    )
