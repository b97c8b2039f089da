"""A queue's worst case in Redis, from its settings: what `jobd validate` prints for each queue
(docs/reference/defaults.md).

What jobd itself keeps of a queue is bounded by its settings: the history (``history.maxlen``
jobs, each with up to ``retry.max_attempts`` records carrying ``history.output`` bytes of stdout
and of stderr, its done record the job's result, up to ``result_max``), the events stream
(about ``history.events`` entries), the dead letters (``dead_letter.maxlen``, each with a 4 KiB
stderr tail) and the finished entries the stream keeps (``retention.maxlen`` a priority level).
The payloads in the stream and in the dead letters are the producers' bytes: they are counted
apart (how many a queue keeps, and ``max_payload``), as is the backlog (entries not yet done),
which jobd never removes.

The constants are Redis's memory for one item less the bytes that vary (measured with MEMORY
USAGE on Redis 7: tests/test_defaults.py checks the estimate against a real daemon), rounded up.
Output is counted as text, one byte kept per byte printed; a byte that must be escaped
(control bytes, bytes that are not UTF-8) takes up to six, and a job's records stay within
``HISTORY_BYTES`` whatever they hold, but for a done record larger than that on its own (a
large result), which is kept alone. A result is counted as base64 (a result that is not UTF-8;
text takes no more room, ``store.notes.result_field``), and such a record with what Redis's
allocator (jemalloc) rounds it up to: up to a quarter more.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobd.config.types import QueueConfig
from jobd.process.output import STDERR_TAIL
from jobd.store.keys import HISTORY_BYTES

RECORD = 640  # a record's JSON but its output tails and stream name: times, attempt, host, …
SMALL_RECORD = 256  # a record without output: a retry's promotion, a reclaim, a lost lease
JOB = 192  # a job's field in the history hash and member in history:at, its job id included
EVENT = 256  # an entry of the events stream (a job id of an entry id's length)
DEAD_LETTER = 1536  # a dead letter but its payload and stderr tail (a stream node its own)
ENTRY = 128  # a finished entry kept in the stream, but its payload
STREAM_SLACK = 100  # entries a stream trimmed with MAXLEN ~ may hold beyond it (one node)
RESULT_TEXT = 384  # a short result kept as text whatever it holds: 63 characters, escaped


@dataclass(frozen=True)
class Footprint:
    """A queue's worst case in bytes, payloads apart; ``stream`` None: its retention is
    ``unbounded``."""

    history: int
    events: int
    dead_letters: int
    stream: int | None
    kept_payloads: int | None  # payloads kept: finished entries and dead letters (None: no bound)
    max_payload: int

    @property
    def total(self) -> int | None:
        """Bytes of all but the payloads; None when the stream is unbounded."""
        if self.stream is None:
            return None
        return self.history + self.events + self.dead_letters + self.stream

    def as_json(self) -> dict[str, int | None]:
        return {
            "bytes": self.total,
            "history": self.history,
            "events": self.events,
            "dead_letters": self.dead_letters,
            "stream": self.stream,
            "kept_payloads": self.kept_payloads,
            "max_payload": self.max_payload,
        }

    def describe(self) -> str:
        """One line: the total and its parts, then the payloads."""
        if self.total is None:
            return (
                f"unbounded: retention.maxlen is unbounded (history {size(self.history)}, "
                f"events {size(self.events)}, dead letters {size(self.dead_letters)}, "
                "besides every entry ever enqueued)"
            )
        return (
            f"at most {size(self.total)} (history {size(self.history)}, events "
            f"{size(self.events)}, dead letters {size(self.dead_letters)}, stream "
            f"{size(self.stream or 0)}) plus the payloads of {self.kept_payloads:,} entries kept "
            f"(at most {size(self.max_payload)} each), besides its backlog"
        )


def per_job(q: QueueConfig) -> int:
    """A job's history at most: every attempt recorded with its output tails full, each
    retry's promotion, and the last attempt's result; never more than HISTORY_BYTES of
    records, but for a done record larger than that, which is kept alone."""
    attempts = q.retry.max_attempts
    attempt = RECORD + len(q.stream) + 2 * q.history.output
    done = attempt + result_bytes(q)
    records = (attempts - 1) * (attempt + SMALL_RECORD) + done
    return JOB + max(min(HISTORY_BYTES, records), allocated(done))


def result_bytes(q: QueueConfig) -> int:
    """What a result of ``result_max`` bytes takes in its done record at most: as base64 (its
    bytes not UTF-8), or a short one as escaped text; none when a queue takes none."""
    if q.result_max <= 0:
        return 0
    return max(4 * -(-q.result_max // 3), RESULT_TEXT) + len('"result_base64":"",')


def allocated(n: int) -> int:
    """The bytes jemalloc gives a string of ``n`` bytes: its size class (four a power of two,
    so up to a quarter more than asked)."""
    if n <= 16:
        return 16
    step = 1 << max((n - 1).bit_length() - 3, 0)
    return -(-n // step) * step


def worst_case(q: QueueConfig) -> Footprint:
    """The most a queue keeps in Redis by its settings (see the module's docstring)."""
    history = q.history.maxlen * per_job(q)
    events = (q.history.events + STREAM_SLACK) * EVENT
    dead_letters = q.dead_letter.maxlen * (DEAD_LETTER + STDERR_TAIL)
    kept = [level.retention_maxlen for level in q.all_levels()]
    stream = None
    if all(n is not None for n in kept):
        stream = sum((n or 0) + STREAM_SLACK for n in kept) * ENTRY
    entries = None if stream is None else stream // ENTRY + q.dead_letter.maxlen
    return Footprint(history, events, dead_letters, stream, entries, q.max_payload)


def size(n: int) -> str:
    """``n`` bytes in binary units, three significant digits at most: 61.2 MiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
