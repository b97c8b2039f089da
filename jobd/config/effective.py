"""A queue's effective settings, every default applied, as `jobd validate --format json` lists
them (like ``nginx -T``): the keys of the config file, each with the value the daemon uses.

Durations are in seconds and sizes in bytes (numbers, whatever units the file used); a setting
with no limit is null, and ``retention.maxlen`` is ``"unbounded"`` when the operator said so.
The handler's environment is listed by name only: its values may be secrets.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from jobd.config.types import QueueConfig, ScheduleConfig


def effective(q: QueueConfig) -> dict[str, Any]:
    """Every setting of queue ``q`` as the daemon uses it."""
    return {
        "stream": q.stream,
        "group": q.group,
        "command": list(q.command),
        "concurrency": q.concurrency,
        "prefetch": "auto" if q.prefetch is None else q.prefetch,
        "timeout": q.timeout,
        "kill_grace": q.kill_grace,
        "max_wait": q.max_wait,
        "cwd": q.cwd,
        "env": sorted(q.env),  # names only: values are never shown
        "lease": {"renew_every": q.lease.renew_every, "reclaim_after": q.lease.reclaim_after},
        "retry": asdict(q.retry),
        "exit_codes": {"fail": sorted(q.fail_exit_codes)},
        "max_deliveries": q.max_deliveries,
        "dead_letter": asdict(q.dead_letter),
        "history": asdict(q.history),
        "retention": {"maxlen": "unbounded" if q.retention_maxlen is None else q.retention_maxlen},
        "max_payload": q.max_payload,
        "result_max": q.result_max,
        "max_follow_ups": q.max_follow_ups,
        "max_follow_ups_bytes": q.max_follow_ups_bytes,
        "then": [{"queue": t.queue, "payload": t.payload, "delay": t.delay} for t in q.then],
        "on_dead_letter": {"queue": q.on_dead_letter.queue} if q.on_dead_letter else None,
        "priorities": [level.priority for level in q.levels] or None,
        "default_priority": q.priority,
        "starvation_after": q.starvation_after,
        "limits": _limits(q),
        "resources": asdict(q.resources),
        "run_as": {"user": q.run_as_user, "group": q.run_as_group} if q.run_as_user else None,
        "log_payload": q.log_payload,
        "dedupe": {"window": q.dedupe_window} if q.dedupe_window is not None else None,
        "schedule": [_schedule(s) for s in q.schedule],
    }


def _limits(q: QueueConfig) -> dict[str, Any]:
    rate = q.rate
    return {
        "concurrency": q.slots,
        "rate": None if rate is None else {"count": rate.count, "per": rate.per},
        "burst": None if rate is None else rate.burst,
    }


def _schedule(s: ScheduleConfig) -> dict[str, Any]:
    return {"name": s.name, "cron": s.cron, "timezone": s.timezone, "catch_up": s.catch_up,
            "payload_bytes": len(s.payload)}  # fmt: skip
