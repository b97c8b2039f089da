"""The daemon: one selector loop that owns every handler process.

The loop, as an algorithm:

    until stopped and every handler has ended:
        wait for an event: a signal, jobs delivered by a reader, handler output or input room
        reap the handlers that exited; decide each outcome and pass it to the recorder
        stop the handlers past their timeout (SIGTERM, then SIGKILL after kill_grace)
        start a handler for each job delivered

Redis stays off this loop: reader threads fetch jobs (``reader``), a recorder thread writes
outcomes (``recorder``). Signals only leave a byte in a pipe; the loop acts on them.

Shutdown order (SIGTERM/SIGINT): stop the readers so no new job is taken; hand back jobs read
but not started; let running handlers finish for up to ``shutdown_grace``, then SIGTERM them
and SIGKILL after ``kill_grace``; hand back the entries of handlers stopped that way; then let
the recorder write everything and exit. A second SIGTERM skips the rest of the grace period.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import selectors
import signal
import socket
import time
from dataclasses import replace

from jobd import dead_letter, exitcodes, logs, policy, redisconn
from jobd.config import Config
from jobd.delayed import Forwarder
from jobd.duties import Duty, Ticker
from jobd.handler import ExitStatus, Handler, SpawnError, State, reap_children
from jobd.janitor import Janitor
from jobd.job import Job
from jobd.lease import Holdings, Lost, Renewal
from jobd.reader import Reader, Slots
from jobd.recorder import ACK, DEAD_LETTER, HAND_BACK, RETRY, Outcome, Recorder
from jobd.retention import Trimmer
from jobd.scripts import Scripts

log = logging.getLogger("jobd.daemon")

IDLE_WAIT = 1.0  # longest select() when nothing is due
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def consumer_name() -> str:
    """Unique per daemon process, and readable: which host and pid holds a job."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.consumer = consumer_name()
        self.selector = selectors.DefaultSelector()
        self.running: dict[int, Handler] = {}
        self.by_entry: dict[tuple[str, str], Handler] = {}  # (queue, message id) → handler
        self.delivered: collections.deque[Job] = collections.deque()
        self.lost: collections.deque[Lost] = collections.deque()
        self.slots = {name: Slots(q.concurrency) for name, q in config.queues.items()}
        self.holdings = Holdings(config.queues)
        self.recorder = Recorder(config.redis, self.consumer, self.holdings)
        self.ticker_client = redisconn.client(config.redis, "jobd-ticker")
        self.ticker = Ticker(self.periodic_duties(Scripts(self.ticker_client)))
        self.readers = [
            Reader(q, config.redis, self.consumer, self.slots[name], self.holdings, self.deliver)
            for name, q in config.queues.items()
        ]
        self.stopping = False
        self.stop_at = float("inf")  # when handlers still running at shutdown are stopped
        self.next_due = float("inf")  # earliest handler deadline or kill time
        self._signal_r, self._signal_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def periodic_duties(self, scripts: Scripts) -> list[Duty]:
        duties: list[Duty] = []
        for q in self.config.queues.values():
            duties.append(Renewal(scripts, q, self.consumer, self.holdings, self.report_lost))
            duties.append(Forwarder(scripts, q))
            duties.append(Janitor(self.ticker_client, scripts, q, self.consumer))
            if q.retention_maxlen is not None:
                duties.append(Trimmer(scripts, q, q.retention_maxlen))
        return duties

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        self.install_signal_handlers()
        self.selector.register(self._signal_r, selectors.EVENT_READ, "signal")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.recorder.start()
        self.ticker.start()
        for reader in self.readers:
            reader.start()
        log.info(
            "jobd running as consumer %s: %s on %s",
            self.consumer,
            ", ".join(
                f"{q.name} (stream {q.stream}, x{q.concurrency})"
                for q in self.config.queues.values()
            ),
            self.config.redis.redacted_url(),
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
        log.info("jobd stopped")
        return exitcodes.OK

    def step(self) -> None:
        for key, _ in self.selector.select(self.wait_time()):
            if key.data == "signal":
                self.on_signals()
            elif key.data == "wake":
                _drain(self._wake_r)
                self.on_lost()
            else:
                self.on_handler_io(key)
        self.enforce_deadlines()
        self.start_delivered()

    def finished(self) -> bool:
        return (
            self.stopping
            and not self.running
            and not self.delivered
            and not any(r.is_alive() for r in self.readers)
        )

    def wait_time(self) -> float:
        if self.delivered:
            return 0
        due = min(self.next_due, self.stop_at) - time.monotonic()
        return max(0.0, min(due, IDLE_WAIT))

    # -- events ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for signum in (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, _note_signal)
        signal.set_wakeup_fd(self._signal_w, warn_on_full_buffer=False)

    def on_signals(self) -> None:
        for signum in _drain(self._signal_r):
            if signum == signal.SIGCHLD:
                self.reap()
            elif signum in STOP_SIGNALS:
                self.begin_stop(signal.Signals(signum).name)
            elif signum == signal.SIGHUP:
                log.warning("SIGHUP: reloading the config is not supported yet; restart to apply")
        self.reap()  # signals coalesce: a pass that saw any signal also looks for exits

    def deliver(self, jobs: list[Job]) -> None:
        """Called by reader threads: queue jobs for the loop and wake it."""
        self.delivered.extend(jobs)
        with contextlib.suppress(BlockingIOError):  # full: the loop is already due to wake
            os.write(self._wake_w, b"\0")

    def report_lost(self, lost: list[Lost]) -> None:
        """Called by lease renewal (ticker thread): entries this daemon no longer holds."""
        self.lost.extend(lost)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def on_lost(self) -> None:
        """Stop the handler of each entry whose lease was lost; never settle those entries."""
        while self.lost:
            lost = self.lost.popleft()
            to = f"consumer {lost.owner}" if lost.owner else "nobody (acked elsewhere, or trimmed)"
            handler = self.by_entry.get((lost.queue, lost.message_id))
            if handler is not None:
                handler.log(
                    logging.WARNING,
                    "lease lost: the entry now belongs to %s; stopping the handler",
                    to,
                )
                handler.lease_lost = True
                if handler.state is State.RUNNING:
                    self.stop_handler(handler, time.monotonic())
                continue
            for job in [
                j
                for j in self.delivered
                if (j.queue, j.message_id) == (lost.queue, lost.message_id)
            ]:
                log.warning(
                    "queue=%s job=%s lease lost before it started; not starting it",
                    job.queue,
                    job.job_id,
                )
                self.delivered.remove(job)
                self.slots[job.queue].give()

    def on_handler_io(self, key: selectors.SelectorKey) -> None:
        handler, direction = key.data
        if handler.state is State.EXITED:
            return  # reaped earlier in this pass: its fds are already closed
        if direction == "in":
            if handler.write_input():
                self.selector.unregister(key.fd)
        elif handler.read_output(key.fd):
            self.selector.unregister(key.fd)

    # -- starting and ending handlers -----------------------------------------------------

    def start_delivered(self) -> None:
        while self.delivered:
            job = self.delivered.popleft()
            if self.stopping:
                log.info("queue=%s job=%s read as jobd stopped: handed back", job.queue, job.job_id)
                self.settle(job, policy.Decision(policy.Action.HAND_BACK))
            elif (reason := self.malformed(job)) is not None:
                log.error("queue=%s job=%s %s: dead-lettered unrun", job.queue, job.job_id, reason)
                decision = policy.Decision(policy.Action.DEAD_LETTER, dead_letter.MALFORMED)
                self.settle(job, decision, error_text=reason.encode())
            else:
                self.start(job)

    def malformed(self, job: Job) -> str | None:
        """Why this job must not run at all, if it must not."""
        limit = self.config.queues[job.queue].max_payload
        if job.payload_size() > limit:
            return f"payload of {job.payload_size()} bytes is above max_payload ({limit})"
        return None

    def start(self, job: Job) -> None:
        queue = self.config.queues[job.queue]
        try:
            handler = Handler.spawn(job, queue)
        except Exception as exc:
            if not isinstance(exc, SpawnError):
                log.exception("queue=%s job=%s cannot start the handler", job.queue, job.job_id)
            decision = policy.decide(queue, job.attempt, None)
            log.error("queue=%s job=%s %s: %s", job.queue, job.job_id, exc, describe(decision))
            self.settle(job, decision, error_text=str(exc).encode())
            return
        self.running[handler.pid] = handler
        self.by_entry[(job.queue, job.message_id)] = handler
        for fd in handler.output_fds():
            self.selector.register(fd, selectors.EVENT_READ, (handler, "out"))
        stdin = handler.input_fd()
        if stdin is not None:
            self.selector.register(stdin, selectors.EVENT_WRITE, (handler, "in"))
        self.next_due = min(self.next_due, handler.due)
        handler.log(logging.DEBUG, "started pid %d (attempt %d)", handler.pid, job.attempt)
        if queue.log_payload:
            preview = job.stdin_bytes()[: queue.log_payload]
            handler.log(logging.INFO, "payload (first %d bytes): %r", queue.log_payload, preview)

    def reap(self) -> None:
        for handler, wait_status in reap_children(self.running):
            del self.running[handler.pid]
            del self.by_entry[(handler.job.queue, handler.job.message_id)]
            for fd in (*handler.output_fds(), handler.input_fd()):
                if fd is not None and fd in self.selector.get_map():
                    self.selector.unregister(fd)
            try:
                status = handler.exited(wait_status)
            except Exception:
                log.exception(
                    "queue=%s job=%s internal error after exit; releasing it",
                    handler.job.queue,
                    handler.job.job_id,
                )
                self.settle(handler.job, policy.Decision(policy.Action.RELEASE))
                continue
            decision = policy.decide(
                handler.queue, handler.job.attempt, status,
                handler.stopped_for_shutdown, handler.lease_lost,
            )  # fmt: skip
            took = time.monotonic() - handler.started
            level = logging.INFO if decision.action is policy.Action.ACK else logging.WARNING
            handler.log(level, "%s after %.3fs: %s", status.describe(), took, describe(decision))
            self.settle(handler.job, decision, status, handler.stderr_tail())

    def settle(
        self,
        job: Job,
        decision: policy.Decision,
        status: ExitStatus | None = None,
        error_text: bytes = b"",
    ) -> None:
        """Carry out a decision and free the job's slot. ``error_text``: the stderr tail, or
        why the handler could not start."""
        queue = self.config.queues[job.queue]
        outcome = Outcome(ACK, queue, job.message_id, job.job_id)
        action = decision.action
        if action is policy.Action.HAND_BACK:
            outcome = replace(outcome, kind=HAND_BACK)
        elif action is policy.Action.RETRY:
            due_ms = int((time.time() + decision.delay) * 1000)
            outcome = replace(
                outcome, kind=RETRY, retry_fields=job.next_attempt_fields(), due_ms=due_ms
            )
        elif action is policy.Action.DEAD_LETTER:
            failure = dead_letter.Failure(
                decision.error or dead_letter.EXIT,
                attempts=job.attempt,
                exit_code=status.code if status else None,
                signal=status.signal if status else None,
                stderr=error_text,
            )
            outcome = replace(outcome, kind=DEAD_LETTER, failure=failure)
        if action is policy.Action.RELEASE:
            self.holdings.discard(job.queue, [job.message_id])
        else:
            self.recorder.record(outcome)
        self.slots[job.queue].give()

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
                    handler.log(
                        logging.WARNING,
                        "still running %gs after SIGTERM; SIGKILL",
                        handler.queue.kill_grace,
                    )
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
        log.info(
            "%s: stopping; %d handler(s) running, waiting up to %gs for them",
            reason,
            len(self.running),
            self.config.shutdown_grace,
        )
        for reader in self.readers:
            reader.stop()


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


def run(config: Config, log_level: str = "INFO") -> int:
    logs.setup(log_level)
    return Daemon(config).run()
