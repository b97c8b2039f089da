"""The duty that tells systemd how the daemon is doing: ``STATUS=`` with running handlers and
the backlog (entries not yet delivered to the group), every few seconds. Only when systemd
listens: outside it, this costs nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobd.daemon import Daemon

STATUS_EVERY = 5.0


class StatusReport:
    name = "status report to systemd"
    interval = STATUS_EVERY

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def tick(self) -> None:
        d = self.daemon
        if not d.notifier.enabled or not d.ready or d.stopping:
            return
        backlog = 0
        for q in list(d.config.queues.values()):
            groups = d.ticker_client.xinfo_groups(q.stream)
            group = next((g for g in groups if g["name"].decode() == q.group), None)
            backlog += (group or {}).get("lag") or 0
        d.notifier.status(d.status_line(backlog))
