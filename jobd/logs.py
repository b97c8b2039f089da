"""Logging to stderr, as text or JSON lines.

Text carries timestamps only when journald is not there to add its own. JSON lines carry
``ts``, ``level``, ``logger`` and ``message``, plus ``queue``, ``job`` and ``attempt`` when the
line is about a job (parsed from the ``queue=… job=… attempt=…`` tag every job line starts with).
Handler output goes through ``OutputLimiter``: a flood from one handler cannot drown the log.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time

import orjson

_TAG = re.compile(r"^queue=(?P<queue>\S+) job=(?P<job>\S+)(?: attempt=(?P<attempt>\d+))?")


# Characters a terminal or a log reader acts on (C0, DEL, C1: newlines that forge lines, escape
# sequences that retitle or clear a terminal or write its clipboard), and the lone surrogates
# that stand for bytes that are not UTF-8 (surrogateescape).
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\x1b``): what jobd prints of other
    people's bytes (job ids, consumer names, a handler's output) cannot forge a log line or
    drive a terminal."""
    return _UNPRINTABLE.sub(_escaped, text) if _UNPRINTABLE.search(text) else text


class JSONFormatter(logging.Formatter):
    process: int | None = None  # which of a supervisor's daemons logs (``setup``)

    def format(self, record: logging.LogRecord) -> str:
        message = printable(record.getMessage())  # bytes that were not UTF-8 as \xff
        body: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if self.process is not None:
            body["process"] = self.process
        tag = _TAG.match(message)
        if tag:
            body["queue"], body["job"] = tag["queue"], tag["job"]
            if tag["attempt"]:
                body["attempt"] = int(tag["attempt"])
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(body).decode()


class TextFormatter(logging.Formatter):
    """The text format, each second's timestamp made once: a line is logged for every job,
    and strftime for each was a tenth of the main loop's time spent logging. Control
    characters in a message are escaped (``printable``); a traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    _second = -1
    _stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:  # called under the handler's lock
            self._stamp = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler without the flush after every record: stderr is line buffered (always,
    since Python 3.9), so each line is one write already."""

    def flush(self) -> None:
        pass


def setup(level: str = "INFO", fmt: str = "text", process: int | None = None) -> None:
    """Log to stderr; ``process``: this is that daemon of a supervisor's (``processes``), and
    each line says so (``[p2]`` after the logger's name, or ``"process": 2``)."""
    # Fields no format here uses, not collected for every record (the logging HOWTO's
    # "Optimization" section): the caller's file and line, thread, process.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = LineHandler(sys.stderr)
    if fmt == "json":
        formatter = JSONFormatter()
        formatter.process = process
        handler.setFormatter(formatter)
    else:
        tag = "" if process is None else f"[p{process}]"
        text = f"%(levelname)s %(name)s{tag}: %(message)s"
        if not os.environ.get("JOURNAL_STREAM"):
            text = "%(asctime)s " + text
        handler.setFormatter(TextFormatter(text))
    root = logging.getLogger("jobd")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class OutputLimiter:
    """A token bucket for handler output lines, shared by every handler of the daemon:
    ``rate`` lines a second on average, bursts up to ``burst``. Lines over the limit are counted
    and reported once the bucket refills."""

    def __init__(self, rate: float = 1000.0, burst: float = 5000.0) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()
        self.dropped = 0

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            if self.dropped:
                dropped, self.dropped = self.dropped, 0
                logging.getLogger("jobd.handler").warning(
                    "%d handler output line(s) not logged: over %g lines/s", dropped, self.rate
                )
            return True
        self.dropped += 1
        return False


OUTPUT_LIMIT = OutputLimiter()
