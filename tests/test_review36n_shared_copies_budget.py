"""Review 36n of issue 36: one job of 9 MiB waiting in one queue (jobd accepts up to
``max_payload``, 16 MiB by default) makes every queue read after it in the same summary "not
read": lag, pending and consumers null, the overview ``unknown``, ``jobd status`` "group not
read", the daemon's metrics NaN, though each of those streams holds 3 jobs of a few bytes
(weighs 5 KiB).

``lib/group.lua group_read`` weighs the stream once (MEMORY USAGE SAMPLES 1: 9 MiB, within the
16 MiB ``LagBudget.copies``) but a stream of one entry has it as first and last entry: XINFO
STREAM copies it twice, and ``copied`` (18 MiB) is spent from the shared budget
(jobd/store/status.py ``lags.copies -= group.copied``), which goes below 0; every later
queue's read gets ``max(0, lags.copies)`` = 0 bytes left, and any stream weighs more than 0.
A 6 MiB job does the same to any later queue whose stream weighs over 4 MiB. Which queues go
blind depends on their order in the config. The docs (docs/operations/dashboard.md, the
group row) say a group is not read for "a stream heavier than the bytes left, about 13 000
jobs of 1 KiB or one 16 MiB job first or last": not that a 9 MiB job in one queue leaves the
others unread.

What should happen: a queue whose stream weighs a few KiB has its group read whatever another
queue's jobs hold (e.g. each queue a bound of its own, or the budget spent only by what a
read is allowed to copy, weighed as it copies: first and last entries both).

Fixed (jobd/store/status.py): each queue's group read had its own 16 MiB (GROUP_COPIES); since
issue 36's threat model (lib/group.lua) no group read copies an entry or weighs the stream, so
there is no such budget: every queue's group is read whatever another queue's jobs hold.
"""

from __future__ import annotations

from typing import Any

import redis


def test_one_large_job_leaves_the_other_queues_groups_unread(
    r: redis.Redis, write_config: Any
) -> None:
    from jobd.config import load
    from jobd.store import status

    queues = "".join(f"  q{i}: {{command: [/bin/true]}}\n" for i in range(5))
    config = load(str(write_config("redis: {url: '{redis}'}\nqueues:\n" + queues)))
    for i in range(5):
        r.xgroup_create(f"jobd:q{i}", "jobd", id="0", mkstream=True)
    for i in range(1, 5):
        for j in range(3):
            r.xadd(f"jobd:q{i}", {"payload": "x", "job_id": f"s{j}"})
    before = status.gather(r, config)["queues"]
    assert [before[f"q{i}"]["lag"] for i in range(1, 5)] == [3] * 4
    r.xadd("jobd:q0", {"payload": b"p" * (9 << 20), "job_id": "big"})  # under max_payload
    after = status.gather(r, config)["queues"]
    assert after["q0"]["lag"] == 1, after["q0"]
    lags = {f"q{i}": after[f"q{i}"]["lag"] for i in range(1, 5)}
    assert lags == {f"q{i}": 3 for i in range(1, 5)}, (
        f"one 9 MiB job waiting in q0 leaves the groups of q1..q4 (3 jobs of 1 byte each, "
        f"streams of a few KiB) not read: lags {lags} (the one entry copied twice by XINFO "
        f"STREAM, 18 MiB spent from the summary's 16 MiB)"
    )
