"""The daemon: one selector loop that owns every handler process.

The loop, as an algorithm:

    until stopped and every handler has ended:
        wait for an event: a signal, jobs delivered by a reader, a handler's output, room in
            its stdin pipe, or its exit (its pidfd)
        reap the handlers that exited; decide each outcome
        stop the handlers past their timeout (SIGTERM, then SIGKILL after kill_grace)
        start a handler for each job delivered
        pass this pass's outcomes to the recorder and its freed slots to the readers, at once
        tell systemd the loop is alive (watchdog)

Redis stays off this loop: reader threads fetch jobs (``reader``), a recorder thread writes
outcomes (``recorder``), a ticker thread renews leases and runs the other periodic duties
(``duties``). Signals only leave a byte in a pipe; the loop acts on them.

The loop starts handlers itself. A vfork-based spawn returns once the child has called exec
(a few hundred microseconds for a small binary on a busy machine; the GIL is released
meanwhile, so the reader and recorder run, see ``spawn``); handing the spawn to threads was
measured slower (bench/spawn.py, bench/compare.py): every hand-over is a GIL round trip
between threads, and those cost more than the wait they hide. For the same reason the loop
hands work to the other threads once per pass, never once per job.

Every job travels with the queue definition it was read under, and a handler keeps the one it
started with: a reload (SIGHUP) never changes a running job.

Shutdown order (SIGTERM/SIGINT): stop the readers so no new job is taken; hand back jobs read
but not started; let running handlers finish for up to ``shutdown_grace``, then SIGTERM them
and SIGKILL after ``kill_grace``; hand back the entries of handlers stopped that way; then let
the recorder write everything; the ticker, which renews leases, stops last. A second SIGTERM
skips the rest of the grace period.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import resource
import secrets
import select
import signal
import socket
import time
from dataclasses import replace

from jobd import exitcodes, hardening, logs
from jobd.config import Config, ConfigError, QueueConfig, load
from jobd.daemon import lease
from jobd.daemon.delayed import Forwarder
from jobd.daemon.duties import Duty, Ticker
from jobd.daemon.janitor import Janitor
from jobd.daemon.lease import Holdings, Lost, Renewal
from jobd.daemon.notify import Notifier
from jobd.daemon.periodic import Periodic
from jobd.daemon.reader import Reader, Slots
from jobd.daemon.recorder import ACK, DEAD_LETTER, HAND_BACK, RETRY, Outcome, Recorder
from jobd.daemon.report import LoopView, StatusReport, status_line
from jobd.daemon.retention import Trimmer
from jobd.embedded import EmbeddedServer
from jobd.job import MAX_FIELDS, Job
from jobd.process import policy, spawn
from jobd.process.handler import ExitStatus, Handler, SpawnError, State
from jobd.store import connection as redisconn
from jobd.store import dead_letter
from jobd.store.scripts import Scripts
from jobd.web.dashboard import Dashboard
from jobd.web.metrics import Metrics, serve

log = logging.getLogger("jobd.daemon")

IDLE_WAIT = 1.0  # longest select() when nothing is due
LOST_MEMORY = 60.0  # seconds a lost entry that no handler runs is remembered, not to start it
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EntryKey = tuple[str, str, str]  # (stream, group, message id)
Watched = str | tuple[Handler, str]


class Poller:
    """epoll, and what each watched descriptor stands for: a handler's (handler, "exit" | "out"
    | "in"), or "signal" or "wake". What selectors.DefaultSelector does, with less work per call
    (measured: a job costs six of them)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.watched: dict[int, Watched] = {}

    def register(self, fd: int, events: int, what: Watched) -> None:
        self.epoll.register(fd, events)
        self.watched[fd] = what

    def unregister(self, fd: int) -> None:
        self.epoll.unregister(fd)
        del self.watched[fd]

    def __contains__(self, fd: int) -> bool:
        return fd in self.watched

    def poll(self, timeout: float) -> list[tuple[int, Watched]]:
        return [(fd, self.watched[fd]) for fd, _ in self.epoll.poll(timeout)]


def consumer_name() -> str:
    """Unique per daemon process, and readable: which host and pid holds a job."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def entry_key(queue: QueueConfig, job: Job) -> EntryKey:
    return (queue.stream, queue.group, job.message_id)


class Daemon:
    def __init__(self, config: Config, notifier: Notifier | None = None) -> None:
        self.config = config
        self.consumer = consumer_name()
        self.notifier = notifier or Notifier.from_environ()
        self.metrics = Metrics()
        self.poller = Poller()
        self.running: dict[int, Handler] = {}
        self.by_entry: dict[EntryKey, Handler] = {}
        # Jobs read and not started yet, each with when it was delivered (monotonic).
        self.delivered: collections.deque[tuple[QueueConfig, Job, float]] = collections.deque()
        self.lost: collections.deque[Lost] = collections.deque()
        # Entries reported lost that no handler runs: if still to be started, they are not.
        self.lost_unstarted: dict[EntryKey, float] = {}
        self.outcomes: list[Outcome] = []  # decided in this pass, for the recorder
        self.freed: collections.Counter[str] = collections.Counter()  # slots freed, by queue
        self.holdings = Holdings()
        self.slots: dict[str, Slots] = {}
        self.readers: dict[str, Reader] = {}
        self.retired_readers: list[Reader] = []  # stopped by a reload, maybe still reading
        self.renewals: dict[lease.LeaseKey, Renewal] = {}  # kept while anything is held there
        self.recorder = Recorder(config.redis, self.consumer, self.holdings)
        self.ticker_client = redisconn.client(config.redis, "jobd-ticker")
        self.scripts = Scripts(self.ticker_client)
        self.ticker = Ticker([])
        self.embedded = EmbeddedServer(config.redis.embedded) if config.redis.embedded else None
        # Where handlers run unless their queue says otherwise; the daemon works there too,
        # which lets it start them with vfork and exec (jobd/process/spawn.py), its fastest path.
        self.folder = os.path.dirname(config.path)
        self.ready = False
        self.queue_list: tuple[QueueConfig, ...] = ()
        self.total_slots = 0
        self.stopping = False
        self.stop_at = float("inf")  # when handlers still running at shutdown are stopped
        self.next_due = float("inf")  # earliest handler deadline or kill time
        self._signal_r, self._signal_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- queues ---------------------------------------------------------------------------

    def add_queue(self, q: QueueConfig) -> None:
        if q.name in self.slots:
            self.slots[q.name].resize(q.concurrency)
        else:
            self.slots[q.name] = Slots(q.concurrency)
            self.metrics.watch(
                q.name,
                running=lambda name=q.name: self.running_in(name),
                free=lambda name=q.name: max(0, self.slots[name].total - self.running_in(name)),
            )
        reader = Reader(
            q, self.config.redis, self.consumer, self.slots[q.name], self.holdings,
            self.deliver, self.metrics,
        )  # fmt: skip
        self.readers[q.name] = reader
        reader.start()

    def running_in(self, queue: str) -> int:
        return sum(1 for h in list(self.running.values()) if h.queue.name == queue)

    def retire_reader(self, name: str) -> None:
        reader = self.readers.pop(name)
        reader.stop()
        self.retired_readers.append(reader)

    def periodic_duties(self) -> list[Duty]:
        served = self.config.metrics_listen is not None
        report = StatusReport(self.ticker_client, self.metrics, self.notifier, self.shown, served)
        duties: list[Duty] = [report]
        for queue in self.config.queues.values():
            for q in queue.all_levels():
                self.renewals[lease.key(q)] = Renewal(
                    self.scripts, q, self.consumer, self.holdings, self.report_lost
                )
                duties.append(Forwarder(self.scripts, q))
                duties.append(Janitor(self.ticker_client, self.scripts, q, self.consumer))
                if q.retention_maxlen is not None:
                    duties.append(Trimmer(self.scripts, q, q.retention_maxlen))
            if queue.schedule:
                duties.append(Periodic(self.ticker_client, self.scripts, queue))
        # Renewal goes on for queues a reload removed or moved, while their jobs finish.
        return [*self.renewals.values(), *duties]

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        raise_open_files_limit()
        inherited = spawn.close_inherited_on_exec()
        if inherited:
            log.info("descriptors inherited at start, kept from handlers: %s", inherited)
        os.chdir(self.folder)
        self.install_signal_handlers()
        if self.embedded is not None:
            try:
                self.embedded.run_supervised()
            except RuntimeError as exc:  # no server binary, or it will not start: see its log
                log.error("cannot start the embedded Redis: %s", exc)
                return exitcodes.UNAVAILABLE
        self.poller.register(self._signal_r, select.EPOLLIN, "signal")
        self.poller.register(self._wake_r, select.EPOLLIN, "wake")
        if self.config.metrics_listen:
            serve(self.metrics, self.config.metrics_listen, Dashboard(self.config))
        for name in self.config.queues:
            self.metrics.of(name)
        self.recorder.start()
        for q in self.config.queues.values():
            self.add_queue(q)
        self.queues_changed()
        self.ticker.replace(self.periodic_duties())
        self.ticker.start()
        log.info(
            "jobd running as consumer %s: %s on %s",
            self.consumer,
            ", ".join(
                f"{q.name} (stream {q.stream}, x{q.concurrency})"
                for q in self.config.queues.values()
            ),
            self.config.redis.describe(),
        )
        while not self.finished():
            try:
                self.step()
            except Exception:  # a bug must not take every running job down with the daemon
                log.exception("internal error in the main loop; going on")
                time.sleep(0.1)
        # Leases are renewed until every outcome is written: the ticker stops last.
        self.recorder.stop()
        self.recorder.join()
        self.ticker.stop()
        self.ticker.join()
        self.ticker_client.close()
        if self.embedded is not None:
            self.embedded.stop()  # after every handler and every outcome
        log.info("jobd stopped")
        return exitcodes.OK

    def step(self) -> None:
        exited: list[Handler] = []
        for fd, what in self.poller.poll(self.wait_time()):
            if what == "signal":
                self.on_signals()
            elif what == "wake":
                _drain(self._wake_r)
                self.on_lost()
            elif what[1] == "exit":
                exited.append(what[0])
            else:
                self.on_handler_io(fd, *what)
        # Exits after output: a handler's last output and end of file come in the same wake-up
        # as its exit, so there is seldom anything left to drain when it is reaped.
        for handler in exited:
            self.finish(handler)
        self.enforce_deadlines()
        self.start_delivered()
        self.hand_over()
        self.heartbeat()

    def hand_over(self) -> None:
        """This pass's outcomes to the recorder and its freed slots to the readers, in one go:
        each wakes a thread, and the GIL round trip of a wake-up costs more than the job."""
        if self.outcomes:
            self.recorder.record(self.outcomes)
            self.outcomes = []
        for name, n in self.freed.items():
            self.slots[name].give(n)
        self.freed.clear()

    def heartbeat(self) -> None:
        now = time.monotonic()
        self.metrics.beat()
        self.notifier.watchdog(now)
        if (
            not self.ready
            and not self.stopping
            and all(r.ready.is_set() for r in self.readers.values())
        ):
            self.ready = True
            self.notifier.ready(self.status_line())
            log.info("ready: Redis answers and every consumer group exists")

    def status_line(self) -> str:
        return status_line(len(self.running), self.total_slots)

    def shown(self) -> LoopView:
        """The loop as other threads may see it: only values the loop replaces whole (a
        tuple, ints, bools) and the size of its handler table, never a structure it changes
        in place (a reload may change ``slots`` while another thread walks it)."""
        return LoopView(self.queue_list, len(self.running), self.total_slots,
                        self.ready and not self.stopping)  # fmt: skip

    def queues_changed(self) -> None:
        """After a start or a reload: what the loop shows of its queues."""
        self.queue_list = tuple(self.config.queues.values())
        self.total_slots = sum(q.concurrency for q in self.queue_list)

    def finished(self) -> bool:
        return (
            self.stopping
            and not self.running
            and not self.delivered
            and not self.outcomes
            and not any(r.is_alive() for r in (*self.readers.values(), *self.retired_readers))
        )

    def wait_time(self) -> float:
        if self.delivered:
            return 0
        due = min(self.next_due, self.stop_at) - time.monotonic()
        if self.notifier.watchdog_interval is not None:
            due = min(due, self.notifier.next_watchdog - time.monotonic())
        return max(0.0, min(due, IDLE_WAIT))

    # -- events ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        reset = spawn.reset_inherited_ignores()
        if reset:
            names = ", ".join(s.name for s in reset)
            log.info("signals ignored when jobd started: %s; handlers get their default", names)
        for signum in (*STOP_SIGNALS, signal.SIGHUP):
            signal.signal(signum, _note_signal)
        signal.set_wakeup_fd(self._signal_w, warn_on_full_buffer=False)

    def on_signals(self) -> None:
        for signum in _drain(self._signal_r):
            if signum in STOP_SIGNALS:
                self.begin_stop(signal.Signals(signum).name)
            elif signum == signal.SIGHUP:
                self.reload()

    def deliver(self, queue: QueueConfig, jobs: list[Job]) -> None:
        """Called by reader threads: queue jobs for the loop and wake it."""
        now = time.monotonic()
        self.delivered.extend((queue, job, now) for job in jobs)
        self._wake()

    def report_lost(self, lost: list[Lost]) -> None:
        """Called by lease renewal (ticker thread): entries this daemon no longer holds."""
        self.lost.extend(lost)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: the loop is already due to wake
            os.write(self._wake_w, b"\0")

    def on_lost(self) -> None:
        """Stop the handler of each entry whose lease was lost; never settle those entries."""
        while self.lost:
            lost = self.lost.popleft()
            key = (*lost.key, lost.message_id)
            to = f"consumer {lost.owner}" if lost.owner else "nobody (acked elsewhere, or trimmed)"
            handler = self.by_entry.get(key)
            if handler is not None:
                self.metrics.of(handler.queue.name).leases_lost.inc()
                handler.log(
                    logging.WARNING,
                    "lease lost: the entry now belongs to %s; stopping the handler",
                    to,
                )
                handler.lease_lost = True
                if handler.state is State.RUNNING:
                    self.stop_handler(handler, time.monotonic())
                continue
            # Maybe delivered and not started yet. Readers may be adding to `delivered` right
            # now, so it is not searched here: start_delivered skips the entry's delivery.
            self.lost_unstarted[key] = time.monotonic()
        cutoff = time.monotonic() - LOST_MEMORY
        for key in [k for k, at in self.lost_unstarted.items() if at < cutoff]:
            del self.lost_unstarted[key]  # settled before the report came: nothing to skip

    def lost_before(self, key: EntryKey, delivered_at: float) -> bool:
        """Whether this delivery of the entry was reported lost (a later delivery of the same
        entry, claimed back after its new owner died, is not)."""
        lost_at = self.lost_unstarted.get(key)
        if lost_at is None or delivered_at > lost_at:
            return False
        del self.lost_unstarted[key]
        return True

    def on_handler_io(self, fd: int, handler: Handler, direction: str) -> None:
        if direction == "in":
            if handler.write_input():
                self.poller.unregister(fd)  # before closing: see Handler.write_input
                handler.close_input()
        elif handler.read_output(fd):
            self.poller.unregister(fd)
            handler.close_output(fd)

    # -- starting and ending handlers -----------------------------------------------------

    def current_level(self, queue: QueueConfig) -> QueueConfig | None:
        """The config now in force for jobs read from ``queue`` (the queue, or one of its
        priority levels); None when a reload removed it or moved it to another stream."""
        current = self.config.queues.get(queue.name)
        if current is None:
            return None
        return next((q for q in current.all_levels() if lease.key(q) == lease.key(queue)), None)

    def start_delivered(self) -> None:
        while self.delivered:
            queue, job, at = self.delivered.popleft()
            current = self.current_level(queue)
            if self.lost_unstarted and self.lost_before(entry_key(queue, job), at):
                log.warning("%s lease lost before it started; not starting it", job.tag(queue.name))
                self.freed[queue.name] += 1
            elif self.stopping or current is None:
                why = "jobd stopped" if self.stopping else "its queue was removed or moved"
                log.info("%s read as %s: handed back", job.tag(queue.name), why)
                self.settle(queue, job, policy.Decision(policy.Action.HAND_BACK))
            elif (reason := malformed(current, job)) is not None:
                log.error("%s %s: dead-lettered unrun", job.tag(queue.name), reason)
                decision = policy.Decision(policy.Action.DEAD_LETTER, dead_letter.MALFORMED)
                self.settle(current, job, decision, error_text=reason.encode())
            else:
                self.start(current, job)

    def start(self, queue: QueueConfig, job: Job) -> None:
        try:
            handler = Handler.spawn(job, queue, self.folder)
        except Exception as exc:  # the daemon never dies of a job
            if not isinstance(exc, SpawnError):
                log.error("%s cannot start the handler", job.tag(queue.name), exc_info=exc)
            decision = policy.decide(queue, job.attempt, None)
            log.error("%s %s: %s", job.tag(queue.name), exc, describe(decision))
            self.settle(queue, job, decision, error_text=str(exc).encode())
            return
        self.running[handler.pid] = handler
        self.by_entry[entry_key(queue, job)] = handler
        self.poller.register(handler.pidfd, select.EPOLLIN, (handler, "exit"))
        for fd in handler.output_fds():
            self.poller.register(fd, select.EPOLLIN, (handler, "out"))
        stdin = handler.input_fd()
        if stdin is not None:
            self.poller.register(stdin, select.EPOLLOUT, (handler, "in"))
        self.next_due = min(self.next_due, handler.due)
        series = self.metrics.of(queue.name)
        series.started.inc()
        handler.waited = max(0.0, time.time() - job.enqueued_at())
        series.latency.observe(handler.waited)
        handler.log(logging.DEBUG, "started pid %d", handler.pid)
        if queue.log_payload:
            preview = job.stdin_bytes()[: queue.log_payload]
            handler.log(logging.INFO, "payload (first %d bytes): %r", queue.log_payload, preview)

    def finish(self, handler: Handler) -> None:
        """The handler's leader exited: reap it, decide, settle."""
        del self.running[handler.pid]
        del self.by_entry[entry_key(handler.queue, handler.job)]
        for fd in (handler.pidfd, *handler.output_fds(), handler.input_fd()):
            if fd is not None and fd in self.poller:
                self.poller.unregister(fd)
        try:
            status = handler.exited(handler.reap())
        except Exception:
            handler.log(logging.ERROR, "internal error after exit; releasing it")
            log.exception("while finishing pid %d", handler.pid)
            self.settle(handler.queue, handler.job, policy.Decision(policy.Action.RELEASE))
            return
        decision = policy.decide(
            handler.queue, handler.job.attempt, status,
            handler.stopped_for_shutdown, handler.lease_lost,
        )  # fmt: skip
        took = time.monotonic() - handler.started
        self.metrics.of(handler.queue.name).duration.observe(took)
        level = logging.INFO if decision.action is policy.Action.ACK else logging.WARNING
        handler.log(level, "%s after %.3fs: %s", status.describe(), took, describe(decision))
        self.settle(
            handler.queue, handler.job, decision, status, handler.stderr_tail(),
            timing=(handler.waited, took),
        )  # fmt: skip

    def settle(
        self,
        queue: QueueConfig,
        job: Job,
        decision: policy.Decision,
        status: ExitStatus | None = None,
        error_text: bytes = b"",
        timing: tuple[float, float] | None = None,
    ) -> None:
        """Carry out a decision and free the job's slot. ``error_text``: the stderr tail, or
        why the handler could not start; ``timing``: enqueue-to-start and run time, seconds."""
        mark = job.mark_key(queue.keys, queue.dedupe_window is not None)
        outcome = Outcome(ACK, queue, job.message_id, job.job_id, mark=mark, timing=timing)
        action = decision.action
        if action is policy.Action.ACK:
            self.metrics.of(queue.name).succeeded.inc()
        elif action is policy.Action.HAND_BACK:
            outcome = replace(outcome, kind=HAND_BACK)
        elif action is policy.Action.RETRY:
            self.metrics.of(queue.name).retried.inc()
            delay_ms = int(decision.delay * 1000)  # from now on Redis's clock: retry.lua
            outcome = replace(
                outcome, kind=RETRY, retry_fields=job.next_attempt_fields(), delay_ms=delay_ms
            )
        elif action is policy.Action.DEAD_LETTER:
            error = decision.error or dead_letter.EXIT
            self.metrics.dead_lettered.labels(queue=queue.name, error=error).inc()
            failure = dead_letter.Failure(
                error,
                attempts=job.attempt,
                exit_code=status.code if status else None,
                signal=status.signal if status else None,
                stderr=error_text,
            )
            outcome = replace(outcome, kind=DEAD_LETTER, failure=failure)
        if action is policy.Action.RELEASE:
            self.holdings.discard(lease.key(queue), [job.message_id])
        else:
            self.outcomes.append(outcome)
        self.freed[queue.name] += 1

    # -- deadlines and stopping -----------------------------------------------------------

    def enforce_deadlines(self) -> None:
        now = time.monotonic()
        if now >= self.stop_at:
            self.stop_at = float("inf")
            for handler in self.running.values():
                if handler.state is State.RUNNING:
                    handler.log(
                        logging.WARNING, "still running at the end of shutdown_grace; stopping it"
                    )
                    handler.stopped_for_shutdown = True
                    self.stop_handler(handler, now)
        if now < self.next_due:
            return
        self.next_due = float("inf")
        for handler in self.running.values():
            if handler.due <= now:
                if handler.state is State.RUNNING:
                    handler.log(
                        logging.WARNING, "timed out after %gs; SIGTERM", handler.queue.timeout
                    )
                    handler.timed_out = True
                    self.stop_handler(handler, now)
                else:
                    handler.log(logging.WARNING, "still running %gs after SIGTERM; SIGKILL",
                                handler.queue.kill_grace)  # fmt: skip
                    handler.kill()
                    handler.due = float("inf")
            self.next_due = min(self.next_due, handler.due)

    def stop_handler(self, handler: Handler, now: float) -> None:
        handler.terminate()
        handler.due = now + handler.queue.kill_grace  # from now on: when SIGKILL is due
        self.next_due = min(self.next_due, handler.due)

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
        for reader in self.readers.values():
            reader.stop()

    # -- reload ---------------------------------------------------------------------------

    def reload(self) -> None:
        """SIGHUP: apply a changed config file, or keep the running one if it is invalid."""
        if self.stopping:
            return
        self.notifier.reloading()
        try:
            new = load(self.config.path, hardening.config_environ())  # secrets forgotten
        except ConfigError as exc:
            for problem in exc.problems:
                log.error("reload refused: %s", problem.format(exc.path))
            log.error("reload refused: %d problem(s); the running config stays", len(exc.problems))
            self.notifier.ready(self.status_line())
            return
        fixed = ("redis", "metrics_listen", "dashboard")  # read once, by threads started once
        if changed := [name for name in fixed if getattr(new, name) != getattr(self.config, name)]:
            log.error(
                "reload refused: changing %s needs a restart; nothing changed",
                " or ".join(name.split("_")[0] for name in changed),
            )
            self.notifier.ready(self.status_line())
            return
        old, self.config = self.config, new
        for name in old.queues.keys() - new.queues.keys():
            running = self.running_in(name)
            log.info("reload: queue %s removed; %d running handler(s) finish first", name, running)
            self.retire_reader(name)
        for name, q in new.queues.items():
            if name not in old.queues:
                log.info("reload: queue %s added", name)
                self.add_queue(q)
            elif old.queues[name] != q:
                log.info("reload: queue %s changed; running handlers finish as they started", name)
                self.warn_if_moved(old.queues[name], q)
                self.retire_reader(name)
                self.add_queue(q)
        self.queues_changed()
        self.ticker.replace(self.periodic_duties())
        for name in new.queues:
            self.metrics.of(name)
        self.notifier.ready(self.status_line())
        log.info("reload done: %s", ", ".join(new.queues))

    def warn_if_moved(self, old: QueueConfig, new: QueueConfig) -> None:
        """A queue moved to other streams leaves behind what its old ones still hold: entries
        not delivered yet and its delayed set (retries, delayed jobs). jobd does not move them
        (on a cluster the two may be in different slots, out of one script's reach); it says
        what is left, so an operator can keep a queue on the old stream until it drains."""
        for before, after in zip(old.all_levels(), new.all_levels(), strict=False):
            if before.stream == after.stream:
                continue
            try:
                delayed = self.ticker_client.zcard(before.keys.delayed)
                length = self.ticker_client.xlen(before.stream)
            except redisconn.UNAVAILABLE:
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


OPEN_FILES = 65536


def raise_open_files_limit() -> None:
    """Each running handler costs up to three pipe ends: lift the soft limit on open files
    (1024 by default outside systemd: too few for a thousand handlers) to 65536, or the hard
    limit if lower. Handlers inherit it; `limits.open_files` sets theirs explicitly."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def malformed(queue: QueueConfig, job: Job) -> str | None:
    """Why this job must not run at all, if it must not."""
    if (width := job.too_wide()) is not None:
        return f"{width} fields with jobd's: more than jobd can retry or dead-letter ({MAX_FIELDS})"
    if job.payload_size() > queue.max_payload:
        return f"payload of {job.payload_size()} bytes is above max_payload ({queue.max_payload})"
    return None


def describe(decision: policy.Decision) -> str:
    if decision.action is policy.Action.RETRY:
        return f"retry in {decision.delay:.1f}s"
    if decision.action is policy.Action.DEAD_LETTER:
        return f"dead-lettered ({decision.error})"
    return decision.action.value


def _note_signal(signum: int, frame: object) -> None:
    """Signals are acted on by the loop, which reads them from the wakeup fd."""


def _drain(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def run(config: Config, log_level: str = "INFO", log_format: str = "text") -> int:
    logs.setup(log_level, log_format)
    hardening.protect_process(config.path)  # before any handler or embedded Redis starts
    return Daemon(config).run()
