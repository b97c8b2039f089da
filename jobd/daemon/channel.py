"""The daemon's end of its handlers' ``NOTIFY_SOCKET``: one datagram socket for every handler of
the loop, each message attributed to its job by the kernel's word on who sent it, read on a
thread of its own.

Every handler's ``NOTIFY_SOCKET`` names the same socket, in the abstract namespace (``@jobd/…``:
no file, nothing for a user to be allowed to write, so a handler of any ``run_as`` user reaches
it). One socket and not one per job: a socket per job would cost every start five system calls
(socket, option, bind, epoll, close), and would protect nothing more (abstract names can be read
in /proc/net/unix by anyone). What protects a job's channel is who sent a message: the socket
has ``SO_PASSCRED``, so the kernel attaches the sender's pid to every message (``SCM_CREDENTIALS``;
a process can name another pid there only with CAP_SYS_ADMIN, a root handler's to do as it
likes), and a message is its job's when that pid is, as the loop sees it: a process of the
session its handler leads (every handler leads its own; setsid is the only way out), or of the
cgroup it runs in (where it has one). Any other message is dropped and counted
(``jobd_notify_dropped_total{reason="stranger"}``): a process of another job, of no job, or one
gone before its message was read (``jobd notify`` waits until it is read; ``systemd-notify``
names its parent, the handler).

A message is read with ``recvmsg``: up to ``MESSAGE_MAX`` bytes (one larger is cut: dropped as
``truncated``), and any descriptors sent with it closed once it is attributed (how a sender
learns that it was read: ``jobd notify`` waits for the end of a pipe, systemd-notify's
``BARRIER=1`` the same way). Reading, attributing and parsing (``process.channel.parse``: a
message of more than ``LINES_MAX`` lines is refused whole) run on the channel's thread, never on
the loop's, and a flood costs what it costs there. A close can block (a TCP socket with
SO_LINGER and unsent data lingers; a FUSE file's close waits for its server): ``Closer`` keeps
it off the channel's thread too, and every descriptor a message may bring is taken (FDS_MAX, the
kernel's own bound: one it had to drop it would close inside ``recvmsg``, on this thread).

What the thread learns reaches the loop in ``queue`` (at most QUEUED_MAX waiting: the thread
then waits, and the socket's queue, whose senders the kernel blocks, holds the rest), with a
byte in ``wakeup``; taking one costs the loop a fixed amount. Each time the thread finds the
socket empty it says when (``drained``): a watchdog stops its job only once the socket was found
empty after its due time (``Handler.act``), so a flood or a stalled channel delays a watchdog,
never fires it on a job that may have spoken.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import queue
import secrets
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping

from jobd.daemon.closer import Closer
from jobd.daemon.poller import Wakeup
from jobd.process import where
from jobd.process.channel import Said, parse
from jobd.process.handler import Handler
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.daemon")

MESSAGE_MAX = 65536  # bytes of one message; one larger is dropped (``truncated``)
FDS_MAX = 253  # descriptors taken with one message (and closed): the kernel's SCM_MAX_FD, all
UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PASSPIDFD, SCM_PIDFD = 76, 4  # Linux 6.5: the sender's pidfd with each message
ANCILLARY = socket.CMSG_SPACE(UCRED.size) + socket.CMSG_SPACE(4) + socket.CMSG_SPACE(FDS_MAX * 4)
CUT = socket.MSG_TRUNC | socket.MSG_CTRUNC
PER_WAKE = 32  # messages the thread queues between two wake-ups of the loop, at most
QUEUED_MAX = 1024  # messages waiting for the loop, at most (``take`` takes as many a pass)
SYNC_WAIT = 0.05  # seconds ``sync`` waits for the thread, at most
SYNC_REST = 1.0  # seconds after a wait that gave up before ``sync`` waits again, at least
CLOSE_WAIT = 1.0  # seconds ``close`` waits for the thread to end

# What the thread tells the loop: a message taken ("said", handler, what, when read), dropped
# ("drop", queue, reason), or the socket found empty ("drained", when).
Item = tuple[str, Handler, Said, float] | tuple[str, str, str] | tuple[str, float]


class Channel:
    """The socket, who may speak on it, and its thread (``start``); the loop ``take``s."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self.sock = socket.socket(
            socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        with contextlib.suppress(OSError):  # older kernels: the pid alone (a gone sender's
            self.sock.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)  # may be reused meanwhile)
        name = f"jobd/{os.getpid()}/{secrets.token_hex(8)}"
        self.sock.bind("\0" + name)
        self.address = "@" + name  # as NOTIFY_SOCKET says it, systemd's way
        self.view = memoryview(bytearray(MESSAGE_MAX))
        self.dropped: dict[tuple[str, str], int] = {}  # (queue, reason): messages dropped
        self.counting = threading.Lock()
        self.queue: queue.Queue[Item] = queue.Queue(QUEUED_MAX)
        self.wakeup = Wakeup()  # the thread's byte: something to take
        self.asked = Wakeup()  # the loop's byte: read the socket out now (or end: ``closing``)
        self.handlers: Mapping[int, Handler] = {}
        self.cgroup_of: Callable[[int], Handler | None] | None = None
        self.thread = threading.Thread(target=self.listen, name="jobd-channel", daemon=True)
        self.closer = Closer()
        self.closing = False
        # The thread's: a message read and not yet queued; messages read.
        self.holding = False
        self.count = 0
        self.flushed = 0  # ``count`` when it last queued what it held
        # For ``sync``: the thread queues what it holds once ``count`` reaches ``flush_at``, and
        # says so (``reached``); the socket holds ``backlog`` messages at most.
        self.flush_at, self.reached, self.backlog = float("inf"), threading.Event(), _backlog()
        # The loop's: the socket last found empty, all before taken (a watchdog waits for it).
        self.drained = float("-inf")
        self.awaited = False
        self.gave_up = float("-inf")  # when the last ``sync`` that gave up began
        self.emptied = float("-inf")  # the thread's: when it last began a read that found none
        self.peek = select.poll()
        self.peek.register(self.sock, select.POLLIN)

    def start(
        self, handlers: Mapping[int, Handler], cgroup_of: Callable[[int], Handler | None]
    ) -> None:
        """The thread starts: ``handlers`` by leader pid (its session's id), ``cgroup_of`` the
        handler whose cgroup a pid is in (None where handlers have none)."""
        self.handlers, self.cgroup_of = handlers, cgroup_of
        self.thread.start()

    def close(self) -> None:
        """The thread ends (CLOSE_WAIT at most: one blocked in a close is left, and so is the
        socket it reads), then the socket is closed."""
        self.closing = True
        self.asked.wake()
        if self.thread.is_alive():
            self.thread.join(CLOSE_WAIT)
        if self.thread.is_alive():
            log.warning("the handlers' channel is blocked (a descriptor sent on it lingers)")
            return
        self.sock.close()
        for fd in (self.wakeup.r, self.wakeup.w, self.asked.r, self.asked.w):
            os.close(fd)

    # -- the loop's side ------------------------------------------------------------------

    def take(self, handlers: Mapping[int, Handler]) -> list[Handler]:
        """What the thread queued, each message to its handler (still running: one that ended
        meanwhile is gone); the handlers that heard one."""
        self.wakeup.drain()  # before the queue: a byte written after this wakes the loop again
        heard: list[Handler] = []
        for _ in range(QUEUED_MAX):
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return heard
            if item[0] == "drained":
                self.drained = item[1]  # type: ignore[misc]
            elif item[0] == "drop":
                self.drop(item[1], item[2])  # type: ignore[misc]
            else:
                _, handler, said, now = item  # type: ignore[misc]
                if handlers.get(handler.pid) is not handler:
                    self.drop("", "stranger")
                    continue
                self.count_taken(handler, said)
                heard.append(handler)
                handler.heard(said, now)
                if said.bad:
                    self.drop(handler.queue.name, "malformed", said.bad)
        self.wakeup.wake()  # more than a pass takes: the next pass
        return heard

    def ask(self) -> None:
        """A watchdog is due: the thread reads the socket out and says when it found it empty."""
        self.awaited = True
        self.asked.wake()

    def sync(self) -> None:
        """Before handlers that exited leave the table: wait (SYNC_WAIT at most) until every
        message they sent is queued, so that what a handler sent before its exit is heard:
        until the socket is empty, or the thread found it empty since, or it has read
        ``backlog`` messages more than it had when this began (all that the socket held then:
        under a flood, a fraction of a millisecond). Not again once a wait gave up (the thread
        stuck in a close, say), until the thread has found the socket empty since and
        SYNC_REST has passed: it costs the loop SYNC_WAIT a SYNC_REST at most (5 %)."""
        if not self.thread.is_alive() or self.settled() or self.emptied < self.gave_up:
            return
        if time.monotonic() < self.gave_up + SYNC_REST:
            return
        began = time.monotonic()
        self.reached.clear()
        target = self.count + 1 + self.backlog  # + 1: one read, not counted yet
        self.flush_at = target
        self.asked.wake()
        try:
            while not self.settled() and self.emptied < began and self.flushed < target:
                if not self.reached.wait(max(0.0, began + SYNC_WAIT - time.monotonic())):
                    self.gave_up = began
                    log.debug("channel: a wait for the thread gave up after 50 ms (stuck?): "
                              "handlers leave without this wait for a second")  # fmt: skip
                    return
                self.reached.clear()
        finally:
            self.flush_at = float("inf")

    def settled(self) -> bool:
        """The socket is empty and the thread holds no message: everything read is queued."""
        return not self.peek.poll(0) and not self.holding

    def count_taken(self, handler: Handler, said: Said) -> None:
        """A message taken for ``handler`` (before it hears it): counted, and so is a request
        for more time while it runs (``jobd_notify_messages_total``,
        ``jobd_timeout_extensions_total``)."""
        if self.metrics is None:
            return
        series = self.metrics.of(handler.queue.name)
        series.notified.inc(said.count)
        if said.extends and handler.stop_reason is None:
            series.extended.inc(said.extends)

    def drop(self, queue: str, reason: str, count: int = 1) -> None:
        key = (queue, reason)
        with self.counting:  # the loop's and the thread's
            self.dropped[key] = self.dropped.get(key, 0) + count
        if self.metrics is not None:
            self.metrics.notify_dropped.labels(queue=queue, reason=reason).inc(count)

    # -- the thread's side ----------------------------------------------------------------

    def listen(self) -> None:
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        poll.register(self.asked.r, select.POLLIN)
        while not self.closing:
            poll.poll()
            asked = bool(self.asked.drain())
            if not self.closing:
                self.read_out(asked)

    def read_out(self, asked: bool) -> None:
        """Read until the socket is empty (then "drained"), queueing what each message says
        and closing its descriptors after (a close may block: only this thread waits)."""
        queued = 0  # items queued
        batch: dict[int, tuple[Handler, Said, float]] = {}  # by handler: its messages, merged
        while not self.closing:
            began = time.monotonic()
            self.holding = True
            try:
                size, ancillary, flags, _ = self.sock.recvmsg_into(
                    (self.view,), ANCILLARY, socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                queued += self.flush(batch)
                self.put(("drained", began))
                self.emptied = began
                self.reached.set()
                break
            self.count += 1
            pid, pidfd, fds = _sender(ancillary)
            try:
                item = self.judge(pid, flags, size, pidfd)
            except Exception:  # a message jobd did not foresee: never the end of the channel
                log.exception("the handlers' channel: a message from pid %d not taken", pid)
                item = ("drop", "", "malformed")
            if item is not None and item[0] == "said":
                _, handler, said, now = item  # type: ignore[misc]
                if (held := batch.get(id(handler))) is not None:
                    held[1].merge(said)
                    said = held[1]
                batch[id(handler)] = (handler, said, now)
            elif item is not None:
                self.put(item)
                queued += 1
            self.holding = bool(batch)  # read, not queued yet (``settled``)
            if fds and batch:  # queued before its sender learns it was read (its pipe closed)
                queued += self.flush(batch)
            for fd in fds:
                self.closer.discard(fd)
            if self.count % PER_WAKE == 0 or self.count >= self.flush_at:
                queued += self.flush(batch)
                self.wakeup.wake()
        if queued or asked:
            self.wakeup.wake()

    def flush(self, batch: dict[int, tuple[Handler, Said, float]]) -> int:
        """Queue what each handler said in the messages read since the last flush, merged:
        the loop takes one item a handler, whatever their number."""
        for handler, said, now in batch.values():
            self.put(("said", handler, said, now))
        count = len(batch)
        batch.clear()
        self.holding = False
        self.flushed = self.count
        if self.flushed >= self.flush_at:
            self.reached.set()
        return count

    def judge(self, pid: int, flags: int, size: int, pidfd: int = -1) -> Item | None:
        """A message read: whose it is, and what it says; None for a stranger's, counted here
        (a stranger's flood costs the loop nothing). With the sender's ``pidfd`` (closed here),
        a sender found gone once its pid was looked up is a stranger: its pid may have been
        another process's by then."""
        handler = None
        try:
            handler = _whose(pid, self.handlers, self.cgroup_of)
        finally:
            if pidfd >= 0 and not _alive(pidfd):
                handler = None
        if handler is None:
            self.drop("", "stranger")
            return None
        if flags & CUT:
            return ("drop", handler.queue.name, "truncated")
        return ("said", handler, parse(bytes(self.view[:size])), time.monotonic())

    def put(self, item: Item) -> None:
        """Queued for the loop; while QUEUED_MAX wait, the thread waits (the loop is woken)."""
        while not self.closing:
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                self.wakeup.wake()


def _backlog() -> float:
    """Datagrams an AF_UNIX socket's queue holds at most: net.unix.max_dgram_qlen, plus one
    (the kernel blocks a send once the queue is longer than it); unknown, no bound."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen", "rb") as f:
            return int(f.read()) + 1
    except (OSError, ValueError):
        return float("inf")


def _sender(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int, list[int]]:
    """The sender's pid from a message's ancillary data (0: none, or not in our pid
    namespace), its pidfd (-1: none; ``Channel.judge`` closes it), and the descriptors that
    came with it (for the caller to close)."""
    pid, pidfd = 0, -1
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_CREDENTIALS and len(data) >= UCRED.size:
            pid = UCRED.unpack_from(data)[0]
        elif kind == SCM_PIDFD and len(data) >= 4:
            pidfd = int.from_bytes(data[:4], sys.byteorder, signed=True)
        elif kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return pid, pidfd, list(fds)


def _alive(pidfd: int) -> bool:
    """Whether the process ``pidfd`` refers to has not exited (a zombie has not); the pidfd
    is closed. Asked after its pid was looked up: alive then, the pid was its all along."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except PermissionError:  # another user's: alive
        pass
    except OSError:  # ESRCH: exited
        return False
    finally:
        os.close(pidfd)
    return True


def _whose(
    pid: int, handlers: Mapping[int, Handler], cgroup_of: Callable[[int], Handler | None] | None
) -> Handler | None:
    """The running handler whose job ``pid`` is a process of: of its session, or its cgroup."""
    if pid <= 0:
        return None
    try:
        handler = handlers.get(os.getsid(pid))
    except OSError:  # gone already (or not ours to see)
        return None
    if handler is None and cgroup_of is not None:
        handler = cgroup_of(pid)
    return handler


def cgroup_finder(running: Callable[[], list[Handler]]) -> Callable[[int], Handler | None]:
    """``Channel.start``'s ``cgroup_of``: the handler, among ``running()``, whose cgroup ``pid``
    is in, or in a cgroup below it, by the whole path (/proc/PID/cgroup, a v2 line
    ``0::/path``, under the hierarchy's mount). Never by a cgroup's name alone: a job's is in
    its processes' /proc/PID/cgroup for anyone to read, and a user given a subtree of their own
    (a user's systemd instance) can make a cgroup of that name there."""
    mount = where.mount_point()

    def of(pid: int) -> Handler | None:
        path = where.cgroup_of(pid, mount) if mount is not None else None
        if path is None:
            return None
        for handler in running():
            if handler.placed:
                own = os.path.normpath(handler.placed[1].path)
                if path == own or path.startswith(own + "/"):
                    return handler
        return None

    return of
