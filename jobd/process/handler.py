"""The process seam: one running handler process and everything the OS does to it.

A handler is started by a clone or vfork and exec (``spawn``; subprocess when it needs another
folder or user; never preexec_fn, never a shell) in a session of its own (so in its own process
group, and no process of it can join a group of the daemon's session: setpgid across sessions
is refused), gets its payload on a pipe, and has its stdout and stderr drained by the daemon's
selector loop. Stopping it (SIGTERM, then SIGKILL) signals its whole tree, and nothing that
jobd cannot prove is the job's: the leader (its pidfd), its group and, where it has a cgroup,
every process in that cgroup and below it (``cgroup.kill`` for SIGKILL); where it has none,
every process of its session (whose number, the leader's pid, cannot be reused while the leader
is unreaped or any process is in the session; each signalled by a pidfd once it is seen still
there, so a pid freed meanwhile is never another process's signal; and SIGKILLed at the
leader's reap when jobd stopped it) and the processes that escaped it, adopted by the
subreaper and attributed to its job (``strays``, ``process.reaper``), with their own sessions.
A process
that escaped by ``setsid`` and is still some other process's child is reached by the cgroup
alone; without one, once it is adopted.

A handler owns its life: ``State`` RUNNING → (TERMINATING →) EXITED; ``stop(reason)`` sends
SIGTERM to its tree and makes SIGKILL due ``kill_grace`` later; ``due`` says when it must be
acted on next (its timeout, then its SIGKILL) and ``act(now)`` does it. The loop only asks: it
calls ``act`` on the handlers whose ``due`` has come, and ``exited()`` once the leader is reaped;
nothing is read from the process after that but what is left in its pipes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import signal
import time
from collections.abc import Callable, Iterable, Mapping

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.outcome import Outcome, Ran, Started
from jobd.process import chains, exitstatus, launch, results, spawn
from jobd.process.cgroup import Cgroup, Tree, Usage
from jobd.process.channel import ProgressOutput, Talking, Told
from jobd.process.deadline import Lapsed
from jobd.process.exitstatus import ExitStatus
from jobd.process.jobenv import attempt_environment
from jobd.process.output import STDERR_TAIL, Output
from jobd.process.procfs import Sessions
from jobd.process.states import SpawnError, State, StopReason, unstarted

log = logging.getLogger("jobd.handler")


class Handler(Talking):
    """One attempt of one job, running as a process group led by ``pid``; what it tells jobd
    of itself: ``Talking``."""

    exit_seen: float | None = None  # when the loop saw its leader's exit (``Handlers.exited``)
    # The config's queues when it started: where its follow-ups go (``chains.targets``).
    started_under: Mapping[str, QueueConfig] | None = None

    def __init__(self, job: Job, queue: QueueConfig, pid: int, uid: int, stdin: int | None,
                 stdout: int, stderr: int, placed: tuple[Tree, Cgroup] | None = None,
                 report: int | None = None) -> None:  # fmt: skip
        self.job = job
        self.placed = placed  # its cgroup and the tree it is in (process.cgroup), if any
        self.cgroup_usage: Usage | None = None  # what its cgroup used, once reaped
        self.queue = queue
        self.pid, self.uid = pid, uid  # the uid it runs as (launch.start): its files' owner
        self.state = State.RUNNING
        self.started = time.monotonic()
        self.waited = job.waited()  # enqueue (its stream id) to start, on Redis's clock
        # This attempt's timeout: the queue's, or the job's own jobd_timeout when shorter.
        self.timeout = job.timeout(queue)
        # When the loop must act on it next: at its timeout, then (once SIGTERMed) SIGKILL.
        self.due = self.started + self.timeout
        self.stop_reason: StopReason | None = None  # why jobd SIGTERMed it, if it did
        self.lease_lost = False  # its entry is someone else's now, whenever that was learnt
        self.cancelled = False  # `jobd cancel` asked for it, whenever that was learnt
        self.told: Told | None = None  # what it said of itself (``process.channel``), if anything
        plain = ProgressOutput if queue.progress_from_output else Output
        out = chains.output_class(queue, plain) if queue.then else plain  # process.chains
        self.stdout = out(self, "stdout", queue.history.output)
        self.stderr = Output(self, "stderr", max(queue.history.output, STDERR_TAIL))
        self.stdin_fd = stdin  # our end of its stdin pipe, until all is written
        self.pending_input = memoryview(b"")
        self.status: ExitStatus | None = None
        self.usage: resource.struct_rusage | None = None  # wait4's, once reaped
        self._outputs = {stdout: self.stdout, stderr: self.stderr}
        # Started without waiting for its exec: where a failure to get there is told, read
        # once it is reaped (``spawn.start_error``); then that failure, if any.
        self.report = report
        self.start_error: SpawnError | None = None
        # Told so once reaped: it reached its exec past its start's deadline and did not exec
        # (``deadline.Lapsed``): the job never started here.
        self.lapsed = False
        # Readable once the leader has exited. Watching each handler's own pidfd, never
        # waiting for "any child", leaves every other child alone (the embedded Redis, a
        # handler another thread is just starting).
        self.pidfd = os.pidfd_open(pid)
        # The processes that escaped its session, adopted by the subreaper and attributed to
        # its job (``process.reaper``; set by whoever runs it): signalled with it.
        self.strays: Callable[[], Iterable[int]] = tuple
        # jobd's span of this attempt (``jobd.tracing``), ended with its outcome; None unless
        # tracing is on and the job carries a trace context.
        self.span: object | None = None
        # Its result once it exited: the channel's X_JOBD_RESULT (``result``, preferred), else
        # its JOBD_RESULT file's (process.results); or why it fails the attempt.
        self.kept_result: bytes | None = None
        self.result_path: str | None = None
        self.result_error: str | None = None

    # -- starting -------------------------------------------------------------------------

    @classmethod
    def spawn(
        cls, job: Job, queue: QueueConfig, here: str, tree: Tree | None = None, deadline:
        int | None = None, notify: str | None = None, hear: Callable[[int], object] | None = None,
    ) -> Handler:  # fmt: skip
        """Start the handler with its payload pipe filled as far as it goes.

        The fast path is ``spawn`` (a clone that the daemon does not wait for, or vfork; no
        Python in the child) when the handler runs in the daemon's own folder ``here`` as the
        daemon's user; otherwise subprocess.Popen, which can change folder and identity. With
        a ``tree``, in a cgroup of its own (``process.cgroup``). A failure to start raises
        SpawnError, or, where the start was not waited for, is ``start_error`` once reaped.
        Past ``deadline`` (CLOCK_BOOTTIME nanoseconds: until when the job's lease is known to
        hold) the handler does not exec: ``deadline.Lapsed`` is raised, or, where the start was
        not waited for, ``lapsed`` is set once reaped (``process.deadline``). ``notify``: the
        daemon's channel (NOTIFY_SOCKET); ``hear``: ``launch.start``'s."""
        payload = job.stdin_bytes()
        job_env, span, result_path = attempt_environment(job, queue, len(payload), notify)
        try:  # a start that fails leaves nothing behind (``_pipes``, ``piped``, ``_made``)
            pipes = _pipes(3 if payload else 2)
            started, ours = launch.piped(queue, here, job_env, payload, pipes, tree, deadline,
                                         hear)  # fmt: skip
            return cls._made(job, queue, started, ours, payload, span, result_path)
        except Exception as exc:  # its span goes with the error (``states.unstarted``)
            if (failed := unstarted(queue, exc, span)) is exc:  # Lapsed; a bug
                raise
            raise failed from exc

    @classmethod
    def _made(
        cls, job: Job, queue: QueueConfig, started: launch.Started,
        ours: tuple[int, int, int | None], payload: bytes, span: object, result_path: str | None,
    ) -> Handler:  # fmt: skip
        """The handler of the process ``launch.piped`` started, with our ends of its pipes;
        should making it fail (its pidfd at the descriptor limit), the process is killed and
        reaped, our ends closed (``launch.abandon``), before the error goes on."""
        (pid, report, placed, uid), (out_r, err_r, in_w) = started, ours
        handler: Handler | None = None
        try:
            handler = cls(job, queue, pid, uid, in_w, out_r, err_r, placed, report)
            handler.span, handler.result_path = span, result_path
            if in_w is not None:  # a larger payload: written as the handler reads it
                os.set_blocking(in_w, False)
                handler.pending_input = memoryview(payload)
                if handler.write_input():
                    handler.close_input()  # not in any selector yet
            return handler
        except BaseException:
            launch.abandon(started, (*ours, None if handler is None else handler.pidfd))
            raise

    # -- I/O, driven by the daemon's loop --------------------------------------------------

    def output_fds(self) -> list[int]:
        return list(self._outputs)

    def input_fd(self) -> int | None:
        return self.stdin_fd

    # A descriptor is closed only after the caller has taken it out of its epoll: closed
    # first, its number could be reused (for the next handler) while the epoll entry of the old
    # file lives on in a child another thread is just starting (the embedded Redis's
    # supervisor), and that entry's events would then be read as the new descriptor's; with
    # output pipes read blocking, a false "readable" would stall the loop.

    def write_input(self) -> bool:
        """Write what the pipe takes; True once all is written or the reader is gone (then
        ``close_input``)."""
        if self.stdin_fd is None:
            return True
        try:
            while self.pending_input:
                written = os.write(self.stdin_fd, self.pending_input)
                self.pending_input = self.pending_input[written:]
        except BlockingIOError:
            return False
        except BrokenPipeError:
            pass  # the handler exited or closed stdin without reading: that is its right
        self.pending_input = memoryview(b"")
        return True

    def close_input(self) -> None:
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def read_output(self, fd: int) -> bool:
        """Read what ``fd`` has (it is readable: this does not block); True at end of file
        (then ``close_output``)."""
        data = os.read(fd, 65536)
        if not data:
            return True
        self._outputs[fd].feed(data)
        return False

    def close_output(self, fd: int) -> None:
        self._outputs.pop(fd).close()
        os.close(fd)

    # -- stopping -------------------------------------------------------------------------

    def stop(self, reason: StopReason, now: float, scan: Sessions | None = None) -> None:
        """SIGTERM to its tree, SIGKILL due ``kill_grace`` later (``act``). A handler
        already stopping keeps its reason and its SIGKILL time; a lost lease is noted whatever
        the state."""
        self.lease_lost |= reason is StopReason.LEASE_LOST
        self.cancelled |= reason is StopReason.CANCEL
        if self.state is not State.RUNNING:
            return
        self.stop_reason = reason
        if reason is StopReason.TIMEOUT:
            self.log(logging.WARNING, "timed out after %.3fs; SIGTERM", now - self.started)
        elif reason is StopReason.WATCHDOG:
            self.log(logging.WARNING, "watchdog: no WATCHDOG=1 for %gs; SIGTERM",
                     self.queue.watchdog)  # fmt: skip
        elif reason is StopReason.SHUTDOWN:
            self.log(logging.WARNING, "still running at the end of shutdown_grace; stopping it")
        self.state = State.TERMINATING
        self._signal_tree(signal.SIGTERM, scan=scan)
        self.due = now + self.queue.kill_grace  # from now on: when SIGKILL is due

    def act(self, now: float, scan: Sessions | None = None, heard: float = math.inf) -> float:
        """Do what is due by ``now`` (the timeout's SIGTERM, or SIGKILL after the grace);
        returns when this handler is due next. Its watchdog stops it only when its channel
        was heard out (``heard``: every message sent before then is taken) past its due time:
        until then it waits (still RUNNING, its ``due`` past), as long as its timeout allows."""
        if self.due <= now:
            if self.state is State.RUNNING:
                told, watchdog = self.told, self.queue.watchdog
                lapsed = told is not None and told.watchdog_lapsed(now, watchdog)
                if told is not None and lapsed and not told.watchdog_lapsed(heard, watchdog):
                    deadline = told.due(self.started + self.timeout, None)
                    if deadline > now:
                        return deadline  # the channel is behind: it may have spoken
                    lapsed = False
                self.stop(StopReason.WATCHDOG if lapsed else StopReason.TIMEOUT, now, scan)
            elif self.state is State.TERMINATING:
                self.log(logging.WARNING, "still running %gs after SIGTERM; SIGKILL",
                         self.queue.kill_grace)  # fmt: skip
                self.kill(scan=scan)
                self.due = float("inf")
        return self.due

    def ending(self) -> StopReason | None:
        """Why jobd ended it, for the policy: a lost lease above all, then a cancellation, else
        why it was stopped."""
        if self.lease_lost:
            return StopReason.LEASE_LOST
        return StopReason.CANCEL if self.cancelled else self.stop_reason

    def kill(self, whole: bool = True, scan: Sessions | None = None) -> None:
        """SIGKILL to its tree (``_signal_tree``)."""
        if self.state is not State.EXITED:
            self._signal_tree(signal.SIGKILL, whole, scan)

    def _signal_tree(self, signum: int, whole: bool = True, scan: Sessions | None = None) -> None:
        """``signum`` to every process of the handler jobd can prove is its job's (the module
        docstring); never to another. Called while the leader is unreaped: its pid, which
        numbers its group and its session, is no other process's. Not ``whole``: without a
        cgroup, the leader and its group only (a look at every process's session costs a read
        of /proc per process: for a stop, not for every job's end; ``scan``, one such look
        shared by the handlers one pass stops)."""
        # Before its setsid, the leader alone; one that exec'd a setuid program may refuse (the
        # group's signal below says so).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            signal.pidfd_send_signal(self.pidfd, signum)
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as exc:  # a member changed its uid: nothing more we can do
            self.log(logging.WARNING, "cannot signal process group %d: %s", self.pid, exc)
        if self.placed is not None:  # every process in its cgroup, whatever group or session
            tree, cgroup = self.placed
            if signum == signal.SIGKILL:
                tree.kill(cgroup)
            else:
                cgroup.send(signum)
            return
        if whole:  # its session, and its strays with theirs (``Sessions.signal``)
            (scan or Sessions()).signal(self.pid, self.strays(), signum)

    def reap(self) -> int:
        """The leader exited (its pidfd is readable): end what is left of its group, then
        collect its wait status and its resource usage (``usage``: wait4's). While the leader
        is a zombie its pid, which is the group id, cannot be reused, so SIGKILL to the group
        reaches only this handler's descendants; with a cgroup, every process in it, escaped
        from the group or not. A handler jobd stopped (TERMINATING) is killed whole: its SIGKILL
        was due anyway, and without a cgroup a process of its session in a group of its own
        would outlive a leader that died of the SIGTERM (the session's number, the leader's
        pid, is still the handler's: the zombie holds it). (What left the group of a handler
        that ended by itself, without a cgroup, is the sweep's: ``process.reaper``.)"""
        self.kill(whole=self.state is State.TERMINATING)
        _, wait_status, self.usage = os.wait4(self.pid, 0)
        os.close(self.pidfd)
        if self.report is not None:
            failed, self.report = spawn.start_error(self.report), None
            if isinstance(failed, Lapsed):
                self.lapsed = True
            elif failed is not None:
                self.start_error = SpawnError.of(self.queue, failed)
        if self.placed is not None:
            tree, cgroup = self.placed
            self.cgroup_usage = cgroup.usage()
            tree.end(cgroup)
        return wait_status

    def exited(self, wait_status: int) -> ExitStatus:
        """The leader was reaped: drain the pipes, close everything (the caller has taken
        every descriptor out of its selector)."""
        self.state = State.EXITED
        code = os.waitstatus_to_exitcode(wait_status)
        self.close_input()
        for fd in self.output_fds():
            # What the group wrote before it ended; a setsid escapee that keeps the pipe open
            # cannot keep us waiting. (Usually nothing is left: the loop reads output before
            # exits, and a pipe's end of file comes with its writer's exit.)
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                while not self.read_output(fd):
                    pass
            self.close_output(fd)
        if self.told is not None:
            self.log(logging.DEBUG, "told jobd: %s", self.told.describe())
        usage, used = self.usage, self.cgroup_usage
        cpu = None if usage is None else usage.ru_utime + usage.ru_stime
        peak = exitstatus.peak(usage)
        if used is not None:  # the cgroup's figures take in the whole tree, escapees too
            cpu = cpu if used.cpu_seconds is None else used.cpu_seconds
            peak = peak if used.peak_bytes is None else used.peak_bytes
            if used.oom_killed and self.stop_reason is None:
                self.log(logging.WARNING, "OOM-killed in its cgroup (resources.memory)")
                self.stop_reason = StopReason.MEMORY
        self.status = ExitStatus(
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            timed_out=self.stop_reason in (StopReason.TIMEOUT, StopReason.WATCHDOG),
            watchdog=self.stop_reason is StopReason.WATCHDOG,
            cpu_seconds=cpu,
            max_rss_bytes=peak,
        )
        self.kept_result, self.result_error = results.collected(
            self.result_path, self.result, self.queue, self.status.ok, self.uid
        )
        return self.status

    def detail(self) -> bytes:
        """For its record: its stderr tail, and a last line when its watchdog stopped it."""
        if self.stop_reason is StopReason.WATCHDOG:
            return bytes(self.stderr.tail) + b"\njobd: stopped by its watchdog\n"
        return bytes(self.stderr.tail)

    def noted(self) -> Started:
        """It runs: for its job's active record."""
        return Started(self.queue, self.job, self.pid, self.started, self.timeout)

    def ran(self, status: ExitStatus, seconds: float) -> Ran:
        """How it ran, for the job's history record."""
        told = self.told
        progress, said = (None, None) if told is None else (told.progress, told.status)
        return Ran(self.pid, self.started, seconds, status.code, status.signal,
                   bytes(self.stdout.tail), bytes(self.stderr.tail), status.cpu_seconds,
                   status.max_rss_bytes, progress, said)  # fmt: skip

    def log(self, level: int, message: str, *args: object, outcome: Outcome | None = None) -> None:
        """A line about this job: its tag first; ``outcome``, the one this line says (its
        fields in the journal: ``Outcome.journal``)."""
        if log.isEnabledFor(level):  # the tag is built for every job: not for nothing
            extra = None if outcome is None else outcome.journal()
            log.log(level, "%s " + message, self.job.tag(self.queue.name), *args, extra=extra)


def _pipes(count: int) -> list[int]:
    """``count`` pipes, each read end then write end: a handler's stdout, its stderr, its stdin
    for a payload. Should one fail (EMFILE: a daemon at its descriptor limit), those made are
    closed. Blocking pipes: O_NONBLOCK on pipe2 would reach the handler's ends too. Ours stay
    blocking as well (one syscall less each): output is read once per readiness, which never
    blocks, and a payload is written ahead only when the empty pipe surely takes it."""
    made: list[int] = []
    try:
        for _ in range(count):
            made += os.pipe2(os.O_CLOEXEC)
    except BaseException:
        for fd in made:
            os.close(fd)
        raise
    return made
