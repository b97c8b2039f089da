"""The loop's one wait: an epoll over every descriptor it acts on and what each stands for; and
what wakes it besides its handlers: signals (``Signals``) and other threads (``Wakeup``)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal

from jobd.process import spawn
from jobd.process.handler import Handler

log = logging.getLogger("jobd.daemon")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# A handler's (handler, "exit" | "out" | "in"), or "signal" or "wake".
Watched = str | tuple[Handler, str]


class Poller:
    """What selectors.DefaultSelector does, with less work per call (measured: a job costs six
    of them)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.watched: dict[int, Watched] = {}

    def register(self, fd: int, events: int, what: Watched) -> None:
        self.epoll.register(fd, events)
        self.watched[fd] = what

    def unregister(self, fd: int) -> None:
        self.epoll.unregister(fd)
        del self.watched[fd]

    def __contains__(self, fd: int) -> bool:
        return fd in self.watched

    def poll(self, timeout: float) -> list[tuple[int, Watched]]:
        return [(fd, self.watched[fd]) for fd, _ in self.epoll.poll(timeout)]

    def watch_handler(self, handler: Handler) -> None:
        """Its exit (pidfd), its output, and room in its stdin pipe while a payload is left."""
        self.register(handler.pidfd, select.EPOLLIN, (handler, "exit"))
        for fd in handler.output_fds():
            self.register(fd, select.EPOLLIN, (handler, "out"))
        stdin = handler.input_fd()
        if stdin is not None:
            self.register(stdin, select.EPOLLOUT, (handler, "in"))

    def forget_handler(self, handler: Handler) -> None:
        for fd in (handler.pidfd, *handler.output_fds(), handler.input_fd()):
            if fd is not None and fd in self:
                self.unregister(fd)


class Wakeup:
    """A pipe other threads write a byte to, so the loop's poll returns."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # A byte written and not drained yet: a wake then writes none (under a flood on the
        # handlers' channel, its thread wakes the loop a thousand times a second). Set before
        # the write, cleared after the read (cleared before it, a byte written meanwhile would
        # be read with pending left set: no wake would write again): the reader, which drains
        # before it takes what it was woken for, takes what a wake that wrote nothing was for.
        self.pending = False

    def wake(self) -> None:
        if self.pending:
            return
        self.pending = True
        with contextlib.suppress(BlockingIOError):  # full: the loop is already due to wake
            os.write(self.w, b"\0")

    def drain(self) -> bytes:
        data = drain(self.r)
        self.pending = False
        return data


class Signals:
    """A signal only leaves its number in a pipe (``signal.set_wakeup_fd``); the loop reads
    them (``take``) and acts. Handlers get the default disposition of every signal, even one
    ignored when jobd started."""

    def __init__(self) -> None:
        self.pipe = Wakeup()
        self.fd = self.pipe.r

    def install(self) -> None:
        reset = spawn.reset_inherited_ignores()
        if reset:
            names = ", ".join(s.name for s in reset)
            log.debug("signals ignored when jobd started: %s; handlers get their default", names)
        for signum in (*STOP_SIGNALS, signal.SIGHUP):
            signal.signal(signum, _note_signal)
        signal.set_wakeup_fd(self.pipe.w, warn_on_full_buffer=False)

    def take(self) -> bytes:
        return self.pipe.drain()


def _note_signal(signum: int, frame: object) -> None:
    """Signals are acted on by the loop, which reads them from the wakeup fd."""


def drain(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk
