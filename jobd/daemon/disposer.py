"""What becomes of the descriptors messages on the handlers' channel bring (``daemon.channel``):
any local process may send some, of any kind, and the kernel makes whoever holds the last copy
of a file do its release, which can block for as long as the file's sender likes (a pipe whose
writer holds its mutex, a TCP socket's lock or linger, an AF_PACKET socket's RCU grace period,
a FUSE server that does not answer). So the daemon never holds the last copy, and the
channel's thread makes no system call on a received descriptor at all: it hands their numbers
to the ``Disposer`` (``give``), a thread that sends them on to a sink (``daemon.sink``, a
process of its own that closes what it receives) and only then closes the daemon's copies,
which are not the last: each release happens in the sink, whatever it costs there. (A close
that is not the last still flushes: a FUSE or NFS file's may block this thread, never the
channel's thread nor the loop.)

A sink that leaves messages unread for STUCK_AFTER without reading any is stuck in its
closes: it is killed (it exits, releasing what it holds, once its closes let it) and a new one
takes over, with what was queued for the old one and left unread (``Sink.abandon``). Bounded:
at most SINKS_MAX killed sinks not yet exited; beyond, the descriptors wait in the daemon, at
most PENDING_MAX (less under a low RLIMIT_NOFILE), and beyond that the channel's thread reads
messages without room for theirs (``room``): the kernel drops them inside recvmsg, on that
thread but with the GIL released (the channel may stall, the daemon never freezes); not counted
one by one (the kernel cuts every such message's pidfd too, and says nothing of which brought
descriptors). Both are logged once.

Descriptors the kernel will not pass on to the sink are closed by the disposer's thread itself
(a close that blocks holds it alone), logged once: ETOOMANYREFS among them, the daemon's user
having more descriptors in flight than its open-file limit (a handler of that user can get
there alone, sending its own and never receiving them). That refusal is retried only while
some of the sink's own are in flight (they count too), once the sink has read them.
"""

from __future__ import annotations

import array
import collections
import contextlib
import errno
import fcntl
import logging
import os
import resource
import select
import socket
import subprocess
import sys
import termios
import threading
import time

from jobd.daemon import sink as sink_module
from jobd.daemon.sink import FDS_MAX, close_all, received
from jobd.process import reaper, spawn

log = logging.getLogger("jobd.daemon")

SINKS_MAX = 4  # sinks killed while stuck in a close and not yet exited, at most
PENDING_MAX = 2048  # descriptors waiting in the daemon for a sink, at most (see ``_pending_max``)
STUCK_AFTER = 0.5  # seconds a sink may leave messages unread, reading none, before it is stuck
RETRY_EVERY = 0.5  # seconds between tries while no sink can be started (killed ones reaped)
SNDBUF = 4096  # the sink's queue: a few messages (the kernel's least send buffer)
CLOSE_WAIT = 0.5  # seconds ``close`` waits for the thread, and for the sinks to exit
REFUSED_WHY = {errno.ETOOMANYREFS: ": its user has more descriptors in flight than its open-file "
               "limit, a handler's of the daemon's user, say, sent and not received"}  # fmt: skip
REFUSED_POLL = 0.005  # seconds between looks at a sink's queue after ETOOMANYREFS (``Sink.wait``)
SINK = [sys.executable, "-I", "-S", os.path.abspath(sink_module.__file__)]  # run from /


class Sink:
    """A sink process and the daemon's end of its socket (SOCK_SEQPACKET: the sink reads end
    of file when the daemon is gone), and a copy of the sink's end (``abandon`` takes back
    what a stuck sink left unread)."""

    def __init__(self) -> None:
        pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock, self.theirs = pair
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            self.sock.setblocking(False)
            fd = self.theirs.fileno()
            with spawn.LOCK:  # the reaper's sweep leaves it alone (a child not of a handler)
                self.proc = subprocess.Popen(
                    [*SINK, str(fd), str(os.getpid())], pass_fds=(fd,), env={}, cwd="/",
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                reaper.protect(self.proc.pid)
        except BaseException:
            self.sock.close()
            self.theirs.close()  # nothing was ever queued in it
            raise
        self.unread, self.moved = 0, time.monotonic()  # bytes it had not read; when it last read
        self.refused = False  # the last ``send``: ETOOMANYREFS while some of ours were in flight

    def send(self, fds: list[int]) -> bool:
        """``fds`` sent (True), or not: its queue is full, or the kernel refused them for too
        many descriptors in flight while some of this sink's are (``wait`` waits for it to read
        them); OSError: the sink is gone, or the kernel will not pass them on (ETOOMANYREFS
        with none of ours in flight: the user's descriptors in flight are others', say a
        handler's that it never reads, and waiting would not end)."""
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        self.stuck()  # read meanwhile? (an empty queue: the clock starts with this message)
        self.refused = False
        try:
            self.sock.sendmsg([b"x"], rights)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno != errno.ETOOMANYREFS or self.unread == 0:
                raise
            self.refused = True  # ours in flight count: once read, tried again
            return False
        self.unread = _outq(self.sock)
        return True

    def stuck(self) -> bool:
        """Whether it has left messages unread for STUCK_AFTER without reading any (the
        bytes queued and not read yet, SIOCOUTQ, never went down meanwhile)."""
        unread, now = _outq(self.sock), time.monotonic()
        if unread == 0 or unread < self.unread:
            self.moved = now
        self.unread = unread
        return unread > 0 and now - self.moved > STUCK_AFTER

    def wait(self) -> None:
        """Until its queue has room, a while at most (then ``stuck`` says); after a refusal
        (``send``), until it has read every message queued (its room is no sign: polled,
        REFUSED_POLL apart, never a busy loop)."""
        if self.refused:
            while _outq(self.sock) > 0 and not self.stuck():
                time.sleep(REFUSED_POLL)
            return
        poll = select.poll()
        poll.register(self.sock, select.POLLOUT)
        poll.poll(STUCK_AFTER * 250)

    def reaped(self) -> bool:
        """Whether it has exited (then reaped here, and no more ``protect``ed)."""
        if self.proc.returncode is None and self.proc.poll() is None:
            return False
        reaper.unprotect(self.proc.pid)
        return True

    def abandon(self, room: int = 0) -> list[int]:
        """Killed (it exits once its closes let it: what it holds is released then, by it);
        the daemon's end closed; what is queued in the sink's and unread (it reads only while
        a thread of its is idle) taken back, the daemon's copies (for the next sink: a pipe of
        `jobd notify` among them is closed at once), before the daemon's copy of that end is
        closed, empty (a queue released by the daemon would be a release in the daemon): up
        to ``room`` descriptors (what is left unread beyond is released by the sink as it
        exits, or by this thread if it is gone already)."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.sock.close()
        back: list[int] = []
        flags, space = socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC, socket.CMSG_SPACE(FDS_MAX * 4)
        with contextlib.suppress(OSError):  # BlockingIOError: empty
            while len(back) < room and (message := self.theirs.recvmsg(1, space, flags))[0]:
                back += received(message[1])
        self.theirs.close()
        return back


class Disposer:
    """Takes the descriptors messages bring (``give``, the channel's thread) and sends them to
    a sink on a thread of its own (``run``), started with the first."""

    def __init__(self) -> None:
        self.ready = threading.Condition()
        self.batches: collections.deque[list[int]] = collections.deque()
        self.pending = 0  # descriptors given, not yet sent to a sink
        self.closed = threading.Event()  # some of them closed here since ``settle`` began
        self.most = PENDING_MAX
        self.thread = threading.Thread(target=self.run, name="jobd-disposer", daemon=True)
        self.started = False
        self.closing = threading.Event()
        self.sink: Sink | None = None
        self.abandoned: list[Sink] = []  # killed, not yet reaped
        self.warned: set[str] = set()

    def room(self) -> int:
        """How many descriptors the channel's thread may take now, in all (``receive`` takes a
        message's only while FDS_MAX more fit: the bound holds whatever a batch brings)."""
        if not self.started:  # the bound as the open-file limit is now, from the first batch
            self.most = _pending_max()
        if self.pending + FDS_MAX <= self.most:
            return self.most - self.pending
        self.warn(
            "full",
            "the handlers' channel: %d descriptors wait for a sink: messages are read without "
            "theirs (the kernel drops them) meanwhile",
            self.pending,
        )
        return 0

    def settle(self, wait: float) -> None:
        """Until some of the descriptors given are closed here, ``wait`` seconds at most (at
        once when none waits): the channel's reader out of spare slots (``receive.NEED``) waits
        for those its messages' descriptors took."""
        self.closed.clear()
        if self.pending and self.started:
            self.closed.wait(wait)

    def give(self, fds: list[int]) -> None:
        """The descriptors a message brought (the caller's no more): to the thread."""
        with self.ready:
            self.batches.append(fds)
            self.pending += len(fds)
            if not self.started:
                self.most = _pending_max()
                try:
                    self.thread.start()
                    self.started = True
                except RuntimeError as exc:  # no thread now (the task limit reached, say):
                    # they wait (counted: the bound holds), the start tried again at the next
                    self.warn("start", "the handlers' channel: no thread to close "
                              "descriptors (%s); tried again with the next", exc)  # fmt: skip
            self.ready.notify()

    def close(self) -> None:
        """The thread ends (CLOSE_WAIT at most), the sinks are killed (and reaped: CLOSE_WAIT
        at most, the rest left to exit on their own)."""
        self.closing.set()
        with self.ready:
            self.ready.notify()
        if self.started:
            self.thread.join(CLOSE_WAIT)
        sinks = [s for s in (self.sink, *self.abandoned) if s is not None]
        for sink in sinks:
            sink.abandon()  # what it gives back is left to the daemon's exit
        deadline = time.monotonic() + CLOSE_WAIT
        while not all([s.reaped() for s in sinks]) and time.monotonic() < deadline:
            time.sleep(0.01)

    def run(self) -> None:
        while not self.closing.is_set():
            fds = self.take()
            if fds is None:
                return
            try:
                sent = self.hand_over(fds)
            except Exception:  # never the end of the thread: descriptors would pile up
                log.exception("the handlers' channel: descriptors not sent to the sink")
                sent = False
            if sent:
                close_all(fds)  # not the last copies: the sink's (in flight) are
                with self.ready:
                    self.pending -= len(fds)
                self.closed.set()
            else:  # no sink for now: kept, tried again
                with self.ready:
                    self.batches.appendleft(fds)
                self.closing.wait(RETRY_EVERY)
                self.reap()

    def take(self) -> list[int] | None:
        """The next descriptors to send, FDS_MAX at most (the batches of several messages
        together while they fit); None once closing."""
        with self.ready:
            while not self.batches and not self.closing.is_set():
                watch = self.sink is not None and self.sink.unread > 0
                self.ready.wait(
                    STUCK_AFTER / 2 if watch else RETRY_EVERY if self.abandoned else None
                )
                self.reap()
                if self.sink is not None and self.sink.stuck():  # unread messages in it
                    self.replace(TimeoutError())
            if self.closing.is_set():
                return None
            fds = self.batches.popleft()
            while self.batches and len(fds) + len(self.batches[0]) <= FDS_MAX:
                fds = fds + self.batches.popleft()
            return fds

    def hand_over(self, fds: list[int]) -> bool:
        """``fds`` sent to the sink (True), a stuck one replaced on the way, or refused by the
        kernel (True: the caller closes them); False when no sink could take them (none can be
        started now)."""
        for _ in range(3):  # a sink that dies at once, again and again: not for ever
            if self.sink is None:
                self.sink = self.start()
                if self.sink is None:
                    return False
            try:
                while not self.sink.send(fds):
                    if self.sink.stuck():
                        raise TimeoutError
                    self.sink.wait()
                return True
            except (TimeoutError, ConnectionError) as exc:  # stuck, or gone (killed, crashed)
                self.replace(exc)
            except OSError as exc:  # the kernel would not pass them on: they are closed here,
                why = REFUSED_WHY.get(exc.errno, "")
                self.warn("refused", "the handlers' channel: descriptors not sent to its sink "
                          "(%s%s): closed by the daemon", exc, why)  # fmt: skip
                return True  # by this thread (a close that blocks holds it alone)
        return False

    def replace(self, why: OSError) -> None:
        """The sink, stuck or gone: killed, what it left unread taken back; the next message
        starts another."""
        assert self.sink is not None
        if isinstance(why, TimeoutError):
            self.warn("stuck", "the handlers' channel: its sink (pid %d) is stuck in a close "
                      "(a descriptor sent on the channel): killed, a new one takes over",
                      self.sink.proc.pid)  # fmt: skip
        else:
            log.debug("the handlers' channel: its sink is gone (%s): another", why)
        self.abandoned.append(self.sink)
        self.requeue(self.sink.abandon(max(0, self.most - self.pending)))
        self.sink = None

    def requeue(self, fds: list[int]) -> None:
        """Descriptors a sink gave back: sent first, FDS_MAX a message."""
        with self.ready:
            for start in reversed(range(0, len(fds), FDS_MAX)):
                self.batches.appendleft(fds[start : start + FDS_MAX])
            self.pending += len(fds)

    def start(self) -> Sink | None:
        """A new sink, or None: closing, or SINKS_MAX killed ones have not exited, or one cannot
        be started (said once)."""
        self.reap()
        if self.closing.is_set():
            return None
        if len(self.abandoned) >= SINKS_MAX:
            self.warn(
                "sinks",
                "the handlers' channel: %d sinks killed while stuck in a close have not exited: "
                "descriptors wait in the daemon",
                len(self.abandoned),
            )
            return None
        try:
            return Sink()
        except (OSError, subprocess.SubprocessError) as exc:
            self.warn("spawn", "the handlers' channel: cannot start its sink: %s", exc)
            return None

    def reap(self) -> None:
        """The killed sinks that exited, reaped (without waiting)."""
        self.abandoned = [s for s in self.abandoned if not s.reaped()]

    def warn(self, what: str, message: str, *args: object) -> None:
        """``message`` logged as a warning, the first time only (``what``)."""
        if what not in self.warned:
            self.warned.add(what)
            log.warning(message, *args)


def _pending_max() -> int:
    """PENDING_MAX, or a quarter of the daemon's RLIMIT_NOFILE when that is less (one message's
    FDS_MAX at least): descriptors waiting must never leave the daemon short of its own."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return PENDING_MAX
    return max(FDS_MAX, min(PENDING_MAX, soft // 4))


def _outq(sock: socket.socket) -> int:
    """Bytes sent on ``sock`` that its peer has not read yet (SIOCOUTQ)."""
    got = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int.from_bytes(got, sys.byteorder)
