"""Review 36l of issue 36: since round 36k every read of a queue's group copies the stream's
first and last entries whole into the script: queues whose jobs carry payloads of the size jobd
accepts by default (``max_payload``: 16 MiB) make each summary hold Redis for most of a second
(every 5 s of an open overview; each daemon's status report reads the same way, as do the
waiting tab's ``group_of`` and ``jobd status``).

Round 36k (ef5885b) made ``lib/group.lua group_read`` begin with ``XINFO STREAM key`` to count
the stream's groups. That reply carries ``first-entry`` and ``last-entry``, each whole, and in a
script Redis converts them into Lua strings. The header says "XINFO STREAM answers the stream's
first and last entries whole too: two entries, as any read of an entry ... takes them whole;
jobd's own are small". But jobd's own are as large as ``max_payload`` allows, 16 MiB by default
(schema.json). Here one summary of 5 queues, each with 2 such jobs waiting, held Redis 745 ms
and 1 041 ms in scripts (2 runs), 0.4 ms with jobs of 1 byte; one read of one such queue's group
took 82 to 163 ms of Redis's time (EVALSHA in INFO commandstats; XINFO STREAM sent alone, 17 ms),
where it took well under 1 ms before 36k (no XINFO STREAM). The docs measure 8 ms of Redis for
a summary of 50 queues. The other reads that take an entry whole (a page of the waiting tab, a
counted null lag) are bounded by a budget in bytes; this one by nothing.

What should happen: one read of a queue's group holds Redis a bounded time whatever the
stream's entries hold (suggested fix: learn whether the queue's group is the stream's only one
without XINFO STREAM, e.g. ``XPENDING key group - + 0`` finds the group without a name, and
XINFO GROUPS is asked only under a bound on the groups' names; or ask XINFO STREAM only when
its first and last entries are known small). Bound: 100 ms of Redis for the summary (36k's
bound for one group read; the docs' 8 ms for 50 queues).

Fixed (lib/group.lua, issue 36): a group read asks neither XINFO STREAM nor MEMORY USAGE (the
36l fix weighed the whole stream and left such a queue "not read"): XINFO GROUPS, XPENDING and
XINFO CONSUMERS copy no entry. The summary's time is Redis's in every command a group read may
use (scripts, XINFO, XPENDING, MEMORY: ``support.group_read_usec``), and each queue's figures
are read (backlog 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from support import group_read_usec
from test_dashboard_pages import TOKEN, App

PAYLOAD = 16 << 20  # max_payload's default: the largest job jobd accepts
QUEUES = 5
JOBS = 2  # waiting in each queue: the stream's first and last entries
# Redis's time for one summary of QUEUES queues: the docs measure 8 ms for 50 queues
# (docs/operations/dashboard.md); 36k's bound for one group read alone was 100 ms.
WITHIN_USEC = 100_000


def _summary_usec(r: redis.Redis, app: App) -> tuple[int, dict]:
    app.get("/api/summary")  # the scripts loaded, the clock read
    before = group_read_usec(r)
    rows = app.get("/api/summary")["queues"]
    return group_read_usec(r) - before, rows


def test_a_summary_is_bounded_whatever_the_queues_jobs_carry(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    queues = "".join(f"  q{i}: {{command: [/bin/true]}}\n" for i in range(QUEUES))
    app = App(write_config("redis: {url: '{redis}'}\nqueues:\n" + queues +
                           "dashboard: {token_file: token}\n"))  # fmt: skip
    for i in range(QUEUES):
        r.xgroup_create(f"jobd:q{i}", "jobd", id="0", mkstream=True)  # as a daemon makes it
        for j in range(JOBS):
            r.xadd(f"jobd:q{i}", {"payload": "p", "job_id": f"small-{j}"})
    small, _ = _summary_usec(r, app)
    for i in range(QUEUES):
        r.delete(f"jobd:q{i}")
        r.xgroup_create(f"jobd:q{i}", "jobd", id="0", mkstream=True)
        for j in range(JOBS):  # waiting jobs of the size jobd accepts by default
            r.xadd(f"jobd:q{i}", {"payload": b"p" * PAYLOAD, "job_id": f"big-{j}"})
    big, rows = _summary_usec(r, app)
    assert big < WITHIN_USEC, (
        f"one summary of {QUEUES} queues, each with {JOBS} waiting jobs of {PAYLOAD >> 20} MiB "
        f"(max_payload's default), held Redis {big / 1000:.0f} ms in scripts, XINFO and XPENDING "
        f"({small / 1000:.1f} ms with jobs of 1 byte): each group read's XINFO STREAM copies the "
        f"stream's first and last entries whole into the script"
    )
    shown = {name: (row["backlog"], row["lag_known"]) for name, row in rows.items()}
    assert shown == {f"q{i}": (JOBS, True) for i in range(QUEUES)}, shown


def test_a_null_lag_count_leaves_the_next_queues_groups_read(
    r: redis.Redis, write_config: Any
) -> None:
    """The groups' reads have bytes of their own: a queue whose null lag was counted over 11 MiB
    leaves the next queue's group (a stream of 6 MiB) read, not "unknown"."""
    from jobd.config import load
    from jobd.store import status

    config = load(str(write_config(
        "redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n"
        "  b: {command: [/bin/true]}\n")))  # fmt: skip
    r.xgroup_create("jobd:a", "jobd", id="0", mkstream=True)
    ids = [r.xadd("jobd:a", {"payload": b"p" * (1 << 20)}) for _ in range(12)]
    r.xdel("jobd:a", ids[5])  # Redis says the lag is null: counted
    r.xgroup_create("jobd:b", "jobd", id="0", mkstream=True)
    for _ in range(6):
        r.xadd("jobd:b", {"payload": b"p" * (1 << 20)})
    queues = status.gather(r, config)["queues"]
    # Since review 36o a null lag is not counted (that read entries): at most the stream's 11.
    assert (queues["a"]["lag"], queues["a"]["lag_at_most"]) == (None, 11), queues["a"]
    assert queues["b"]["lag"] == 6, queues["b"]
