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
from typing import Any

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
    """systemd's STATUS= line: ``unread`` queues whose lag is not known (a stream holding
    entries and not the queue's group, or Redis's lag null after someone's XDEL ahead of the
    group: ``lib/group.lua``) are said, never counted as 0 waiting."""
    line = f"{running} of {slots} handlers running"
    if backlog is None:
        return line
    waiting = f"{backlog}"
    if unread:
        rest = f"{unread} queue(s) not read, {waiting} waiting in the rest"
        return f"{line}; backlog unknown ({rest})"
    return f"{line}; backlog {waiting}"


def queue_report(client: redis.Redis, q: QueueConfig, now: float) -> dict[str, Any]:
    """Queue ``q``'s status summed over its priority levels (each its own stream, read as
    ``status.with_levels`` reads them): lag, pending and delayed summed, the oldest pending age
    the oldest of any level, ``unread`` when a level holds entries and not its group (its lag
    not known), ``waiting`` the levels' known lags; the lag None when no level's is known, or
    one level's is not while it holds entries."""
    reports = [status.queue_status(client, level, now) for level in q.all_levels()]
    result = next(r for r in reports if r["stream"] == q.stream)
    if len(reports) == 1:
        result["unread"] = result["lag"] is None and result["length"] != 0
        result["waiting"] = result["lag"] or 0
        return result
    result = dict(result)
    ages = [r["oldest_pending_age"] for r in reports if r["oldest_pending_age"] is not None]
    unread = any(r["lag"] is None and r["length"] != 0 for r in reports)
    known = [r["lag"] for r in reports if r["lag"] is not None]
    result.update(
        lag=None if unread or not known else sum(known),
        unread=unread,
        waiting=sum(known),
        pending=sum(r["pending"] for r in reports),
        oldest_pending_age=max(ages, default=None),
        delayed=sum(r["delayed"] or 0 for r in reports),
    )
    return result


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
        try:
            for q in v.queues:
                report = queue_report(self.client, q, clock.at(q.stream))
                backlog += report["waiting"]
                unread += report["unread"]
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
