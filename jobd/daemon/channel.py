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

Messages are read a batch at a time (``daemon.receive``: in C, up to 64 messages and what the
kernel says of each sender with the GIL let go once, so that a flood does not make the thread and
the loop hand the GIL to each other at every system call): up to ``MESSAGE_MAX`` bytes each (one
larger is cut: dropped as ``truncated``), and any descriptors sent with it (FDS_MAX, all the
kernel lets one carry) given to ``daemon.disposer`` once it is queued for the loop; they are
closed in a process of their own (how a sender learns that it was read: ``jobd notify`` waits
for the end of a pipe, systemd-notify's ``BARRIER=1`` the same way). This thread makes no system
call on a received descriptor (a release can block, with the GIL held in some calls), and reads,
attributes and parses (``process.channel.parse``) what the loop then takes at a fixed cost. While
too many descriptors wait for the disposer, messages are read without room for theirs.

What the thread learns reaches the loop in ``queue`` (at most QUEUED_MAX waiting: the thread
then waits, and the socket's queue, whose senders the kernel blocks, holds the rest), with a
byte in ``wakeup``; taking one costs the loop a fixed amount. Each time the thread finds the
socket empty it says when (``drained``): a watchdog stops its job only once the socket was found
empty after its due time (``Handler.act``), so a flood or a stalled channel delays a watchdog,
never fires it on a job that may have spoken.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from jobd.daemon.disposer import Disposer
from jobd.daemon.poller import Wakeup
from jobd.daemon.receive import (
    BATCH_MAX,
    NEED,
    SO_PASSPIDFD,
    Message,
    Receiver,
    backlog,
    count_of,
    speakers,
)
from jobd.daemon.starts import Batch, Starts, vouched
from jobd.process.channel import Said, parse
from jobd.process.handler import Handler
from jobd.web.metrics import Metrics

log = logging.getLogger("jobd.daemon")

PER_WAKE = 32  # messages the thread queues between two wake-ups of the loop, at most
QUEUED_MAX = 1024  # messages waiting for the loop, at most (``take`` takes as many a pass)
LEAVE_WAIT = 1.0  # seconds a handler that exited waits for the thread to read past it (``mark``)
CLOSE_WAIT = 1.0  # seconds ``close`` waits for the thread to end
UNSURE_MAX = 256  # messages of an unknown session kept while a start is under way, at most
SETTLE_WAIT = 0.05  # seconds the thread waits for the disposer when short of spare slots
# A wake that read messages is followed by a rest of REST_MS, so that under a flood each wake
# reads many: only where the socket's queue holds REST_BACKLOG messages or more (systemd sets
# net.unix.max_dgram_qlen to 512; the kernel's default, 10, would block a flood's sender
# through the rest: none then), and not after messages that brought descriptors (each costs
# the thread 0.1 ms: a rest's worth of them, queued, would hold a handler's end that long).
REST_MS, REST_BACKLOG = 2, 64

# What the thread tells the loop: a message taken ("said", handler, what, when read), dropped
# ("drop", queue, reason), or the socket found empty ("drained", when).
Item = tuple[str, Handler, Said, float] | tuple[str, str, str] | tuple[str, float]
WAIT: Item = ("wait", 0.0)  # ``judge``: ``unsure`` is full, the message waits for a start's end
KEPT: Item = ("kept", 0.0)  # ``judge``: the message is kept in ``unsure`` (``starts``)
Mark = tuple[float, int, float]  # ``mark``: when, ``count`` then, the count to be queued


class Channel(Starts):
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
        self.dropped: dict[tuple[str, str], int] = {}  # (queue, reason): messages dropped
        self.counting = threading.Lock()
        self.queue: queue.Queue[Item] = queue.Queue(QUEUED_MAX)
        self.wakeup = Wakeup()  # the thread's byte: something to take
        self.asked = Wakeup()  # the loop's byte: read the socket out now (or end: ``closing``)
        self.handlers: Mapping[int, Handler] = {}
        self.cgroup_of: Callable[[bytes], Handler | None] | None = None
        self.receiver = Receiver(self.sock, cgroups=False)
        self.uids: set[int] = set()  # the users handlers run as (``speak_as``)
        self.thread = threading.Thread(target=self.listen, name="jobd-channel", daemon=True)
        self.disposer = Disposer()
        self.closing = False
        # The thread's: a message read and not yet queued; messages read, not judged yet.
        self.holding, self.in_hand = False, 0
        # A handler's first message may be read while the loop starts it (``starting``,
        # ``started``: the loop's): one of an unknown session then waits in ``unsure`` (with
        # ``started`` then) until that start ended, a later one of its session behind it.
        self.starting, self.started, self.ended = 0, 0, threading.Event()
        self.unsure: list[tuple[Message, int, bool]] = []
        self.count, self.flushed = 0, 0  # messages read; ``count`` when it last queued them
        self.laden = 0  # messages read that brought descriptors (or lost them: MSG_CTRUNC)
        self.backlog = backlog()  # messages the socket holds, at most (``mark``)
        # The loop's: the socket last found empty, all before taken (a watchdog waits for it).
        self.drained, self.awaited = float("-inf"), False
        self.stuck: tuple[int, float] | None = None  # (count, emptied) when a mark ran out
        self.emptied = float("-inf")  # the thread's: when it last began a read that found none
        self.peek = select.poll()
        self.peek.register(self.sock, select.POLLIN)

    def start(
        self, handlers: Mapping[int, Handler], cgroup_of: Callable[[bytes], Handler | None] | None
    ) -> None:
        """The thread starts: ``handlers`` by leader pid (its session's id), ``cgroup_of`` the
        handler whose cgroup a /proc/PID/cgroup ``0::`` path is or is below (None: no cgroups)."""
        self.handlers, self.cgroup_of = handlers, cgroup_of
        self.receiver.cgroups = cgroup_of is not None
        self.thread.start()

    def speak_as(self, uids: Iterable[int]) -> None:
        """Handlers of this daemon run as ``uids`` (a config's queues, at its start and each
        reload): a message from any other user is a stranger's, known from its credentials
        alone (``receive.speakers``). Every user handlers ran as since the start stays one (a
        handler of a queue a reload removed may still run); once one is root, none is
        filtered."""
        self.uids |= set(uids)
        self.receiver.uids = speakers(self.uids)  # replaced whole: the thread's next batch

    def speaking(self, uid: int) -> None:
        """A handler runs as ``uid`` (its spawn's lookup: newer than the config's), heard."""
        if uid not in self.uids:
            self.speak_as((uid,))

    def close(self) -> None:
        """The thread ends (CLOSE_WAIT at most: one stuck in a close is left, and its socket)."""
        self.closing = True
        self.asked.wake()
        if self.thread.is_alive():
            self.thread.join(CLOSE_WAIT)
        self.disposer.close()
        if self.thread.is_alive():
            log.warning("the handlers' channel is blocked (a descriptor sent on it lingers)")
            return
        self.receiver.close()  # its spare descriptors: the thread's, ended (never both closing)
        self.forget()
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
                    self.drop("", "stranger", said.count)
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

    def mark(self) -> Mark | None:
        """A handler has exited: where the thread has read everything it sent before (in the
        socket then, or read and not queued yet), for ``past``; None when that is already so
        (the socket empty, the thread holding nothing), or when no thread would get there: it
        has ended, or it is stuck (a mark ran out with it reading nothing: none until it reads
        again). The thread is asked to read the socket out (ending a rest) and to say so."""
        began = time.monotonic()  # before the ask: a read it makes begins after this
        if not self.thread.is_alive() or self.settled() or self.stuck == (self.count, self.emptied):
            return None
        self.asked.wake()
        # + BATCH_MAX: a batch read and not all judged yet (``in_hand``) comes before them
        return began, self.count, self.count + BATCH_MAX + self.backlog

    def past(self, mark: Mark, now: float) -> bool:
        """Whether everything sent before ``mark`` is queued (then ``take``): the thread has
        found the socket empty since, or has queued what it judged of as many messages as the
        socket held then and the batch in hand (under a flood, a millisecond or so: it queues
        every PER_WAKE messages, and wakes the loop). Or LEAVE_WAIT has passed: what comes
        later is a stranger's."""
        began, count, target = mark
        if self.emptied >= began or self.flushed >= target:
            return True
        if now < began + LEAVE_WAIT:
            return False
        if self.count == count:
            self.stuck = (count, self.emptied)
        log.debug("channel: a wait for the thread gave up after %gs (%d messages read since): "
                  "a handler leaves unheard out", LEAVE_WAIT, self.count - count)  # fmt: skip
        return True

    def settled(self) -> bool:
        """The socket is empty and the thread holds no message: everything read is queued."""
        return not self.peek.poll(0) and not self.holding and not self.in_hand and not self.unsure

    def count_taken(self, handler: Handler, said: Said) -> None:
        """A message taken for ``handler`` (before it hears it): counted, a request for more time
        while it runs too (``jobd_notify_messages_total``, ``jobd_timeout_extensions_total``)."""
        if self.metrics is None:
            return
        series = self.metrics.of(handler.queue.name)
        series.notified.inc(said.count)
        if said.extends and handler.stop_reason is None:
            series.extended.inc(said.extends)

    def drop(self, queue: str, reason: str, count: int = 1) -> None:
        with self.counting:  # the loop's and the thread's
            self.dropped[queue, reason] = self.dropped.get((queue, reason), 0) + count
        if self.metrics is not None:
            self.metrics.add(self.metrics.notify_dropped, queue, count, reason=reason)

    # -- the thread's side ----------------------------------------------------------------

    def listen(self) -> None:
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        poll.register(self.asked.r, select.POLLIN)
        rest = select.poll()  # a rest after a flood's wake, ended by the loop's byte
        rest.register(self.asked.r, select.POLLIN)
        resting = self.backlog >= REST_BACKLOG
        asked_fd = self.asked.r
        while not self.closing:
            ready = poll.poll()
            # its byte read only when one came: a flood's wake is one call less
            asked = any(fd == asked_fd for fd, _ in ready) and bool(self.asked.drain())
            read, laden = self.count, self.laden
            try:
                self.read_out(asked) if not self.closing else None
            except Exception:  # never the channel's end (the sink not started, say): again
                log.exception("the handlers' channel: a read failed; reading on in 0.1 s")
                time.sleep(0.1)
            if resting and self.count != read and self.laden == laden:
                rest.poll(REST_MS)  # the next messages read together: under a flood, a wake
                # every REST_MS at most, and the loop woken as often

    def read_out(self, asked: bool) -> None:
        """Read until the socket is empty (then "drained"), queueing what each message says,
        then giving its descriptors to the disposer (which closes them elsewhere)."""
        queued = 0  # items queued
        batch: Batch = {}  # by handler: its messages, merged
        while not self.closing:
            began = time.monotonic()
            self.holding = True
            queued += self.rejudge(batch) if self.unsure else 0
            if self.receiver.held() < NEED:  # out of descriptors: the last ones given back?
                self.disposer.settle(SETTLE_WAIT)
                self.receiver.held()
            messages = self.receiver.batch(list(self.handlers), self.disposer.room(), keep=True)
            if not messages:
                queued += self.flush(batch)
                self.put(("drained", began))
                self.emptied = began
                break
            self.in_hand = sum(map(count_of, messages))
            for message in messages:
                queued += self.take_one(message, batch)
                self.in_hand -= count_of(message)
        if queued or asked:
            self.wakeup.wake()

    def take_one(self, message: Message, batch: Batch, again: bool = False) -> int:
        """One message read: judged, merged into ``batch`` (its sender's), its descriptors
        given to the disposer once what it said is queued; the items queued. ``again``: one
        judged before (``unsure``), its descriptors given then."""
        queued, before = 0, self.count
        self.count += 0 if again else count_of(message)
        pid, flags, fds = message[0], message[4], () if again else message[6]
        self.laden += bool(fds or flags & socket.MSG_CTRUNC)
        if flags & socket.MSG_CTRUNC and not again:  # its descriptors dropped (read with room)
            self.drop("", "descriptors")
        try:
            item = self.judge(message, defer=not again)
            while item is WAIT and not self.closing:
                queued += self.await_start(batch)
                item = self.judge(message, defer=not again)
        except Exception:  # a message jobd did not foresee: never the end of the channel
            log.exception("the handlers' channel: a message from pid %d not taken", pid)
            item = ("drop", "", "malformed")
        if message[8] >= 0 and item is not KEPT:  # its session's leader: no more asked
            os.close(message[8])
        if item is not None and item[0] == "said":  # (WAIT left when closing: not queued)
            _, handler, said, now = item  # type: ignore[misc]
            if (held := batch.get(id(handler))) is not None:
                held[1].merge(said)
                said = held[1]
            batch[id(handler)] = (handler, said, now)
        elif item is not None and item is not WAIT and item is not KEPT:
            self.put(item)
            queued += 1
        self.holding = bool(batch)  # read, not queued yet (``settled``)
        if (fds or flags & socket.MSG_CTRUNC) and batch:  # queued before its sender learns it
            # was read (its pipe closed: by the sink, or dropped by the kernel just now)
            queued += self.flush(batch)
        if fds:
            self.disposer.give(list(fds))
        if self.count // PER_WAKE != before // PER_WAKE:
            queued += self.flush(batch)
            self.wakeup.wake()
        return queued

    def flush(self, batch: Batch) -> int:
        """Queue what each handler said in the messages read since the last flush, merged:
        the loop takes one item a handler, whatever their number."""
        for handler, said, now in batch.values():
            self.put(("said", handler, said, now))
        count = len(batch)
        batch.clear()
        self.holding = False
        self.flushed = self.count
        return count

    def judge(self, message: Message, defer: bool = False) -> Item | None:
        """A message read: whose it is, and what it says; None for a stranger's, counted here
        (a stranger's flood costs the loop nothing). A sender found gone once its pid was
        looked up (``receive``) is a stranger: its pid may have been another process's by
        then."""
        pid, sid, cgroup, alive, flags, data, _, parsed, _ = message
        if alive is False or pid <= 0:  # gone, of a user no handler runs as, or unknown: no
            self.drop("", "stranger", count_of(message))  # handler's ever (kept for none)
            return None
        # Read before the lookup: a start that ends just after it missed is seen under way.
        started, starting, full = self.started, self.starting, len(self.unsure) >= UNSURE_MAX
        if defer and self.unsure and any(m[1] == sid for m, _, _ in self.unsure):
            return WAIT if full else self.keep(message, started, True)  # behind
        handler = self.handlers.get(sid)
        if handler is not None and not vouched(message):  # a session unknown when read,
            handler = None  # whose leader is gone: the id another's (``starts``)
        if handler is None and cgroup is not None and self.cgroup_of:
            handler = self.cgroup_of(cgroup)
        if handler is None and defer and starting:  # a start under way: its?
            return WAIT if full else self.keep(message, started, False)
        if handler is None:
            self.drop("", "stranger", count_of(message))
            return None
        if flags & socket.MSG_TRUNC:  # counted here: no item (a flood of them fills no queue)
            self.drop(handler.queue.name, "truncated", count_of(message))
            return None
        said = parse(data) if parsed is None else Said(*parsed)
        return ("said", handler, said, time.monotonic())

    def keep(self, message: Message, started: int, follows: bool) -> Item:
        """``message`` kept in ``unsure``, to be judged once the starts under way ended."""
        self.unsure.append((message, started, follows))
        return KEPT

    def put(self, item: Item) -> None:
        """Queued for the loop; while QUEUED_MAX wait, the thread waits (the loop is woken)."""
        told = False  # the loop, which makes room (``take``)
        while not self.closing:
            try:
                self.queue.put(item, block=told, timeout=0.1)
                return
            except queue.Full:
                self.wakeup.wake()
                told = True
