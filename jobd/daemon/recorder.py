"""Recording outcomes in Redis, off the main loop, batched: one round trip per pass.

The main loop hands over what it decided (ack this entry, hand that one back) and goes on
spawning and reaping. This thread writes everything queued since its last pass in one
pipeline, and keeps the batch to try again when Redis is away: an outcome is never dropped.
Each write checks, in the same script, that this daemon still holds the entry
(``lua/settle.lua``): an entry another daemon took over is theirs to settle. Once written, the
entries are no longer held, and their leases are no longer renewed.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from itertools import chain

import redis

from jobd.config import QueueConfig, RedisConfig
from jobd.daemon import delayed, lease, limits
from jobd.daemon.lease import Holdings
from jobd.store import connection as redisconn
from jobd.store import dead_letter, figures
from jobd.store.keys import STATS_TTL
from jobd.store.scripts import Batch, Scripts

log = logging.getLogger("jobd.recorder")

ACK = "ack"
HAND_BACK = "back"  # make the entry look idle for decades, so any consumer takes it now
RETRY = "retry"  # into the delayed set, and ack
DEAD_LETTER = "dead"  # a dead-letter record, and ack
STOP_PATIENCE = 10.0  # at exit, how long to keep trying an unreachable Redis
# How long the first outcome of a batch waits for others (Kafka's linger.ms, 5 ms by default
# since Kafka 4.0). Nothing waits on an ack: the slot was freed when the handler ended. Fewer,
# larger batches mean fewer wake-ups of this thread, and each wake-up takes the GIL from the
# loop: measured +6 to +8 % jobs/s on bench/spawn.py (2 ms: +6 %; 20 ms: no gain).
LINGER = 0.005
WRITE_TRIES = 5  # times one outcome's write may fail (Redis answering) before it is left pending
RETRY_DELAY = 0.2  # seconds between those tries
_EMPTY = object()


class Away(redis.ConnectionError):
    """Redis could not take some of a batch's outcomes for now (away, a replica after a
    failover, busy, out of memory): ``outcomes`` are the ones to keep and write later."""

    def __init__(self, outcomes: list[Outcome], cause: object) -> None:
        super().__init__(str(cause))
        self.outcomes = outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str  # ACK, HAND_BACK, RETRY or DEAD_LETTER
    queue: QueueConfig
    message_id: str
    job_id: str
    retry_fields: dict[bytes, bytes] | None = None  # RETRY: the next attempt's fields
    delay_ms: int = 0  # RETRY: how long until the next attempt, from when it is written
    failure: dead_letter.Failure | None = None  # DEAD_LETTER: what goes in the record
    mark: bytes | None = None  # the job id's mark, set or cleared with the ack (Job.mark_key)
    timing: tuple[float, float] | None = None  # enqueue-to-start and run time, for figures


class Recorder(threading.Thread):
    def __init__(self, redis_config: RedisConfig, consumer: str, holdings: Holdings) -> None:
        super().__init__(name="recorder", daemon=True)
        self.client = redisconn.client(redis_config, "jobd-recorder")
        self.scripts = Scripts(self.client)
        self.consumer = consumer
        self.holdings = holdings
        self.inbox: queue.SimpleQueue[list[Outcome] | None] = queue.SimpleQueue()
        self.outage = redisconn.Outage(log)
        self._stop_deadline: float | None = None
        # Outcomes whose write failed though Redis answered: how often, by entry (see _failed).
        self.failures: dict[tuple[str, str, str], int] = {}

    def record(self, outcomes: list[Outcome]) -> None:
        self.inbox.put(outcomes)

    def stop(self) -> None:
        """Write everything recorded so far, then end (the caller joins)."""
        self.inbox.put(None)

    def run(self) -> None:
        backlog: list[Outcome] = []
        stopping = False
        while True:
            stopping |= self._collect(backlog, wait=not backlog)
            if backlog:
                try:
                    backlog[:] = self.write_isolated(backlog)
                except redisconn.UNAVAILABLE as exc:
                    redisconn.refresh(self.client)
                    # Away: some were written, keep only the others. Otherwise the connection
                    # failed and any call may have applied: keep all but the hand-backs.
                    backlog[:] = exc.outcomes if isinstance(exc, Away) else unsent(backlog)
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
        self.client.close()

    def write_isolated(self, batch: list[Outcome]) -> list[Outcome]:
        """Write ``batch``; returns the outcomes to try again. An error that is not Redis
        being away (a bug, a value Redis refuses) fails one outcome, never its batch: the
        batch is written again one outcome at a time."""
        try:
            return self.write(batch)
        except redisconn.UNAVAILABLE:
            raise
        except Exception as exc:
            if len(batch) == 1:
                return self._failed(batch, exc)
            log.warning("cannot record %d outcomes at once (%r); one by one", len(batch), exc)
            return self._one_by_one(batch)

    def _one_by_one(self, batch: list[Outcome]) -> list[Outcome]:
        """Each outcome written alone; if Redis goes away meanwhile, the ones not written yet
        are kept (Away), never dropped."""
        again: list[Outcome] = []
        for i, o in enumerate(batch):
            try:
                again += self.write_isolated([o])
            except redisconn.UNAVAILABLE as exc:
                rest = exc.outcomes if isinstance(exc, Away) else unsent([o])
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
                o.queue.name, o.job_id, o.kind, error, tries, WRITE_TRIES,
            )  # fmt: skip
            return [replace(o, timing=None)]  # its timings were counted with the first try
        del self.failures[key]
        log.error(
            "queue=%s job=%s cannot record its outcome (%s) after %d tries: %s; left pending: "
            "it is delivered again after lease.reclaim_after, and counts toward max_deliveries",
            o.queue.name, o.job_id, o.kind, WRITE_TRIES, error,
        )  # fmt: skip
        self.holdings.discard(lease.key(o.queue), [o.message_id])
        return []

    def _collect(self, backlog: list[Outcome], wait: bool) -> bool:
        """Move what is in the inbox to ``backlog``; True when asked to stop. Waiting, it gives
        the first outcomes LINGER to be joined by more before the batch goes out."""
        stopping = False
        item = self.inbox.get() if wait else self._next()
        if wait and item is not None:
            time.sleep(LINGER)
        while item is not _EMPTY:
            if item is None:
                stopping = True
            else:
                backlog += item  # type: ignore[arg-type]
            item = self._next()
        return stopping

    def _next(self) -> list[Outcome] | object | None:
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return _EMPTY

    def write(self, batch: list[Outcome]) -> list[Outcome]:
        """Everything in one round trip (one pipeline; on a cluster, one per node): per queue
        one settle call for its acks and hand-backs, one call per retry and per dead letter,
        then per queue the slots to free (limits) and the timings to count (figures). Each
        outcome call checks ownership itself. Returns the outcomes to try again (_failed)."""
        sent = Batch()
        calls: list[list[Outcome]] = []
        settles: dict[lease.LeaseKey, list[Outcome]] = defaultdict(list)
        for o in batch:
            if o.kind in (ACK, HAND_BACK):
                settles[lease.key(o.queue)].append(o)
                if o.kind == HAND_BACK:
                    # Forgotten before it is sent: a renewal after it would make the entry look
                    # busy again, and it would wait a whole reclaim_after (renew.lua skips it).
                    self.holdings.discard(lease.key(o.queue), [o.message_id])
            elif o.kind == RETRY:
                q = o.queue
                args = [q.group, self.consumer, o.message_id, o.delay_ms, STATS_TTL]
                fields = delayed.flatten(o.retry_fields or {})
                keys = [q.stream, q.keys.delayed, q.keys.stats()]
                sent.add(self.scripts.retry, keys, [*args, *fields])
                calls.append([o])
            else:
                keys, args = dead_letter.script_call(
                    o.queue,
                    self.consumer,
                    o.job_id,
                    o.message_id,
                    o.failure,  # type: ignore[arg-type]
                    o.mark,
                )
                sent.add(self.scripts.dead_letter, keys, args)
                calls.append([o])
        for outcomes in settles.values():
            q = outcomes[0].queue
            keys, ops = [q.stream, q.keys.stats()], []
            for o in outcomes:
                mark_index = 0  # where settle.lua finds the job's mark in KEYS; 0: none
                if o.mark is not None and o.kind == ACK:
                    keys.append(o.mark)
                    mark_index = len(keys)
                ops += [o.kind, o.message_id, mark_index]
            window_ms = int((q.dedupe_window or 0) * 1000)
            args = [q.group, self.consumer, STATS_TTL, window_ms, *ops]
            sent.add(self.scripts.settle, keys, args)
            calls.append(outcomes)
        self._release_slots(sent, batch)
        self._timings(sent, batch)
        replies = sent.run(self.client)
        again: list[Outcome] = []
        kept: list[Outcome] = []  # Redis cannot write now (a replica, busy, out of memory)
        for outcomes, reply in zip(calls, replies, strict=False):  # the rest: slots, timings
            if isinstance(reply, Exception):
                if redisconn.away(reply):
                    kept += [replace(o, timing=None) for o in outcomes]
                else:
                    again += self._failed(outcomes, reply)
                continue
            self._report(outcomes, reply)
            self.holdings.discard(lease.key(outcomes[0].queue), [o.message_id for o in outcomes])
            if self.failures:
                for o in outcomes:
                    self.failures.pop((*lease.key(o.queue), o.message_id), None)
        if kept:
            raise Away([*kept, *again], next(r for r in replies if isinstance(r, Exception)))
        return again

    def _timings(self, sent: Batch, batch: list[Outcome]) -> None:
        """This minute's histograms of enqueue-to-start and run times, per queue, in the same
        round trip (see figures.py)."""
        by_queue: dict[str, tuple[QueueConfig, Counter[str]]] = {}
        for o in batch:
            if o.timing is not None:
                _, counts = by_queue.setdefault(o.queue.name, (o.queue, Counter()))
                counts.update(figures.fields(*o.timing))
        for q, counts in by_queue.values():  # this minute's key: once per queue, not per job
            sent.add(self.scripts.observe, [q.keys.timings()], [STATS_TTL, *chain(*counts.items())])

    def _release_slots(self, sent: Batch, batch: list[Outcome]) -> None:
        """Free the cluster-wide slots of these outcomes' entries (queues with
        limits.concurrency), in the same round trip; a lost release expires with its lease."""
        by_queue: dict[str, list[Outcome]] = defaultdict(list)
        for o in batch:
            if o.queue.slots is not None:
                by_queue[o.queue.keys.running].append(o)
        for running, outcomes in by_queue.items():
            members = [
                limits.slot_member(self.consumer, o.queue.stream, o.message_id) for o in outcomes
            ]
            sent.add(self.scripts.release, [running], members)

    def _report(self, outcomes: list[Outcome], reply: object) -> None:
        q = outcomes[0].queue
        for mid, owner in _not_held(outcomes, reply):
            job_id = next((o.job_id for o in outcomes if o.message_id == mid), mid)
            log.warning(
                "queue=%s job=%s outcome not recorded: the lease was lost%s",
                q.name,
                job_id,
                f" to {owner}" if owner else " (entry gone)",
            )

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


def unsent(outcomes: list[Outcome]) -> list[Outcome]:
    """What to send again after a connection failed mid-call, when any call may have applied:
    everything but hand-backs. A settle, retry or dead letter that applied is a no-op the
    second time (each checks it still holds the entry); a hand-back is not: by then this
    daemon may have claimed the entry back and be running it, and the same hand-back would
    give that run away. One that did not apply leaves the entry unrenewed (it was forgotten
    before it was sent), so it is taken over after reclaim_after anyway."""
    dropped = [o for o in outcomes if o.kind == HAND_BACK]
    for o in dropped:
        log.warning(
            "queue=%s job=%s the hand-back may not have reached Redis; not sent again: the "
            "entry is taken over after lease.reclaim_after if it did not",
            o.queue.name, o.job_id,
        )  # fmt: skip
    return [o for o in outcomes if o.kind != HAND_BACK] if dropped else outcomes


def _not_held(outcomes: list[Outcome], reply: object) -> list[tuple[str, str]]:
    """(message id, owner now) of the outcomes a script left alone because the entry is not
    this consumer's any more. settle.lua returns such pairs for its batch; retry.lua and
    dead_letter.lua return {'not held', owner} for their one entry."""
    if not isinstance(reply, list):
        return []
    if outcomes[0].kind in (RETRY, DEAD_LETTER):
        return [(outcomes[0].message_id, os.fsdecode(reply[1]))] if reply else []
    return [(reply[i].decode(), os.fsdecode(reply[i + 1])) for i in range(0, len(reply), 2)]
