"""A handler's output streams: each logged line by line, up to a limit per job (and the logs'
shared rate limit), and its tail kept for the job's history and dead-letter record."""

from __future__ import annotations

import logging
from typing import Protocol

from jobd import logs

LOG_LIMIT = 64 * 1024  # bytes of each output stream logged per job; the rest is counted
LINE_LIMIT = 4096  # a longer line is logged in pieces
# Bytes of stderr kept for the dead-letter record (here, not in ``handler``: `jobd validate`
# counts it in a queue's worst case without importing the handler's machinery).
STDERR_TAIL = 4096


class Logs(Protocol):
    def log(self, level: int, message: str, *args: object) -> None: ...


class Output:
    """One of a handler's output streams: logged line by line up to a limit, tail kept."""

    def __init__(self, handler: Logs, name: str, keep: int) -> None:
        self.handler = handler
        self.name = name
        self.partial = b""
        self.logged = 0
        self.dropped = 0
        self.keep = keep  # bytes of its tail kept
        self.tail = bytearray()

    def feed(self, data: bytes) -> None:
        if self.keep:
            self.tail += data
            del self.tail[: -self.keep]
        if self.logged >= LOG_LIMIT:
            self.dropped += len(data)
            return
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > LINE_LIMIT:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self._log(line)

    def close(self) -> None:
        if self.partial:
            self._log(self.partial)
            self.partial = b""
        if self.dropped:
            self.handler.log(
                logging.WARNING, "%s: %d more bytes not logged", self.name, self.dropped
            )

    def _log(self, line: bytes) -> None:
        if self.logged >= LOG_LIMIT or not logs.OUTPUT_LIMIT.allow():
            self.dropped += len(line) + 1
            return
        self.logged += len(line) + 1
        text = line.decode("utf-8", "backslashreplace")
        self.handler.log(logging.INFO, "%s: %s", self.name, text)
