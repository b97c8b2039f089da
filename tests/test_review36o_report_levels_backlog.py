"""Review 36o of issue 36: a daemon's status report (``daemon.report.StatusReport``: systemd's
``STATUS=`` line and the gauges of its /metrics, ``jobd_queue_lag``, ``jobd_queue_pending``, the
oldest pending age) reads each queue with ``status.queue_status``, which is one stream: a queue
with ``priorities`` has only its default level read. Jobs waiting at any other level are not
read, and the line says ``backlog 0`` (the gauge 0), where "backlog unknown" would at least be
honest: a real "not read" shown as 0, the very thing the 36l/36n rounds and d53cf0b's
``status_line`` docstring ("never counted as 0 waiting") guard against. The overview and
``jobd status`` read every level (``status.with_levels``), so two views of one Redis disagree.

Reproduced: a queue ``priorities: [high, low]`` (``low``, the last, is the default: the queue's
own stream), its groups made on both levels as a daemon makes them, three jobs waiting on
``high``; the report says ``backlog 0`` and ``jobd_queue_lag{queue="q"}`` is 0.

What should happen: the report counts every level of a queue, as the overview does (its backlog
3 here), or says it did not (``backlog unknown``). Suggested fix: ``status.with_levels`` in
``StatusReport.tick`` (one ``LagBudget`` for the request, as now), summing the levels' lags
(and pending) as ``web.pages._row`` does.

Fixed (jobd/daemon/report.py ``queue_report``): the report reads every level of a queue within
the request's one ``LagBudget`` and sums their lags, pending and delayed (the oldest pending age
the oldest of any level); a level holding entries and not its group makes the queue "not read".
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


def test_a_queues_other_priority_levels_are_counted_as_nothing_waiting(
    r: redis.Redis, write_config, tmp_path: Path
) -> None:
    q = load(str(write_config(queue_config("[/bin/true]", priorities="[high, low]")))).queues["q"]
    levels = {level.priority: level for level in q.all_levels()}
    for level in levels.values():  # as a daemon's reader makes them (ensure_group)
        r.xgroup_create(level.stream, level.group, id="0", mkstream=True)
    assert levels["low"].stream == q.stream != levels["high"].stream
    for i in range(3):
        r.xadd(levels["high"].stream, {"payload": str(i), "job_id": f"urgent-{i}"})
    metrics = Metrics()
    metrics.watch("q", lambda: 0, lambda: 1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    with listener:
        view = LoopView(queues=(q,), running=0, slots=1, live=True)
        notifier = Notifier(str(tmp_path / "notify"))
        StatusReport(r, metrics, notifier, lambda: view, False).tick()
        if notifier._sock is not None:  # its socket, made at its first send
            notifier._sock.close()
        listener.settimeout(5)
        line = listener.recv(4096)
    lag = metrics.registry.get_sample_value("jobd_queue_lag", {"queue": "q"})
    assert b"backlog 0" not in line and lag != 0, (
        f"three jobs wait on the queue's 'high' level; the daemon's STATUS= says {line!r}, "
        f"jobd_queue_lag {lag}: only the default level's stream is read"
    )
