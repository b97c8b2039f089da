"""The queues a daemon serves: their readers and slots, and how a reload (SIGHUP) changes them.

Each queue has one reader thread and its free slots (``slots.Slots``). A reload reads the file
again and applies it only if it is valid and changes nothing read once at start (Redis, the
metrics listener, the dashboard): a removed queue's reader stops, a changed queue's reader is
replaced, an added queue gets one. Running handlers keep the queue definition they started with;
a job read under an old definition is started under the one in force (``current_level``), or
handed back when its queue was removed or moved.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from jobd import hardening
from jobd.config import Config, ConfigError, QueueConfig, digest, load, read_text
from jobd.daemon import lease
from jobd.daemon.reader import Reader
from jobd.daemon.slots import Slots
from jobd.process import containment
from jobd.store import connection
from jobd.store.leases import LeaseKey
from jobd.store.store import Store

log = logging.getLogger("jobd.daemon")

StartReader = Callable[[QueueConfig, Slots, frozenset[LeaseKey]], Reader]
FIXED = ("redis", "metrics_listen", "dashboard", "cgroup", "tracing")  # read once at start


class QueueSet:
    """Readers and slots by queue name; used by the loop's thread only."""

    def __init__(self, config: Config, start_reader: StartReader) -> None:
        self.config = config
        self.start_reader = start_reader
        self.slots: dict[str, Slots] = {}
        self.readers: dict[str, Reader] = {}
        # Stopped by a reload, maybe still reading; forgotten once ended (``prune``).
        self.retired: list[Reader] = []
        # Where a queue was read before reloads moved it: its reader's limiter counts the
        # entries still held there against its limit (``limits.Limiter.keep_earlier``).
        self.former: dict[str, frozenset[LeaseKey]] = {}
        self.leaving: set[str] = set()  # removed queues whose slots are kept (``gone``)

    def start(self) -> None:
        for q in self.config.queues.values():
            self.add(q)

    def add(self, q: QueueConfig) -> None:
        if q.name in self.slots:
            self.slots[q.name].resize(q.concurrency)
        else:
            self.slots[q.name] = Slots(q.concurrency)
        self.readers[q.name] = self.start_reader(
            q, self.slots[q.name], self.former.get(q.name, frozenset())
        )

    def retire(self, name: str) -> None:
        reader = self.readers.pop(name)
        reader.stop()
        self.retired.append(reader)

    def give(self, freed: dict[str, int]) -> None:
        """Slots freed by ended handlers, back to their queues' readers."""
        for name, n in freed.items():
            if slots := self.slots.get(name):
                slots.give(n)

    def stop_reading(self) -> None:
        for reader in self.readers.values():
            reader.stop()

    def ready(self) -> bool:
        return all(r.ready.is_set() for r in self.readers.values())

    def reading(self) -> bool:
        """Whether a reader, current or retired, may still deliver."""
        self.prune()
        return any(r.is_alive() for r in (*self.readers.values(), *self.retired))

    def prune(self) -> None:
        """Forget the retired readers whose thread has ended: each holds its store, its
        queue's config and its limiter, and a reload retires one per changed queue, so
        keeping them grew the daemon by every reload it ever applied. (What is kept by a
        removed queue's name goes once nothing of it is left: ``gone``.)"""
        self.retired = [r for r in self.retired if r.is_alive()]

    def gone(self, busy: Callable[[str], bool]) -> list[str]:
        """The removed queues of which nothing is left: no reader of theirs still reading and
        nothing ``busy`` (a handler running, an entry waiting); their slots and their record
        of earlier streams are forgotten here, and the caller forgets the rest kept by name
        (paces, metric series). Kept, a reload renaming queues left them all for ever."""
        self.prune()
        reading = {r.queue.name for r in self.retired}
        names = [n for n in self.leaving if n not in reading and not busy(n)]
        for name in names:
            self.leaving.discard(name)
            self.slots.pop(name, None)
            self.former.pop(name, None)
        return names

    def in_use(self) -> set[LeaseKey]:
        """Where the queues in force and the readers still reading hold leases."""
        readers = (*self.readers.values(), *self.retired)
        return {lease.key(q) for r in readers for q in r.levels}

    def current_level(self, queue: QueueConfig) -> QueueConfig | None:
        """The config now in force for jobs read from ``queue`` (the queue, or one of its
        priority levels); None when a reload removed it or moved it to another stream."""
        current = self.config.queues.get(queue.name)
        if current is None:
            return None
        return next((q for q in current.all_levels() if lease.key(q) == lease.key(queue)), None)

    def apply(
        self,
        new: Config,
        store: Store,
        running_in: Callable[[str], int],
        held: AbstractSet[LeaseKey] = frozenset(),
    ) -> None:
        """Serve ``new``'s queues from now on (``store``: to say what a moved queue leaves;
        ``held``: where this daemon holds entries now)."""
        old, self.config = self.config, new
        self.prune()
        moved: list[tuple[QueueConfig, QueueConfig]] = []
        for name in old.queues.keys() - new.queues.keys():
            log.info(
                "reload: queue %s removed; %d running handler(s) finish first",
                name, running_in(name),
            )  # fmt: skip
            self.retire(name)
            self.leaving.add(name)
        for name, q in new.queues.items():
            if name not in old.queues:
                log.info("reload: queue %s added", name)
                self.leaving.discard(name)  # back before it was forgotten: its slots serve
                self.add(q)
            elif old.queues[name] != q:
                log.info("reload: queue %s changed; running handlers finish as they started", name)
                moved.append((old.queues[name], q))
                now = {lease.key(level) for level in q.all_levels()}
                before = {lease.key(level) for level in old.queues[name].all_levels()}
                earlier = (self.former.get(name, frozenset()) | before) - now
                self.former[name] = frozenset(k for k in earlier if k in held)
                self.retire(name)
                self.add(q)
        if moved:
            warn_moved_later(store, moved)


def reloaded(config: Config) -> tuple[Config | None, str]:
    """The config file read again, or None (and why, logged) when it cannot be applied; and
    the digest of the text read ("" if none was): a supervisor learns which reload this
    answers (``handover.InForce``)."""
    text = ""
    try:
        text = read_text(config.path)
        new = load(config.path, hardening.config_environ(), text)  # secrets forgotten
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("reload refused: %s", problem.format(exc.path))
        log.error("reload refused: %d problem(s); the running config stays", len(exc.problems))
        return None, digest(text) if text else ""
    return _applicable(config, new), new.digest


def _applicable(config: Config, new: Config) -> Config | None:
    """``new``, unless it changes what only a restart applies, or asks for containment this
    daemon cannot give (why, logged)."""
    if changed := [name for name in FIXED if getattr(new, name) != getattr(config, name)]:
        log.error(
            "reload refused: changing %s needs a restart; nothing changed",
            " or ".join(name.split("_")[0] for name in changed),
        )
        return None
    if refused := containment.unenforced(new.queues.values(), containment.ACTIVE):
        for line in refused:
            log.error("reload refused: %s", line)
        return None
    return new


def warn_moved_later(store: Store, moved: list[tuple[QueueConfig, QueueConfig]]) -> None:
    """``warn_if_moved`` for each (old, new) pair, on a short-lived thread: it asks Redis, and
    the loop must never wait on Redis (cut off, each moved level took a ~10 s timeout: three
    moved queues froze reaping, timeouts and signals past the units' 30 s WatchdogSec)."""

    def warn() -> None:
        try:
            for old, new in moved:
                warn_if_moved(store, old, new)
        except Exception:  # a warning only: never a reason to stop anything
            log.exception("reload: while saying what moved queues leave behind")

    threading.Thread(target=warn, name="reload-moved", daemon=True).start()


def warn_if_moved(store: Store, old: QueueConfig, new: QueueConfig) -> None:
    """A queue moved to other streams leaves behind what its old ones still hold: entries not
    delivered yet and its delayed set (retries, delayed jobs). jobd does not move them (on a
    cluster the two may be in different slots, out of one script's reach); it says what is
    left, so an operator can keep a queue on the old stream until it drains."""
    for before, after in zip(old.all_levels(), new.all_levels(), strict=False):
        if before.stream == after.stream:
            continue
        try:
            delayed = store.delayed_count(before)
            length = store.length(before.stream)
        except connection.UNAVAILABLE:
            delayed = length = -1
        log.warning(
            "reload: queue %s moved from stream %r to %r; %s entries on the old stream and "
            "%s jobs in its delayed set %r are no longer served by this daemon: keep a "
            "queue on %r until they drain",
            old.name, before.stream, after.stream, _known(length), _known(delayed),
            before.keys.delayed, before.stream,
        )  # fmt: skip


def _known(count: int) -> str:
    return "an unknown number of" if count < 0 else str(count)
