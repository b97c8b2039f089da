"""cgroup v2 containment: each handler in a cgroup of its own, from its first instruction.

Where jobd has a cgroup v2 it may manage (``cgroup: auto``: the daemon's own, when systemd
delegated it with ``Delegate=yes``; or the path ``cgroup:`` names), every handler runs in a child
cgroup of its own, ``jobd-<daemon pid>-<token>-<n>``, under it:

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
- **The end.** A stop (timeout, cancel, lost lease, memory, shutdown) sends its SIGTERM to
  every process in the cgroup, and its SIGKILL is ``cgroup.kill``. When the handler's leader
  exits, ``cgroup.kill`` ends every process left in the cgroup — escaped from the process
  group or not, whatever its environment says; processes of another cgroup are never touched.
  What it used is read then: CPU from ``cpu.stat`` (the whole tree, escapees included; less
  what the cgroup had counted when the daemon left it, the daemon's own share), peak
  memory from ``memory.peak``, OOM kills from ``memory.events`` (outcome ``memory``). The cgroup
  is removed once empty (at once, or by a later sweep); cgroups left by a daemon that died are
  ended and removed by the next one to start under the same parent (which knows a dead
  daemon's by a lock the live one holds, not by its pid: ``Tree``).

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
from jobd.process import owners, procfs, where
from jobd.process.owners import OWNER, PREFIX
from jobd.process.where import DAEMON_LEAF, DELEGATED_HOW, Found

log = logging.getLogger("jobd.cgroup")

CPU_PERIOD = 100_000  # microseconds: cpu.max's period
BUSY_TRIES = 40  # removals found busy (one a sweep: 10 s) before the log says so


@dataclass
class Cgroup:
    """One handler's cgroup."""

    path: str
    caps_memory: bool = False  # memory.max is set: the kernel enforces resources.memory
    cpu_before: int = 0  # usage_usec when the daemon left it: the daemon's own, not the job's
    tries: int = 0  # removals that found it busy

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

    def send(self, signum: int) -> None:
        """``signum`` to every process in it and in the cgroups below it (a process of the
        handler's may make some: container runtimes do) — a stop's SIGTERM: ``kill`` is its
        SIGKILL, recursive too; never to the daemon, were it in it. Each by a pidfd, and only if
        the process is still in it once the pidfd holds it (``procfs.send``): a member that
        exits after ``cgroup.procs`` was read leaves its pid to any process."""
        mount = where.mount_point()
        if mount is None:
            return
        top = os.path.normpath(self.path)

        def inside(pid: int) -> bool:
            now = where.cgroup_of(pid, mount)
            return now is not None and (now == top or now.startswith(top + "/"))

        for folder, _, _ in os.walk(top):
            for pid in self.members(folder):
                if pid != os.getpid():
                    procfs.send(pid, signum, inside)

    def members(self, folder: str | None = None) -> list[int]:
        """The processes in it (or in ``folder``, a cgroup below it)."""
        with (
            contextlib.suppress(OSError),
            open(os.path.join(folder or self.path, "cgroup.procs")) as f,
        ):
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
        used = None if cpu is None else max(0, cpu - self.cpu_before) / 1e6
        return Usage(used, peak, events.get("oom_kill", 0) > 0)

    def remove(self) -> bool:
        """Remove it, and any cgroup a process of it made inside (deepest first); False while a
        process is still in one of them (ending: try again later). Said once when that lasts
        (BUSY_TRIES); anything else than busy is said, and the cgroup left."""
        try:
            for folder, _, _ in os.walk(self.path, topdown=False):
                os.rmdir(folder)
        except FileNotFoundError:
            return True
        except OSError as exc:
            self.tries += 1
            busy = exc.errno == errno.EBUSY
            if not busy or self.tries == BUSY_TRIES:
                log.warning("cannot remove %s (%s): %s", self.path, exc.strerror or exc,
                            "trying again" if busy else "left there")  # fmt: skip
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
    """The cgroup handlers are placed under, taken (``take``) by the daemon's process. Its
    handlers' cgroups are ``jobd-<pid>-<token>-<n>``, the token drawn at start: they are this
    daemon's and no other's (another daemon of the same pid: a reused pid, another pid
    namespace). Whether another daemon's are a dead one's is told by its owner lock
    (``owners``), not by its pid."""

    found: Found
    home_procs: int = -1  # the daemon's home's cgroup.procs, open for writing
    owner: int = -1  # its owner cgroup, open and locked for the daemon's life
    stale_owners: set[str] = field(default_factory=set)  # dead daemons' prefixes, owner left
    ending: list[Cgroup] = field(default_factory=list)  # killed, not yet removed
    counter: Iterator[int] = field(default_factory=itertools.count)
    prefix: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}-")

    @classmethod
    def take(cls, found: Found) -> Tree:
        """Make ``found.root`` ready: created if needed; when the daemon was in it, moved into
        ``jobd-daemon`` (delegated: with every process of the service; a cgroup named in the
        config: alone); its controllers enabled for its children; cgroups left by dead daemons
        ended and removed. OSError when the kernel refuses."""
        root, home = found.root, found.home
        os.makedirs(root, exist_ok=True)
        if home == root:
            home = os.path.join(root, DAEMON_LEAF)
            os.makedirs(home, exist_ok=True)
            _move(root, home, everyone=found.how == DELEGATED_HOW)
        enabled = _enable(root, found.controllers)
        tree = cls(Found(root, home, enabled, found.how))
        tree.home_procs = os.open(os.path.join(home, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        tree.owner = owners.lock(os.path.join(root, owners.name(tree.prefix)))
        tree.remove_stale()
        return tree

    @contextlib.contextmanager
    def spawning(self, resources: Resources) -> Iterator[Cgroup]:
        """Make a handler's cgroup and hold the daemon in it while the caller starts the
        handler; the daemon goes home and the limits are written on the way out (see the module
        docstring). The caller holds ``spawn.LOCK``. OSError, the handler not started, when the
        cgroup cannot be made or entered."""
        cgroup = Cgroup(os.path.join(self.found.root, f"{self.prefix}{next(self.counter)}"))
        try:
            os.mkdir(cgroup.path, 0o755)
            fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")  # this process, every thread of it
            finally:
                os.close(fd)
        except OSError as exc:
            self.go_home()
            self.end(cgroup)
            what = f"cannot make its cgroup {cgroup.path}: {exc.strerror}"
            raise OSError(exc.errno, what) from exc
        try:
            yield cgroup
        except BaseException:  # not started
            self.go_home()
            self.end(cgroup)
            raise
        self.go_home()  # never raises: the handler runs
        cgroup.cpu_before = cgroup.read("cpu.stat").get("usage_usec", 0)
        cgroup.limit(resources, self.found.controllers)

    def go_home(self) -> None:
        """Back to the daemon's own cgroup. Never raises: a handler may have been started. If
        the daemon's cgroup is gone (it was empty while the daemon was away: anyone who may
        write there may remove it), it is made again; if that fails too, the daemon stays where
        it is, said loudly, and ``kill`` refuses any cgroup that holds it."""
        try:
            os.write(self.home_procs, b"0")
            return
        except OSError as exc:
            lost = exc
        procs = os.path.join(self.found.home, "cgroup.procs")
        try:
            os.makedirs(self.found.home, exist_ok=True)
            fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
            os.write(fd, b"0")
        except OSError as exc:
            log.critical("cannot go back to the daemon's cgroup %s (%s; made again: %s): it "
                         "stays in a handler's", self.found.home, lost.strerror or lost,
                         exc.strerror or exc)  # fmt: skip
            return
        os.close(self.home_procs)
        self.home_procs = fd
        log.warning("the daemon's cgroup %s had gone (%s): made again", self.found.home,
                    lost.strerror or lost)  # fmt: skip

    def kill(self, cgroup: Cgroup) -> None:
        """Every process in ``cgroup`` killed — unless the daemon is one of them (it could not
        go home after a spawn): then it tries again first, and kills nothing if it cannot."""
        if os.getpid() in cgroup.members():
            self.go_home()
            if os.getpid() in cgroup.members():
                log.critical("not killing %s: the daemon is in it", cgroup.path)
                return
        cgroup.kill()

    def end(self, cgroup: Cgroup) -> None:
        """The handler ended: every process left in its cgroup is killed; removed when empty."""
        self.kill(cgroup)
        if not cgroup.remove():
            self.ending.append(cgroup)

    def tidy(self) -> None:
        """Remove the cgroups emptied since (their processes take a moment to exit)."""
        if self.ending:
            self.ending = [c for c in self.ending if not c.remove()]
        if self.stale_owners:
            self._remove_owners()

    def remove_stale(self) -> None:
        """Cgroups of daemons that are gone (``jobd-<pid>-<token>-…``, whose owner is not
        locked, or, with no owner, whose pid is dead): ended, removed; then their owners."""
        judged: dict[str, bool] = {}  # prefix -> its daemon is gone
        others: set[str] = set()  # prefixes of other daemons' owner cgroups
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.found.root):
                if entry.name.startswith(OWNER) and entry.name != owners.name(self.prefix):
                    others.add(PREFIX + entry.name[len(OWNER) :] + "-")
                pid = owners.pid_of(entry.name)
                if pid is None or entry.name.startswith(self.prefix):
                    continue
                prefix = entry.name[: entry.name.rindex("-") + 1]
                if prefix not in judged:
                    judged[prefix] = owners.gone(self.found.root, prefix, pid)
                if judged[prefix]:
                    log.warning("cgroup %s of a daemon that is gone: ending what is in it",
                                entry.path)  # fmt: skip
                    self.end(Cgroup(entry.path))
        root = self.found.root
        self.stale_owners = {
            p for p in others if judged.get(p, True) and owners.gone(root, p, None)
        }
        self._remove_owners()

    def _remove_owners(self) -> None:
        """Dead daemons' owner cgroups, once none of their handlers' cgroups is left."""
        for prefix in list(self.stale_owners):
            if not any(os.path.basename(c.path).startswith(prefix) for c in self.ending):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(self.found.root, owners.name(prefix)))
                self.stale_owners.discard(prefix)

    def close(self) -> None:
        """The daemon stops: every cgroup of its handlers ended and, once empty, removed."""
        ending = {c.path for c in self.ending}
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.found.root):
                if entry.name.startswith(self.prefix) and entry.path not in ending:
                    self.ending.append(Cgroup(entry.path))
        for cgroup in self.ending:
            self.kill(cgroup)
        self.tidy()
        if self.owner >= 0 and not self.ending:  # nothing of it left: its owner goes too
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(self.found.root, owners.name(self.prefix)))


def _move(source: str, target: str, everyone: bool) -> None:
    """This process into ``target``; with ``everyone``, every process in ``source`` too (one may
    be forked meanwhile: a few passes; kernel threads refuse, and stay)."""
    with open(os.path.join(target, "cgroup.procs"), "w") as f:
        f.write("0")
    for _ in range(10 if everyone else 0):
        with open(os.path.join(source, "cgroup.procs")) as f:
            pids = f.read().split()
        if not pids:
            return
        for pid in pids:
            with (
                contextlib.suppress(ProcessLookupError, OSError),
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
    return where.controllers(root, "cgroup.subtree_control") & controllers
