"""cgroup v2 containment: each handler in a cgroup of its own, from its first instruction.

Where jobd has a cgroup v2 it may manage (``cgroup: auto``: the daemon's own, when systemd
delegated it with ``Delegate=yes``; or the path ``cgroup:`` names), every handler runs in a child
cgroup of its own, ``jobd-<daemon pid>-<n>``, under it:

- **From its first instruction.** A process is born in its parent's cgroup. For the instant of
  each spawn the daemon moves itself into the handler's new cgroup, starts the handler there, and
  moves back (``Tree.spawning``; every thread of the daemon that starts processes takes
  ``spawn.LOCK`` for it, so nothing else is started meanwhile). No descendant of the handler can
  start outside it: the handler's first instruction already runs inside. Writing the handler's pid
  after the spawn would leave it a moment outside, in which a fork escapes.
- **Limits** (``resources``): ``memory.max`` (with ``memory.swap.max`` 0 and ``memory.oom.group``
  1: an OOM kill ends the whole handler), ``pids.max``, ``cpu.max`` — for the controllers the
  cgroup offers. They are written right after the daemon has left the cgroup, before it does
  anything else: written before, the daemon itself would be held to them while inside (a thread of
  its allocating past ``memory.max`` would be OOM-killed with the handler; its threads would count
  against ``pids.max``). What the handler did in those microseconds is charged to the cgroup, and
  a limit written below the usage is enforced at once.
- **The end.** When the handler's leader exits, or it is stopped (timeout, cancel, lost lease,
  shutdown), ``cgroup.kill`` ends every process left in the cgroup — escaped from the process
  group or not, whatever its environment says; processes of another cgroup are never touched.
  What it used is read then: CPU from ``cpu.stat`` (the whole tree, escapees included), peak
  memory from ``memory.peak``, OOM kills from ``memory.events`` (outcome ``memory``). The cgroup
  is removed once empty (at once, or by a later sweep); cgroups left by a daemon that died are
  ended and removed by the next one to start under the same parent.

Without such a cgroup (``find`` says why) handlers are contained by their process group, the child
subreaper (``process.reaper``) and the sampled memory cap (``process.memory``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field

from jobd.config.types import Resources

log = logging.getLogger("jobd.cgroup")

CONTROLLERS = ("memory", "pids", "cpu")  # the ones jobd sets limits with
CPU_PERIOD = 100_000  # microseconds: cpu.max's period
DELEGATED = ("trusted.delegate", "user.delegate")  # systemd marks a delegated cgroup so (v251+)
PREFIX = "jobd-"
DAEMON_LEAF = "jobd-daemon"  # where jobd's own processes go when the cgroup they were in is used


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
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                path = line[3:].rstrip("\n")
                return os.path.normpath(mount + path) if path.startswith("/") else None
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
        root, how = home, "delegated by systemd"
    else:
        root, how = os.path.normpath(setting), f"cgroup: {setting}"
        if os.path.commonpath([root, mount]) != mount:
            return f"{setting} is not a cgroup under the cgroup v2 mount {mount}"
    if os.path.isdir(root):  # what it offers its children once enabled
        where, offered = root, _controllers(root, "cgroup.controllers")
    else:  # to be made: what its parent enables for it
        where = os.path.dirname(root)
        offered = _controllers(where, "cgroup.subtree_control")
    if not os.path.isfile(os.path.join(where, "cgroup.procs")):
        return f"{where} is not a cgroup v2 directory"
    if not os.access(where, os.W_OK):
        return f"{where} is not writable by this user"
    return Found(root, home, offered & frozenset(CONTROLLERS), how)


def _controllers(path: str, name: str) -> frozenset[str]:
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


@dataclass
class Cgroup:
    """One handler's cgroup."""

    path: str
    caps_memory: bool = False  # memory.max is set: the kernel enforces resources.memory

    def write(self, name: str, value: str) -> bool:
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError as exc:
            log.warning("cannot write %s of %s: %s", name, self.path, exc.strerror or exc)
            return False
        return True

    def read(self, name: str) -> dict[str, int]:
        """A flat-keyed file (``cpu.stat``, ``memory.events``) as a dict; {} when unreadable."""
        found = {}
        with contextlib.suppress(OSError), open(os.path.join(self.path, name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                with contextlib.suppress(ValueError):
                    found[key] = int(value)
        return found

    def limit(self, resources: Resources, controllers: frozenset[str]) -> None:
        if resources.memory is not None and "memory" in controllers:
            self.write("memory.oom.group", "1")
            with contextlib.suppress(OSError):  # no swap on the host: no such file
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    self.write("memory.swap.max", "0")
            self.caps_memory = self.write("memory.max", str(resources.memory))
        if resources.pids is not None and "pids" in controllers:
            self.write("pids.max", str(resources.pids))
        if resources.cpu is not None and "cpu" in controllers:
            self.write("cpu.max", f"{max(1000, round(resources.cpu * CPU_PERIOD))} {CPU_PERIOD}")

    def kill(self) -> None:
        """End every process in it (``cgroup.kill``; where the kernel has none, SIGKILL to each
        member until none is left)."""
        if os.path.exists(os.path.join(self.path, "cgroup.kill")):
            with contextlib.suppress(FileNotFoundError):
                if self.write("cgroup.kill", "1"):
                    return
        for _ in range(100):
            pids = self.members()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def members(self) -> list[int]:
        with contextlib.suppress(OSError), open(os.path.join(self.path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
        return []

    def usage(self) -> Usage:
        cpu = self.read("cpu.stat").get("usage_usec")
        peak = None
        if self.caps_memory or os.path.exists(os.path.join(self.path, "memory.peak")):
            with (
                contextlib.suppress(OSError, ValueError),
                open(os.path.join(self.path, "memory.peak")) as f,
            ):
                peak = int(f.read())
        events = self.read("memory.events")
        return Usage(None if cpu is None else cpu / 1e6, peak, events.get("oom_kill", 0) > 0)

    def remove(self) -> bool:
        """Remove it; False while a process is still in it (ending: try again later)."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("cannot remove %s: %s", self.path, exc.strerror or exc)
            return exc.errno != errno.EBUSY
        return True


@dataclass(frozen=True)
class Usage:
    """What a handler's cgroup used: CPU seconds (user + system), peak memory, OOM-killed."""

    cpu_seconds: float | None
    peak_bytes: int | None
    oom_killed: bool


@dataclass
class Tree:
    """The cgroup handlers are placed under, taken (``take``) by the daemon's process."""

    found: Found
    home_procs: int = -1  # the daemon's home's cgroup.procs, open for writing
    ending: list[Cgroup] = field(default_factory=list)  # killed, not yet removed
    counter: Iterator[int] = field(default_factory=itertools.count)

    @classmethod
    def take(cls, found: Found) -> Tree:
        """Make ``found.root`` ready: created if needed; the daemon's processes moved out of it
        into ``jobd-daemon`` when they were in it; its controllers enabled for its children;
        cgroups left by dead daemons ended and removed. OSError when the kernel refuses."""
        root, home = found.root, found.home
        os.makedirs(root, exist_ok=True)
        if home == root:
            home = os.path.join(root, DAEMON_LEAF)
            os.makedirs(home, exist_ok=True)
            _move_all(root, home)
        enabled = _enable(root, found.controllers)
        tree = cls(Found(root, home, enabled, found.how))
        tree.home_procs = os.open(os.path.join(home, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        tree.remove_stale()
        return tree

    @contextlib.contextmanager
    def spawning(self, resources: Resources) -> Iterator[Cgroup]:
        """Make a handler's cgroup and hold the daemon in it while the caller starts the
        handler; the daemon goes home and the limits are written on the way out (see the module
        docstring). The caller holds ``spawn.LOCK``."""
        name = f"{PREFIX}{os.getpid()}-{next(self.counter)}"
        cgroup = Cgroup(os.path.join(self.found.root, name))
        os.mkdir(cgroup.path, 0o755)
        try:
            fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")  # this process, every thread of it
            finally:
                os.close(fd)
        except OSError:
            self.ending.append(cgroup)
            raise
        try:
            yield cgroup
        except BaseException:
            self.go_home()
            self.end(cgroup)
            raise
        self.go_home()
        cgroup.limit(resources, self.found.controllers)

    def go_home(self) -> None:
        os.write(self.home_procs, b"0")

    def end(self, cgroup: Cgroup) -> None:
        """The handler ended: every process left in its cgroup is killed; removed when empty."""
        cgroup.kill()
        if not cgroup.remove():
            self.ending.append(cgroup)

    def tidy(self) -> None:
        """Remove the cgroups emptied since (their processes take a moment to exit)."""
        if self.ending:
            self.ending = [c for c in self.ending if not c.remove()]

    def remove_stale(self) -> None:
        """Cgroups of daemons that are gone (``jobd-<pid>-<n>``, that pid dead): ended, removed."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.found.root):
                pid = _owner(entry.name)
                if pid is not None and pid != os.getpid() and not _alive(pid):
                    log.warning("cgroup %s of a daemon that is gone: ending what is in it",
                                entry.path)  # fmt: skip
                    self.end(Cgroup(entry.path))

    def close(self) -> None:
        """The daemon stops: every cgroup of its handlers ended and, once empty, removed."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.found.root):
                if _owner(entry.name) == os.getpid():
                    Cgroup(entry.path).kill()
        self.tidy()


def _owner(name: str) -> int | None:
    """The pid of the daemon a ``jobd-<pid>-<n>`` cgroup belongs to."""
    if not name.startswith(PREFIX):
        return None
    pid, _, n = name[len(PREFIX) :].partition("-")
    return int(pid) if pid.isdigit() and n.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _move_all(source: str, target: str) -> None:
    """Every process in ``source`` into ``target`` (one may be forked meanwhile: a few passes)."""
    for _ in range(10):
        with open(os.path.join(source, "cgroup.procs")) as f:
            pids = f.read().split()
        if not pids:
            return
        for pid in pids:
            with (
                contextlib.suppress(ProcessLookupError),
                open(os.path.join(target, "cgroup.procs"), "w") as f,
            ):
                f.write(pid)


def _enable(root: str, controllers: frozenset[str]) -> frozenset[str]:
    """Enable ``controllers`` for ``root``'s children, each on its own (one refused leaves the
    others); those enabled."""
    for name in sorted(controllers):
        try:
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{name}")
        except OSError as exc:
            log.warning("cannot enable the %s controller in %s: %s", name, root,
                        exc.strerror or exc)  # fmt: skip
    return _controllers(root, "cgroup.subtree_control") & controllers
