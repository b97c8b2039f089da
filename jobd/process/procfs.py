"""What ``/proc`` says: this process's own figures (``/proc/self/status``), and which processes
are in a session or below a process, signalled only while they are still the process found."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable
from typing import NamedTuple


def own_status(field: bytes) -> int | None:
    """The number after ``field`` (``b"VmHWM:"``, ``b"TracerPid:"``), None where /proc cannot
    say."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class Stat(NamedTuple):
    """What ``/proc/PID/stat`` says of a process, of what jobd needs."""

    ppid: int
    group: int
    session: int
    start: int  # clock ticks after boot: with its pid, which process it is
    pages: int  # resident set, in pages


def stat(pid: int) -> Stat | None:
    """``pid``'s figures now, or None (gone, unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return _parse(f.read())
    except OSError:
        return None


def _parse(text: bytes) -> Stat | None:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime priority nice num_threads itrealvalue starttime vsize rss …: comm ends
    # at the last ')'
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return Stat(
            int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), int(fields[21])
        )
    except (IndexError, ValueError):
        return None


def send(pid: int, signum: int, still: Callable[[int], bool]) -> bool:
    """``signum`` to ``pid`` only if, once a pidfd holds the process that has it, ``still(pid)``
    says it is still the one meant (read after the pidfd is open: a pid freed and taken by
    another process before it is not that process's, and one freed after it leaves the pidfd
    on a dead process, which no signal reaches). Whether it was sent."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone
        return False
    try:
        if not still(pid):
            return False
        signal.pidfd_send_signal(fd, signum)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


class Sessions:
    """Every process's parent, group and session, from ``/proc/PID/stat`` (one read per process
    on the host: for stops and sweeps, never for every job), read at the first question and
    kept: one pass of the loop that stops many handlers at once (shutdown), or a sweep that
    ends a thousand strays, reads it once. A process it lists is signalled (``send``) only if
    it is still, by a look taken once a pidfd holds it, the process it found, in the same
    session: what ended meanwhile, its pid taken by another, is never signalled."""

    def __init__(self) -> None:
        self.procs: dict[int, Stat] | None = None
        self.members: dict[int, list[int]] = {}
        self._children: dict[int, list[int]] | None = None

    def _read(self) -> dict[int, Stat]:
        if self.procs is None:
            self.procs = scan()
            for pid, found in self.procs.items():
                self.members.setdefault(found.session, []).append(pid)
        return self.procs

    def of(self, sessions: set[int]) -> list[int]:
        """The processes whose session is one of ``sessions``."""
        self._read()
        return [pid for sid in sessions for pid in self.members.get(sid, ())]

    def descendants(self, pid: int) -> list[int]:
        """``pid``'s descendants, as their parents were when read."""
        procs = self._read()
        if self._children is None:
            self._children = {}
            for child, found in procs.items():
                self._children.setdefault(found.ppid, []).append(child)
        found, todo = [], [pid]
        while todo:
            for child in self._children.get(todo.pop(), ()):
                found.append(child)
                todo.append(child)
        return found

    def send(self, pid: int, signum: int) -> bool:
        """``signum`` to ``pid``, a process this scan found, if it still is that process (its
        start time) in the same session; never to this process."""
        known = self._read().get(pid)
        if known is None or pid == os.getpid():
            return False

        def same(pid: int) -> bool:
            now = stat(pid)
            return now is not None and (now.session, now.start) == (known.session, known.start)

        return send(pid, signum, same)

    def signal(self, leader: int, strays: Iterable[int], signum: int) -> None:
        """``signum`` to a handler's sessions (where it has no cgroup): to each of its
        ``strays`` (adopted by the subreaper: the daemon's unreaped children, their pids theirs),
        then to every process of the session of its ``leader`` and of the strays' own sessions
        (made by the job's process that escaped, or one before it), each by ``send``."""
        sessions = {leader}
        own = os.getsid(0)
        for pid in strays:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
                session = os.getsid(pid)
                if session != own:
                    sessions.add(session)
        for pid in self.of(sessions):
            self.send(pid, signum)


def scan() -> dict[int, Stat]:
    """Every process on the host, by pid: one read of ``/proc/PID/stat`` each."""
    found: dict[int, Stat] = {}
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not (entry.name.isascii() and entry.name.isdigit()):
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    text = f.read()
            except OSError:  # gone meanwhile
                continue
            parsed = _parse(text)
            if parsed is not None:
                found[int(entry.name)] = parsed
    return found
