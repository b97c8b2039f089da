"""Review 36o of issue 36: f85b7ab's running tab still shows none of 2 500 running records
that jobd wrote (25 daemons of concurrency 100; review 36n's test had 2 000), when their jobs
have job ids of MAX_JOB_ID (1 024 bytes, the producer's) and their handlers report a status
line of STATUS_MAX (1 KiB) control bytes (``\\x01``: orjson escapes each as ``\\u0001``, 6
bytes; a terminal's escapes are most of such a line already). Each record is then about 6.3 KiB
under a 1 KiB name, well within ACTIVE_CAP (16 KiB) and every bound jobd puts on what it writes.

``lib/shown.lua hash_read`` now reads a table's names when its ``MEMORY USAGE … SAMPLES 0`` is
at most ``most`` × ``cap`` (RUNNING_READ × ACTIVE_CAP = 16 MiB), but that weight is of every
record in the hash (NAMES_MOST, 10 000 of them), not of the ``most`` ones a read takes: 2 500
such records weigh about 20 MiB (2 000 already 16.2 MiB), and ``running_read`` reads 0 of them
(``unread`` 2 500, the overview's count "at most"), where docs/operations/dashboard.md says the
tab shows the first 1 000 records and 1 MiB and counts the rest. The fixer's own record size
(2.1 KiB) goes blank the same way: 7 000 of them weigh 17.4 MiB, read 0 (NAMES_MOST allows
10 000).

What should happen: with any records jobd writes (each ≤ ACTIVE_CAP with a name ≤ MAX_JOB_ID,
NAMES_MOST at most), the tab shows what its bounds hold (RUNNING_READ records, 1 MiB) and
counts the rest unread. Suggested fix: a weight bound that follows the hash's length
(NAMES_MOST × (MAX_JOB_ID + ACTIVE_CAP), or HLEN × that: what jobd may write), or read the
names of a table through a bounded HSCAN rather than weigh all of it.

Fixed (jobd/store/lua/lib/shown.lua ``names_bound``): a table's names are read when it weighs
no more than its fields would if jobd wrote each at its largest (HLEN × a NAME_MOST-byte name,
jobd.job.MAX_JOB_ID, and a ``cap``-byte value, each allocation a quarter more and FIELD_COST),
or than the old bound; a 64 MiB name or value beside a few fields still leaves the hash unread
(tests/test_review36k_hash_page_huge_value.py, tests/test_review36l_hash_huge_name.py). A
bounded HSCAN would not do: it copies each field's value, of any size, before it can be weighed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import redis
from support import queue_config, running_records, running_tab_read

from jobd.job import MAX_JOB_ID
from jobd.process.channel import STATUS_MAX
from jobd.store.leases import Shown

RUNNING = 2500


def record(stream: str, i: int, entry: str) -> tuple[str, bytes]:
    """The i-th job's running record at its largest: a MAX_JOB_ID-byte job id, STATUS_MAX
    control bytes as its status line."""
    job_id = f"{i:04d}".ljust(MAX_JOB_ID, "j")  # a producer's job id, as long as runs
    told = Shown(entry, job_id, 42.0, b"\x01" * STATUS_MAX).fields()  # renew.lua's
    note = {"stream": stream, "entry": entry, "consumer":
            f"host-{i // 100}-abcdabcdabcdabcd", "host": "host", "pid": 1000 + i,
            "attempt": 1}  # notes.active, as start.lua writes it  # fmt: skip
    return job_id, (b"{" + told + b',"since":1700000000000,"deadline":1700003600000,'
                    + orjson.dumps(note)[1:])  # fmt: skip


def test_running_records_jobd_writes_at_their_largest_leave_the_tab_blank(
    r: redis.Redis, write_config: Any
) -> None:
    queue = running_records(r, write_config(queue_config("[/bin/true]")), RUNNING, record)
    size = max(r.hstrlen(queue.keys.active, f"{i:04d}".ljust(MAX_JOB_ID, "j")) for i in (0, 1))
    assert size <= 16 * 1024, size  # within ACTIVE_CAP: a record jobd writes
    what = (f"of {size} bytes each under job ids of {MAX_JOB_ID} bytes "
            "(a 1 KiB status line of control bytes, escaped as jobd writes it)")  # fmt: skip
    running_tab_read(r, queue, RUNNING, what)


def test_the_name_bound_is_the_job_ids() -> None:
    """lib/shown.lua's NAME_MOST is jobd.job.MAX_JOB_ID: the names jobd writes to its hashes."""
    lua = Path(__file__).resolve().parents[1] / "jobd" / "store" / "lua" / "lib" / "shown.lua"
    found = re.search(r"^local NAME_MOST = (\d+) -- jobd\.job\.MAX_JOB_ID", lua.read_text(), re.M)
    assert found and int(found[1]) == MAX_JOB_ID
