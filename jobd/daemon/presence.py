"""The daemon in the daemon registry (``store.registry``): its heartbeat, and its farewell.

**Beat.** A duty on the ticker writes the daemon's record — host, pid, version, the queues it
serves (whether it has read from them yet or not), its running handlers and slots, and whether
it is stopping — every ``BEAT_EVERY`` seconds, or every ``lease.renew_every`` of its queues when
that is shorter: one script call, whatever the number of jobs. Its queues are sent only when
they changed (a reload), or when Redis lost the record (it had expired: a daemon frozen longer
than the registry keeps a dead one). A beat that fails (Redis away, a registry key of another
type) is logged by the ticker and tried again on the next tick; the daemon runs on regardless.

**Farewell** (``leave``, at the end of a clean stop, after the last outcome is written): the
daemon removes its record, and its consumer from every group it read, one group at a time with
``Store.drop_consumer`` (which deletes a consumer only when it holds no entry, checked in the
same script: XGROUP DELCONSUMER would drop its pending entries for good). A group where it
still holds entries (handed back at the stop: another daemon takes them at once) keeps it; the
janitors of the other daemons remove it once that one holds nothing (``janitor``).

A daemon killed (SIGKILL, a power cut) leaves both behind: it is listed dead once its lease
lapsed, its entry goes ``registry.KEEP_FACTOR`` × its largest ``reclaim_after`` later, and the
janitors remove its consumers on the same bound.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable

from jobd import __version__
from jobd.config import QueueConfig
from jobd.daemon import lease
from jobd.daemon.report import LoopView
from jobd.store.leases import LeaseKey, key
from jobd.store.registry import KEEP_FACTOR, Beat, Served
from jobd.store.store import Store

log = logging.getLogger("jobd.presence")

BEAT_EVERY = 5.0  # seconds between two beats, at most
NO_QUEUE_LEASE = 60.0  # the lease of a daemon with no queue (all removed by a reload)


def served(queues: Iterable[QueueConfig]) -> tuple[Served, ...]:
    """The streams and groups a daemon serves: each queue's, each priority level's."""
    return tuple(
        Served(q.name, level.stream, level.group, q.concurrency)
        for q in queues
        for level in q.all_levels()
    )


def beat_every(queues: Iterable[QueueConfig]) -> float:
    return min([BEAT_EVERY, *(q.lease.renew_every for q in queues)])


class Presence:
    """The heartbeat duty, and the farewell; one for the daemon's life, across reloads."""

    name = "heartbeat in the daemon registry"

    def __init__(self, store: Store, consumer: str, view: Callable[[], LoopView]) -> None:
        self.store, self.consumer, self.view = store, consumer, view
        self.sent: tuple[Served, ...] | None = None  # the queues the record holds
        self.read: dict[LeaseKey, QueueConfig] = {}  # every group served: left at the stop
        self.host, self.pid = socket.gethostname(), os.getpid()
        # Its own whatever its name: a beat finds another process writing under the same name.
        self.instance = os.urandom(8).hex()

    @property
    def interval(self) -> float:
        """Seconds to the next beat, for the queues in force now (a reload changes them)."""
        return beat_every(self.view().queues)

    def tick(self) -> None:
        v = self.view()
        queues = served(v.queues)
        for q in v.queues:
            self.read |= {key(level): level for level in q.all_levels()}
        leases = [q.lease.reclaim_after for q in v.queues] or [NO_QUEUE_LEASE]
        beat = Beat(
            host=self.host, pid=self.pid, version=__version__, process=lease.process_index(),
            queues=None if queues == self.sent else queues, running=v.running, slots=v.slots,
            beat_every_ms=int(beat_every(v.queues) * 1000), lease_ms=int(min(leases) * 1000),
            keep_ms=int(KEEP_FACTOR * max(leases) * 1000),
            state="stopping" if v.stopping else "running", instance=self.instance,
        )  # fmt: skip
        self.sent = None  # until Redis says it has them: a beat that failed sends them again
        beaten = self.store.beat(self.consumer, beat)
        self.sent = None if beaten.created and beat.queues is None else queues

    def leave(self, queues: Iterable[QueueConfig]) -> None:
        """The farewell of a clean stop: the record, then each empty consumer of this daemon.
        Nothing here may stop the daemon from ending: each step's failure is logged."""
        try:
            self.store.deregister(self.consumer)
        except Exception as exc:
            log.warning("could not remove this daemon from the registry: %s", exc)
        for q in queues:
            self.read |= {key(level): level for level in q.all_levels()}
        for level in self.read.values():
            try:
                self._drop(level)
            except Exception as exc:  # the group is gone, the key is another type, Redis away
                log.warning("could not remove consumer %s from group %s of %s: %s",
                            self.consumer, level.group, level.stream, exc)  # fmt: skip

    def _drop(self, level: QueueConfig) -> None:
        """This daemon's consumer out of the group of ``level``, unless it holds entries."""
        mine = os.fsencode(self.consumer)
        found = next((c for c in self.store.consumers(level) if c.name == mine), None)
        if found is None:
            return  # never read there (a consumer is made by its first read)
        if found.pending or not self.store.drop_consumer(level, mine, 0):
            log.info("consumer %s stays in group %s of %s: it holds %d entries, handed back",
                     self.consumer, level.group, level.stream, found.pending)  # fmt: skip
