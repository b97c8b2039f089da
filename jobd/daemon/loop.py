"""The daemon: one selector loop that owns every handler process.

The loop, as an algorithm:

    until stopped and every handler has ended:
        wait for an event: a signal, jobs delivered by a reader, a handler's output, room in
            its stdin pipe, or its exit (its pidfd)
        reap the handlers that exited (what they said first); decide each outcome (policy),
            once a follow-up file a handler left is parsed, on a thread (``endings``)
        let the handlers whose time has come act (SIGTERM at their timeout, SIGKILL after)
        start a handler for each job delivered while its queue has a free slot; the others
            wait for one, read ahead (``admission``, ``prefetch``)
        pass this pass's outcomes to the recorder and its freed slots to the readers, at once
        tell systemd the loop is alive (watchdog)

Redis stays off this loop, and work reaches it and leaves it through queues only: see the
package docstring (``jobd.daemon``) for the threads and their hand-offs, how the loop starts
handlers without waiting for their exec, and why nothing is handed to them per job.

Every job travels with the queue definition it was read under, and a handler keeps the one it
started with: a reload (SIGHUP, ``queues``) never changes a running job.

Shutdown order (SIGTERM/SIGINT): stop the readers so no new job is taken; hand back jobs read
but not started (those read ahead included); let running handlers finish for up to
``shutdown_grace``, then SIGTERM them and SIGKILL after ``kill_grace``; hand back the entries
of handlers stopped that way; the recorder writes everything; the ticker (leases) stops last;
the daemon leaves the registry (``presence``). A second SIGTERM skips the rest of the grace.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections import Counter

from jobd import exitcodes, hardening, logs, tracing
from jobd.config import Config, QueueConfig
from jobd.daemon import delayed, janitor, lease, outbox, periodic, presence, queues, retention
from jobd.daemon.admission import Admission
from jobd.daemon.duties import Duty, Ticker
from jobd.daemon.endings import Endings
from jobd.daemon.handlers import Handlers
from jobd.daemon.inbox import Inbox
from jobd.daemon.lease import Holdings, Renewal
from jobd.daemon.notify import Notifier
from jobd.daemon.poller import STOP_SIGNALS, Poller, Signals
from jobd.daemon.reader import Reader
from jobd.daemon.recorder import Recorder
from jobd.daemon.report import LoopView, StatusReport, serve_endpoint, status_line
from jobd.daemon.slots import Slots
from jobd.embedded import EmbeddedServer
from jobd.outcome import Outcome, Started, Verb
from jobd.process import results, spawn
from jobd.process.handler import Handler, StopReason
from jobd.store.store import Store
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.daemon")

IDLE_WAIT = 1.0  # longest select() when nothing is due


class Daemon:
    def __init__(self, config: Config, notifier: Notifier | None = None) -> None:
        self.config = config
        self.consumer = lease.consumer_name()
        self.notifier = notifier or Notifier.from_environ()
        self.metrics = Metrics()
        self.poller = Poller()
        self.running = Handlers(self.poller, self.metrics)
        self.inbox = Inbox()  # jobs read, leases lost: from the readers and the ticker
        self.outcomes: list[Outcome | Started] = []  # this pass's, for the recorder
        self.freed: Counter[str] = Counter()  # slots freed in this pass, by queue
        self.holdings = Holdings()
        self.queues = queues.QueueSet(config, self.start_reader)
        self.renewals: dict[lease.LeaseKey, Renewal] = {}  # kept while anything is held there
        self.recorder = Recorder(config.redis, self.consumer, self.holdings, self.metrics)
        self.store = Store.open(config.redis, "ticker", self.consumer)  # the ticker's
        self.ticker = Ticker([])
        self.embedded = EmbeddedServer(config.redis.embedded) if config.redis.embedded else None
        # Where handlers run unless their queue says otherwise; the daemon works there too,
        # which lets it start them with vfork and exec (jobd/process/spawn.py), its fastest path.
        self.folder = os.path.dirname(config.path)
        self.admission = Admission(self.running, self.inbox, self.queues, self.metrics,
                                   self.folder, lambda o: self.settle(o), self.freed,
                                   self.holdings)  # fmt: skip
        self.endings = Endings(self.poller, self.running, self.admission, self.metrics)
        self.ready = self.stopping = False  # READY=1 told; a stop begun
        self.queue_list: tuple[QueueConfig, ...] = ()
        self.total_slots = 0
        self.stop_at = float("inf")  # when handlers still running at shutdown are stopped
        self.signals = Signals()
        self.presence = presence.Presence(self.store, self.consumer, self.shown)

    # -- queues ---------------------------------------------------------------------------

    def start_reader(
        self, q: QueueConfig, slots: Slots, earlier: frozenset[lease.LeaseKey] = frozenset()
    ) -> Reader:
        self.metrics.watch(
            q.name,
            running=lambda: self.running.running_in(q.name),
            free=lambda: max(0, slots.total - self.running.running_in(q.name)),
        )
        reader = Reader(
            q, self.config.redis, self.consumer, slots, self.holdings, self.inbox.deliver,
            self.recorder.record, self.metrics, report=self.inbox.report_lost, earlier=earlier,
        )  # fmt: skip
        reader.start()
        return reader

    def periodic_duties(self) -> list[Duty]:
        """Every duty of the queues in force, each built by the module that owns it; renewals
        go on for queues a reload removed or moved, while their jobs finish."""
        served = self.config.metrics_listen is not None
        report = StatusReport(self.store.client, self.metrics, self.notifier, self.shown, served)
        duties: list[Duty] = [report, self.presence]
        # A renewal no queue reads and holding nothing goes (a reload would leave one behind).
        keep = self.queues.in_use() | self.holdings.keys()
        self.renewals = {k: r for k, r in self.renewals.items() if k in keep}
        self.recorder.store.payload_limits = self.store.payload_limits  # outbox.duties fills it
        for queue in self.config.queues.values():
            self.renewals |= lease.renewals(
                self.store, queue, self.holdings, self.inbox.report_lost
            )
            for owner in (delayed, janitor, retention, periodic, outbox):
                duties += owner.duties(self.store, queue)
        return [*self.renewals.values(), *duties]

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        if not self.prepare():
            return exitcodes.UNAVAILABLE
        self.open()
        while not self.finished():
            try:
                self.step()
            except Exception:  # a bug must not take every running job down with the daemon
                log.exception("internal error in the main loop; going on")
                time.sleep(0.1)
        self.close()
        if self.embedded is not None:
            self.embedded.stop()  # after every handler and every outcome
        log.info("jobd stopped")
        return exitcodes.OK

    def prepare(self) -> bool:
        """What the process needs before the loop opens: descriptors, folder, signals, the
        embedded Redis. (In-process tests skip it: ``open``, ``step``, ``close``.)"""
        spawn.raise_open_files_limit()
        if inherited := spawn.close_inherited_on_exec():
            log.debug("descriptors inherited at start, kept from handlers: %s", inherited)
        os.chdir(self.folder)
        if not self.running.contain(self.config.queues.values(), self.config.cgroup):
            return False
        self.signals.install()
        if self.embedded is not None:
            try:
                self.embedded.run_supervised()
            except RuntimeError as exc:  # no server binary, or it will not start: see its log
                log.error("cannot start the embedded Redis: %s", exc)
                return False
        return True

    def close(self) -> None:
        """After the last pass; the ticker (lease renewals) stops last, after every outcome."""
        self.running.close()  # what escaped a handler's group ends with the daemon
        self.recorder.stop()
        self.recorder.join()
        self.ticker.stop()
        self.ticker.join()
        self.presence.leave(self.config.queues.values())  # its record, its empty consumers
        self.store.close()
        tracing.shutdown()  # jobd's last spans, exported

    def open(self) -> None:
        """The loop's descriptors and threads: recorder, readers, ticker, metrics server."""
        self.poller.register(self.signals.fd, select.EPOLLIN, "signal")
        self.poller.register(self.inbox.wakeup.r, select.EPOLLIN, "wake")
        self.running.listen()  # the handlers' channel's thread
        if self.config.metrics_listen:
            serve_endpoint(self.metrics, self.config.metrics_listen, self.config)
        self.recorder.start()
        self.queues.start()
        self.admission.configure(self.config)
        self.queues_changed()
        self.ticker.replace(self.periodic_duties())
        self.ticker.start()
        served = ", ".join(
            f"{q.name} (stream {q.stream}, x{q.concurrency}, prefetch "
            f"{'auto' if q.prefetch is None else q.prefetch})"
            for q in self.config.queues.values()
        )
        log.info("jobd running as consumer %s: %s on %s",
                 self.consumer, served, self.config.redis.describe())  # fmt: skip

    def step(self) -> None:
        exited: list[Handler] = []
        if spawn.OOM.holding():  # the handlers' OOM score, once its last starts have exec'd
            spawn.OOM.give_back()
        for fd, what in self.poller.poll(self.wait_time()):
            if what == "signal":
                self.on_signals()
            elif what == "wake":
                self.on_lost()
            elif what == "channel":
                self.running.hear(time.monotonic())
            elif what == "endings":  # follow-up files read (``endings``)
                self.endings.take()
            elif what[1] == "exit":
                exited.append(what[0])
            else:
                self.running.on_io(fd, *what)
        # Exits after output (its last output and end of file come in the wake-up of its exit)
        # and after what it said on the channel: it leaves once the channel's thread has read
        # past its exit (``Handlers.exited``, ``left``), the loop never waiting for that.
        self.running.exited(exited) if exited else None
        for handler in self.running.left(time.monotonic()) if self.running.leaving else ():
            self.finish(handler)
        self.act_on_due()
        self.start_delivered()
        self.hand_over()
        self.heartbeat()

    def hand_over(self) -> None:
        """This pass's outcomes (and the jobs now long running: their active records) to the
        recorder and its freed slots to the readers, in one go: each wakes a thread, and the GIL
        round trip of a wake-up costs more than the job."""
        self.outcomes += [h.noted() for h in self.running.long_running(time.monotonic())]
        if self.outcomes:
            self.recorder.record(self.outcomes)
            self.outcomes = []
        if self.freed:
            self.queues.give(self.freed)
            self.freed.clear()
        if self.queues.leaving:  # what a removed queue's name kept, once nothing of it is left
            busy = lambda n: self.running.running_in(n) > 0 or self.admission.waiting.has(n)  # noqa: E731
            for name in self.queues.gone(busy):
                self.admission.forget(name)
                self.metrics.forget(name)

    def heartbeat(self) -> None:
        now = time.monotonic()
        self.metrics.beat()
        self.notifier.watchdog(now)
        if not self.ready and not self.stopping and self.queues.ready():
            self.ready = True
            self.notifier.ready(self.status_line(), **self.ready_fields())
            log.info("ready: Redis answers and every consumer group exists")

    def status_line(self) -> str:
        return status_line(len(self.running), self.total_slots)

    def ready_fields(self, read: str | None = None) -> dict[str, str]:
        """What READY=1 says besides the status (a supervised daemon's: ``child``); ``read``:
        after a reload, the digest of the text it read, applied or not."""
        return {}

    def shown(self) -> LoopView:
        """The loop as other threads may see it: only values the loop replaces whole (a tuple,
        ints, bools) and the size of its handler table, never a structure it changes in place."""
        return LoopView(self.queue_list, len(self.running), self.total_slots,
                        self.ready and not self.stopping, self.stopping)  # fmt: skip

    def queues_changed(self) -> None:
        """After a start or a reload: what the loop shows of its queues."""
        self.queue_list = tuple(self.config.queues.values())
        self.total_slots = sum(q.concurrency for q in self.queue_list)
        self.running.channel.speak_as(results.uids(self.queue_list))

    def finished(self) -> bool:
        return (
            self.stopping
            and not self.running
            and not self.inbox.has_deliveries()
            and not self.admission.waiting
            and not self.endings.pending
            and not self.outcomes
            and not self.queues.reading()
        )

    def wait_time(self) -> float:
        if self.inbox.has_deliveries():
            return 0
        due = min(self.running.next_due, self.stop_at, self.admission.waiting.next_due())
        due -= time.monotonic()
        if self.notifier.watchdog_interval is not None:
            due = min(due, self.notifier.next_watchdog - time.monotonic())
        if spawn.OOM.holding():
            due = min(due, spawn.GIVE_BACK_EVERY)
        return max(0.0, min(due, IDLE_WAIT))

    # -- events ---------------------------------------------------------------------------

    def on_signals(self) -> None:
        for signum in self.signals.take():
            if signum in STOP_SIGNALS:
                self.begin_stop(signal.Signals(signum).name)
            elif signum == signal.SIGHUP:
                self.reload()

    def on_lost(self) -> None:
        """Stop the handler of each entry whose lease was lost (never settling it) or that was
        cancelled; one not started yet is not started (``admission``)."""
        now = time.monotonic()
        for lost in self.inbox.losses():
            if not self.running.told(lost, now, self.metrics):
                self.admission.lost(lost, now)

    # -- starting and ending handlers -----------------------------------------------------

    def start_delivered(self) -> None:
        self.admission.start_delivered()

    def finish(self, handler: Handler) -> None:
        """The handler's leader exited: reap it, decide, settle (``endings``)."""
        self.endings.finish(handler, self.config.queues)

    def settle(self, outcome: Outcome) -> None:
        """Count an outcome, pass it on to the recorder with this pass's others, free its slot.
        A release is forgotten at once: the entry is someone else's, and a reader may claim it
        back later as a new delivery, which must stay held."""
        self.metrics.count(outcome)
        if outcome.verb is Verb.RELEASE:
            self.holdings.discard(lease.key(outcome.queue), [outcome.message_id],
                                  [outcome.job.delivery])  # fmt: skip
        else:
            self.outcomes.append(outcome)
        self.freed[outcome.queue.name] += 1

    # -- deadlines and stopping -----------------------------------------------------------

    def act_on_due(self) -> None:
        """Each handler whose time has come acts (``Handler.act``): SIGTERM at its timeout,
        SIGKILL after ``kill_grace``; at the end of ``shutdown_grace``, every one is stopped."""
        now = time.monotonic()
        if now >= self.stop_at:
            self.stop_at = float("inf")
            self.running.stop_all(StopReason.SHUTDOWN, now)
        self.running.act(now)

    def begin_stop(self, reason: str) -> None:
        now = time.monotonic()
        if self.stopping:
            log.warning("%s again: stopping %d running handler(s) now", reason, len(self.running))
            self.stop_at = now
            return
        self.stopping = True
        self.stop_at = now + self.config.shutdown_grace
        self.notifier.stopping(f"stopping; {len(self.running)} handler(s) finishing")
        log.info(
            "%s: stopping; %d handler(s) running, waiting up to %gs for them",
            reason, len(self.running), self.config.shutdown_grace,
        )  # fmt: skip
        self.queues.stop_reading()
        self.admission.stop()

    def reload(self) -> None:
        """SIGHUP: apply a changed config file, or keep the running one if it is invalid."""
        if self.stopping:
            return
        self.notifier.reloading()
        new, read = queues.reloaded(self.config)
        if new is not None:
            self.queues.apply(new, self.store, self.running.running_in, self.holdings.keys())
            self.admission.reloaded(self.config, new)
            self.config = new
            self.queues_changed()
            self.ticker.replace(self.periodic_duties())
            ending = len(self.queues.retired)  # this reload's, and earlier ones' not ended yet
            log.info("reload done: %s%s", ", ".join(new.queues),
                     f" ({ending} replaced reader(s) still ending)" if ending else "")  # fmt: skip
        self.notifier.ready(self.status_line(), **self.ready_fields(read))


def run(config: Config, log_level: str = "INFO", log_format: str = "text") -> int:
    logs.setup(log_level, log_format)
    hardening.protect_process(config.path)  # before any handler or embedded Redis starts
    return Daemon(config).run()
