"""Periodic jobs: a queue's ``schedule`` of cron expressions, enqueued by every daemon and yet
once per tick.

Each daemon evaluates every schedule on its own clock. A tick at time T of schedule N is
enqueued by one script (``lua/tick.lua``) that sets the tick's key ``{S}:tick:N:T`` with NX and
adds the job only if it set it: whichever daemon comes first enqueues it, the others find the
key and do nothing, and no leader is needed. The script also keeps the schedule's latest
enqueued tick. A starting daemon checks every tick since that one, back to ``catch_up`` ago at
most (so a restart, or every daemon being down for less than ``catch_up``, skips nothing; a
schedule never run before starts from now), then each new tick as it comes. Tick keys outlive
``catch_up`` by ``TICK_KEY_MARGIN`` (room for clocks that disagree), so no tick is enqueued
twice.

Cron expressions are croniter's: five fields, or six with seconds last
(``* * * * * */10``: every ten seconds), evaluated in the schedule's time zone (DST included).
"""

from __future__ import annotations

import datetime
import logging
import time
from zoneinfo import ZoneInfo

import redis
from croniter import croniter

from jobd.config import QueueConfig, ScheduleConfig
from jobd.job import JOB_ID, PAYLOAD
from jobd.scripts import Scripts

log = logging.getLogger("jobd.periodic")

CHECK_EVERY = 0.2  # seconds: a tick is enqueued within this of its time (plus a round trip)
TICK_KEY_MARGIN = 600  # seconds a tick's key outlives the catch-up window


def _from(schedule: ScheduleConfig, moment: float) -> croniter:
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


class Periodic:
    """The duty that enqueues one queue's periodic jobs."""

    def __init__(self, client: redis.Redis, scripts: Scripts, queue: QueueConfig) -> None:
        self.name = f"periodic jobs of queue {queue.name}"
        self.interval = CHECK_EVERY
        self.client = client
        self.scripts = scripts
        self.queue = queue
        # The last tick each schedule has settled (enqueued here or found taken); None: not
        # known yet, read from Redis on the first tick.
        self.settled: dict[str, float | None] = dict.fromkeys(
            (s.name for s in queue.schedule), None
        )

    def tick(self) -> int:
        added = 0
        now = time.time()
        for schedule in self.queue.schedule:
            last = self.settled[schedule.name]
            if last is None:
                raw = self.client.get(self.queue.keys.schedule_last(schedule.name))
                last = float(raw) if raw is not None else now
            after = max(last, now - schedule.catch_up)
            for t in ticks(schedule, after, now):
                added += self.enqueue(schedule, t)
                after = t
            self.settled[schedule.name] = after
        return added

    def enqueue(self, schedule: ScheduleConfig, t: float) -> int:
        q = self.queue
        jid = job_id(schedule, t)
        ttl_ms = int((schedule.catch_up + TICK_KEY_MARGIN) * 1000)
        tick_key, last_key = q.keys.tick(schedule.name, int(t)), q.keys.schedule_last(schedule.name)
        message_id = self.scripts.tick(
            keys=[q.stream, tick_key, last_key],
            args=[ttl_ms, int(t), PAYLOAD, schedule.payload, JOB_ID, jid],
        )
        if message_id is None:
            return 0
        lateness = time.time() - t
        log.info("queue=%s job=%s enqueued for its tick (%.3fs after it)", q.name, jid, lateness)
        return 1
