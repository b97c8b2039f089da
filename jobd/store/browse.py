"""Pages of a queue's jobs for the dashboard's queue page: a stream read from a cursor, a few
fields of each entry cut in Redis (``lua/entries_shown.lua``: waiting jobs, dead letters), and
the delayed set, a member's job id and attempt cut in Redis (``lua/delayed_shown.lua``), and the
latest jobs of the history (``lua/recent.lua``). Every read is bounded by what it is asked for:
an entry read at a time, at most ``count`` shown and ``scan`` looked at, and at most
``READ_BUDGET`` bytes read in Redis, each field counted ``FIELD_COST`` bytes more (plus one
entry: a stream has no read of part of a field, so an entry is read whole); never a walk of a
whole stream, set or hash. A job's history longer than ``READ_BUDGET`` is never read.

A page of a sorted set goes on from a ``Cursor``: the score and member (or the member's first
bytes) of the last one shown, never an index, which members leaving or coming before it would
shift (a delayed job promoted: the next page skipped one; a job ending: it repeated one)."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.store.base import StoreBase
from jobd.store.records import Event, utf8
from jobd.store.scripts import Batch

FIELD_CAP = 256  # bytes of a recent job's field returned at most
# Bytes of entries (or delayed members, or histories) one page reads in Redis at most, besides
# the one that passes it: a page of 16 MiB payloads reads one entry, not 50 (the cursor goes on).
READ_BUDGET = 1 << 20
# What a field costs the budget besides its name and value (lua/lib/shown.lua's FIELD_COST;
# delayed_shown.lua's): an entry of 100 000 empty fields holds a few bytes, costs as 6 MiB.
FIELD_COST = 64
EVENT_FIELDS = 32  # an event's fields the feed returns at most (its first ones)
# A sorted set's score read as a time (Redis ms) within a date's range (JavaScript's: ±8.64e15
# ms, the year 275760); a score past it (+inf, -inf, 1e300: anyone can ZADD one) is no time.
TIME_MAX_MS = 8_640_000_000_000_000


MARK_MAX = 1024  # bytes of a member a cursor carries at most (jobd.job.MAX_JOB_ID: a job id)
# A cursor as text: SCORE:w|p:MARK, the score as Redis writes one (%.17g or shortest: 12, 1.5,
# 1e+300, -inf), "w" when the mark is the whole member, the mark in unpadded base64url.
_CURSOR = re.compile(
    r"(-?(?:inf|[0-9]{1,20}(?:\.[0-9]{1,20})?(?:e[+-]?[0-9]{1,3})?)):([wp]):([A-Za-z0-9_-]*)",
    re.ASCII,
)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page of a sorted set goes on: just past the member of score ``score`` (as Redis
    writes it) that starts with ``mark`` (is it, when ``whole``), in the page's order; a member
    that only starts with a mark that is not whole counts as shown (``lua/lib/cursor.lua``)."""

    score: str
    mark: bytes
    whole: bool

    @classmethod
    def of(cls, score: str | bytes | int, member: bytes) -> Cursor:
        """The cursor just past ``member`` (its first MARK_MAX bytes kept)."""
        text = score.decode() if isinstance(score, bytes) else str(score)
        return cls(text, member[:MARK_MAX], len(member) <= MARK_MAX)

    def text(self) -> str:
        mark = base64.urlsafe_b64encode(self.mark).rstrip(b"=").decode()
        return f"{self.score}:{'w' if self.whole else 'p'}:{mark}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """A cursor a page gave; ValueError for anything else."""
        found = _CURSOR.fullmatch(text)
        if found is None or len(found[3]) % 4 == 1 or len(found[3]) > (MARK_MAX * 4 + 2) // 3:
            raise ValueError("not a cursor")
        mark = base64.urlsafe_b64decode(found[3] + "=" * (-len(found[3]) % 4))
        return cls(found[1], mark, found[2] == "w")

    def args(self) -> list[object]:
        """As the scripts take a cursor (lua/lib/cursor.lua's resume)."""
        return [self.score, self.mark, 1 if self.whole else 0]

    def passed(self, score: float, member: bytes) -> bool:
        """Whether (``score``, ``member``) comes after this cursor, in ascending order (as
        lua/lib/cursor.lua's past_mark decides it in Redis)."""
        if score != float(self.score):
            return score > float(self.score)
        head = member[: len(self.mark)]
        return head > self.mark or (head == self.mark and self.whole and len(member) > len(head))


START = ["", b"", 0]  # a scripts' cursor for the first page


def score_ms(raw: bytes | str) -> int | None:
    """A sorted set's score (as Redis sends it) as a time in ms; None for one past a date's
    range (``TIME_MAX_MS``: ±inf among them), which int() would refuse or the page not show."""
    score = float(raw)
    return int(score) if abs(score) <= TIME_MAX_MS else None


@dataclass(frozen=True, slots=True)
class EntryPage:
    """A page of a stream: for each entry, its id, how many fields it holds and, per field
    asked for, its value cut (None: no such field) and its whole length; the last id looked at
    (None: none), and whether the end of the range was reached."""

    rows: list[tuple[str, int, list[tuple[bytes | None, int]]]]
    last: str | None
    ended: bool


@dataclass(frozen=True, slots=True)
class DelayedShown:
    """A member of a delayed set as the dashboard shows it: when it is due (Redis ms), why it
    is not a job ('' when it is), its job id cut (None: it runs under its entry id once due)
    and the id's whole length, its attempt cut (None: none said)."""

    due_ms: int | None  # None: its score is no time (``score_ms``): due never
    malformed: str
    job_id: bytes | None
    job_id_length: int
    attempt: bytes | None


@dataclass(frozen=True, slots=True)
class DelayedPage:
    """A page of a delayed set: its members shown, where to go on from (None: nothing was
    looked at), whether the end of the set was reached."""

    rows: list[DelayedShown]
    next: Cursor | None
    ended: bool


@dataclass(frozen=True, slots=True)
class Recent:
    """A job of the history, by its latest record: its id, when (Redis ms), the length of its
    records when they were not read (longer than a page reads: someone else wrote them; 0 when
    read), and what the record says ('' where it does not)."""

    job_id: bytes
    at_ms: int | None  # None: its score is no time (``score_ms``)
    unread: int
    event: str
    attempt: str
    exit_code: str
    signal: str
    error: str
    duration_ms: str
    consumer: str


def _id_key(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def event_shown(queue: str, row: list) -> Event:
    """A row of ``lua/events_shown.lua`` (id, fields held, name, value, length, …)."""
    fields, cut, inexact = {}, [], []
    for i in range(2, len(row), 3):
        name = _text(row[i])
        fields[name] = _text(row[i + 1])
        if int(row[i + 2]) > len(row[i + 1]):
            cut.append(name)
        if not utf8(row[i + 1]):  # escaped: "\\xff" is also the text of 4 characters
            inexact.append(name)
    return Event(_text(row[0]), queue, fields, int(row[1]), tuple(cut), tuple(inexact))


def _event_key(event: Event) -> tuple[tuple[int, int], str]:
    return _id_key(event.id), event.queue


@dataclass
class Feed:
    """A reply of the events feed: its events, oldest first, each queue's cursor (the id of
    its last event read or skipped: of its own stream), and whether events were skipped."""

    events: list[Event]
    after: dict[str, str]
    skipped: bool


def shown_pairs(row: list) -> list[tuple[bytes | None, int]]:
    """A row of ``lib/shown.lua`` (id, width, value, length, …): its (value, length) pairs."""
    return [(row[i], int(row[i + 1])) for i in range(2, len(row), 2)]


class BrowseOps(StoreBase):
    def entries_shown(
        self,
        stream: str,
        span: tuple[str, str],
        fields: Sequence[tuple[str, int]],
        count: int,
        scan: int | None = None,
        find: str = "",
        newest_first: bool = False,
        budget: int = READ_BUDGET,
    ) -> EntryPage:
        """Up to ``count`` entries of ``stream`` in ``span`` (start, end: ids as XRANGE takes
        them; newest first: as XREVRANGE does), only ``fields`` of each (name, bytes kept: the
        first N, -N the last N); with ``find``, only those whose job id holds it, looking at
        ``scan`` entries at most; no entry read once those read hold ``budget`` bytes."""
        args: list[object] = [*span, "rev" if newest_first else "fwd", count]
        args += [scan if find and scan else count, find, budget]
        for name, cap in fields:
            args += [name, cap]
        last, ended, rows = self.scripts.entries_shown(keys=[stream], args=args)
        shown = [(row[0].decode(), int(row[1]), shown_pairs(row)) for row in rows]
        return EntryPage(shown, last.decode() if last else None, bool(ended))

    def delayed_shown(
        self,
        level: QueueConfig,
        after: Cursor | None,
        count: int,
        scan: int,
        find: str = "",
        cap: int = FIELD_CAP,
        budget: int = READ_BUDGET,
    ) -> DelayedPage:
        """Up to ``count`` members of the level's delayed set past ``after`` (None: from the
        soonest), soonest first, each's job id and attempt cut to ``cap`` bytes in Redis; with
        ``find``, only those whose job id holds it; ``scan`` members looked at at most, and none
        read once those read (the one ``after`` names included: found by halves among those of
        its due time) hold ``budget`` bytes, one at least."""
        args = [*(START if after is None else after.args()), count, scan if find else count,
                find, budget, cap]  # fmt: skip
        ended, rows, score, mark, whole = self.scripts.delayed_shown(
            keys=[level.keys.delayed], args=args
        )
        shown = [DelayedShown(score_ms(row[0]), row[1].decode(), row[2] or None, int(row[3]),
                              row[4] or None) for row in rows]  # fmt: skip
        last = Cursor(score.decode(), mark, bool(whole)) if score else None
        return DelayedPage(shown, last, bool(ended))

    def recent(
        self, queue: QueueConfig, after: Cursor | None, count: int, budget: int = READ_BUDGET
    ) -> tuple[int, list[Recent], Cursor | None]:
        """The jobs of the history, latest record first, past ``after`` (None: from the
        latest): how many it holds, ``count`` of them at most, each by its latest record (fewer
        once the records read hold ``budget`` bytes; a job's records longer than that are not
        read at all), and where to go on from (None: the end was reached)."""
        keys = [queue.keys.history_at, queue.keys.history]
        args = [*(START if after is None else after.args()), count, FIELD_CAP, budget]
        total, ended, rows = self.scripts.recent(keys=keys, args=args)
        found = []
        for row in rows:
            texts = [value.decode("utf-8", "backslashreplace") for value in row[3:]]
            found.append(Recent(row[0], score_ms(row[1]), int(row[2]), *texts))
        last = Cursor.of(rows[-1][1], rows[-1][0]) if rows and not ended else None
        return int(total), found, last

    def events_feed(
        self,
        queues: list[QueueConfig],
        after: dict[str, str] | None,
        count: int,
        budget: int = READ_BUDGET,
    ) -> Feed:
        """The dashboard's events feed (``HistoryOps.events`` as it reads them, without a wait,
        in Redis: ``lua/events_shown.lua``, of each event its first EVENT_FIELDS fields, names
        and values cut to FIELD_CAP bytes): every queue's events after ``after`` (queue -> id),
        oldest first, or when more than ``count`` came since (or ``after`` is None), the newest
        ``count``, with each queue's cursor at its own newest event (``skipped`` when ``after``
        was given). The queues share ``budget`` bytes a read (one event a queue at least); a
        request makes three reads at most (since; the newest of the queues that stopped at their
        share, with what the first read left of ``budget``; the newest of all)."""
        share = max(1, budget // max(1, len(queues)))
        if after is not None:
            since = {q.name: after.get(q.name, "0-0") for q in queues}
            feed = self._events_since(queues, since, count, budget)
            if feed is not None:
                return feed
        read = self._events_read(queues, "rev", {}, count, share)
        # A queue stopped at its share has older events not read: those of every queue before
        # its oldest returned are left out too, so what is shown is every event of its span.
        edge = max((_id_key(found[-1].id) for more, found, _ in read if more), default=(0, 0))
        events = sorted((e for _, found, _ in read for e in found if _id_key(e.id) >= edge),
                        key=_event_key)  # fmt: skip
        newest = zip(queues, (found for _, found, _ in read), strict=True)
        cursor = {q.name: found[0].id if found else "0-0" for q, found in newest}
        return Feed(events[-count:], cursor, after is not None)

    def _events_since(
        self, queues: list[QueueConfig], since: dict[str, str], count: int, budget: int
    ) -> Feed | None:
        """The events after ``since``, or None when more than ``count`` came since (the caller
        gives the newest, ``skipped``). A queue that stopped at its share is read from its
        newest down to where it stopped, what the first read left of ``budget`` shared among
        those that stopped (its share at least; a probe capped at one share fell behind a busy
        queue for good: two shares of jobd's events with 1 KiB ids hold fewer than 50): what came
        since is then known whole (or more than ``count``); else (events of more than
        ``budget`` ÷ ``count`` each) its events past where it stopped, and every queue's, wait
        for the next request."""
        share = max(1, budget // max(1, len(queues)))
        read = self._events_read(queues, "fwd", since, count + 1, share)
        events = [e for _, found, _ in read for e in found]
        stopped = [(q, found) for q, (more, found, _) in zip(queues, read, strict=True)
                   if more and found]  # fmt: skip
        unread = 0  # events known to have come since, past a gap not read
        edges: list[tuple[int, int]] = []
        if stopped and len(events) <= count:
            left = budget - sum(spent for _, _, spent in read)  # what the first read left
            tails = {q.name: found[-1].id for q, found in stopped}
            wide = max(1, left // len(stopped), share)
            probes = self._events_read([q for q, _ in stopped], "rev", tails, count + 1, wide)
            for (q, _), (more, newest, _) in zip(stopped, probes, strict=True):
                if more:  # a gap between where it stopped and its newest read: these wait
                    edges.append(_id_key(tails[q.name]))
                    unread += len(newest)
                else:
                    events += newest
        if len(events) + unread > count:
            return None
        events.sort(key=_event_key)
        if edges:
            events = [e for e in events if _id_key(e.id) <= min(edges)]
        cursor = dict(since)
        for event in events:
            cursor[event.queue] = event.id
        return Feed(events, cursor, False)

    def _events_read(
        self, queues: list[QueueConfig], mode: str, since: dict[str, str], want: int, share: int
    ) -> list[tuple[bool, list[Event], int]]:
        """Each queue's events (``lua/events_shown.lua``): whether it stopped at ``share``
        bytes (it may hold more), those read, and the bytes read (as counted)."""
        batch = Batch()
        for q in queues:
            args = [mode, since.get(q.name, ""), want, share, EVENT_FIELDS, FIELD_CAP]
            batch.add(self.scripts.events_shown, [q.keys.events], args)
        read = []
        for q, reply in zip(queues, self.run(batch), strict=True):
            stopped, rows, spent = reply if isinstance(reply, list) else (0, [], 0)  # not a stream
            read.append((bool(stopped), [event_shown(q.name, row) for row in rows], int(spent)))
        return read
