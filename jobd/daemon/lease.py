"""Leases: an entry stays this daemon's for as long as its handler runs, however long that is.

Redis counts a pending entry's idle time from its last delivery or claim, and other daemons take
over entries idle for ``lease.reclaim_after`` (see ``reader``). So "idle" must mean "its owner
stopped answering": every ``lease.renew_every`` this daemon renews every entry it holds, per queue,
in one script call (``Store.renew``, ``lua/renew.lua``): one round trip per queue per tick, whatever
the number in flight, and no change to the delivery count.

An entry is *held* from the moment a reader receives it until its outcome is written (or until
the daemon gives it up). An entry the renewal reports lost — acknowledged elsewhere, owned by
another consumer, its data trimmed, or handed back by this daemon's recorder while the tick
was under way (a renewal never takes a hand-back back) — is reported to the main loop, which
stops its handler and records nothing for it. A renewal that fails because Redis is away is
not a loss: the next tick tries again, and the margin between ``renew_every`` and
``reclaim_after`` is what it may use. Slots' expiries are counted on Redis's clock (see
``limits``): the renewal passes the lease's length, not a time.

Before a handler starts, its lease must be known to hold (``Admission.start``): a daemon that
was stopped (SIGSTOP, a VM pause) or cut off from Redis for longer than ``reclaim_after`` with
an entry read, or whose read's reply came that late, would otherwise start a job another daemon
already took over and runs. So each entry held keeps when its lease was last *confirmed*, on
``lease_clock``: the time just before the request that confirmed it was sent (the read or the
claim that delivered it, or a renewal that kept it); Redis reset the entry's idle time no
earlier than that, so no other daemon can take it before ``reclaim_after`` has passed since.
A handler starts only while less than ``START_MARGIN`` of ``reclaim_after`` has passed since;
an entry confirmed longer ago is handed back unstarted (settle.lua leaves it alone if another
daemon took it). No round trip is added to a start: renewals (every ``renew_every``, at most a
third of ``reclaim_after``) keep the entries waiting for a slot confirmed, and a read's own
confirmation is at most one blocking read old (a quarter of ``reclaim_after`` at most).

What a running handler tells of itself (its progress and status, and the deadline it extended
to: ``process.channel``) travels with the renewal of its entry, in the same script call, when it
changed since it was last written: never a round trip of its own, and at most a ``renew_every``
old in its job's active record (``jobd job``, ``jobd status``, the dashboard). The script writes
it only for the entries it renewed: a handler whose lease was lost changes nothing of the new
owner's record.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.store.leases import LeaseKey, Lost, Shown, key
from jobd.store.store import Store

if TYPE_CHECKING:
    from jobd.process.channel import Told

log = logging.getLogger("jobd.lease")


class Teller(Protocol):
    """A running handler as its renewals see it (``process.handler.Handler``)."""

    job: Job
    told: Told | None
    started: float  # monotonic, as ``Told``'s times
    timeout: float  # seconds: its own deadline is ``started`` plus this


# A handler starts only on an entry whose lease was confirmed less than this share of
# reclaim_after ago: the other half is the margin for whatever comes between the check and the
# start (the check is the last step before the spawn) and for two hosts' clocks' rates.
START_MARGIN = 0.5


def lease_clock() -> float:
    """Seconds on the clock leases are counted on here: CLOCK_BOOTTIME, monotonic and going on
    while the host is suspended (CLOCK_MONOTONIC stops then, Redis's clock does not)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


_process_tag = ""  # "-p2" in the second daemon of a supervisor's (``name_process``)


def name_process(index: int) -> None:
    """This process is daemon ``index`` of a supervisor's (``processes``): its consumer name
    ends in ``-pINDEX``, so one host's daemons read as such. Called once, before the daemon
    is made (``daemon.child``)."""
    global _process_tag
    _process_tag = f"-p{index}"


def process_index() -> int | None:
    """Which of a supervisor's daemons this one is (``name_process``); None: on its own."""
    return int(_process_tag[2:]) if _process_tag else None


def consumer_name() -> str:
    """A daemon's name in every consumer group, unique per process, and readable: which host
    and pid holds a job (and which of the host's daemons it is: ``name_process``). Containers
    often share both (a fixed host name, pid 1): 64 random bits keep their names apart (16
    bits clashed in 7 % of a fleet of 100's restarts); a clash all the same is found by the
    daemon registry (``beat.lua``) and listed."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(8)}{_process_tag}"


@dataclass(slots=True)
class _Held:
    """One entry held: by which delivery (``Job.delivery``), when its lease was last confirmed
    (``lease_clock``, before the request was sent), its --unique job's 'queued' mark, and its
    job id as read ('' when not given)."""

    delivery: int
    confirmed: float
    mark: bytes | None = None
    job_id: str = ""
    teller: Teller | None = None  # its handler, once started: what it tells (``told``)
    shown: float = 0.0  # its ``Told.changed`` last written to its active record


class Holdings:
    """The entries this daemon holds, by (stream, group): ``store.leases.key``; shared by
    readers, loop, recorder and ticker. Keyed by stream and group rather than queue name, so a
    queue whose stream changes on reload keeps renewing the entries it read from the old one
    until they are settled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[LeaseKey, dict[str, _Held]] = defaultdict(dict)  # id -> its record
        self._numbers = itertools.count(1)
        # Entries handed back whose hand-back Redis has not answered yet (kept while it is away):
        # a reclaim of one by this daemon is the hand-back's claim too (reclaim.lua).
        self._backs: dict[LeaseKey, set[str]] = defaultdict(set)

    def add(
        self,
        key: LeaseKey,
        ids: Iterable[str],
        confirmed: float,
        marks: dict[str, bytes] | None = None,
        job_ids: dict[str, str] | None = None,
    ) -> list[int]:
        """Hold ``ids`` from now on, their leases ``confirmed`` then (``lease_clock``, before
        the read or claim that delivered them was sent); each one's delivery number
        (``Job.delivery``). ``marks``: those of --unique jobs, by id (``marks_of``);
        ``job_ids``: their job ids, by id (a job whose entry is deleted ends 'lost' under it,
        started or not)."""
        marks, job_ids = marks or {}, job_ids or {}
        with self._lock:
            held = self._held[key]
            numbers = []
            for mid in ids:
                number = next(self._numbers)
                held[mid] = _Held(number, confirmed, marks.get(mid), job_ids.get(mid, ""))
                numbers.append(number)
            return numbers

    def confirm(self, key: LeaseKey, renewed: dict[str, int], at: float) -> None:
        """A renewal sent at ``at`` (``lease_clock``) kept these entries (id -> the delivery
        the renewal was about): each still held by that delivery is confirmed then."""
        with self._lock:
            held = self._held.get(key, {})
            for mid, number in renewed.items():
                entry = held.get(mid)
                if entry is not None and entry.delivery == number and entry.confirmed <= at:
                    entry.confirmed = at

    def confirmed(self, key: LeaseKey, message_id: str, delivery: int) -> float | None:
        """When that delivery's lease was last confirmed (``lease_clock``); None when it is no
        longer held (the renewal found it lost, or it was settled)."""
        with self._lock:
            entry = self._held.get(key, {}).get(message_id)
            return entry.confirmed if entry is not None and entry.delivery == delivery else None

    def marks(self, key: LeaseKey, ids: Iterable[str]) -> list[bytes]:
        """The marks of those of ``ids`` that are --unique jobs."""
        with self._lock:
            held = self._held.get(key, {})
            return [e.mark for mid in ids if (e := held.get(mid)) and e.mark is not None]

    def discard(self, key: LeaseKey, ids: Iterable[str], deliveries: Iterable[int]) -> None:
        """Forget ``ids``, each only while its delivery (a number each; 0: any) holds it: one
        this daemon has claimed again since is the new delivery's."""
        with self._lock:
            held = self._held.get(key, {})
            for mid, number in zip(ids, deliveries, strict=True):
                entry = held.get(mid)
                if entry is not None and (not number or entry.delivery == number):
                    del held[mid]
            if not held:  # a stream a reload left behind leaves nothing here
                self._held.pop(key, None)

    def telling(self, key: LeaseKey, message_id: str, delivery: int, teller: Teller) -> None:
        """That delivery's handler started: what it tells of itself goes with the renewals."""
        with self._lock:
            entry = self._held.get(key, {}).get(message_id)
            if entry is not None and entry.delivery == delivery:
                entry.teller = teller

    def told(self, key: LeaseKey, held: dict[str, int]) -> list[tuple[Shown, float]]:
        """What the handlers of ``held`` (id -> delivery) told of themselves since it was last
        shown, each with its ``Told.changed`` (for ``shown``). Read from the ticker's thread
        while the loop's hears more: ``changed`` first, so a change in between is sent again."""
        found = []
        with self._lock:
            entries = self._held.get(key, {})
            for mid, number in held.items():
                entry = entries.get(mid)
                if entry is None or entry.delivery != number or entry.teller is None:
                    continue
                told = entry.teller.told
                if told is None or told.changed <= entry.shown:
                    continue
                changed, progress, status = told.changed, told.progress, told.status
                extended = deadline_ms(entry.teller, told.extended_to)
                if progress is not None or status is not None or extended is not None:
                    job_id = entry.teller.job.job_id
                    found.append((Shown(mid, job_id, progress, status, extended), changed))
        return found

    def job_ids(self, key: LeaseKey, held: dict[str, int]) -> list[tuple[str, bytes | None]]:
        """The job ids and --unique marks of ``held`` (id -> delivery), in its order: ('', None)
        for an entry no longer held by that delivery. A job read ahead, its handler not started
        yet, has the job id it was read with (a handler's is the same: ``Job.job_id``)."""
        with self._lock:
            entries = self._held.get(key, {})
            return [
                (e.teller.job.job_id if e.teller else e.job_id, e.mark)
                if (e := entries.get(mid)) and e.delivery == number
                else ("", None)
                for mid, number in held.items()
            ]

    def shown(self, key: LeaseKey, written: dict[str, tuple[int, float]]) -> None:
        """These entries' fields (id -> delivery and ``Told.changed``) are in their records."""
        with self._lock:
            entries = self._held.get(key, {})
            for mid, (number, changed) in written.items():
                entry = entries.get(mid)
                if entry is not None and entry.delivery == number:
                    entry.shown = max(entry.shown, changed)

    def handing_back(self, key: LeaseKey, message_id: str, delivery: int) -> None:
        """A hand-back of that delivery is sent: the entry is forgotten, and on its way back."""
        self.discard(key, [message_id], [delivery])
        with self._lock:
            self._backs[key].add(message_id)

    def handed_back(self, key: LeaseKey, ids: Iterable[str]) -> None:
        """Redis answered these hand-backs (applied, or left alone), or they were given up."""
        with self._lock:
            backs = self._backs.get(key, set())
            backs.difference_update(ids)
            if not backs:
                self._backs.pop(key, None)

    def on_their_way_back(self, key: LeaseKey) -> list[str]:
        """The entries whose hand-back has not been answered yet, and not held again."""
        with self._lock:
            return sorted(self._backs.get(key, set()) - self._held.get(key, {}).keys())

    def holds(self, key: LeaseKey, message_id: str) -> bool:
        with self._lock:
            return message_id in self._held.get(key, ())

    def snapshot(self, key: LeaseKey) -> dict[str, int]:
        """The entries held, each with its delivery number."""
        with self._lock:
            return {mid: e.delivery for mid, e in self._held.get(key, {}).items()}

    def keys(self) -> set[LeaseKey]:
        """Where this daemon holds entries, or has hand-backs not answered yet."""
        with self._lock:
            return {k for k, held in self._held.items() if held} | {
                k for k, backs in self._backs.items() if backs
            }


def deadline_ms(teller: Teller, extended_to: float | None) -> int | None:
    """The deadline its handler extended to (``Told.extended_to``), in ms after its start;
    never before its own (``Told.due``, less the watchdog's: a heartbeat's due time is no
    deadline to show, it moves with each); None when it extended none."""
    if extended_to is None:
        return None
    return round(max(teller.timeout, extended_to - teller.started) * 1000)


class Renewal:
    """The duty that renews one queue's leases every ``lease.renew_every``, as the store's
    consumer (``Store.renew``: one script call for them all)."""

    def __init__(
        self,
        store: Store,
        queue: QueueConfig,
        holdings: Holdings,
        on_lost: Callable[[list[Lost]], None],
    ) -> None:
        self.name = f"lease renewal of {queue.stream} ({queue.group})"
        self.interval = queue.lease.renew_every
        self.store = store
        self.queue = queue
        self.holdings = holdings
        self.on_lost = on_lost

    def tick(self) -> None:
        held = self.holdings.snapshot(key(self.queue))
        if not held:
            return
        told = self.holdings.told(key(self.queue), held)
        sent = lease_clock()  # before the request: Redis reset the idle times no earlier
        known = self.holdings.job_ids(key(self.queue), held)  # a job deleted ends 'lost' by it
        shown = [s for s, _ in told]
        lost, written = self.store.renew_telling(
            self.queue, list(held), shown, [j for j, _ in known], [m for _, m in known]
        )
        changed = {s.message_id: c for s, c in told}
        self.holdings.shown(key(self.queue), {m: (held[m], changed[m]) for m in written})
        gone_ids = {x.message_id for x in lost if not x.cancelled}
        self.holdings.confirm(
            key(self.queue), {m: n for m, n in held.items() if m not in gone_ids}, sent
        )
        if lost:  # a cancelled entry is still held: its outcome ('cancelled') is to be written
            # Each report names the delivery it is about: the entry may have been handed back
            # and claimed again by this daemon while the call was under way (read ahead).
            lost = [replace(x, delivery=held.get(x.message_id, 0)) for x in lost]
            gone = [x for x in lost if not x.cancelled]
            self.holdings.discard(key(self.queue), [x.message_id for x in gone],
                                  [x.delivery for x in gone])  # fmt: skip
            self.on_lost(lost)
        if marks := self.holdings.marks(key(self.queue), held):  # --unique jobs running long
            self.store.keep_marks(marks)


def marks_of(queue: QueueConfig, jobs: Iterable[Job]) -> dict[str, bytes]:
    """The 'queued' marks of the --unique jobs among ``jobs``, by entry id."""
    return {
        job.message_id: mark
        for job in jobs
        if (mark := job.mark_key(queue.keys, dedupe=False)) is not None
    }


def renewals(
    store: Store, queue: QueueConfig, holdings: Holdings, on_lost: Callable[[list[Lost]], None]
) -> dict[LeaseKey, Renewal]:
    """A queue's lease renewals, by where the leases live: one per stream."""
    return {key(q): Renewal(store, q, holdings, on_lost) for q in queue.all_levels()}
