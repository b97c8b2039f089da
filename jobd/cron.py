"""When a schedule's ticks fall: cron expressions (croniter's: five fields, or six with seconds
last) evaluated in the schedule's time zone, DST included; and the stable job id of a tick."""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from jobd.config import ScheduleConfig

if TYPE_CHECKING:  # imported at the first schedule evaluated: most daemons have none, and
    from croniter import croniter  # croniter's import runs `file` (platform.architecture)


def _from(schedule: ScheduleConfig, moment: float) -> croniter:
    from croniter import croniter

    zone = ZoneInfo(schedule.timezone)
    return croniter(schedule.cron, datetime.datetime.fromtimestamp(moment, zone))


def ticks(schedule: ScheduleConfig, after: float, until: float) -> list[float]:
    """The schedule's ticks in (after, until], Unix seconds."""
    it = _from(schedule, after)
    found: list[float] = []
    while (t := it.get_next(float)) <= until:
        found.append(t)
    return found


def next_tick(schedule: ScheduleConfig, now: float | None = None) -> float:
    return _from(schedule, time.time() if now is None else now).get_next(float)


def job_id(schedule: ScheduleConfig, tick: float) -> str:
    """Stable per tick: ``NAME@2026-11-29T12:00:05Z`` (UTC)."""
    moment = datetime.datetime.fromtimestamp(tick, datetime.UTC)
    return f"{schedule.name}@{moment.strftime('%Y-%m-%dT%H:%M:%SZ')}"
