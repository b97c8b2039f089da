"""A handler's result: the file ``JOBD_RESULT`` names, read once its leader has exited.

Nothing is made for a job: its ``JOBD_RESULT`` names a file that does not exist yet, in a
folder the daemon made for its own handlers (``Folders``, one per daemon process, created at
the first job); a handler that writes no result costs one failed ``open`` at its end. The name
is 128 random bits: a folder of handlers running as another user (``run_as``) is mode 1733
(anyone may create a file there, nobody but the daemon may list it, and the sticky bit keeps
each file its creator's and the daemon's), so a process that does not know a job's name cannot
write its result; a folder of handlers running as the daemon's user is 0700. What is read must
be a regular file of the handler's user with one link, opened without following a symbolic
link: a handler cannot have the daemon read, and record, a file the handler could not read.
(Processes of the same user can read each other's environment, as they can trace each other:
jobs running as one user are not kept from each other's results.)

The file is removed at the job's end, whatever the outcome; its bytes are read only when the
attempt succeeded, at most ``result_max`` of them: a larger result fails the attempt (the
policy dead-letters it: ``ResultError``)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterable

from jobd.config import QueueConfig

OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
SHARED_MODE = 0o1733  # run_as handlers: create, never list; each file stays its creator's


class ResultError(Exception):
    """The handler left a result jobd will not take: the attempt fails with this reason."""


class Folders:
    """The folders of this daemon process's result files: made when first needed, removed
    with everything left in them at ``close``."""

    def __init__(self) -> None:
        self.own: str | None = None  # 0700: handlers running as the daemon's user
        self.shared: str | None = None  # 1733: handlers running as another user

    def name(self, shared: bool) -> str:
        """A new result file's path (the file is not made: the handler makes it)."""
        if shared:
            if self.shared is None:
                self.shared = tempfile.mkdtemp(prefix="jobd-results-")
                os.chmod(self.shared, SHARED_MODE)  # mkdtemp's 0700, less the umask's say
            folder = self.shared
        else:
            if self.own is None:
                self.own = tempfile.mkdtemp(prefix="jobd-results-")
            folder = self.own
        return f"{folder}/{os.urandom(16).hex()}"

    def close(self) -> None:
        for folder in (self.own, self.shared):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self.own = self.shared = None


FOLDERS = Folders()


def take(path: str, uid: int, limit: int, wanted: bool, what: str = "result") -> bytes | None:
    """The result at ``path`` (None: there is none), the file removed; read only when
    ``wanted`` (the attempt succeeded). ResultError when it is more than ``limit`` bytes, or
    not a regular file of ``uid`` (the handler's, as it was spawned: ``Handler.uid``, never
    its user looked up again) with one link; ``what`` the file is, for
    its message (``process.followups`` takes its JOBD_ENQUEUE file the same way)."""
    try:
        fd = os.open(path, OPEN)
    except FileNotFoundError:
        return None  # most jobs: no result
    except OSError as exc:  # ELOOP: a symbolic link; EACCES: made unreadable
        _remove(path)
        if not wanted:
            return None
        raise ResultError(f"{what} file unreadable: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        _remove(path)
        if not wanted:
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != uid:
            raise ResultError(f"{what} file not a regular file of the handler's user")
        if info.st_size > limit:
            raise ResultError(too_large(info.st_size, limit, what))
        data = _read(fd, limit + 1)  # a file still growing: no more than that
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ResultError(too_large(len(data), limit, what))
    return data


def too_large(size: int, limit: int, what: str = "result") -> str:
    if what != "result":
        return f"{what} file too large: {size} bytes, more than {limit}"
    return f"result too large: {size} bytes, more than result_max ({limit})"


def _read(fd: int, most: int) -> bytes:
    chunks, left = [], most
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def collected(
    path: str | None, given: bytes | None, queue: QueueConfig, ok: bool, uid: int
) -> tuple[bytes | None, str | None]:
    """A handler's result at its end, and why it fails the attempt (None: it does not): the one
    it ``given`` by its channel (X_JOBD_RESULT) when it gave one, else its file's (removed
    either way; ``take``, of ``uid``); none unless the attempt succeeded (``ok``)."""
    try:
        taken = None if path is None else take(path, uid, queue.result_max, ok)
    except ResultError as exc:
        return None, str(exc)
    result = given if given is not None else taken
    if not ok or result is None:
        return None, None
    if len(result) > queue.result_max:
        return None, too_large(len(result), queue.result_max)
    return result, None


def uid(queue: QueueConfig) -> int:
    """The user the queue's handlers run as."""
    return pwd.getpwnam(queue.run_as_user).pw_uid if queue.run_as_user else os.geteuid()


def uids(queues: Iterable[QueueConfig]) -> set[int]:
    """The users the queues' handlers run as; with root (0) among them when one cannot be
    told (its user gone since the config was read): then no message is judged by its user."""
    found = set()
    for queue in queues:
        try:
            found.add(uid(queue))
        except KeyError:
            found.add(0)
        if not queue.run_as_user:  # the daemon's: the kernel tells its real uid
            found.add(os.getuid())
    return found
