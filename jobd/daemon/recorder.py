"""Recording outcomes in Redis, off the main loop, batched: one round trip per pass; and which
jobs run here (their active records), for those that run long enough to be looked at.

The main loop hands over the outcomes it decided (``jobd.outcome``), and the readers the poison
entries they found, through this thread's inbox; both go on at once. This thread writes
everything queued since its last pass in one round trip (``Store.settle``), and keeps the
batch to try again when Redis is away: an outcome is never dropped. Each write checks, in the
same script, that this daemon still holds the entry: an entry another daemon took over is
theirs to settle. Once written, the entries are no longer held, and their leases are no longer
renewed. (A release never comes here: the loop forgets it at once.)

The loop also hands over each handler that has run ``handlers.ACTIVE_AFTER`` (``Started``): its
job's active record is written in this pass (``Store.started``), unless its outcome came with it.
An active record is only informative: one that cannot be written is tried again a second later,
while its job runs here, and never holds up an outcome.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace

import redis

from jobd.config import RedisConfig
from jobd.daemon import lease
from jobd.daemon.lease import Holdings
from jobd.logs import word
from jobd.outcome import POISON, Outcome, Started, Verb
from jobd.store import connection
from jobd.store.store import Store
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.recorder")

STOP_PATIENCE = 10.0  # at exit, how long to keep trying an unreachable Redis
# How long the first outcome of a batch waits for others (Kafka's linger.ms, 5 ms by default
# since Kafka 4.0). Nothing waits on an ack: the slot was freed when the handler ended. Fewer,
# larger batches mean fewer wake-ups of this thread, and each wake-up takes the GIL from the
# loop: measured +6 to +8 % jobs/s on bench/spawn.py (2 ms: +6 %; 20 ms: no gain).
LINGER = 0.005
WRITE_TRIES = 5  # times one outcome's write may fail (Redis answering) before it is left pending
RETRY_DELAY = 0.2  # seconds between those tries
RETRY_ACTIVE = 1.0  # seconds before an active record that could not be written is tried again
_EMPTY = object()


class Away(redis.ConnectionError):
    """Redis could not take some of a batch's outcomes for now (away, a replica after a
    failover, busy, out of memory): ``outcomes`` are the ones to keep and write later."""

    def __init__(self, outcomes: list[Outcome], cause: object) -> None:
        super().__init__(str(cause))
        self.outcomes = outcomes


class Recorder(threading.Thread):
    def __init__(
        self, redis_config: RedisConfig, consumer: str, holdings: Holdings,
        metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        super().__init__(name="recorder", daemon=True)
        self.store = Store.open(redis_config, "recorder", consumer)
        self.holdings = holdings
        self.metrics = metrics  # counts poison entries once written
        self.inbox: queue.SimpleQueue[list[Outcome | Started] | None] = queue.SimpleQueue()
        # Handlers started whose active record is not written yet, by (stream, message id):
        # each with when to write it (time.monotonic()).
        self.starts: dict[tuple[str, str], tuple[Started, float]] = {}
        self.outage = connection.Outage(log)
        self._stop_deadline: float | None = None
        # Outcomes whose write failed though Redis answered: how often, by entry (see _failed).
        self.failures: dict[tuple[str, str, str], int] = {}

    def record(self, outcomes: list[Outcome | Started]) -> None:
        self.inbox.put(outcomes)

    def stop(self) -> None:
        """Write everything recorded so far, then end (the caller joins)."""
        self.inbox.put(None)

    def run(self) -> None:
        backlog: list[Outcome] = []
        stopping = False
        while True:
            stopping |= self._collect(backlog, wait=not backlog)
            self._write_starts()
            if backlog:
                try:
                    backlog[:] = self.write_isolated(backlog)
                except connection.UNAVAILABLE as exc:
                    self.store.refresh()
                    # Away: some were written, keep only the others. Otherwise the connection
                    # failed and any call may have applied: keep them all (each is safe to send
                    # again: it checks ownership, and a hand-back its own delivery).
                    if isinstance(exc, Away):
                        backlog[:] = exc.outcomes
                    delay = self.outage.down(exc, f"{len(backlog)} outcome(s) kept to record later")
                    if stopping and self._give_up(backlog):
                        break
                    time.sleep(delay)
                    continue
                self.outage.up("; kept outcomes recorded")
                if backlog:  # writes that failed for another reason than Redis being away
                    time.sleep(RETRY_DELAY)
            if stopping and not backlog:
                break
        self.store.close()

    def write_isolated(self, batch: list[Outcome]) -> list[Outcome]:
        """Write ``batch``; returns the outcomes to try again. An error that is not Redis
        being away (a bug, a value Redis refuses) fails one outcome, never its batch: the
        batch is written again one outcome at a time."""
        try:
            return self.write(batch)
        except connection.UNAVAILABLE:
            raise
        except Exception as exc:
            if connection.away(exc):  # raised, not replied: BUSY or OOM as a connection began
                raise Away(batch, exc) from exc
            if len(batch) == 1:
                return self._failed(batch, exc)
            log.warning("cannot record %d outcomes at once (%r); one by one", len(batch), exc)
            return self._one_by_one(batch)

    def _one_by_one(self, batch: list[Outcome]) -> list[Outcome]:
        """Each outcome written alone; if Redis goes away meanwhile, the ones not written yet
        are kept (Away), never dropped."""
        again: list[Outcome] = []
        for i, o in enumerate(batch):
            one = [o]
            try:
                again += self.write_isolated(one)
            except connection.UNAVAILABLE as exc:
                rest = exc.outcomes if isinstance(exc, Away) else one
                raise Away([*again, *rest, *batch[i + 1 :]], exc) from exc
        return again

    def _failed(self, outcomes: list[Outcome], error: object) -> list[Outcome]:
        """Outcomes whose write failed with ``error`` (not for want of Redis): each is tried
        alone again, up to WRITE_TRIES times; then it is left pending, no longer renewed, so
        it is delivered again after reclaim_after and that delivery counts toward
        max_deliveries (poison): a job whose outcome cannot be written never runs forever."""
        if len(outcomes) > 1:  # one call for several outcomes: find the one that fails
            return self._one_by_one(outcomes)
        o = outcomes[0]
        key = (*lease.key(o.queue), o.message_id)
        tries = self.failures[key] = self.failures.get(key, 0) + 1
        if tries < WRITE_TRIES:
            log.warning(
                "queue=%s job=%s cannot record its outcome (%s): %s; trying again (%d of %d)",
                o.queue.name, word(o.job.job_id), o.verb.value, error, tries, WRITE_TRIES,
            )  # fmt: skip
            return [replace(o, timing=None)]  # its timings were counted with the first try
        del self.failures[key]
        log.error(
            "queue=%s job=%s cannot record its outcome (%s) after %d tries: %s; left pending: "
            "it is delivered again after lease.reclaim_after, and counts toward max_deliveries",
            o.queue.name, word(o.job.job_id), o.verb.value, WRITE_TRIES, error,
        )  # fmt: skip
        self.holdings.discard(lease.key(o.queue), [o.message_id], [o.job.delivery])
        self.holdings.handed_back(lease.key(o.queue), [o.message_id])
        return []

    def _collect(self, backlog: list[Outcome], wait: bool) -> bool:
        """Move what is in the inbox to ``backlog`` (and starts to ``starts``); True when asked
        to stop. Waiting (until a start's record is due, at most), it gives the first outcomes
        LINGER to be joined by more before the batch goes out."""
        stopping = False
        item = self._wait() if wait else self._next()
        if wait and item is not None and item is not _EMPTY:
            time.sleep(LINGER)
        while item is not _EMPTY:
            if item is None:
                stopping = True
            else:
                for o in item:  # type: ignore[attr-defined]
                    if isinstance(o, Started):  # its record is due now
                        self.starts[(o.queue.stream, o.message_id)] = (o, time.monotonic())
                    else:
                        backlog.append(o)
                        if self.starts:
                            self.starts.pop((o.queue.stream, o.message_id), None)
            item = self._next()
        return stopping

    def _wait(self) -> list[Outcome | Started] | object | None:
        """The inbox's next item; _EMPTY when the oldest start's record is due first."""
        if not self.starts:
            return self.inbox.get()
        soonest = min(due for _, due in self.starts.values())
        try:
            return self.inbox.get(timeout=max(0.0, soonest - time.monotonic()))
        except queue.Empty:
            return _EMPTY

    def _write_starts(self) -> None:
        """The active records due of the jobs that still run here (held: not lost, not
        settled). Those that cannot be written now are tried again RETRY_ACTIVE later, while
        their jobs run here."""
        if not self.starts:
            return
        now = time.monotonic()
        ripe = [k for k, (_, due) in self.starts.items() if due <= now]
        started = [self.starts.pop(k)[0] for k in ripe]
        held = [s for s in started if self.holdings.holds(lease.key(s.queue), s.message_id)]
        if not held:
            return
        try:
            self.store.started(held)
        except Exception as exc:  # informative only: the jobs run on regardless
            log.debug("cannot write %d active record(s) now: %r", len(held), exc)
            for s in held:
                self.starts[(s.queue.stream, s.message_id)] = (s, now + RETRY_ACTIVE)

    def _next(self) -> list[Outcome] | object | None:
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return _EMPTY

    def write(self, batch: list[Outcome]) -> list[Outcome]:
        """Everything in one round trip (``Store.settle``); each write checks ownership itself.
        Returns the outcomes to try again (``_failed``); raises Away with the ones to keep when
        Redis could not take some."""
        now = time.monotonic()
        first = [o for o in batch if o.verb is Verb.HAND_BACK and o.sent_at is None]
        for o in first:
            # Forgotten before it is sent: a renewal after it would make the entry look busy
            # again, and it would wait a whole reclaim_after (renew.lua skips it).
            self.holdings.handing_back(lease.key(o.queue), o.message_id, o.job.delivery)
        try:
            replies = self.store.settle(batch)
        finally:  # whatever became of the call, each hand-back in it has been sent from now on
            if first:
                batch[:] = [sent(o, now) for o in batch]
        again: list[Outcome] = []
        kept: list[Outcome] = []  # Redis cannot write now (a replica, busy, out of memory)
        away: Exception | None = None
        for outcomes, result in replies:
            if isinstance(result, Exception):
                if connection.away(result):
                    kept += [replace(sent(o, now), timing=None) for o in outcomes]
                    away = result
                else:
                    again += self._failed([sent(o, now) for o in outcomes], result)
                continue
            self._report(outcomes, result)
            self._poison_written(outcomes, result)
            # Hand-backs were forgotten before the call: this daemon's reader may have claimed
            # one back meanwhile (read ahead, it is often the first to), and that holding is
            # the new delivery's, not this outcome's.
            held = lease.key(outcomes[0].queue)
            settled = [o for o in outcomes if o.verb is not Verb.HAND_BACK]
            self.holdings.discard(held, [o.message_id for o in settled],
                                  [o.job.delivery for o in settled])  # fmt: skip
            if backs := [o.message_id for o in outcomes if o.verb is Verb.HAND_BACK]:
                self.holdings.handed_back(held, backs)
            if self.failures:
                for o in outcomes:
                    self.failures.pop((*lease.key(o.queue), o.message_id), None)
            self._move_follow_ups(outcomes, result)
        if kept:
            raise Away([*kept, *again], away)
        return again

    def _move_follow_ups(self, outcomes: list[Outcome], not_held: list[tuple[str, str]]) -> None:
        """On a cluster, the follow-ups just written into a queue's outbox (and a dead letter's
        on_dead_letter job) go on to their queues now (store.outbox), and on any Redis the
        notices of jobs' ends to the jobs waiting for them and to their batches
        (store.workflows); what cannot is moved by the queue's outbox duty (daemon.outbox)."""
        noticed = outcomes[0].queue.name in self.store.noticed
        if not noticed and (not self.store.cluster or not any(map(_outboxed, outcomes))):
            return
        q, skipped = outcomes[0].queue, {mid for mid, _ in not_held}
        if not noticed and all(o.message_id in skipped for o in outcomes if _outboxed(o)):
            return
        try:
            self.store.move_follow_ups(q)
        except Exception as exc:  # still in the outbox: its duty moves them
            log.warning("queue=%s follow-ups not moved out of its outbox yet: %r", q.name, exc)

    def _report(self, outcomes: list[Outcome], not_held: list[tuple[str, str]]) -> None:
        q = outcomes[0].queue
        for mid, owner in not_held:
            job_id = next((o.job.job_id for o in outcomes if o.message_id == mid), mid)
            log.warning(
                "queue=%s job=%s outcome not recorded: the lease was lost%s",
                q.name,
                word(job_id),
                f" to {owner}" if owner else " (entry gone)",
            )

    def _poison_written(self, outcomes: list[Outcome], not_held: list[tuple[str, str]]) -> None:
        """A poison entry is counted and logged once its dead letter is written (a reader
        decided it; the loop counts what it decides itself). A dead letter is a call of its
        own: only a one-outcome write can be one, so a batch of acks costs nothing here."""
        o = outcomes[0]
        if o.verb is not Verb.DEAD_LETTER or o.error != POISON or not_held:
            return
        if self.metrics is not None:
            self.metrics.count(o)
        log.error(
            "queue=%s job=%s delivered %d times with no outcome (max_deliveries %d): "
            "dead-lettered as poison",
            o.queue.name, word(o.job.job_id), o.attempts, o.queue.max_deliveries,
        )  # fmt: skip

    def _give_up(self, backlog: list[Outcome]) -> bool:
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + STOP_PATIENCE
        if time.monotonic() < self._stop_deadline:
            return False
        log.error(
            "Redis still unreachable at exit; %d outcome(s) not recorded: those entries stay "
            "pending and run again after lease.reclaim_after",
            len(backlog),
        )
        return True


def sent(o: Outcome, now: float) -> Outcome:
    """The outcome as kept after a call that sent it at ``now``: a hand-back remembers when it
    was first sent, so that sent again it cannot hand back a later delivery of its entry
    (``Outcome.sent_at``); the others are the same whenever they are sent again."""
    if o.verb is not Verb.HAND_BACK or o.sent_at is not None:
        return o
    return replace(o, sent_at=now)


def _outboxed(o: Outcome) -> bool:
    """Whether writing ``o`` (on a cluster) put jobs into its queue's outbox."""
    return bool(o.follow_ups) or (o.verb is Verb.DEAD_LETTER and o.queue.on_dead_letter is not None)
