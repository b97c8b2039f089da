"""What becomes of each job a reader delivers to the loop.

In order: a job whose lease was lost before it started is not started (one ``jobd cancel``
reached is acknowledged as cancelled, unrun); one delivered while the daemon stops, or whose
queue was removed or moved by a reload, or is paused, is handed back at once; one malformed or
expired (``max_wait``, ``jobd_expires_at``, checked just before it would start) is dead-lettered
unrun; any other is started as soon as its queue has a free slot. Until then it waits (it was
read ahead: ``prefetch``), in order, held and renewed like a running one, and is handed back
when it waited ``prefetch.START_BOUND``, when the daemon stops, when a reload changes its queue,
or when its queue is paused. Last, immediately before its handler is spawned, the job's lease
must have been confirmed less than ``lease.START_MARGIN`` of ``reclaim_after`` earlier (see
``lease``): else another daemon may have taken it over and run it (this daemon was stopped or
cut off meanwhile), and it is handed back unstarted. That bound goes with the start as its
deadline, checked again as late as each way of starting allows (``process.deadline``; in the
clone's child, as its last step before exec): a handler that gets there past it does not exec,
and its job is handed back unstarted too ("lease lapsed before exec"). Each queue's read-ahead
allowance follows its handlers' run times (``prefetch.Pace``) and reaches its reader through its
``Slots``.

Used by the loop's thread only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from jobd import tracing
from jobd.config import Config, QueueConfig
from jobd.daemon import limits
from jobd.daemon.handlers import Handlers
from jobd.daemon.inbox import Delivery, Inbox
from jobd.daemon.lease import START_MARGIN, Holdings, lease_clock
from jobd.daemon.prefetch import Pace, Waiting
from jobd.daemon.queues import QueueSet
from jobd.job import Job
from jobd.outcome import Outcome, Verb
from jobd.process import policy
from jobd.process.deadline import Lapsed
from jobd.process.handler import Handler, SpawnError, StopReason
from jobd.process.states import span_of
from jobd.store.leases import Lost, key
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.daemon")

# Jobs of a queue handed back in a row, their lease's confirmation too old at the start check,
# no start between them: then the round trip to Redis is likely too long for reclaim_after
# (every read's reply arrives with its confirmation already too old), said at most every
# TOO_SLOW_SAID seconds per queue.
TOO_SLOW_IN_A_ROW = 3
TOO_SLOW_SAID = 60.0


class Admission:
    def __init__(
        self, running: Handlers, inbox: Inbox, queues: QueueSet, metrics: Metrics, folder: str,
        settle: Callable[[Outcome], None], freed: Counter[str], holdings: Holdings,
    ) -> None:  # fmt: skip
        self.running, self.inbox, self.queues, self.metrics = running, inbox, queues, metrics
        self.holdings = holdings  # when each entry's lease was last confirmed
        self.folder = folder  # where handlers run unless their queue says otherwise
        self.settle = settle  # the loop's: counts the outcome, frees its slot
        self.freed = freed  # the loop's slots freed this pass, by queue
        self.waiting = Waiting()
        self.paces: dict[str, Pace] = {}
        self.too_old: Counter[str] = Counter()  # hand-backs in a row for an old confirmation
        self.too_slow_said: dict[str, float] = {}  # when each queue's ERROR was last logged
        self.stopping = False

    # -- read-ahead allowances ------------------------------------------------------------

    def configure(self, config: Config) -> None:
        """At start and after a reload: each queue's read-ahead, as its setting allows now;
        jobd's spans, at start (``tracing``: a reload cannot change them)."""
        tracing.setup(config.tracing)
        for name, q in config.queues.items():
            if name in self.paces:
                self.paces[name].configure(q)
            else:
                self.paces[name] = Pace(q)
            self.publish(name)

    def publish(self, name: str) -> None:
        """Tell the queue's reader its allowance, when it changed."""
        pace = self.paces[name]
        allowed = 0 if self.stopping else pace.allowed()
        if allowed != pace.published and (slots := self.queues.slots.get(name)):
            pace.published = allowed
            slots.read_ahead(allowed)

    def ended(self, outcome: Outcome, span: object = None, exited: float | None = None,
              took: float | None = None) -> None:  # fmt: skip
        """An attempt ended with ``outcome``, settled here: every way one ends comes here
        (decided, it could not start, its end released), so that jobd's span of it (``span``,
        when it is traced: ``jobd.tracing``) ends with it, at ``exited`` (when its handler's
        exit was seen: monotonic seconds; None: now). ``took``: how long its handler ran, when
        it ran (its queue's pace learns it: ``prefetch.Pace``)."""
        name = outcome.queue.name
        if took is not None and (pace := self.paces.get(name)):
            pace.ended(took)
            self.publish(name)
        tracing.ended(span, outcome, exited)
        self.settle(outcome)

    # -- deliveries -----------------------------------------------------------------------

    def start_delivered(self) -> None:
        """Take the readers' deliveries, start what has a slot, in order; hand back what waited
        too long, first: an entry that waited past the bound (the loop was stalled, say) is
        never started late."""
        for delivery in self.inbox.deliveries():
            queue = delivery[0]
            current = self.queues.current_level(queue)
            if (
                self.stopping or current is None or self.paused(queue.name)  # handed back
                or (self.running.running_in(queue.name) < current.concurrency
                    and not self.waiting.has(queue.name))  # a slot: started (none waits before)
            ):  # fmt: skip
                self.admit(*delivery)
            else:
                self.waiting.add(delivery)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s read ahead: waits for a slot", delivery[1].tag(queue.name))
        if self.waiting:
            self.hand_back_overdue(time.monotonic())
            for name in self.waiting.names():
                self.start_waiting(name)

    def start_waiting(self, name: str) -> None:
        """Start queue ``name``'s waiting entries while it has free slots."""
        current = self.queues.config.queues.get(name)
        if current is None or self.paused(name):
            for delivery in self.waiting.take(name):
                self.admit(*delivery)
            return
        order = [level.priority for level in current.all_levels()]
        while self.running.running_in(name) < current.concurrency:
            delivery = self.waiting.pop(name, order)
            if delivery is None:
                return
            self.admit(*delivery)

    def hand_back_overdue(self, now: float) -> None:
        for queue, job, at in self.waiting.overdue(now):
            if (pace := self.paces.get(queue.name)) and not pace.held_back:
                log.info("queue=%s no slot freed in %.1fs: reading ahead no more until one "
                         "does", queue.name, now - at)  # fmt: skip
            if pace:
                pace.overdue(now - at)
                self.publish(queue.name)
            self.admit(queue, job, at, overdue=True)

    def paused(self, name: str) -> bool:
        slots = self.queues.slots.get(name)
        return slots is not None and slots.paused

    def admit(self, queue: QueueConfig, job: Job, at: float, overdue: bool = False) -> None:
        """Start the job under the config in force, or settle it unstarted."""
        current = self.queues.current_level(queue)
        # Read by a reader a reload replaced, before the queue had limits: it took no slot or
        # token (its slot, if the new reader adopted it, goes with the hand-back: ``current``).
        unlimited = current is not None and limits.limited(current) and not limits.limited(queue)
        if self.inbox.lost_unstarted and (lost := self.inbox.lost_before(queue, job, at)):
            self.not_started(queue, job, lost)
        elif self.stopping or current is None or overdue or self.paused(queue.name) or unlimited:
            why = (
                "jobd stopped" if self.stopping
                else "its queue was removed or moved" if current is None
                else "no slot freed in time" if overdue
                else "its queue is paused" if self.paused(queue.name)
                else "its queue's limits were set after it was read"
            )  # fmt: skip
            log.info("%s read as %s: handed back", job.tag(queue.name), why)
            self.settle(Outcome(Verb.HAND_BACK, current if unlimited else queue, job))
        elif (earlier := self.running.running(queue, job)) is not None:
            # Never two handlers for one entry: the earlier delivery's is stopped, and this
            # one handed back (a hand-back is no delivery: it does not count toward poison).
            self.running.delivered_again(earlier, time.monotonic(), self.metrics)
            log.warning("%s delivered again while its earlier handler (pid %d) still ends: "
                        "handed back", job.tag(queue.name), earlier.pid)  # fmt: skip
            self.settle(Outcome(Verb.HAND_BACK, queue, job))
        elif (dead := policy.refusal(current, job)) is not None:  # malformed, expired
            log.error("%s %s: dead-lettered unrun", job.tag(queue.name), dead.detail.decode(),
                      extra=dead.journal())  # fmt: skip
            self.settle(dead)
        else:
            self.start(current, job)

    def not_started(self, queue: QueueConfig, job: Job, lost: Lost) -> None:
        """The job's lease was lost, or ``jobd cancel`` reached it, before it started."""
        cancelled = Outcome(Verb.CANCEL, queue, job) if lost.cancelled else None
        log.warning("%s %s before it started: not started", job.tag(queue.name),
                    "lease lost" if cancelled is None else "cancelled",
                    extra=None if cancelled is None else cancelled.journal())  # fmt: skip
        if cancelled is not None:
            self.settle(cancelled)
        else:
            self.freed[queue.name] += 1

    def lost(self, lost: Lost, now: float) -> None:
        """An entry no handler runs was reported lost or cancelled: if it waits, it is settled
        now; else it may still be on its way here (the inbox remembers it)."""
        found = self.waiting.remove((*lost.key, lost.message_id), lost)
        if found is None:
            self.inbox.lost_unstarted_at(lost, now)
        else:
            self.not_started(found[0], found[1], lost)

    def hand_back(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            self.admit(*delivery)

    def stop(self) -> None:
        """The daemon stops: no job waits any more, and none is read ahead."""
        self.stopping = True
        for name in self.paces:
            self.publish(name)
        self.hand_back(self.waiting.take())

    def forget(self, name: str) -> None:
        """A queue a reload removed, with nothing of it left running or waiting: its pace."""
        self.paces.pop(name, None)
        self.waiting.forget(name)

    def reloaded(self, old: Config, new: Config) -> None:
        """After a reload: entries waiting under a queue it changed or removed go back."""
        for name in self.waiting.names():
            if old.queues.get(name) != new.queues.get(name):
                for delivery in self.waiting.take(name):
                    log.info("%s read ahead before a reload changed its queue: handed back",
                             delivery[1].tag(name))  # fmt: skip
                    self.settle(Outcome(Verb.HAND_BACK, delivery[0], delivery[1]))
        self.configure(new)

    # -- starting -------------------------------------------------------------------------

    def cannot_start(self, queue: QueueConfig, job: Job, error: Exception,
                     span: object = None) -> None:  # fmt: skip
        """The job's handler could not be started (``error``): retried or dead-lettered by its
        queue's policy, as a handler that failed (its ``span`` ended: ``ended``). Told at once,
        or by the loop when a handler started without waiting for its exec is reaped
        (``Handler.start_error``)."""
        outcome = policy.decide(queue, job, None, detail=str(error).encode())
        log.error("%s %s: %s", job.tag(queue.name), error, outcome.describe(),
                  extra=outcome.journal())  # fmt: skip
        self.ended(outcome, span)

    def lapsed(self, queue: QueueConfig, job: Job, stopped: StopReason | None = None,
               span: object = None) -> None:  # fmt: skip
        """The job's handler reached its exec past its start's deadline and did not exec
        (``deadline.Lapsed``): handed back unstarted, as ``lease_held`` does (no attempt counted);
        one whose lease was since found lost, or that was cancelled, settled as such. Its
        ``span``, started, ends with it (``ended``)."""
        if stopped in (StopReason.LEASE_LOST, StopReason.CANCEL):
            self.ended(policy.decide(queue, job, None, stopped), span)
            return
        log.warning("%s lease lapsed before exec: handed back unstarted", job.tag(queue.name))
        self.ended(Outcome(Verb.HAND_BACK, queue, job), span)

    def lease_held(self, queue: QueueConfig, job: Job) -> int | None:
        """Until when (``lease_clock`` in nanoseconds) the job's handler may start, when its
        lease was confirmed recently enough to start it now (see ``lease``); if not None, and
        the job is settled unstarted: handed back, or (the renewal found it lost, its report
        still on its way to the loop) only its slot freed."""
        confirmed = self.holdings.confirmed(key(queue), job.message_id, job.delivery)
        if confirmed is None:
            log.warning("%s lease lost before it started: not started", job.tag(queue.name))
            self.freed[queue.name] += 1
            return None
        age = lease_clock() - confirmed
        if age < queue.lease.reclaim_after * START_MARGIN:
            self.too_old.pop(queue.name, None)
            return int((confirmed + queue.lease.reclaim_after * START_MARGIN) * 1e9)
        log.warning("%s lease last confirmed %.1fs ago (reclaim_after %gs): another daemon may "
                    "have taken it over: handed back unstarted", job.tag(queue.name), age,
                    queue.lease.reclaim_after)  # fmt: skip
        self.settle(Outcome(Verb.HAND_BACK, queue, job))
        self.too_old[queue.name] += 1
        self.say_too_slow(queue, age)
        return None

    def say_too_slow(self, queue: QueueConfig, age: float) -> None:
        """After TOO_SLOW_IN_A_ROW hand-backs in a row for an old confirmation, one ERROR (a
        minute apart at most per queue): if each reply arrives with its lease too old to start,
        every job is read, handed back, reclaimed and handed back again, forever."""
        now = time.monotonic()
        if (
            self.too_old[queue.name] < TOO_SLOW_IN_A_ROW
            or now < self.too_slow_said.get(queue.name, -TOO_SLOW_SAID) + TOO_SLOW_SAID
        ):
            return
        self.too_slow_said[queue.name] = now
        log.error(
            "queue=%s %d jobs in a row handed back unstarted, their lease confirmed %.2fs before "
            "the start check (it must be under %gs: half of lease.reclaim_after %gs): the round "
            "trip to Redis is too long for reclaim_after, no job of this queue can start; raise "
            "lease.reclaim_after (or the daemon is stalled)",
            queue.name, self.too_old[queue.name], age, queue.lease.reclaim_after * START_MARGIN,
            queue.lease.reclaim_after,
        )  # fmt: skip

    def start(self, queue: QueueConfig, job: Job) -> None:
        # The last step before the spawn: a daemon stopped or cut off anywhere before this line
        # (with the job read, in a reply, or waiting for a slot) finds the lease too old here;
        # one stopped after it, on its way to the handler's exec, meets the deadline there.
        if (deadline := self.lease_held(queue, job)) is None:
            return
        channel = self.running.channel
        channel.begin_start()  # its first message may be read before it is in the table
        try:
            handler = Handler.spawn(job, queue, self.folder, self.running.tree, deadline,
                                    channel.address, channel.speaking)  # fmt: skip
        except Lapsed as exc:  # a started span goes with a failed start (``Handler.spawn``)
            self.lapsed(queue, job, span=span_of(exc))
            return
        except Exception as exc:  # the daemon never dies of a job
            if not isinstance(exc, SpawnError):
                log.error("%s cannot start the handler", job.tag(queue.name), exc_info=exc)
            self.cannot_start(queue, job, exc, span_of(exc))
            return
        else:
            handler.started_under = self.queues.config.queues  # its follow-ups' (process.chains)
            self.running.add(handler)
        finally:
            channel.end_start()
        self.holdings.telling(key(queue), job.message_id, job.delivery, handler)
        series = self.metrics.of(queue.name)
        series.started.inc()
        series.latency.observe(handler.waited)
        if job.trace is not None and job.trace.dropped:
            self.metrics.trace_dropped(queue.name, job.trace.dropped)
        handler.log(logging.DEBUG, "started pid %d", handler.pid)
        if queue.log_payload:
            preview = job.stdin_bytes()[: queue.log_payload]
            handler.log(logging.INFO, "payload (first %d bytes): %r", queue.log_payload, preview)
