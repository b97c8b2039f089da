"""The duty that reports how the queues are doing, every few seconds: ``STATUS=`` to systemd
(running handlers, backlog) and the queue gauges of the metrics endpoint (lag, pending, oldest
pending age, delayed, dead-lettered). Only when systemd listens or metrics are served:
otherwise it costs nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobd import status

if TYPE_CHECKING:
    from jobd.daemon import Daemon

STATUS_EVERY = 5.0


class StatusReport:
    name = "status report"
    interval = STATUS_EVERY

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def tick(self) -> None:
        d = self.daemon
        if not (d.notifier.enabled or d.config.metrics_listen) or not d.ready or d.stopping:
            return
        backlog = 0
        for q in list(d.config.queues.values()):
            report = status.queue_status(d.ticker_client, q)
            backlog += report["lag"] or 0
            d.metrics.queue_state(q.name, report)
        d.notifier.status(d.status_line(backlog))
