"""The process seam: one running handler process and everything the OS does to it.

A handler is started by a clone or vfork and exec (``spawn``; subprocess when it needs another
folder or user; never preexec_fn, never a shell) in its own process group, gets its payload on a
pipe, and has its stdout and stderr drained by the daemon's selector loop. Stopping it
signals the whole group: SIGTERM, then SIGKILL.

A handler owns its life: ``State`` RUNNING → (TERMINATING →) EXITED; ``stop(reason)`` sends
SIGTERM to the group and makes SIGKILL due ``kill_grace`` later; ``due`` says when it must be
acted on next (its timeout, then its SIGKILL) and ``act(now)`` does it. The loop only asks: it
calls ``act`` on the handlers whose ``due`` has come, and ``exited()`` once the leader is reaped;
nothing is read from the process after that but what is left in its pipes.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import resource
import select
import signal
import time
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.job import Job
from jobd.outcome import Ran, Started
from jobd.process import launch, spawn
from jobd.process.cgroup import Cgroup, Tree, Usage
from jobd.process.output import Output
from jobd.process.procfs import own_status

log = logging.getLogger("jobd.handler")

STDERR_TAIL = 4096  # bytes of stderr kept for the dead-letter record


class State(enum.Enum):
    RUNNING = "running"
    TERMINATING = "terminating"  # SIGTERM sent to the group; SIGKILL follows after kill_grace
    EXITED = "exited"


class StopReason(enum.Enum):
    """Why jobd stopped a handler before it ended by itself (the policy reads it)."""

    TIMEOUT = "timed out"
    SHUTDOWN = "still running at the end of shutdown_grace"
    LEASE_LOST = "lease lost"
    CANCEL = "cancelled (jobd cancel)"
    MEMORY = "over resources.memory"


class SpawnError(Exception):
    """The handler could not be started (missing, not executable, bad interpreter line)."""

    @classmethod
    def of(cls, queue: QueueConfig, exc: OSError) -> SpawnError:
        return cls(f"cannot start {queue.command[0]!r}: {exc.strerror or exc}")


@dataclass(frozen=True, slots=True)
class ExitStatus:
    code: int | None  # the exit code, or None when a signal killed it
    signal: int | None
    timed_out: bool
    # What it cost, from wait4's rusage: the leader and the descendants it waited for.
    cpu_seconds: float | None = None  # user + system
    max_rss_bytes: int | None = None  # the largest resident set of any one of them

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out

    def describe(self) -> str:
        what = f"exit {self.code}" if self.code is not None else f"signal {_signame(self.signal)}"
        return f"timed out ({what})" if self.timed_out else what

    def cost(self) -> str:
        """For the log line that ends a job: ' (cpu 0.012s, max rss 93.1MiB)', or ''."""
        if self.cpu_seconds is None:
            return ""
        rss = "" if self.max_rss_bytes is None else f", max rss {self.max_rss_bytes / 2**20:.1f}MiB"
        return f" (cpu {self.cpu_seconds:.3f}s{rss})"


_own_peak = 0  # the daemon's peak resident memory (KiB) when last read: it only grows


def _peak(usage: resource.struct_rusage | None) -> int | None:
    """A reaped handler's peak resident memory, in bytes, when it is known: until its exec a
    handler shares the daemon's memory (vfork, or spawn's clone), and the kernel counts that in
    its peak, so a peak no larger than the daemon's own says nothing of the handler (None). The
    daemon's own is read again only when a handler's is above it as last read."""
    global _own_peak
    if usage is None or usage.ru_maxrss <= _own_peak:
        return None
    _own_peak = _memory_peak()
    if usage.ru_maxrss <= _own_peak:
        return None
    return usage.ru_maxrss * 1024  # KiB on Linux


def _memory_peak() -> int:
    """The peak of the daemon's own memory, KiB (VmHWM): what a vfork child shares. Not
    getrusage's, which also holds the peak of whatever process exec'd the daemon (exec keeps
    it): started by a large process, the daemon took every handler smaller than that for the
    share, and reported none's peak."""
    peak = own_status(b"VmHWM:")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if peak is None else peak


def _signame(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name  # type: ignore[arg-type]
    except ValueError:
        return str(signum)


class Handler:
    """One attempt of one job, running as a process group led by ``pid``."""

    def __init__(self, job: Job, queue: QueueConfig, pid: int, stdin: int | None, stdout: int,
                 stderr: int, placed: tuple[Tree, Cgroup] | None = None,
                 report: int | None = None) -> None:  # fmt: skip
        self.job = job
        self.placed = placed  # its cgroup and the tree it is in (process.cgroup), if any
        self.cgroup_usage: Usage | None = None  # what its cgroup used, once reaped
        self.queue = queue
        self.pid = pid
        self.state = State.RUNNING
        self.started = time.monotonic()
        self.waited = max(0.0, time.time() - job.enqueued_at())  # enqueue (its stream id) to start
        # This attempt's timeout: the queue's, or the job's own jobd_timeout when shorter.
        self.timeout = job.timeout(queue)
        # When the loop must act on it next: at its timeout, then (once SIGTERMed) SIGKILL.
        self.due = self.started + self.timeout
        self.stop_reason: StopReason | None = None  # why jobd SIGTERMed it, if it did
        self.lease_lost = False  # its entry is someone else's now, whenever that was learnt
        self.cancelled = False  # `jobd cancel` asked for it, whenever that was learnt
        self.stdout = Output(self, "stdout", queue.history.output)
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
        # Readable once the leader has exited. Watching each handler's own pidfd, never
        # waiting for "any child", leaves every other child alone (the embedded Redis, a
        # handler another thread is just starting).
        self.pidfd = os.pidfd_open(pid)

    # -- starting -------------------------------------------------------------------------

    @classmethod
    def spawn(cls, job: Job, queue: QueueConfig, here: str, tree: Tree | None = None) -> Handler:
        """Start the handler with its payload pipe filled as far as it goes.

        The fast path is ``spawn`` (a clone that the daemon does not wait for, or vfork; no
        Python in the child) when the handler runs in the daemon's own folder ``here`` as the
        daemon's user; otherwise subprocess.Popen, which can change folder and identity. With
        a ``tree``, in a cgroup of its own (``process.cgroup``). A failure to start raises
        SpawnError, or, where the start was not waited for, is ``start_error`` once reaped.
        """
        payload = job.stdin_bytes()
        job_env = dict(  # the job's own variables, on top of the queue's environment
            JOBD_QUEUE=queue.name,
            JOBD_STREAM=queue.stream,
            JOBD_JOB_ID=job.job_id,
            JOBD_MESSAGE_ID=job.message_id,
            JOBD_ATTEMPT=str(job.attempt),
            JOBD_DEADLINE=str(int(time.time() + job.timeout(queue))),  # the job's own, if less
            # A handler whose daemon dies while the payload is still being written reads a
            # short stdin then EOF; this tells it so (extension of the contract, see README).
            JOBD_PAYLOAD_BYTES=str(len(payload)),
        )
        # Blocking pipes: O_NONBLOCK on pipe2 would reach the handler's ends too. Ours stay
        # blocking as well (one syscall less each): output is read once per readiness, which
        # never blocks, and a payload is written ahead only when the empty pipe surely takes it.
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if payload else (None, None)
        if in_w is not None and len(payload) <= select.PIPE_BUF:
            os.write(in_w, payload)  # a pipe holds at least PIPE_BUF bytes
            os.close(in_w)
            in_w = None
        child_ends = [fd for fd in (out_w, err_w, in_r) if fd is not None]
        try:
            pid, report, placed = launch.start(queue, here, job_env, in_r, out_w, err_w, tree)
        except OSError as exc:
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
            raise SpawnError.of(queue, exc) from exc
        finally:
            for fd in child_ends:
                os.close(fd)
        handler = cls(job, queue, pid, in_w, out_r, err_r, placed, report)
        if in_w is not None:  # a larger payload: written as the handler reads it
            os.set_blocking(in_w, False)
            handler.pending_input = memoryview(payload)
            if handler.write_input():
                handler.close_input()  # not in any selector yet
        return handler

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

    def stop(self, reason: StopReason, now: float) -> None:
        """SIGTERM to the process group, SIGKILL due ``kill_grace`` later (``act``). A handler
        already stopping keeps its reason and its SIGKILL time; a lost lease is noted whatever
        the state."""
        self.lease_lost |= reason is StopReason.LEASE_LOST
        self.cancelled |= reason is StopReason.CANCEL
        if self.state is not State.RUNNING:
            return
        self.stop_reason = reason
        if reason is StopReason.TIMEOUT:
            self.log(logging.WARNING, "timed out after %gs; SIGTERM", self.timeout)
        elif reason is StopReason.SHUTDOWN:
            self.log(logging.WARNING, "still running at the end of shutdown_grace; stopping it")
        self.state = State.TERMINATING
        self._signal_group(signal.SIGTERM)
        self.due = now + self.queue.kill_grace  # from now on: when SIGKILL is due

    def act(self, now: float) -> float:
        """Do what is due by ``now`` (the timeout's SIGTERM, or SIGKILL after the grace);
        returns when this handler is due next."""
        if self.due <= now:
            if self.state is State.RUNNING:
                self.stop(StopReason.TIMEOUT, now)
            elif self.state is State.TERMINATING:
                self.log(logging.WARNING, "still running %gs after SIGTERM; SIGKILL",
                         self.queue.kill_grace)  # fmt: skip
                self.kill()
                self.due = float("inf")
        return self.due

    def ending(self) -> StopReason | None:
        """Why jobd ended it, for the policy: a lost lease above all, then a cancellation, else
        why it was stopped."""
        if self.lease_lost:
            return StopReason.LEASE_LOST
        return StopReason.CANCEL if self.cancelled else self.stop_reason

    def kill(self) -> None:
        if self.state is not State.EXITED:
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as exc:  # a member changed its uid: nothing more we can do
            self.log(logging.WARNING, "cannot signal process group %d: %s", self.pid, exc)

    def reap(self) -> int:
        """The leader exited (its pidfd is readable): end what is left of its group, then
        collect its wait status and its resource usage (``usage``: wait4's). While the leader
        is a zombie its pid, which is the group id, cannot be reused, so SIGKILL to the group
        reaches only this handler's descendants."""
        self.kill()
        if self.placed is not None:  # everything in its cgroup, escaped from the group or not
            self.placed[0].kill(self.placed[1])
        _, wait_status, self.usage = os.wait4(self.pid, 0)
        os.close(self.pidfd)
        if self.report is not None:
            failed, self.report = spawn.start_error(self.report), None
            self.start_error = None if failed is None else SpawnError.of(self.queue, failed)
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
        usage, used = self.usage, self.cgroup_usage
        cpu = None if usage is None else usage.ru_utime + usage.ru_stime
        peak = _peak(usage)
        if used is not None:  # the cgroup's figures take in the whole tree, escapees too
            cpu = cpu if used.cpu_seconds is None else used.cpu_seconds
            peak = peak if used.peak_bytes is None else used.peak_bytes
            if used.oom_killed and self.stop_reason is None:
                self.log(logging.WARNING, "OOM-killed in its cgroup (resources.memory)")
                self.stop_reason = StopReason.MEMORY
        self.status = ExitStatus(
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            timed_out=self.stop_reason is StopReason.TIMEOUT,
            cpu_seconds=cpu,
            max_rss_bytes=peak,
        )
        return self.status

    def stderr_tail(self) -> bytes:
        return bytes(self.stderr.tail)

    def noted(self) -> Started:
        """It runs: for its job's active record."""
        return Started(self.queue, self.job, self.pid, self.started, self.timeout)

    def ran(self, status: ExitStatus, seconds: float) -> Ran:
        """How it ran, for the job's history record."""
        return Ran(self.pid, self.started, seconds, status.code, status.signal,
                   bytes(self.stdout.tail), bytes(self.stderr.tail), status.cpu_seconds,
                   status.max_rss_bytes)  # fmt: skip

    def log(self, level: int, message: str, *args: object) -> None:
        if log.isEnabledFor(level):  # the tag is built for every job: not for nothing
            log.log(level, "%s " + message, self.job.tag(self.queue.name), *args)
