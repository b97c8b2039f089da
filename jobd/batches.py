"""Batches, the producer's side (docs/workflows.md; Redis's side: ``store.workflows``,
lua/batch.lua): an enqueue with ``--batch`` adds to its batch as a ``Member`` (``jobd.producer``
calls these; ``jobd.workflows`` re-exports them).

A batch is *open* while an enqueue adds to it (``Member``): its total grows before each
round trip of jobs (and shrinks by the jobs Redis refused), and the enqueue *seals* it when it
ends; several enqueues may add to one batch at once. Once sealed and every member counted, it is
complete (with one member at least: an enqueue that added nothing seals with a count of 0, and
a batch no enqueue added a job to is gone with its last seal, never complete): its callback is
enqueued once, by whoever sees it complete first (the daemons that count the last members, or
the move of the enqueue's seal notice). A complete batch takes no more jobs. Each enqueue's
batch calls carry a token of its own, so that one sent again after a lost reply changes the
batch once (``Member``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TypeVar

from jobd.config import Config, QueueConfig
from jobd.job import BATCH_INCARNATION
from jobd.newjob import NewJob
from jobd.store import connection
from jobd.store.keys import batch
from jobd.store.store import Store
from jobd.store.workflows import BatchState, callback_spec
from jobd.workflow_input import WorkflowError, check_batch_id

# Seconds between the tries of a batch call while Redis is away (its reply lost, a failover):
# each is sent again as it was, and changes the batch once (lua/batch.lua); none is begun
# RETRY_FOR seconds after the first (a try that times out takes connection.SOCKET_TIMEOUT).
RETRY = (0.1, 0.4, 1.0, 2.5)
RETRY_FOR = 10.0

log = logging.getLogger("jobd.workflows")
T = TypeVar("T")


class BatchComplete(WorkflowError):
    """The batch is complete: it takes no new job. A --unique job whose job id is there
    already is a duplicate all the same (``marks_of``, read after this refusal)."""


def marks_of(store: Store, q: QueueConfig, job_ids: list[str]) -> list[str | None]:
    """The marks of ``job_ids`` in ``q`` (a queue or a level of it): 'queued' or 'done' for a
    job id queued, running or done within the dedupe window, as enqueue_unique.lua and
    hold.lua read them; None for one free (or a key of another type there: no mark)."""
    found = store.client.mget([q.keys.job_mark(j) for j in job_ids]) if job_ids else []
    return [m.decode(errors="replace") if m is not None else None for m in found]


class Member:
    """Adding jobs to batch ``batch_id`` (a context: opened by the first ``grow`` of one job or
    more, sealed on exit when opened, the jobs not added taken off its total). ``grow`` before
    each round trip of jobs, with the jobs of it that passed their own checks; ``added(n)``
    after it, with how many Redis took. An enqueue whose every job is refused before it is sent
    leaves the batch as it was; one whose jobs were sent, none added, seals with 0 (batch.lua:
    a batch no adder counted a job into is never complete, and gone once sealed).

    Each call names this enqueue's token (made here, before the first) and says what this
    enqueue's count is now, not what to add: a call whose reply was lost is sent again as it
    was (``RETRY``), and Redis, knowing it, changes nothing twice. The seal is a notice in the
    queue's outbox (``Store.seal_notice``), applied at once, else by the daemons: a seal that
    completes the batch is followed by its callback whatever happens to this process or to
    Redis between the two."""

    def __init__(self, store: Store, config: Config, q: QueueConfig, job: NewJob) -> None:
        check_batch_id(job.batch or "")
        on_complete = job.on_complete
        if on_complete is not None and on_complete not in config.queues:
            raise WorkflowError(f"on_complete: queue {on_complete!r} is not in the config")
        self.store, self.batch_id = store, job.batch or ""
        self.token = secrets.token_hex(16)
        self.seq = 0  # calls made that change the count (add, seal): each sent with its number
        self.counted = 0  # jobs Redis took
        self.sent = 0  # jobs of the round trip under way
        self.outbox = config.queues[q.name].keys.outbox
        cb = b"" if on_complete is None else callback_spec(config.queues[on_complete])
        self.opening = (int(q.history.max_age) or 1, on_complete or "", cb)
        self.sealed: BatchState | None = None
        self.opened = False
        self.incarnation = ""  # the batch opened (its open's reply): its seal names it

    def __enter__(self) -> Member:
        return self

    def _open(self) -> None:
        try:
            state = self._again(self.store.batch_op, self.batch_id, "open", self.token,
                                *self.opening)  # fmt: skip
        except Exception as exc:
            if "batch complete" in str(exc):
                raise BatchComplete(f"batch {self.batch_id!r} is complete: it takes no more "
                                    "jobs") from None  # fmt: skip
            if "is not a batch" in str(exc):  # batch.lua: someone else's key where it lives
                raise WorkflowError(f"batch {self.batch_id!r}: its key {batch(self.batch_id)} "
                                    "is not a batch (another type)") from None  # fmt: skip
            raise
        self.opened = True
        self.incarnation = state.incarnation if state is not None else ""

    def _count(self, count: int) -> None:
        self.seq += 1
        self._again(self.store.batch_op, self.batch_id, "add", self.token, self.seq, count)

    def grow(self, n: int, jobs: Iterable[dict[bytes, bytes]] = ()) -> None:
        """``n`` jobs more to be sent (``jobs``: their fields), counted in the batch (opened at
        the first: BatchComplete when it is complete), each job told which batch of its id it
        is a member of (its field ``job.BATCH_INCARNATION``: its end is counted there only)."""
        if n == 0:  # nothing to send: nothing to count (nor to open the batch for)
            self.sent = 0
            return
        if not self.opened:
            self._open()
        for fields in jobs:
            fields[BATCH_INCARNATION] = self.incarnation.encode()
        self.sent = n
        try:
            self._count(self.counted + n)
        except BaseException:
            self.sent = 0  # not sent: its jobs are not in Redis, whatever the count says
            raise

    def added(self, n: int) -> None:
        sent, self.sent = self.sent, 0
        self.counted += n
        if n < sent:
            self._count(self.counted)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        """Sealed whatever happened (the jobs of a round trip that failed not counted), unless
        Redis could not be reached in the middle of one, or the enqueue was interrupted there
        (Ctrl-C, SystemExit: no Exception, nothing Redis said): then it stays open, those jobs
        may or may not be added. Never opened (no job got as far as Redis): nothing."""
        if not self.opened:
            return
        if self.sent and kind is not None and (_unreachable(exc) or not isinstance(exc, Exception)):
            return
        self.sent, self.seq = 0, self.seq + 1
        fields = {b"kind": b"seal", b"batch": self.batch_id.encode(),
                  b"token": self.token.encode(), b"seq": b"%d" % self.seq,
                  b"count": b"%d" % self.counted,
                  b"incarnation": self.incarnation.encode()}  # fmt: skip
        entry = self._again(self.store.seal_notice, self.outbox, fields)
        try:
            self.sealed = self._again(self.store.apply_seal, self.outbox, entry, fields)
        except Exception as exc:
            if not connection.away(exc):
                raise
            log.warning("batch %s: its seal is in %s, for the daemons to apply (%s)",
                        self.batch_id, self.outbox, exc)  # fmt: skip

    def _again(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)``, sent again as it was while Redis is away (``connection.away``),
        after each wait of RETRY (RETRY_FOR seconds at most); the last error raised."""
        end = time.monotonic() + RETRY_FOR
        for wait in (*RETRY, None):
            try:
                return call(*args)
            except Exception as exc:
                if wait is None or not connection.away(exc) or time.monotonic() + wait > end:
                    raise
                time.sleep(wait)
                self.store.refresh()
        raise AssertionError("unreachable")


class NoBatch:
    """A job of no batch: nothing to count."""

    def grow(self, n: int, jobs: Iterable[dict[bytes, bytes]] = ()) -> None:
        pass

    def added(self, n: int) -> None:
        pass


def member(
    store: Store, config: Config, q: QueueConfig, job: NewJob
) -> contextlib.AbstractContextManager:
    """The batch ``job`` is added to (``Member``), or none."""
    if job.batch is None:
        return contextlib.nullcontext(NoBatch())
    return Member(store, config, q, job)


@contextlib.contextmanager
def member_of(
    store: Store, config: Config, q: QueueConfig, jobs: Iterable[NewJob]
) -> Iterator[tuple[Member | NoBatch, Iterator[NewJob]]]:
    """The batch of a bulk enqueue: its first job's, every job's (``_same_batch``); and the
    jobs, the first put back."""
    source = iter(jobs)
    first = next(source, None)
    if first is None:
        yield NoBatch(), source
        return
    source = itertools.chain([first], source)
    with member(store, config, q, first) as m:
        yield m, _same_batch(source, first.batch)


def _same_batch(jobs: Iterator[NewJob], batch: str | None) -> Iterator[NewJob]:
    """Every job of a bulk enqueue in the batch of its first (or none, as it)."""
    for job in jobs:
        yield job if job.batch == batch else dataclasses.replace(job, batch=batch)


def _unreachable(exc: BaseException | None) -> bool:
    return exc is not None and isinstance(exc, connection.UNAVAILABLE)
