"""The embedded Redis's state directory: jobd's user's alone, and nobody else's hand in it.

It holds every job (the AOF), so it is opened without following a symbolic link, and refused
when it is one, when another user owns it, when a folder on the way to it lets another user
replace it, or when it was writable by others or holds a link, a hard link or anything of
another user's: someone may have planted a file there to read the jobs, or a link to make Redis
write elsewhere. jobd then says what it found and leaves the operator to inspect it. What an
earlier version of jobd left readable (0755 folders, 0644 files, all jobd's own) is made
private, with a warning. Every check is made on descriptors, never on paths a second time.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("jobd.embedded")

PRIVATE = 0o077  # the permission bits of group and others
WRITABLE = stat.S_IWGRP | stat.S_IWOTH  # group or others may create, rename or change
MAX_LINKS = 40  # symbolic links followed on the way to the state directory, as the kernel does
NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
SHOWN = 5  # problems named in a refusal


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


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
