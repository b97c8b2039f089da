"""Review 36n of issue 36: 2 000 jobs running in one queue (20 daemons of concurrency 100),
each of whose handlers reports a status line of 1 KiB as a terminal progress line (ANSI
``\\x1b[2K`` escapes), and the running tab shows none of them: ``unread`` 2 000, the overview's
count "at most"; the docs promise the first 1 000 records and 1 MiB.

jobd keeps a status line's first STATUS_MAX (1 KiB) bytes, escaped in the record's JSON
(``jobd/store/leases.py`` ``fields``: orjson writes ESC as ``\\u001b``, 6 bytes): a record of about
2.1 KiB, within ACTIVE_CAP (16 KiB). ``lib/shown.lua hash_read`` reads a table's names only
when ``MEMORY USAGE … SAMPLES 0`` is NAMES_WEIGHED (4 MiB) or less, else none at all: 2 000
such records weigh about 5 MiB. docs/operations/dashboard.md's running row says "1 000 records
and 1 MiB at most (beyond, the page says how many were not read)": not the 1 MiB's worth
(about 490 records) but nothing is read; at about 1 600 records (4 MiB) the tab goes from 490
to none. A record jobd writes counts in the weight as a hostile value does.

What should happen: with records of a size jobd writes, the tab shows what its bounds hold
(RUNNING_READ records, 1 MiB), the rest counted unread (e.g. a weight bound that follows RUNNING_READ x ACTIVE_CAP, or reading
names by a bounded HSCAN of a table, whose names jobd writes small).

Fixed (lib/shown.lua hash_read): a table's names are read when it weighs no more than the
read's records at their cap (``most`` × ``cap``: the running tab's 1 000 × 16 KiB, 16 MiB; 4 MiB
at least, as before, for the other reads), so 2 000 such records are read to the tab's 1 MiB
and the rest counted unread; a 64 MiB value or name still leaves the hash not read.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis
from support import queue_config, running_records, running_tab_read

RUNNING = 2000
STATUS = (b"\x1b[2K\x1b[1G#" * 103)[:1024].decode()  # a terminal progress line, 1 KiB


def record(stream: str, i: int, entry: str) -> tuple[str, bytes]:
    """The i-th job's running record, with STATUS as its status line."""
    note = {"stream": stream, "entry": entry, "consumer": "host-1-abcd",
            "host": "host", "pid": 1000 + i, "since": 1700000000000, "attempt": 1,
            "progress": 42, "status": STATUS}  # fmt: skip
    return f"job-{i:04d}", orjson.dumps(note)


def test_running_records_jobd_writes_leave_the_running_tab_blank(
    r: redis.Redis, write_config: Any
) -> None:
    queue = running_records(r, write_config(queue_config("[/bin/true]")), RUNNING, record)
    size = len(r.hget(queue.keys.active, "job-0000") or b"")
    what = (
        f"of {size} bytes each (a 1 KiB status line, escaped as jobd writes it; ACTIVE_CAP 16 KiB)"
    )
    read = running_tab_read(r, queue, RUNNING, what)
    assert (1 << 20) // (size + 128) <= read.read < RUNNING, read.read  # the 1 MiB, names and all
