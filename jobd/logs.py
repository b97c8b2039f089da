"""Logging to stderr, as text or JSON lines, or to the journal.

Under systemd, with stderr going to the journal (``JOURNAL_STREAM`` names it: docs/operations/
logs.md), each record is one entry sent in journald's native protocol (``JournalHandler``), with
structured fields (``JOBD_QUEUE``, ``JOBD_JOB_ID``, ``JOBD_ATTEMPT``, ``JOBD_OUTCOME`` on a job's
lines); where journald's native socket is missing, each line starts with its syslog priority as
sd-daemon(3) has it (``<4>`` a warning), which journald strips and keeps as the entry's priority
(``journalctl -p warning`` finds it). Either way text carries no timestamp (journald adds its
own). JSON lines carry
``ts``, ``level``, ``logger`` and ``message``, plus ``queue``, ``job`` and ``attempt`` when the
line is about a job (parsed from the ``queue=… job=… attempt=…`` tag every job line starts with),
and ``trace_id`` when that job carries a trace context (the tag's ``trace=…``: ``Job.tag``).
Handler output goes through ``OutputLimiter``: a flood from one handler cannot drown the log.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import stat
import sys
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

import orjson

_TAG = re.compile(
    r"^queue=(?P<queue>\S+) job=(?P<job>\S+)(?: attempt=(?P<attempt>\d+))?"
    r"(?: trace=(?P<trace>[0-9a-f]{32}))?"
)


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


# What else ends or hides a word: every space (the ASCII one included) and every format
# character (Unicode categories Zs, Zl, Zp, Cf: a no-break space, a line or paragraph separator,
# a zero-width or bidi control), which a reader, or the tag parser below, takes for a word's end
# or does not see at all.
_NOT_IN_A_WORD = frozenset(("Cc", "Cf", "Cs", "Zs", "Zl", "Zp"))


def word(text: str) -> str:
    """``text`` as one unmistakable word: ``printable``, and every space and format character
    escaped too (``\\x20``, ``\\xa0``, ``\\u202e``). What a log line, or a line the CLI
    prints, shows of an identifier others chose (a job id): one with a no-break space or a bidi
    control cannot pass for another job's, in the text or in the JSON log's ``job`` field."""
    if text.isascii() and text.isprintable() and " " not in text:  # nearly every job id
        return text
    return "".join(_word_char(ch) for ch in text)


def _word_char(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it
        return f"\\x{code - 0xDC00:02x}"
    if ch != " " and unicodedata.category(ch) not in _NOT_IN_A_WORD:
        return ch
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


# In UTF-8 JSON text, the C1 controls (U+0080-U+009F) and the line and paragraph separators
# (U+2028, U+2029): each lead byte here begins one of them, as no other character can.
_JSON_UNSAFE = re.compile(rb"\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]")


def _json_escape(match: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % ord(match.group().decode())


def safe_json(body: bytes) -> bytes:
    """JSON text (orjson's) with the characters JSON may carry raw but a terminal acts on (C1
    controls: U+009B is CSI, U+0085 a newline) or a reader takes for a line's end (U+2028,
    U+2029) escaped as ``\\u0085``: what the CLI's ``--json`` prints of others' bytes."""
    return _JSON_UNSAFE.sub(_json_escape, body) if _JSON_UNSAFE.search(body) else body


class JSONFormatter(logging.Formatter):
    process: int | None = None  # which of a supervisor's daemons logs (``setup``)

    def format(self, record: logging.LogRecord) -> str:
        message = printable(record.getMessage())  # bytes that were not UTF-8 as \xff
        record.message = message  # as logging.Formatter does: for JournalHandler's fields
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
            if tag["trace"]:
                body["trace_id"] = tag["trace"]
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

    def formatException(self, ei: Any) -> str:
        """The traceback, each of its lines escaped: a NUL, carriage return or escape sequence
        in an exception's message (others' bytes) cannot end or forge a line, nor lose the
        journal's priority prefix (``prefixed`` starts each line with it)."""
        return _lines_printable(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _lines_printable(super().formatStack(stack_info))

    _second = -1
    _stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:  # called under the handler's lock
            self._stamp = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"


def _lines_printable(text: str) -> str:
    return "\n".join(printable(line) for line in text.split("\n"))


# sd-daemon(3)'s prefixes: syslog priorities (3 error, 4 warning, 6 info, 7 debug).
PRIORITIES = {logging.CRITICAL: "<2>", logging.ERROR: "<3>", logging.WARNING: "<4>",
              logging.INFO: "<6>", logging.DEBUG: "<7>"}  # fmt: skip


def to_journal(stream: object = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` (default stderr) is the journal's: systemd sets JOURNAL_STREAM to
    "DEVICE:INODE" of the stream it connects stdout and stderr to, and a process whose stderr was
    redirected elsewhere (a shell's 2>file) still inherits the variable, so the two must match."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not all(n.isascii() and n.isdigit() and len(n) <= 20 for n in (device, inode)):
        return False
    try:
        st = os.fstat((sys.stderr if stream is None else stream).fileno())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # no descriptor: not the journal's
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def with_priority(text: str, level: int) -> str:
    """Each line of ``text`` with the sd-daemon prefix of ``level``."""
    prefix = PRIORITIES.get(level, "<6>")
    return "\n".join(prefix + line for line in text.split("\n"))


def prefixed(formatter: logging.Formatter) -> logging.Formatter:
    """``formatter`` with each line of a record (a traceback's too: journald makes an entry of
    each line) starting with the record's priority."""
    plain = formatter.format

    def format(record: logging.LogRecord) -> str:
        return with_priority(plain(record), record.levelno)

    formatter.format = format  # type: ignore[method-assign]
    return formatter


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler without the flush after every record: stderr is line buffered (always,
    since Python 3.9), so each line is one write already."""

    def flush(self) -> None:
        pass


def setup(level: str = "INFO", fmt: str = "text", process: int | None = None) -> None:
    """Log to stderr, or to the journal's native socket when stderr is the journal's;
    ``process``: this is that daemon of a supervisor's (``processes``), and each line says so
    (``[p2]`` after the logger's name, or ``"process": 2``)."""
    # Fields no format here uses, not collected for every record (the logging HOWTO's
    # "Optimization" section): the caller's file and line, thread, process.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    journal = to_journal()
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JSONFormatter()
        formatter.process = process
    else:
        tag = "" if process is None else f"[p{process}]"
        text = f"%(levelname)s %(name)s{tag}: %(message)s"
        formatter = TextFormatter(text if journal else "%(asctime)s " + text)
    native = journal_socket() if journal else None
    handler: logging.Handler
    if native is not None:
        handler = JournalHandler(native, process)
        handler.setFormatter(formatter)
    else:
        handler = LineHandler(sys.stderr)
        handler.setFormatter(prefixed(formatter) if journal else formatter)
    root = logging.getLogger("jobd")
    for old in root.handlers:
        old.close()
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


# journald's native protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL): one datagram an entry.
JOURNAL_SOCKET = "/run/systemd/journal/socket"


def journal_socket(environ: Mapping[str, str] | None = None) -> str | None:
    """The path of journald's native socket, None if there is none (journald not running, or
    not reachable from here: another mount namespace). ``JOBD_JOURNAL_SOCKET`` names another
    path: for tests only, which cannot bind the real one."""
    path = (os.environ if environ is None else environ).get("JOBD_JOURNAL_SOCKET") or JOURNAL_SOCKET
    try:
        return path if stat.S_ISSOCK(os.stat(path).st_mode) else None
    except OSError:
        return None


def field(name: bytes, value: str) -> bytes:
    """One field of an entry: ``NAME=value\\n``, or, for a value with a newline (a traceback),
    ``NAME\\n``, the value's length as 64-bit little-endian, the value and ``\\n``."""
    data = value.encode("utf-8", "backslashreplace")  # a lone surrogate as \udcff
    if b"\n" in data:
        return b"%s\n%s%s\n" % (name, len(data).to_bytes(8, "little"), data)
    return b"%s=%s\n" % (name, data)


_PRIORITY = {level: b"PRIORITY=%s\n" % p[1:-1].encode() for level, p in PRIORITIES.items()}
SEND_BUFFER = 8 << 20  # what one datagram may be, at most (capped by net.core.wmem_max)


class JournalHandler(logging.Handler):
    """Each record one entry in the journal, sent to its native socket: ``MESSAGE`` (the line
    stderr would have had, without a prefix: a traceback's lines in the one entry),
    ``PRIORITY``, ``SYSLOG_IDENTIFIER=jobd``, ``LOGGER`` (the logger's name), ``JOBD_PROCESS``
    for a supervisor's daemon; on a job's line ``JOBD_QUEUE``, ``JOBD_JOB_ID``, ``JOBD_ATTEMPT``
    from its tag (escaped as the message is: ``word``), and the fields the record brings in
    ``journal`` (an outcome's ``JOBD_OUTCOME``, ``JOBD_ERROR``: ``Outcome.journal``).

    Never blocks the loop, never loses a record: the socket does not wait, and a record it does
    not take (journald's queue full, a record over a datagram's limit, journald stopped) is
    written to ``stream`` instead, as a line with its priority prefix (``fallbacks`` counts
    them). The socket is not connected: each datagram goes to the path, so a restarted journald
    gets the next one."""

    def __init__(self, path: str, process: int | None = None, stream: object = None) -> None:
        super().__init__()
        self.path = path
        self.stream = sys.stderr if stream is None else stream
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.setblocking(False)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self.fixed = b"SYSLOG_IDENTIFIER=jobd\n"
        if process is not None:
            self.fixed += b"JOBD_PROCESS=%d\n" % process
        self.fallbacks = 0

    def entry(self, record: logging.LogRecord, text: str) -> bytes:
        """The datagram of ``record``, formatted as ``text``: the fields of one line encoded at
        once, a field with a newline (a traceback's message) in the binary form (``field``)."""
        plain = f"LOGGER={record.name}\n"
        tag = _TAG.match(getattr(record, "message", ""))  # printable: set by the formatter
        if tag:  # \S+: no newline in any of them
            queue, job, attempt = tag.group("queue", "job", "attempt")
            plain += f"JOBD_QUEUE={queue}\nJOBD_JOB_ID={job}\n"
            if attempt:
                plain += f"JOBD_ATTEMPT={attempt}\n"
        lines = b""
        fields: Mapping[str, str] | None = getattr(record, "journal", None)
        for name, value in fields.items() if fields else ():
            if "\n" in value:
                lines += field(name.encode(), value)
            else:
                plain += f"{name}={value}\n"
        if "\n" in text:
            lines += field(b"MESSAGE", text)
        else:
            plain = f"MESSAGE={text}\n{plain}"
        priority = _PRIORITY.get(record.levelno, b"PRIORITY=6\n")
        return b"".join((plain.encode("utf-8", "backslashreplace"), lines, self.fixed, priority))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            datagram = self.entry(record, text)
        except Exception:
            self.handleError(record)
            return
        try:
            self.socket.sendto(datagram, self.path)
            return
        except OSError:  # EAGAIN, EMSGSIZE, ENOENT, ECONNREFUSED: this record on stderr
            self.fallbacks += 1
        try:
            self.stream.write(with_priority(text, record.levelno) + "\n")  # type: ignore[attr-defined]
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self.socket.close()
        super().close()


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
