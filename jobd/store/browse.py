"""Pages of a queue's jobs for the dashboard's queue page: a stream read from a cursor, a few
fields of each entry cut in Redis (``lua/entries_shown.lua``: waiting jobs, dead letters), and
the delayed set by index, a member's job id and attempt cut in Redis (``lua/delayed_shown.lua``),
and the latest jobs of the history (``lua/recent.lua``). Every read is bounded by what it is
asked for: an entry read at a time, at most ``count`` shown and ``scan`` looked at, and at most
``READ_BUDGET`` bytes read in Redis (plus one entry: a stream has no read of part of a field, so
an entry is read whole); never a walk of a whole stream, set or hash."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.store.base import StoreBase

FIELD_CAP = 256  # bytes of a recent job's field returned at most
# Bytes of entries (or delayed members) one page reads in Redis at most, besides the one that
# passes it: a page of 16 MiB payloads reads one entry, not 50 (the cursor goes on).
READ_BUDGET = 1 << 20


@dataclass(frozen=True, slots=True)
class EntryPage:
    """A page of a stream: for each entry, its id and, per field asked for, its value cut
    (None: no such field) and its whole length; the last id looked at (None: none), and
    whether the end of the range was reached."""

    rows: list[tuple[str, list[tuple[bytes | None, int]]]]
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
    """A page of a delayed set: its members shown, the index to go on from, whether the end of
    the set was reached."""

    rows: list[DelayedShown]
    next: int
    ended: bool


@dataclass(frozen=True, slots=True)
class Recent:
    """A job of the history, by its latest record: its id, when (Redis ms), and what the record
    says ('' where it does not)."""

    job_id: bytes
    at_ms: int
    event: str
    attempt: str
    exit_code: str
    signal: str
    error: str
    duration_ms: str
    consumer: str


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
        shown = [
            (row[0].decode(), [(row[i], int(row[i + 1])) for i in range(1, len(row), 2)])
            for row in rows
        ]
        return EntryPage(shown, last.decode() if last else None, bool(ended))

    def delayed_shown(
        self,
        level: QueueConfig,
        first: int,
        count: int,
        scan: int,
        find: str = "",
        cap: int = FIELD_CAP,
        budget: int = READ_BUDGET,
    ) -> DelayedPage:
        """Up to ``count`` members of the level's delayed set from index ``first`` (soonest
        first), each's job id and attempt cut to ``cap`` bytes in Redis; with ``find``, only
        those whose job id holds it; ``scan`` members looked at at most, and none read once
        those read hold ``budget`` bytes."""
        args = [first, count, scan if find else count, find, budget, cap]
        index, ended, rows = self.scripts.delayed_shown(keys=[level.keys.delayed], args=args)
        shown = [DelayedShown(int(float(row[0])), row[1].decode(), row[2] or None, int(row[3]),
                              row[4] or None) for row in rows]  # fmt: skip
        return DelayedPage(shown, int(index), bool(ended))

    def recent(self, queue: QueueConfig, first: int, count: int) -> tuple[int, list[Recent]]:
        """The jobs of the history, latest record first, from index ``first``: how many it
        holds, and ``count`` of them at most, each by its latest record."""
        keys = [queue.keys.history_at, queue.keys.history]
        total, rows = self.scripts.recent(keys=keys, args=[first, count, FIELD_CAP])
        found = []
        for row in rows:
            texts = [value.decode("utf-8", "backslashreplace") for value in row[2:]]
            found.append(Recent(row[0], int(float(row[1])), *texts))
        return int(total), found
