"""The duty that reports how the queues are doing, every few seconds: ``STATUS=`` to systemd
(running handlers, backlog) and the queue gauges of the metrics endpoint (lag, pending, oldest
pending age, delayed, dead-lettered; whether Redis answered). Only when systemd listens or
metrics are served: otherwise it costs nothing.

It runs on the ticker thread and reads nothing the loop changes in place: it asks for a
``LoopView``, an immutable value made of what the loop replaces whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from jobd.config import Config, QueueConfig
from jobd.daemon.notify import Notifier
from jobd.store import connection as redisconn
from jobd.store import status
from jobd.web.endpoint import serve
from jobd.web.metrics import Metrics

STATUS_EVERY = 5.0


@dataclass(frozen=True, slots=True)
class LoopView:
    """What the loop shows of itself to other threads."""

    queues: tuple[QueueConfig, ...] = ()
    running: int = 0  # handlers running
    slots: int = 0  # handler slots of the queues in force
    live: bool = False  # ready, and not stopping
    stopping: bool = False  # from SIGTERM on


def status_line(running: int, slots: int, backlog: int | None = None, unread: int = 0) -> str:
    """systemd's STATUS= line: ``unread`` queues whose lag was not read (a stream holding
    entries and not the queue's group: ``lib/group.lua``) are said, never counted as 0
    waiting."""
    line = f"{running} of {slots} handlers running"
    if backlog is None:
        return line
    if unread:
        rest = f"{unread} queue(s) not read, {backlog} waiting in the rest"
        return f"{line}; backlog unknown ({rest})"
    return f"{line}; backlog {backlog}"


class StatusReport:
    name = "status report"
    interval = STATUS_EVERY

    def __init__(
        self,
        client: redis.Redis,
        metrics: Metrics,
        notifier: Notifier,
        view: Callable[[], LoopView],
        served: bool,
    ) -> None:
        self.client, self.metrics, self.notifier, self.view = client, metrics, notifier, view
        self.served = served  # metrics are served: their gauges want the queues' state

    def tick(self) -> None:
        v = self.view()
        if not (self.notifier.enabled or self.served) or not v.live:
            return
        backlog = unread = 0
        clock = redisconn.Clock(self.client)  # ages on Redis's clock: one TIME per server
        lags = status.LagBudget()  # shared by the queues
        try:
            for q in v.queues:
                report = status.queue_status(self.client, q, clock.at(q.stream), lags)
                backlog += report["lag"] or 0
                unread += report["lag"] is None and report.get("length", 0) != 0
                self.metrics.queue_state(q.name, report)
        except redisconn.UNAVAILABLE:
            self.metrics.redis_up.set(0)
            raise
        self.metrics.redis_up.set(1)
        self.notifier.status(status_line(v.running, v.slots, backlog, unread))


def serve_endpoint(metrics: Metrics, listen: str, config: Config) -> None:
    """The daemon's ``metrics_listen``: /metrics, /healthz and the dashboard's page. The page
    and the server are imported here: a daemon that serves nothing never loads them."""
    from jobd.web.dashboard import Dashboard

    serve(metrics, listen, Dashboard(config))
