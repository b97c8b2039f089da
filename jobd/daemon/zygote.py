"""Where a supervisor's daemons come from: forked from a process that was never dumpable, never
exec'd, so that no daemon is ever dumpable, not even for an instant.

A process the supervisor exec'd would be dumpable from its exec until it made itself
non-dumpable (``hardening``), about 0.2 s of its interpreter's start. Where processes of one
user may ptrace each other (no Yama, or ``kernel.yama.ptrace_scope`` 0), a handler of that user
could open its ``/proc/PID/mem`` (or attach) then, and the kernel checks that at open alone: it
would read the secrets the daemon fetches later (``handover``), or write into its memory. A
forked process inherits its parent's memory and its non-dumpable flag; only an exec makes a
process dumpable again. So:

- The supervisor, non-dumpable from the first line of ``cli.main``, forks the zygote before it
  starts any thread (a fork of a threaded process is unsafe) and before any handler can exist.
  The zygote lets go of the secrets the supervisor kept (``hardening.forget_remembered``; what
  its copy of the supervisor's memory still holds, the config as loaded, is as unreadable as
  the supervisor's own: it is never dumpable), closes every descriptor but its socket and the
  standard three, leaves the terminal's process group (Ctrl-C is the supervisor's to pass
  on), ignores SIGINT, SIGHUP and SIGTERM (``systemctl kill`` or ``pkill`` reaching it would
  otherwise pass for its death: a failure), and dies with the supervisor
  (``PR_SET_PDEATHSIG``, and end of file on its socket).
- ``Zygote.spawn`` (the supervisor): a request on a SOCK_SEQPACKET pair — the daemon's `jobd`
  arguments, its environment as it differs from the one the zygote was forked with (a
  message must fit the socket's buffer, about 200 KiB, and an environment may not), and the
  descriptors it inherits (sent as SCM_RIGHTS, each with the number it takes in the daemon),
  and its gate — answered with the daemon's pid, or an error. The daemon waits at its gate
  (a pipe) until the supervisor closes the other end: a daemon forked and running in a few
  milliseconds would otherwise ask for its secrets before the supervisor has turned away the
  connections already waiting with its pid (``handover``), and be turned away itself.
- The zygote takes out of its own environment (and of the block ``/proc/PID/environ`` shows)
  every variable the request does not give, as the supervisor forgets a variable that a reload
  made a secret; then forks a middle process, which forks the daemon and exits at once: the
  daemon is re-parented to the nearest child subreaper, the supervisor (``orphans``), whose
  child it is from then on (its pidfd, its exit status, ``handover``'s parent check). The
  zygote answers once the middle process is reaped: the daemon is the supervisor's child then.
- The daemon (``become``): its own process group, default signal dispositions, the descriptors
  it was given at their numbers and no other, the environment it was given, ``/proc/PID/comm``
  ``jobd-pINDEX``; then it waits to be the supervisor's child, and at its gate, and runs
  ``cli.main`` with its
  arguments (given to ``Zygote.fork``: this module imports nothing of the command line), as
  `jobd run … --process INDEX` would have. It ends with ``os._exit``: the zygote's stack is
  not its own to unwind.

Should the zygote die (someone killed it), the supervisor cannot start a daemon without exec,
and it stops every daemon and exits with a failure: systemd starts the service again, whole.
One that does not answer within ANSWER_WITHIN is killed, to the same end (an answer that came
later would be taken for the next request's).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence

import orjson

from jobd import hardening

log = logging.getLogger("jobd.supervisor")

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
LARGEST = 4 << 20  # bytes of a message read (a request fits the socket's buffer, ~200 KiB)
MOST_FDS = 16  # descriptors a daemon may be given
MOST_OPEN = 1 << 30  # past any descriptor number (close_range closes what is open below it)
ANSWER_WITHIN = 10.0  # seconds the supervisor waits for a daemon's pid
ADOPTED_WITHIN = 10.0  # seconds a daemon waits to be the supervisor's child
PID = struct.Struct("i")
Entry = Callable[[Sequence[str]], int]  # what a daemon runs: `jobd ARGS` (``cli.main``)
NAME = b"jobd-forkserver"  # 15 bytes: /proc/PID/comm's most


class Zygote:
    """The supervisor's end of the fork server (module docstring)."""

    def __init__(self, pid: int, sock: socket.socket, environ: Mapping[str, str]) -> None:
        self.pid, self.sock = pid, sock
        self.environ = dict(environ)  # the zygote's, as forked
        self.pidfd = os.pidfd_open(pid)
        self.sock.settimeout(ANSWER_WITHIN)

    @classmethod
    def fork(cls, entry: Entry) -> Zygote:
        """Fork the zygote, whose daemons each run ``entry(args)`` (``cli.main``). Call it while
        this process is non-dumpable and has one thread (a fork of a threaded process may copy
        a lock another thread holds)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote
            code = 70
            try:
                ours.close()
                code = serve(theirs, supervisor, entry)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        try:
            return cls(pid, ours, os.environ)
        except OSError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise

    def spawn(
        self, args: Sequence[str], env: Mapping[str, str], fds: Mapping[int, int]
    ) -> tuple[int, int]:
        """A daemon running `jobd ARGS` in ``env``, given descriptor ``fds[n]`` as its ``n``:
        its pid, a child of this process, and its gate: the daemon waits before it runs until
        the caller closes that descriptor. OSError when it cannot be started."""
        gate, held = os.pipe2(os.O_CLOEXEC)
        try:
            return self.request(args, env, fds, gate), held
        except BaseException:
            os.close(held)
            raise
        finally:
            os.close(gate)

    def request(
        self, args: Sequence[str], env: Mapping[str, str], fds: Mapping[int, int], gate: int
    ) -> int:
        changed = {k: v for k, v in env.items() if self.environ.get(k) != v}
        unset = [k for k in self.environ if k not in env]
        body = orjson.dumps({"args": list(args), "set": changed, "unset": unset, "fds": list(fds)})
        socket.send_fds(self.sock, [body], [*fds.values(), gate])
        for name in unset:  # the fork server lets go of them: one given again is "set"
            self.environ.pop(name, None)
        try:
            answer = self.sock.recv(LARGEST)
        except TimeoutError:  # its answer, should it come, would be taken for the next one's
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            raise OSError(f"the fork server did not answer within {ANSWER_WITHIN}s") from None
        if not answer:
            raise OSError("the fork server is gone")
        reply = orjson.loads(answer)
        if "error" in reply:
            raise OSError(f"the fork server: {reply['error']}")
        return int(reply["pid"])

    def close(self) -> None:
        """End it (end of file on its socket) and reap it."""
        self.sock.close()
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.pidfd)


# -- the zygote ------------------------------------------------------------------------------


def serve(sock: socket.socket, supervisor: int, entry: Entry) -> int:
    """The zygote's loop: a daemon for each request, until the supervisor is gone."""
    hardening.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:  # it died before the line above
        return 0
    hardening.forget_remembered()
    hardening.prctl(PR_SET_NAME, NAME)
    os.setpgid(0, 0)
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # the supervisor's to act on
        signal.signal(signum, signal.SIG_IGN)
    close_others(keep={sock.fileno()})
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, LARGEST, MOST_FDS)
        except InterruptedError:
            continue
        if not msg:
            return 0
        try:
            reply = {"pid": fork_daemon(orjson.loads(msg), fds, sock, supervisor, entry)}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(orjson.dumps(reply))


def fork_daemon(
    request: dict, fds: list[int], sock: socket.socket, supervisor: int, entry: Entry
) -> int:
    """Fork a middle process that forks the daemon and exits: the daemon's pid, re-parented
    to the supervisor by the time this returns."""
    args, changed, unset = request["args"], request["set"], request["unset"]
    targets = request["fds"]
    if not (
        isinstance(args, list)
        and all(isinstance(a, str) for a in args)
        and isinstance(changed, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in changed.items())
        and isinstance(unset, list)
        and all(isinstance(k, str) for k in unset)
        and isinstance(targets, list)
        and all(isinstance(t, int) and t >= 0 for t in targets)
        and len(targets) + 1 == len(fds)  # and the gate, last
    ):
        raise ValueError("a malformed request")
    forget(unset)
    env = {**os.environ, **changed}
    r, w = os.pipe2(os.O_CLOEXEC)
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                given = dict(zip(targets, fds[:-1], strict=True))
                become(entry, args, env, given, fds[-1], sock, supervisor)
            os.write(w, PID.pack(pid))
        finally:
            os._exit(0)
    os.close(w)
    with open(r, "rb") as pipe:
        said = pipe.read(PID.size)
    os.waitpid(middle, 0)  # the daemon is the supervisor's child now
    if len(said) != PID.size:
        raise OSError("the middle process could not fork the daemon")
    return int(PID.unpack(said)[0])


def forget(names: Sequence[str]) -> None:
    """Out of this process's environment, and of the block ``/proc/PID/environ`` shows for it
    and every daemon it forks: each variable the daemon is not given (the supervisor forgot it
    since: a reload made it a secret, ``hardening``)."""
    gone = {k: os.environ[k] for k in names if k in os.environ}
    hardening.wipe_initial_environment(gone)
    for name in gone:
        del os.environ[name]


def close_others(keep: set[int]) -> None:
    """Close every descriptor but the standard three and ``keep``."""
    low = 3
    for fd in sorted(fd for fd in keep if fd >= low):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, MOST_OPEN)


# -- the daemon ------------------------------------------------------------------------------


def become(
    entry: Entry,
    args: list[str],
    env: dict[str, str],
    fds: dict[int, int],
    gate: int,
    sock: socket.socket,
    supervisor: int,
) -> None:
    """The daemon's start, in the forked process: never returns (module docstring)."""
    code = 70
    try:
        sock.close()
        os.setpgid(0, 0)
        for signum in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        gate = place(fds, gate)
        os.environ.clear()
        os.environ.update(env)
        index = args[args.index("--process") + 1] if "--process" in args else "?"
        hardening.prctl(PR_SET_NAME, f"jobd-p{index}".encode()[:15])
        deadline = time.monotonic() + ADOPTED_WITHIN
        while os.getppid() != supervisor and time.monotonic() < deadline:
            time.sleep(0.001)  # the middle process is exiting
        with open(gate, "rb") as opened:  # until the supervisor lets it go (``Zygote.spawn``)
            opened.read()
        sys.argv = ["jobd", *args]
        code = entry(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:  # SIGINT before the daemon handles it: a stop, not a bug
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            threading._shutdown()  # type: ignore[attr-defined]  # as an interpreter's exit
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            if code == -signal.SIGINT:  # ended by it, as an interpreter is (the supervisor: clean)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            os._exit(code)


def place(fds: Mapping[int, int], gate: int) -> int:
    """Give each descriptor its number (``fds[number]``), close-on-exec above 2, keep ``gate``
    at a number of its own (returned), and close every other one above 2."""
    high = max([*fds, *fds.values(), gate, 2]) + 1
    moved = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for target, fd in fds.items()}
    for fd in fds.values():
        os.close(fd)
    for target, fd in moved.items():
        os.dup2(fd, target, inheritable=target <= 2)
        os.close(fd)
    kept = fcntl.fcntl(gate, fcntl.F_DUPFD_CLOEXEC, max([*fds, 2]) + 1)
    os.close(gate)
    close_others(keep={*fds, kept})
    return kept
