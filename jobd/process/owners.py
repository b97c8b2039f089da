"""Whose handler cgroups these are, and whether their daemon still lives: the owner lock.

A daemon's handler cgroups are ``jobd-<pid>-<token>-<n>`` (``cgroup.Tree``). Whether their
daemon is alive is told by a lock, not by its pid: the daemon holds ``flock`` on an empty
cgroup ``jobd.<pid>-<token>`` (its owner, mode 0700: no other user may open it, so none can
hold its lock) for as long as it lives, and the kernel lets go of it when it dies, in whatever
pid namespace. A pid alone would take a live daemon of another pid
namespace for dead (its handlers killed) and a dead one whose pid was reused for alive (its
handlers left running). Cgroups without an owner (a daemon that could not make it, or of a
version before) are still judged by their pid.
"""

from __future__ import annotations

import fcntl
import logging
import os

log = logging.getLogger("jobd.cgroup")

PREFIX = "jobd-"  # a handler's cgroup: ``jobd-<pid>-<token>-<n>``
OWNER = "jobd."  # a daemon's owner cgroup: ``jobd.<pid>-<token>``
PID_MAX_LIMIT = 1 << 22  # no pid is larger (the kernel's pid_max is at most this)


def name(prefix: str) -> str:
    """The owner cgroup of the handler cgroups named ``prefix…`` (``jobd-<pid>-<token>-``):
    ``jobd.<pid>-<token>``, not taken for a handler's cgroup."""
    return OWNER + prefix[len(PREFIX) : -1]


def lock(path: str) -> int:
    """Make the daemon's owner cgroup and lock it; its descriptor, or -1 (said in the log: its
    cgroups are then judged by its pid alone)."""
    try:
        # The daemon's alone (whatever the umask): a process of another user (a ``run_as``
        # handler) that could open it could hold its lock once the daemon died, and keep the
        # daemon's handlers running as a live daemon's.
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot make %s (%s): another daemon will judge by my pid alone whether my "
                    "handlers' cgroups are a dead daemon's", path, exc.strerror or exc)  # fmt: skip
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        log.warning("cannot lock %s (%s): another daemon will judge by my pid alone whether my "
                    "handlers' cgroups are a dead daemon's", path, exc.strerror or exc)  # fmt: skip
        return -1
    return fd


def gone(root: str, prefix: str, pid: int | None) -> bool:
    """Whether the daemon of the cgroups named ``prefix…`` under ``root`` is gone: its owner
    can be locked (no process holds it); with no owner, its pid is dead."""
    try:
        fd = os.open(os.path.join(root, name(prefix)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return pid is not None and not _alive(pid)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its daemon lives
        return False
    finally:
        os.close(fd)  # and the lock with it
    return True


def pid_of(cgroup: str) -> int | None:
    """The pid of the daemon a ``jobd-<pid>-<token>-<n>`` cgroup belongs to; None for any
    other name, and for a pid no process can have (0, or past PID_MAX_LIMIT: anyone who may
    make a directory there names it as they like, and it must not crash the daemon's start)."""
    if not cgroup.startswith(PREFIX):
        return None
    parts = cgroup[len(PREFIX) :].split("-")
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() for p in parts[::2]):
        return None
    if len(parts[0]) > len(str(PID_MAX_LIMIT)) or not 0 < int(parts[0]) <= PID_MAX_LIMIT:
        return None
    return int(parts[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
