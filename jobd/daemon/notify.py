"""sd_notify without a dependency: the protocol is one datagram on an AF_UNIX socket.

``NOTIFY_SOCKET`` names the socket (a leading ``@`` means the abstract namespace). Messages are
newline-separated ``KEY=value`` lines: ``READY=1``, ``STATUS=…``, ``WATCHDOG=1``,
``STOPPING=1``, ``RELOADING=1`` (with ``MONOTONIC_USEC``, or ``systemctl reload`` can hang).
Outside systemd every call is a no-op. A failed send is logged, never raised: the daemon does
not die because systemd went away.

A supervisor (``processes`` over 1) hears its daemons the same way: each is started with
``NOTIFY_SOCKET`` naming the supervisor's ``Listener``, never systemd's, and only the
supervisor tells systemd anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping

log = logging.getLogger("jobd.notify")


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_interval = watchdog_usec / 2_000_000 if watchdog_usec else None
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._warned = False
        self.next_watchdog = 0.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        watchdog = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        usec = int(watchdog) if _decimal(watchdog, 20) else None
        if _decimal(pid, 10) and int(pid) != os.getpid():
            usec = None  # the watchdog is meant for another process
        return cls(env.get("NOTIFY_SOCKET") or None, usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: object) -> None:
        if self.address is None:
            return
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(
                        socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    )
                self._sock.sendto(message, target)
            except OSError as exc:
                if not self._warned:
                    log.warning("cannot notify systemd at %s: %s", self.address, exc)
                    self._warned = True

    def ready(self, status: str, **extra: str) -> None:
        """READY=1, at start and after each reload (applied or refused); ``extra``: fields of
        jobd's own (``X_JOBD_…``), which systemd ignores."""
        self.send(READY=1, STATUS=status, **extra)

    def status(self, status: str) -> None:
        self.send(STATUS=status)

    def reloading(self) -> None:
        self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)

    def stopping(self, status: str) -> None:
        self.send(STOPPING=1, STATUS=status)

    def watchdog(self, now: float) -> None:
        """Called from the main loop only: a wedged loop stops the pings, and systemd acts."""
        if self.watchdog_interval is None or now < self.next_watchdog:
            return
        self.next_watchdog = now + self.watchdog_interval
        self.send(WATCHDOG=1)


UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid (SCM_CREDENTIALS)


class Listener:
    """The receiving end, for a supervisor: a datagram socket at ``path`` (in a directory only
    this user can enter) that reads each message with its sender's pid, as the kernel vouches
    for it (``SO_PASSCRED``), so a message is known to come from that daemon and no other."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(path)
        self.sock.setblocking(False)
        self.path = path

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> list[tuple[int, dict[str, str]]]:
        """Every message waiting: (sender's pid, its KEY=value fields)."""
        messages = []
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(UCRED.size))
            except (BlockingIOError, InterruptedError):
                return messages
            pid = next(
                (UCRED.unpack(d[: UCRED.size])[0] for level, kind, d in ancillary
                 if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS),
                0,
            )  # fmt: skip
            lines = data.decode("utf-8", "replace").splitlines()
            messages.append((pid, dict(line.partition("=")[::2] for line in lines if line)))

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _decimal(text: str | None, digits: int) -> bool:
    """Whether an environment variable's ``text`` is a decimal ``int`` takes: ASCII digits
    only (``str.isdigit`` alone takes "²", which ``int`` refuses), ``digits`` of them at most."""
    return text is not None and text.isascii() and text.isdigit() and len(text) <= digits
