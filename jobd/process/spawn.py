"""Starting a handler process: cloned and exec'd without the daemon waiting for the exec, or
vfork and exec with the GIL released while the child gets there.

The fast way is ``_clonexec`` (C, built with the package on x86_64 and aarch64 Linux): the
child is cloned sharing the daemon's memory, as vfork does, but the caller is not suspended
until it reaches exec. With vfork the daemon's loop waited 0.13 to 0.93 ms a start on a busy
machine (the child queues behind running handlers for a CPU), most of its time a job, and one
daemon could not start handlers as fast as ``xargs -P8`` (docs/performance.md). A failure
before or at exec (not found, not executable, a bad interpreter line) then comes later: the
child writes it on a pipe and exits 127, and whoever reaps it reads the pipe (``start_error``).
The OOM score the daemon takes for its handlers' sake waits for them (``OomScore``). A handler
placed in a cgroup with a memory limit is started with vfork (``wait``; ``launch``): that limit
is written once it has exec'd, so a child before its exec, sharing the daemon's memory, is
never the one the kernel's OOM killer picks in that cgroup, which would kill the daemon with it
(the OOM killer passes over a vfork child, not over a clone).

The waiting way, where the C extension is missing: ``_posixsubprocess.fork_exec``, the C helper
behind ``subprocess``, which releases the GIL around its vfork (CPython gh-104372) and converts
its arguments in C: measured +4 to +9 % jobs/s against ``os.posix_spawn``. It is private to
CPython, with the same arguments from 3.11 to 3.13; where it is missing or refuses them,
``os.posix_spawn`` does the same work, holding the GIL.

A start may carry a ``deadline``, past which its handler must not exec (``deadline``): the
clone's child checks it just before its execve, the other ways just before their fork.

The child, either way: a session of its own (``setsid``: its own process group too, and no
way for any process of it to join a group of the daemon's session, where the embedded Redis,
a supervisor or an operator's shell may be); the given descriptors as 0, 1 and 2 (stdin
/dev/null when None) and no other (every descriptor the daemon opens is close-on-exec); no
signal blocked, and every signal at its default action: exec resets caught signals,
``_clonexec`` resets every action, ``fork_exec`` resets SIGPIPE and SIGXFSZ (which Python
ignores), and ``reset_inherited_ignores`` leaves no other signal ignored in the daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import threading
from collections.abc import Mapping

from jobd import hardening
from jobd.process.deadline import LAPSED, NO_DEADLINE, Lapsed, check

try:
    from _posixsubprocess import fork_exec as _fork_exec
except ImportError:  # not CPython on a POSIX system
    _fork_exec = None

try:
    from jobd.process import _clonexec
except ImportError:  # not built here (see setup.py): every start waits for its exec
    _clonexec = None

log = logging.getLogger("jobd.spawn")


# Held by every thread of the daemon while it starts a process: a spawn changes what the daemon's
# children inherit for its instant (its OOM score, its cgroup), which no other start may see.
# Reentrant: giving the OOM score back takes it too, inside a start or from the loop.
LOCK = threading.RLock()

_devnull: int | None = None  # /dev/null, opened once, close-on-exec: an empty payload's stdin


def spawn(
    argv: tuple[str, ...], env: Mapping[str, str], extra: Mapping[str, str], stdin: int | None,
    stdout: int, stderr: int, *, wait: bool = False, deadline: int | None = None,
) -> tuple[int, int | None]:  # fmt: skip
    """Start ``argv[0]`` (a path) with ``argv`` and exactly ``env`` plus ``extra``; its pid,
    and where a failure to start it is told: None when this call waited for the exec (and
    raised OSError for not found, not executable, a bad interpreter line, or ``Lapsed``), else
    a descriptor for ``start_error`` once the process has exited. ``env`` is a queue's
    environment, the same for each of its jobs, ``extra`` the job's own variables. With
    ``wait``, the call returns once the child has exec'd (vfork). Past ``deadline``
    (CLOCK_BOOTTIME nanoseconds) the handler does not exec (the module docstring)."""
    if _fork_exec is not None:
        # A name in both: ``extra`` wins, and the child must see it once (getenv takes the
        # first of two).
        shared = extra.keys() & env.keys()
        base = (
            _encode({k: v for k, v in env.items() if k not in shared}) if shared else _encoded(env)
        )
        entries = [*base, *_encode(extra)]
        if (
            _clonexec is not None
            and not wait
            and min(stdout, stderr, _null() if stdin is None else stdin) > 2
        ):
            return _clone_exec(argv, entries, stdin, stdout, stderr, deadline)
        try:
            return _vfork_exec(argv, entries, stdin, stdout, stderr, deadline), None
        except _OtherPython:
            _fall_back()
    return _posix_spawn(argv, {**env, **extra}, stdin, stdout, stderr, deadline), None


def _clone_exec(
    argv: tuple[str, ...], env_list: list[bytes], stdin: int | None, stdout: int, stderr: int,
    deadline: int | None = None,
) -> tuple[int, int]:  # fmt: skip
    """``_clonexec.start``: the pid at once, and the read end of the pipe the child reports a
    failure on (non-blocking: read once the child has exited, it never waits). The child
    checks ``deadline`` itself, just before its exec."""
    args = [os.fsencode(a) for a in argv]
    report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    fds = (_null() if stdin is None else stdin, stdout, stderr, report_w, report_r)
    until = NO_DEADLINE if deadline is None else deadline
    try:
        pid = _clonexec.start(args, env_list, *fds, until)  # type: ignore[union-attr]
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    return pid, report_r


def start_error(report: int) -> OSError | Lapsed | None:
    """What a child started by ``_clone_exec`` reported before or at exec (None: it got
    there; ``Lapsed``: it got there past its deadline, and did not exec), read once it has
    exited; closes ``report``."""
    try:
        told = os.read(report, 4096)
    except BlockingIOError:  # nothing written, and another child holds a copy of the pipe
        told = b""
    finally:
        os.close(report)
    return _reported_error(told) if told else None


_encodings: dict[int, tuple[Mapping[str, str], list[bytes]]] = {}  # id(env) -> env, its entries
ENCODINGS_KEPT = 256  # a reload brings new mappings: start afresh past this many


def _encoded(env: Mapping[str, str]) -> list[bytes]:
    """A queue's environment as ``NAME=value`` bytes, encoded once (the entry holds the
    mapping, so its id cannot be reused by another one meanwhile)."""
    held = _encodings.get(id(env))
    if held is None or held[0] is not env:
        if len(_encodings) >= ENCODINGS_KEPT:
            _encodings.clear()
        held = _encodings[id(env)] = (env, _encode(env))
    return held[1]


def _encode(env: Mapping[str, str]) -> list[bytes]:
    return [os.fsencode(f"{k}={v}") for k, v in env.items()]


class _OtherPython(Exception):
    """This Python's ``fork_exec`` takes other arguments (raised before any fork)."""


def _vfork_exec(
    argv: tuple[str, ...], env_list: list[bytes], stdin: int | None, stdout: int, stderr: int,
    deadline: int | None = None,
) -> int:  # fmt: skip
    """``fork_exec`` as ``subprocess`` calls it; ``env_list``: ``NAME=value`` entries. Raises
    ``Lapsed`` past ``deadline``, checked as the last statement before the vfork."""
    args = [os.fsencode(a) for a in argv]
    stdin = _null() if stdin is None else stdin
    # The child reports a failure before or at exec on this pipe; exec closes it.
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    try:
        check(deadline)  # then fork_exec: its arguments converted in C, the GIL let go, vfork
        pid = _fork_exec(  # type: ignore[misc]
            args, [args[0]], False, (), None, env_list,
            stdin, -1, -1, stdout, -1, stderr,
            report_r, report_w,
            True,  # restore_signals: SIGPIPE and SIGXFSZ to their default
            True, -1,  # call_setsid: a session (and group) of its own; pgid_to_set: none
            None, None, None, -1,  # gid, extra groups, uid, umask: the daemon's
            None, True,  # preexec_fn: none; allow_vfork
        )  # fmt: skip
    except BaseException as exc:
        os.close(report_r)
        if isinstance(exc, TypeError):
            raise _OtherPython from exc
        raise
    finally:
        os.close(report_w)
    try:
        report = b""
        while chunk := os.read(report_r, 4096):
            report += chunk
    finally:
        os.close(report_r)
    if report:
        os.waitpid(pid, 0)  # it exited right after writing
        raise _reported_error(report)
    return pid


def _reported_error(report: bytes) -> OSError | Lapsed:
    """The child's report, ``OSError:<errno in hex>:…`` (or ``SubprocessError:0:<text>``);
    ``Lapsed`` for the code ``LAPSED``."""
    _, _, rest = report.partition(b":")
    code, _, text = rest.partition(b":")
    with contextlib.suppress(ValueError):
        errno = int(code, 16)
        if errno == LAPSED:
            return Lapsed()
        if errno:
            return OSError(errno, os.strerror(errno))
    return OSError(0, text.decode("utf-8", "replace") or "the child could not start")


def _fall_back() -> None:
    global _fork_exec
    _fork_exec = None
    log.warning("this Python's _posixsubprocess differs; starting handlers with os.posix_spawn")


def _posix_spawn(
    argv: tuple[str, ...], env: Mapping[str, str], stdin: int | None, stdout: int, stderr: int,
    deadline: int | None = None,
) -> int:  # fmt: skip
    """``os.posix_spawn``; raises ``Lapsed`` past ``deadline``, checked as the last statement
    before it."""
    actions = [
        (os.POSIX_SPAWN_DUP2, stdin, 0) if stdin is not None
        else (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]  # fmt: skip
    check(deadline)
    return os.posix_spawn(
        argv[0], list(argv), env, file_actions=actions, setsid=True,
        setsigdef=DEFAULT_SIGNALS, setsigmask=(),
    )  # fmt: skip


def _null() -> int:
    global _devnull
    if _devnull is None:
        _devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    return _devnull


# Every signal but the two that cannot be caught: what os.posix_spawn resets in the child.
DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


def reset_inherited_ignores() -> list[signal.Signals]:
    """An ignored signal stays ignored across exec. For each one the daemon was started with
    ignored (``nohup``, a shell's background job, a supervisor), install a handler that does
    nothing: the daemon still ignores it, and its handlers start with the default action.
    SIGCHLD goes back to its default instead (ignoring it would reap children before the
    daemon could). Returns the signals changed."""
    changed = []
    for signum in sorted(DEFAULT_SIGNALS - {signal.SIGPIPE, signal.SIGXFSZ}):
        with contextlib.suppress(OSError, ValueError):
            if signal.getsignal(signum) is signal.SIG_IGN:
                default = signum == signal.SIGCHLD
                signal.signal(signum, signal.SIG_DFL if default else _ignore)
                changed.append(signal.Signals(signum))
    return changed


def _ignore(signum: int, frame: object) -> None:
    """Stands for SIG_IGN in the daemon; exec resets it to the default in handlers."""


def close_inherited_on_exec() -> list[int]:
    """Descriptors the daemon was started with beyond 0-2 (a shell's ``7<secret``, a
    supervisor's sockets) are marked close-on-exec, so that no handler receives them on any
    spawn path: handlers get 0, 1 and 2 and nothing else. Everything Python opens afterwards is
    close-on-exec already (PEP 446). Returns the descriptors changed."""
    changed = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if os.get_inheritable(fd):
                os.set_inheritable(fd, False)
                changed.append(fd)
    return changed


OPEN_FILES = 65536


def raise_open_files_limit() -> None:
    """Each running handler costs up to three pipe ends: lift the soft limit on open files
    (1024 by default outside systemd: too few for a thousand handlers) to 65536, or the hard
    limit if lower. Handlers inherit it; ``resources.open_files`` sets theirs explicitly."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class OomScore:
    """Handlers get their ``resources.oom_score_adj`` from their first instruction: the daemon
    takes that score itself for its spawns (a child inherits its parent's when it is made) and
    goes back to its own once they are done (``/proc/self/oom_score_adj``, kept open). Going
    back is always allowed (the kernel refuses going below the lowest score a privileged
    process set, and ours was at least that); a score lower than ours needs CAP_SYS_RESOURCE:
    refused, that queue's handlers keep ours, said once a value in the log.

    A child started without waiting for its exec (``_clonexec``) shares the daemon's memory
    until then, and the kernel gives every process sharing that memory the score the daemon
    writes for itself: so the daemon changes its score only once no such child is before its
    exec (``_settle``), and keeps one score across starts back to back. The loop gives it back
    within ``GIVE_BACK_EVERY`` of the last start (``holding``, ``give_back``). A child before
    its exec for longer than ``STALE`` (stopped, or exec'ing from a hung file system) is not
    waited for: it gets the score written next. The daemon's own score is read before it takes
    one, and an operator's change while it held one is kept, not overwritten. While it holds a
    handler's score the daemon competes with its handlers for the OOM killer (as it did for
    each vfork, which took as long)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.own = 0  # the daemon's score, as read before it last took one
        self.held: int | None = None  # the score taken for handlers, until given back
        self.refused: set[int] = set()
        self.fd = hardening.OOM_SCORE_FD  # opened while /proc/self was still this user's
        if self.fd is None:
            with contextlib.suppress(OSError):
                self.fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)

    def take(self, value: int) -> None:
        """Hold ``value`` for the next spawn, or the daemon's own score when ``value`` is
        refused or is its own (the caller holds LOCK)."""
        if self.fd is None or value == self.held:
            return
        # Whatever is written next reaches every child before its exec, whatever its own score.
        _settle(STALE)
        self.give_back(force=True)
        if value in self.refused:
            return
        try:
            self.own = int(os.pread(self.fd, 16, 0))
        except (OSError, ValueError):
            return
        if value == self.own:
            return
        try:
            os.write(self.fd, str(value).encode())
        except OSError as exc:
            self.refused.add(value)
            log.warning("handlers cannot get oom_score_adj %d (%s): they keep the daemon's (%d)",
                        value, exc.strerror or exc, self.own)  # fmt: skip
            return
        self.held = value

    def holding(self) -> bool:
        return self.held is not None

    def give_back(self, force: bool = False) -> bool:
        """The daemon's own score again, if it holds another and no child it started is before
        its exec (with ``force``, whatever children are); True once it has its own."""
        with LOCK:
            if self.held is None or self.fd is None:
                return True
            if not force and not _settle(0.0):
                return False
            try:
                now = int(os.pread(self.fd, 16, 0))
            except (OSError, ValueError):
                now = self.held
            if now == self.held:
                with contextlib.suppress(OSError):
                    os.write(self.fd, str(self.own).encode())
            else:  # an operator set the daemon's score meanwhile: that is its own now
                self.own = now
            self.held = None
            return True


def _settle(timeout: float) -> bool:
    """Whether every child started without waiting less than STALE ago has exec'd (or
    exited), waiting up to ``timeout`` seconds."""
    return _clonexec is None or _clonexec.settle(timeout, STALE)


# A child before its exec for this long is not waited for any more (see OomScore): an exec takes
# milliseconds, even queued behind busy handlers.
STALE = 0.5
GIVE_BACK_EVERY = 0.01  # seconds: how soon after its last start the loop gives the score back


OOM = OomScore()
