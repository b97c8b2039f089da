"""What a supervisor hands each daemon it starts: the config in force, and the secrets it
expands, never through the daemon's environment.

The config: the text its siblings run (``InForce``), so that a daemon started again runs what
they run: not a file edited since and not yet reloaded, nor one that does not load at all, nor
one whose reload they refused (a change only a restart applies: ``redis``, ``cgroup``…). That
is the file's text at the supervisor's start; at a SIGHUP, the file's text is offered, and is
in force once a daemon says it runs it (the digest its READY=1 carries, ``daemon.child``).

A process's environment is readable by its user at ``/proc/PID/environ`` for as long as it is
dumpable, and a daemon the supervisor exec'd would be dumpable until its interpreter has started and
``jobd`` made it non-dumpable (``hardening``): about 0.2 s in which a handler of a sibling
daemon, running as the same user, could read it, or take a copy of any descriptor it holds
(``pidfd_getfd``, for the same user while the target is dumpable). So the variables the config
expands into secrets (the supervisor took them out of its own environment:
``hardening.config_environ``) are neither in its environment nor waiting in a descriptor it
inherits; the daemon fetches them once it is non-dumpable:

- ``Desk`` (the supervisor): a unix socket in the supervisor's private directory (0700, this
  user's alone), named to each daemon by ``JOBD_SECRETS_SOCKET`` (a path, no secret). On each
  connection it asks the kernel who connected (``SO_PEERCRED``: the pid of the process that
  called connect, which no process can forge) and answers only a daemon it started and has not
  answered yet (its pid is held by the supervisor's pidfd: not reused while it is unreaped), with
  the secrets and the config's text as a length-prefixed JSON frame, then closes. Anyone else
  gets the connection closed, and a warning in the log. That pid is the connecting process's
  *at connect*: a process that connected and then exited leaves a connection bearing a pid the
  kernel may give the next daemon. So right after each start the supervisor takes every
  connection already waiting (``serve(fresh=pid)``) and refuses those bearing the new daemon's
  pid: they were made before it existed (or by the daemon itself, in the instant before the
  supervisor looked: it is started again). From then on no other process can connect with that
  pid while the daemon lives.
- ``take`` (the daemon, in ``cli.main``, after ``set_non_dumpable()`` and before the config is
  read): refuses if a tracer is attached (one that attached while the daemon was dumpable stays
  attached), connects, reads the frame; the daemon loads the config from its text (its path
  for relative paths and messages), and gives the secrets to ``hardening.remember``: the
  config is expanded with ``hardening.config_environ()``, at start and at each reload, and they
  never enter the daemon's environment, so its handlers cannot inherit them either. A missing or
  short frame raises: the daemon exits 75 and the supervisor starts it again.

The daemon checks the socket is its parent's (``SO_PEERCRED`` of the listener, and where the
kernel gives one, a pidfd of that listener still alive): a process of the user may put a socket
of its own in the supervisor's directory, even one listened on by a process since gone whose pid
the supervisor got after it (on kernels before 6.5, without that pidfd, this last case is not
ruled out).

A daemon is never dumpable in fact: it is forked from the supervisor's fork server, never
exec'd (``zygote``), since where processes of one user may ptrace each other (no Yama, or
``kernel.yama.ptrace_scope`` 0) a process that opened an exec'd daemon's ``/proc/PID/mem`` in
its dumpable instant would read what it fetches later. What is said above of that instant
stands as a second line, should a daemon ever be exec'd. Handlers that must not reach the
daemon's secrets run as another user (``run_as``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from jobd.config import ConfigError, read_text
from jobd.config import digest as config_digest
from jobd.process.procfs import own_status

log = logging.getLogger("jobd.supervisor")

VARIABLE = "JOBD_SECRETS_SOCKET"
CHILD_WATCHDOG_USEC = 2_000_000  # each daemon says its loop turns every second
# systemd's variables for the supervisor alone, never for a daemon it starts
SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")
TIMEOUT = 10.0  # the daemon's wait for its answer (a full backlog: connects again meanwhile)
RETRY = 0.05  # seconds between two connects of the daemon
SEND_TIMEOUT = 1.0  # the supervisor's, for one answer (a frame fits a socket's buffer)
HEADER = struct.Struct(">I")  # the length of the JSON that follows
LARGEST = 64 << 20  # bytes of a frame (the secrets and the config's text): more is refused
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PEERPIDFD = 77  # Linux 6.5+: a pidfd of the peer (not in Python 3.11's socket module)
BACKLOG = 64  # connections waiting to be accepted (the kernel queues one more)
PER_WAKE = 64  # connections answered in one wake-up of the supervisor's loop


@dataclass(frozen=True)
class Handed:
    """What a daemon gets: the secrets (variable: value) and the config file's text."""

    secrets: Mapping[str, str]
    config: str | None = None  # None: the daemon reads the file


class InForce:
    """The config text the daemons run, and those reloads offered them since (module
    docstring)."""

    OFFERS_KEPT = 16  # reloads refused one after another: the oldest are forgotten

    def __init__(self, config_path: str, text: str | None) -> None:
        self.config_path = config_path
        self.text = text  # None: the daemon reads the file
        self.digest = None if text is None else config_digest(text)
        self.offered: dict[str, str] = {}  # digest: text, oldest first

    def offer(self, text: str) -> None:
        """A reload: its text, in force once a daemon names it."""
        digest = config_digest(text)
        self.offered.pop(digest, None)
        self.offered[digest] = text
        while len(self.offered) > self.OFFERS_KEPT:
            del self.offered[next(iter(self.offered))]

    def pending(self) -> bool:
        """Whether a reload no daemon has named yet may still be applied: a daemon started now
        is handed the text in force and owed that reload (its siblings may apply it)."""
        return bool(self.offered)

    def handed(self) -> Handed:
        """What a daemon started now fetches: the secrets, and the text in force."""
        return Handed(secrets(self.config_path, self.text), self.text)

    def heard(self, runs: str | None, read: str | None = None) -> bool:
        """A daemon said it runs the text of digest ``runs`` and, after a reload, that it read
        the text of digest ``read``, applied or refused: whether another text is in force now.
        Any reload offered may be the one named (two SIGHUPs before either was answered); one
        that read the file after another edit names a text the supervisor did not read: the
        file's, if it still is (then no reload offered before is owed: the file is newer). A
        reload read or run is answered, with every one before it: none of them is owed to a
        daemon started again."""
        text = self._named(runs) if runs and runs != self.digest else None
        for answered in (read, runs):
            if answered in self.offered:
                names = list(self.offered)
                for older in names[: names.index(answered) + 1]:
                    del self.offered[older]
        if text is None:
            return False
        self.text, self.digest = text, runs
        return True

    def _named(self, digest: str) -> str | None:
        """The text of ``digest``: a reload offered, or else the file, re-read, if it is that
        text (then every reload offered is answered: the file is newer than them all)."""
        text = self.offered.get(digest)
        if text is None:
            text = self.reread()
            if text is None or config_digest(text) != digest:
                return None
            self.offered.clear()
        return text

    def reread(self) -> str | None:
        try:
            return read_text(self.config_path)
        except ConfigError:
            return None


def environment(notify: str, metrics_dir: str, desk: str) -> dict[str, str]:
    """A daemon's: its supervisor's, which holds no secret (``hardening`` took them out),
    talking to the supervisor (``notify``) instead of systemd, its metrics in ``metrics_dir``,
    its secrets to be fetched from ``desk``."""
    env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ONLY}
    env |= {"NOTIFY_SOCKET": notify, "WATCHDOG_USEC": str(CHILD_WATCHDOG_USEC),
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir, VARIABLE: desk}  # fmt: skip
    return env


def secrets(config_path: str, text: str | None) -> dict[str, str]:
    """The variables the config in force (``text``, read from ``config_path``) expands into
    secrets: those this process forgot at start, and any a reload of the file added (forgotten
    now, out of its environment)."""
    from jobd import hardening

    found = hardening.secret_variables(config_path, os.environ, text)
    hardening.forget_variables(found)
    return {k: v for k, v in hardening.config_environ().items() if k not in os.environ}


class Desk:
    """The supervisor's socket that hands each daemon its secrets (module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(BACKLOG)
        self.sock.setblocking(False)
        self.reserve = reserve()  # a descriptor kept to take a connection when out of them

    def fileno(self) -> int:
        return self.sock.fileno()

    def serve(
        self, owed: Callable[[int], bool], handed: Callable[[], Handed], fresh: int = 0
    ) -> None:
        """Answer the connections waiting: ``owed(pid)`` says (once) whether that pid is a
        daemon to give ``handed()`` to. With ``fresh``, the pid of a daemon just started: every
        connection waiting, those bearing that pid refused (module docstring)."""
        refused: list[int] = []
        taken = 0
        # The queue is first in, first out: whatever waited before the start is within the
        # backlog's first BACKLOG + 1; connections made since (a flood) may wait their turn.
        while taken < (2 * BACKLOG if fresh else PER_WAKE):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                shed = self.shed(exc) if exc.errno in (errno.EMFILE, errno.ENFILE) else None
                if shed is None:
                    raise
                if not shed:  # accept fails so even with nothing waiting: nothing was
                    break
                taken += 1
                continue
            taken += 1
            with conn:
                pid = peer_pid(conn)
                if fresh and pid == fresh:
                    log.warning("a connection for the secrets bearing pid %d, made before the "
                                "daemon of that pid started: refused", pid)  # fmt: skip
                elif not owed(pid):
                    refused.append(pid)
                else:
                    self.answer(conn, pid, handed)
        if refused:
            log.warning("%d connection(s) asking for the secrets refused (pids %s): not daemons "
                        "this supervisor started and owes them",
                        len(refused), ", ".join(map(str, sorted(set(refused))[:10])))  # fmt: skip

    def answer(self, conn: socket.socket, pid: int, handed: Callable[[], Handed]) -> None:
        try:
            given = handed()
            body = json.dumps({"secrets": dict(given.secrets), "config": given.config}).encode()
        except Exception:  # it gets nothing, exits 75 and is started again
            log.exception("cannot make the answer for pid %d", pid)
            return
        if len(body) > LARGEST:
            log.error("cannot hand pid %d its config and secrets: %d bytes, more than %d",
                      pid, len(body), LARGEST)  # fmt: skip
            return
        conn.settimeout(SEND_TIMEOUT)
        try:
            conn.sendall(HEADER.pack(len(body)) + body)
        except OSError as exc:
            log.warning("cannot hand pid %d its secrets: %s", pid, exc)

    def shed(self, exc: OSError) -> bool | None:
        """Out of descriptors: the connection waiting is taken with the one kept in reserve
        and closed unanswered (that daemon exits 75 and is started again), rather than left
        to wake the supervisor's loop again and again. True: one was; False: none was waiting
        (accept fails out of descriptors whether or not one waits); None: no descriptor to
        take it with."""
        if self.reserve < 0:
            self.reserve = reserve()
            if self.reserve < 0:
                return None
        os.close(self.reserve)
        try:
            self.sock.accept()[0].close()
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return None
        finally:
            self.reserve = reserve()
        log.warning("a connection for the secrets refused: %s (this process is out of "
                    "descriptors: raise LimitNOFILE)", exc.strerror)  # fmt: skip
        return True

    def close(self) -> None:
        self.sock.close()
        if self.reserve >= 0:
            os.close(self.reserve)


def reserve() -> int:
    """A descriptor to give up when a connection must be taken and closed (``Desk.shed``),
    -1 when none is to be had."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def take(environ: MutableMapping[str, str] = os.environ) -> Handed | None:
    """What the supervisor hands over (None when this process is no supervisor's daemon):
    fetched from the socket ``VARIABLE`` names, which it unsets. Call it once non-dumpable.
    OSError or ValueError when it cannot be had."""
    path = environ.pop(VARIABLE, None)
    if not path:
        return None
    if tracer := traced_by():
        raise OSError(f"this process is traced (by pid {tracer}): the secrets are not fetched")
    data = bytearray()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        connect(sock, path, time.monotonic() + TIMEOUT)
        # A socket put in the supervisor's place (module docstring): refused.
        if (listener := peer_pid(sock)) != os.getppid() or not peer_alive(sock):
            raise OSError(f"the socket is pid {listener}'s, not the supervisor's ({os.getppid()})")
        while len(data) <= HEADER.size + LARGEST and (chunk := sock.recv(1 << 20)):
            data += chunk
    if len(data) < HEADER.size:
        raise ValueError("the supervisor gave none (it refused, or the answer was cut short)")
    (length,) = HEADER.unpack_from(data)
    if length > LARGEST:
        raise ValueError(f"the answer announces {length} bytes, more than {LARGEST}")
    if len(data) != HEADER.size + length:
        raise ValueError(f"an answer cut short: {len(data) - HEADER.size} of {length} bytes")
    frame = json.loads(data[HEADER.size :])
    if not (
        isinstance(frame, dict)
        and isinstance(frame.get("secrets"), dict)
        and isinstance(frame.get("config"), str | None)
    ):
        raise ValueError("the answer is not a frame of secrets and a config")
    return Handed({str(k): str(v) for k, v in frame["secrets"].items()}, frame.get("config"))


def peer_pid(sock: socket.socket) -> int:
    """The pid the kernel gives for the other end: the connecting process's at connect, or the
    listening one's at listen."""
    return int(
        PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))[0]
    )


def peer_alive(sock: socket.socket) -> bool:
    """Whether the process behind the other end's pid is still the one that made it: a socket
    listened on by a process since gone bears a pid the kernel may have given the supervisor
    since. Known from a pidfd of that very process (``SO_PEERPIDFD``, Linux 6.5+); on older
    kernels the pid alone is checked (True)."""
    try:
        pidfd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return True
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
    return True


def connect(sock: socket.socket, path: str, deadline: float) -> None:
    """Connect, again while the supervisor's backlog is full (a unix socket refuses at once
    then, whatever the timeout) or it is not listening yet, until ``deadline``."""
    while True:
        try:
            sock.connect(path)
            return
        except (BlockingIOError, ConnectionRefusedError):
            if time.monotonic() + RETRY > deadline:
                raise
            time.sleep(RETRY)


def traced_by() -> int:
    """The pid of this process's tracer (ptrace), 0 for none or where /proc cannot say."""
    return own_status(b"TracerPid:") or 0
