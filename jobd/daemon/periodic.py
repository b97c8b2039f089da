"""Periodic jobs: a queue's ``schedule`` of cron expressions, enqueued by every daemon and yet
once per tick.

Each daemon evaluates every schedule on its own clock. A tick at time T of schedule N is enqueued by
one script (``Store.tick``, ``lua/tick.lua``) that sets the tick's key ``{S}:tick:N:T`` with NX and
adds the job only if it set it: whichever daemon comes first enqueues it, the others find the key
and do nothing, and no leader is needed. Tick keys outlive ``catch_up`` by ``TICK_KEY_MARGIN``, so
no tick is enqueued twice while the daemons' clocks agree within that. A running daemon enqueues
every tick as it comes, even one it gets to late (``LIVE_WINDOW``).

The script also keeps the schedule's latest enqueued tick, ``{S}:schedule:N``, with no expiry:
whatever the schedule's interval and however long the outage, a daemon that starts, reloads or
gets Redis back resumes from it, so it enqueues none of the ticks before it (a daemon whose
clock is behind the one that enqueued it included). It tries every tick since then that is due
on its clock, and the script refuses those more than ``catch_up`` old on Redis's clock: one
clock for every host, so a daemon whose clock is ahead does not mistake a short outage for a
long one and skip its ticks. So a restart, or every daemon being down for less than
``catch_up``, neither skips nor repeats a tick; a schedule never run before starts from now.

Cron expressions are croniter's: five fields, or six with seconds last
(``* * * * * */10``: every ten seconds), evaluated in the schedule's time zone (DST included).
"""

from __future__ import annotations

import logging
import math
import time

import redis

from jobd.config import QueueConfig, ScheduleConfig
from jobd.cron import job_id, ticks
from jobd.job import JOB_ID, PAYLOAD
from jobd.logs import word
from jobd.store.store import Store

log = logging.getLogger("jobd.periodic")

CHECK_EVERY = 0.2  # seconds: a tick is enqueued within this of its time (plus a round trip)
TICK_KEY_MARGIN = 600  # seconds a tick's key outlives the catch-up window
# How far before this host's catch-up window a resuming daemon looks: ticks that old may still
# be within catch_up on Redis's clock when this host's clock is ahead (tick.lua decides).
CLOCK_SLACK = TICK_KEY_MARGIN
# A running daemon enqueues a tick it gets to this late (a slow duty before it, a short stall),
# whatever catch_up says: catch_up bounds what is caught up after a restart, not live ticks.
LIVE_WINDOW = 10.0


class Periodic:
    """The duty that enqueues one queue's periodic jobs."""

    def __init__(self, store: Store, queue: QueueConfig) -> None:
        self.name = f"periodic jobs of queue {queue.name}"
        self.interval = CHECK_EVERY
        self.store = store
        self.queue = queue
        # The last tick each schedule has settled (enqueued here, found taken, or found too
        # old); None: not known, resume from Redis (at the start, and after a failed tick).
        self.settled: dict[str, float | None] = dict.fromkeys(
            (s.name for s in queue.schedule), None
        )

    def tick(self) -> int:
        now = time.time()
        return sum(self.evaluate(schedule, now) for schedule in self.queue.schedule)

    def evaluate(self, schedule: ScheduleConfig, now: float) -> int:
        """Enqueue the schedule's ticks due by ``now``; an exception leaves it to resume."""
        last, self.settled[schedule.name] = self.settled[schedule.name], None
        if last is None:
            added, settled = self.resume(schedule, now)
        else:
            window = max(schedule.catch_up, LIVE_WINDOW)
            added, settled = self.run(schedule, max(last, now - window), now)
        self.settled[schedule.name] = settled
        return added

    def resume(self, schedule: ScheduleConfig, now: float) -> tuple[int, float]:
        """Catch up from the latest tick enqueued, within ``catch_up`` on Redis's clock."""
        latest = self.latest(schedule)
        if latest is None:
            return 0, now  # never run: from now
        after = max(latest, now - schedule.catch_up - CLOCK_SLACK)
        return self.run(schedule, after, now, deadline=schedule.catch_up)

    def latest(self, schedule: ScheduleConfig) -> float | None:
        """The latest tick enqueued (``{S}:schedule:N``); None if there is none, or if what
        another client wrote there is no number or not a string (tick.lua overwrites it on the
        next tick)."""
        try:
            raw = self.store.latest_tick(self.queue, schedule.name)
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            key = self.queue.keys.schedule_last(schedule.name)
            log.warning("queue=%s schedule=%s: %s is not a string; starting from now",
                        self.queue.name, schedule.name, key)  # fmt: skip
            return None
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            log.warning("queue=%s schedule=%s: ignoring %r", self.queue.name, schedule.name, raw)
            return None
        return value

    def run(
        self, schedule: ScheduleConfig, after: float, now: float, deadline: float | None = None
    ) -> tuple[int, float]:
        """Try each tick in (after, now]; returns how many were added and the last one tried.
        A tick refused as too old (only with a deadline) tells Redis's time: the older ones
        left are skipped without asking."""
        added, late, floor = 0, 0, -math.inf
        for t in ticks(schedule, after, now):
            if t < floor:
                late += 1
            else:
                outcome, redis_now = self.enqueue(schedule, t, deadline)
                added += outcome == "added"
                if redis_now is not None and deadline is not None:
                    late, floor = late + 1, redis_now - deadline
            after = t
        if late:
            log.info(
                "queue=%s schedule=%s: %d missed tick(s) older than catch_up (%gs) on Redis's "
                "clock not enqueued", self.queue.name, schedule.name, late, schedule.catch_up,
            )  # fmt: skip
        return added, after

    def enqueue(
        self, schedule: ScheduleConfig, t: float, deadline: float | None
    ) -> tuple[str, float | None]:
        """tick.lua for tick ``t``: "added", "taken" or "late", and Redis's time when late."""
        q = self.queue
        jid = job_id(schedule, t)
        keep_ms = int((schedule.catch_up + TICK_KEY_MARGIN) * 1000)
        deadline_ms = None if deadline is None else int(deadline * 1000)
        fields = {PAYLOAD: schedule.payload, JOB_ID: jid.encode()}
        tick = self.store.tick(q, schedule.name, int(t), fields, keep_ms, deadline_ms)
        if tick.outcome == "added":
            late_by = time.time() - t
            log.info("queue=%s job=%s enqueued for its tick (%.3fs after it)",
                     q.name, word(jid), late_by)  # fmt: skip
        return tick.outcome, tick.redis_time


def duties(store: Store, queue: QueueConfig) -> list[Periodic]:
    """A queue's periodic-jobs duty, when it has a schedule."""
    return [Periodic(store, queue)] if queue.schedule else []
