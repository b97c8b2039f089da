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

FIELD_CAP = 256  # bytes of a recent job's field returned at most
# Bytes of entries (or delayed members, or histories) one page reads in Redis at most, besides
# the one that passes it: a page of 16 MiB payloads reads one entry, not 50 (the cursor goes on).
READ_BUDGET = 1 << 20
# What a field costs the budget besides its name and value (lua/lib/shown.lua's FIELD_COST;
# delayed_shown.lua's): an entry of 100 000 empty fields holds a few bytes, costs as 6 MiB.
FIELD_COST = 64


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

    due_ms: int
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
    at_ms: int
    unread: int
    event: str
    attempt: str
    exit_code: str
    signal: str
    error: str
    duration_ms: str
    consumer: str


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
        shown = [DelayedShown(int(float(row[0])), row[1].decode(), row[2] or None, int(row[3]),
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
            found.append(Recent(row[0], int(float(row[1])), int(row[2]), *texts))
        last = Cursor.of(rows[-1][1], rows[-1][0]) if rows and not ended else None
        return int(total), found, last
