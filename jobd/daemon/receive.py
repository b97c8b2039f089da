"""Reading the handlers' channel a batch at a time (``Channel``'s thread): each message with what
the kernel says of its sender, looked up in the order that keeps a gone sender's pid from being
taken for another process's.

For each message: the sender's pid (SCM_CREDENTIALS), its session (``getsid``), its cgroup v2
path (the ``0::`` line of /proc/PID/cgroup; only where handlers have cgroups, and only when the
session is not a running handler's), and then whether the sender is still alive, by the pidfd
the kernel sent with it (SCM_PIDFD, Linux 6.5; closed here): alive after its pid was looked up,
the pid was its own all along; gone, its pid may have been another process's by then (and the
message is a stranger's). Descriptors sent with a message are returned untouched, for the
caller to dispose of. For a sender of a session no running handler leads, a pidfd of that
session's leader, when asked (``keep``; ``leader_of``): whose the message is may be asked again
once a start under way has ended (``daemon.starts``). The pidfds need free descriptors, and the
kernel installs a message's descriptors first: ``Receiver.spares`` keeps slots for them. A
message whose sender's uid (SCM_CREDENTIALS) is none of the users handlers run as
(``Receiver.uids``, ``speakers``) is a stranger's before any of that: nothing looked up.

The C extension ``jobd.daemon._receive`` does a whole batch with the GIL released once (and
parses each message, a sender's messages in a row merged: the thread's Python then takes one item
a sender a batch, not one a message; ``Message``): read in
Python, each of those system calls lets go of the GIL and takes it back, and under a flood the
channel's thread and the loop hand it to each other thousands of times a second (each hand-over
may wait out the interpreter's switch interval): the loop, whose work is to start handlers,
lost a quarter of its throughput to 10 000 messages a second. Where the extension is not built,
the same in Python (``_receive_py``), one message a call.
"""

from __future__ import annotations

import array
import contextlib
import os
import signal
import socket
import struct
import sys
from collections.abc import Iterable

from jobd.daemon.sink import FDS_MAX, received
from jobd.process import where

try:
    from jobd.daemon._receive import parse as _native_parse
    from jobd.daemon._receive import receive as _native
except ImportError:  # not built here: the same in Python
    _native = _native_parse = None

MESSAGE_MAX = 65536  # bytes of one message; one larger is cut (MSG_TRUNC in its flags)
CGROUP_MAX = 4096  # bytes of a sender's cgroup path, at most (PATH_MAX: a longer one is none)
BATCH_MAX = 64  # messages a call, at most (the extension's own bound)
SPARES = 4  # descriptors held free for a batch (``Receiver.spares``)
NEED = 3  # free slots a message needs: a descriptor (jobd notify's, BARRIER=1's), the sender's
# pidfd and its session leader's (``leader_of``)
NO_LEADER = -2  # ``Message``'s last: its session, no running handler's, had no leader then
NONE = -(2**31)  # no pidfd came with a message (a negative one: the kernel's error)
ARENA = 1 << 20  # bytes of messages a batch holds: 16 of the largest, more of the usual
UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PASSPIDFD, SCM_PIDFD = 76, 4  # Linux 6.5: the sender's pidfd with each message
NO_ROOM = socket.CMSG_SPACE(UCRED.size)  # the sender's credentials alone (no pidfd: it needs
# as much room as one descriptor, and the kernel puts it after them)
ANCILLARY = NO_ROOM + socket.CMSG_SPACE(FDS_MAX * 4) + socket.CMSG_SPACE(4)

# What a message says, parsed by the extension: ``process.channel.Said``'s fields in its order.
Parsed = tuple[
    bool, bytes | None, float | None, int | None, bool | None, bytes | None, int, int, int
]
# pid, session (-1: none), cgroup path (None: not read, or none), alive (None: no pidfd came),
# flags, data, fds, and what it says (None: not parsed here: the caller parses ``data``). The
# extension gives a run of messages of one sender, one after the other, bringing no descriptor
# and neither cut nor without their ancillary data, as one: its last, with what they say merged
# (``Said.merge``; ``count`` of them).
# Last, when asked (``keep``) for a live sender of a session no running handler leads: a pidfd of
# that session's leader (``leader_of``; the caller's to close), or NO_LEADER; -1 otherwise.
Message = tuple[
    int, int, bytes | None, bool | None, int, bytes, tuple[int, ...], Parsed | None, int
]


class Receiver:
    """A batch of the messages waiting in ``sock`` (non-blocking), each with its sender."""

    def __init__(self, sock: socket.socket, cgroups: bool) -> None:
        self.sock, self.cgroups = sock, cgroups
        # The users handlers run as (``speakers``; native unsigned ints, sorted): a message of
        # another is a stranger's, nothing looked up. Empty: any may be a handler's (root's).
        self.uids = b""
        self.arena = bytearray(ARENA) if _native is not None else bytearray(MESSAGE_MAX)
        self.view = memoryview(self.arena)
        # Descriptors kept free for the kernel's pidfds, given up around each batch: a daemon
        # out of descriptors gets the pidfd's error (EMFILE) for a live sender, and since 6.16
        # a reaped one's pidfd too, so that error says nothing of the sender: a stranger's. The
        # kernel puts a message's descriptors first (jobd notify's pipe end): a message is read
        # only while NEED slots are free (the first of a batch whatever), and its descriptors
        # hold theirs until the disposer has closed them (``held``: how many are back).
        self.spares = array.array("i", [-1] * SPARES)
        self.held()

    def close(self) -> None:
        for i, fd in enumerate(self.spares):
            if fd >= 0:
                os.close(fd)
                self.spares[i] = -1

    def held(self) -> int:
        """The spares held again as far as there are free slots: how many."""
        for i, fd in enumerate(self.spares):
            if fd < 0:
                try:
                    self.spares[i] = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    break
        return sum(fd >= 0 for fd in self.spares)

    def batch(
        self, leaders: Iterable[int], room: int = FDS_MAX, most: int = BATCH_MAX, keep: bool = False
    ) -> list[Message]:
        """Up to ``most`` messages; none: the socket is empty. ``leaders``: the running
        handlers' sessions (a sender of another session has its cgroup read, where asked).
        ``room``: how many descriptors may be taken in all; a message's are taken only while
        FDS_MAX more fit, else the kernel drops them, and the pidfd it puts after them with them
        (``alive`` None; MSG_CTRUNC, then set on every message, is left out: it says nothing).
        ``keep``: for a live sender of another session, a pidfd of its session's leader
        (``leader_of``), last in its item: the caller's to close."""
        sids = array.array("i", sorted(leaders)).tobytes()
        if _native is not None:
            fd = self.sock.fileno()
            return _native(
                fd, self.arena, most, sids, self.cgroups, room, self.spares, keep, self.uids
            )
        self.close()  # slots for a message's descriptors and pidfd
        try:
            message = self._receive_py(set(array.array("i", sids)), room >= FDS_MAX, keep)
            return [] if message is None else [message]
        finally:
            self.held()

    def _receive_py(self, leaders: set[int], room: bool, keep: bool) -> Message | None:
        try:
            size, ancillary, flags, _ = self.sock.recvmsg_into(
                (self.view,), ANCILLARY if room else NO_ROOM, socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            return None
        pid, uid, pidfd, fds = _sender(ancillary)
        if not room:  # then every message has MSG_CTRUNC (its pidfd cut): it says nothing
            flags &= ~socket.MSG_CTRUNC
        if self.uids and uid not in array.array("I", self.uids):  # a stranger's (``speakers``)
            if pidfd >= 0:
                os.close(pidfd)
            return pid, -1, None, False, flags, bytes(self.view[:size]), tuple(fds), None, -1
        sid = -1
        if pid > 0:
            with contextlib.suppress(OSError):
                sid = os.getsid(pid)
        cgroup = _cgroup(pid) if self.cgroups and pid > 0 and sid not in leaders else None
        unknown = keep and pidfd >= 0 and sid > 0 and sid not in leaders  # its leader asked
        leader = leader_of(pid, sid) if unknown else -1
        # < 0: the kernel's error (the sender reaped; EMFILE: says nothing of it): not alive
        alive = None if pidfd == NONE else pidfd >= 0 and lives(pidfd)
        if pidfd >= 0:
            os.close(pidfd)
        if not alive and leader >= 0:
            os.close(leader)
            leader = -1
        return pid, sid, cgroup, alive, flags, bytes(self.view[:size]), tuple(fds), None, leader


def _sender(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int, int, list[int]]:
    """The sender's pid from a message's ancillary data (0: none, or not in our pid
    namespace), its uid (-1: none came), its pidfd (NONE: none came; below 0: the kernel could
    not make one, the sender gone), and the descriptors that came with it."""
    pid, uid, pidfd = 0, -1, NONE
    for level, kind, data in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_CREDENTIALS and len(data) >= UCRED.size:
            pid, uid = UCRED.unpack_from(data)[:2]
            uid &= 0xFFFFFFFF  # uid_t
        elif kind == SCM_PIDFD and len(data) >= 4:
            pidfd = int.from_bytes(data[:4], sys.byteorder, signed=True)
    return pid, uid, pidfd, received(ancillary)


def _cgroup(pid: int) -> bytes | None:
    """``pid``'s cgroup v2 path as /proc/PID/cgroup's ``0::`` line says it, or None (one longer
    than CGROUP_MAX is no handler's: the extension's bound)."""
    path = where.cgroup_line(pid)
    return path if path is not None and len(path) <= CGROUP_MAX else None


def lives(pidfd: int) -> bool:
    """Whether the process ``pidfd`` refers to has not exited (a zombie has not); the pidfd
    is left open."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except PermissionError:  # another user's: alive
        pass
    except OSError:  # ESRCH: exited
        return False
    return True


def leader_of(pid: int, sid: int) -> int:
    """A pidfd of the leader of session ``sid``, taken while ``pid`` (the sender, whose pidfd
    is asked after this) is in it: that session had that leader from before its message was
    read, and while the leader lives no other session has its id. NO_LEADER: it had none (a
    handler that gets that pid later is not of that session), or the sender left it meanwhile.
    A message of that session is its leader's handler's only while ``lives(leader)``."""
    try:
        leader = os.pidfd_open(sid)
    except OSError:
        return NO_LEADER
    try:
        if os.getsid(pid) == sid:
            return leader
    except OSError:
        pass
    os.close(leader)
    return NO_LEADER


def speakers(uids: set[int]) -> bytes:
    """``Receiver.uids`` for handlers that run as ``uids``: empty (no filter) when one is
    root's (a root handler may name any pid and uid, and may become any user)."""
    return b"" if 0 in uids else array.array("I", sorted(uids)).tobytes()


def count_of(message: Message) -> int:
    """How many messages ``message`` stands for (a run of one sender's: ``receive.Message``)."""
    return 1 if message[7] is None else message[7][6]


def backlog() -> float:
    """Datagrams an AF_UNIX socket's queue holds at most: net.unix.max_dgram_qlen, plus one
    (the kernel blocks a send once the queue is longer than it); unknown, no bound."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen", "rb") as f:
            return int(f.read()) + 1
    except (OSError, ValueError):
        return float("inf")
