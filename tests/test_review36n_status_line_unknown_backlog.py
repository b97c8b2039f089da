"""Review 36n of issue 36: the daemon's systemd status line says ``backlog 0`` while a queue's
lag is not known. Since review 36l a queue's group is "not read" (lag None) when its stream
weighs more than the request's budget (about 13 000 jobs of 1 KiB) or has a group the config
does not name; the overview says ``unknown``, the metrics' jobd_queue_lag NaN, but
``report.StatusReport.tick`` adds ``report["lag"] or 0`` (jobd/daemon/report.py, the loop over
``v.queues``) and sends ``STATUS=… backlog 0`` to systemd: ``systemctl status jobd`` tells an
operator in an incident that nothing waits while the queue's stream holds thousands of jobs.
The fixer of 36l noted it and left it.

What should happen: an unknown lag is not counted as 0: the line says the backlog is unknown
(e.g. ``backlog ≥ N, 1 queue unknown``, or ``backlog unknown``), as the overview does.

Fixed (jobd/daemon/report.py): ``backlog unknown (N queue(s) not read, …)``. Since issue 36's
group read (lib/group.lua) a foreign group or a heavy stream leaves the lag read; a lag is
still not known while the stream holds entries and not the queue's group (destroyed, or not
made yet): the test now sets that up, and checks a foreign group's lag is read.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import redis

from jobd.config import load
from jobd.daemon.notify import Notifier
from jobd.daemon.report import LoopView, StatusReport
from jobd.web.metrics import Metrics


def test_status_line_says_backlog_0_for_an_unknown_lag(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    config = load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n")))  # fmt: skip
    r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
    pipe = r.pipeline()
    for i in range(500):
        pipe.xadd("jobd:q", {"payload": f"p{i}", "job_id": f"j{i}"})
    pipe.execute()
    r.xgroup_create("jobd:q", "audit", id="$")  # another application's group on the stream
    from jobd.store import status

    assert status.queue_status(r, config.queues["q"])["lag"] == 500  # read all the same
    r.xgroup_destroy("jobd:q", "jobd")  # the queue's own group gone: its lag not known
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify")
    listener.bind(address)
    listener.settimeout(10)
    view = LoopView(queues=tuple(config.queues.values()), running=0, slots=1, live=True)
    notifier = Notifier(address)
    report = StatusReport(r, Metrics(), notifier, lambda: view, served=True)
    report.tick()
    line = listener.recv(4096).decode()
    listener.close()
    if notifier._sock is not None:  # the daemon's socket, made at its first send
        notifier._sock.close()
    lag = status.queue_status(r, config.queues["q"])["lag"]
    assert lag is None  # the group not read
    assert "backlog 0" not in line, (
        f"500 jobs wait in queue q, whose lag is not known (the queue's group gone), and "
        f"the daemon tells systemd {line!r}: an unknown lag counted as 0 "
        f"(report.StatusReport.tick: report['lag'] or 0)"
    )
