"""Which cgroup v2 jobd may place handlers under, and why none (``process.cgroup`` uses it).

``cgroup: auto`` takes the daemon's own cgroup when systemd delegated it (``Delegate=yes``, which
systemd 251 and later mark with the ``trusted.delegate`` attribute); ``cgroup: PATH`` a cgroup
below the cgroup v2 mount that jobd's user may write; ``off``, none. Only reads: nothing is made
or moved here.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids", "cpu")  # the ones jobd sets limits with
DELEGATED = ("trusted.delegate", "user.delegate")  # systemd marks a delegated cgroup so (v251+)
DAEMON_LEAF = "jobd-daemon"
DELEGATED_HOW = (
    "delegated by systemd"  # where jobd's own processes go when the cgroup they were in is used
)


@dataclass(frozen=True)
class Found:
    """A cgroup jobd may place handlers under: ``root``; the daemon's own ``home`` (moved into
    ``root/jobd-daemon`` when ``root`` is where it was: a cgroup with processes cannot have
    controllers for its children); the controllers ``root`` can give its children."""

    root: str
    home: str
    controllers: frozenset[str]
    how: str  # in words: "delegated by systemd", "cgroup: PATH"


def mount_point() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/proc/self/mountinfo``), or None."""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            if after.split(" ", 1)[0] == "cgroup2":
                return _unescape(before.split(" ")[4])
    return None


def own_cgroup(mount: str) -> str | None:
    """This process's cgroup v2 directory (``/proc/self/cgroup``'s ``0::`` line), or None."""
    return cgroup_of("self", mount)


def cgroup_of(pid: int | str, mount: str) -> str | None:
    """A process's cgroup v2 directory (``/proc/PID/cgroup``'s ``0::`` line), or None."""
    line = cgroup_line(pid)
    if line is None or not line.startswith(b"/"):
        return None
    return os.path.normpath(mount + os.fsdecode(line))


def cgroup_line(pid: int | str) -> bytes | None:
    """``/proc/PID/cgroup``'s ``0::`` line after the ``0::``: the process's cgroup v2 path as it
    sees it, bytes as the kernel wrote them; None when it has none (or is gone)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup", "rb") as f:
        for line in f:
            if line.startswith(b"0::"):
                return line[3:].rstrip(b"\n")
    return None


def find(setting: str) -> Found | str:
    """The cgroup ``setting`` (``auto``, ``off`` or a path) gives jobd, or why there is none.
    Reads only: nothing is created or moved (``Tree.take`` does that)."""
    if setting == "off":
        return "cgroup: off"
    mount = mount_point()
    if mount is None:
        return "no cgroup v2 hierarchy is mounted"
    home = own_cgroup(mount)
    if home is None:
        return "this process is in no cgroup v2 (/proc/self/cgroup)"
    if setting == "auto":
        if os.path.basename(home) == DAEMON_LEAF and _delegated(os.path.dirname(home)):
            home = os.path.dirname(home)  # another jobd of this service moved us there already
        if not _delegated(home):
            return (f"the daemon's cgroup {home} is not delegated to it: run it under systemd with "
                    "Delegate=yes, or set cgroup: to a cgroup jobd may manage")  # fmt: skip
        root, how = home, DELEGATED_HOW
    else:
        root, how = os.path.normpath(setting), f"cgroup: {setting}"
        if os.path.commonpath([root, mount]) != mount or root == mount:
            return f"{setting} is not a cgroup below the cgroup v2 mount {mount}"
    if os.path.lexists(root) and not os.path.isfile(os.path.join(root, "cgroup.procs")):
        return f"{root} is not a cgroup v2 directory"
    if os.path.isdir(root):  # what it offers its children once enabled
        where, offered = root, controllers(root, "cgroup.controllers")
    else:  # to be made: what its parent enables for it
        where = os.path.dirname(root)
        offered = controllers(where, "cgroup.subtree_control")
    if not os.path.isfile(os.path.join(where, "cgroup.procs")):
        return f"{where} is not a cgroup v2 directory"
    if not os.access(where, os.W_OK):
        return f"{where} is not writable by this user"
    return Found(root, home, offered & frozenset(CONTROLLERS), how)


def controllers(path: str, name: str) -> frozenset[str]:
    """The controllers a cgroup's ``cgroup.controllers`` or ``cgroup.subtree_control`` lists."""
    try:
        with open(os.path.join(path, name)) as f:
            return frozenset(f.read().split())
    except OSError:
        return frozenset()


def _delegated(path: str) -> bool:
    for name in DELEGATED:
        with contextlib.suppress(OSError):
            if os.getxattr(path, name).strip(b"\0") == b"1":
                return True
    return False


def _unescape(text: str) -> str:
    """mountinfo writes a space as \\040, and so on."""
    return text.encode().decode("unicode_escape") if "\\" in text else text


def describe(found: Found | str) -> str:
    if isinstance(found, str):
        return f"in no cgroup ({found})"
    limits = ", ".join(sorted(found.controllers)) or "none of memory, pids, cpu"
    return f"in a cgroup of its own under {found.root} ({found.how}; controllers: {limits})"
