"""Review 5 of issue 36: /api/overview still counts each queue's null lag to 16 MiB.

Review 36d's fix (fe7fa64) gave ``status.gather`` and ``pages.summary`` one ``LagBudget`` a
request, but ``dashboard.overview`` (``GET /api/overview``, documented, read by scripts; the
API docs point at it for ``progress`` and the CSRF value) calls ``status.with_levels`` per queue
without one: each queue gets a fresh 16 MiB. The same data as
tests/test_review36d_lag_count_per_queue.py (50 queues, a null lag each, 16.5 MiB counted behind
it) makes one /api/overview read 824 MiB in 200 XRANGE calls (about 4.6 s of Redis blocked on
this machine), any reader with the read token, as often as it likes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from test_review36d_lag_count_per_queue import FIELDS, QUEUES, counted


def test_an_overview_counts_each_queues_null_lag_to_16_mib(
    r: redis.Redis, write_config: Any, tmp_path: Path
) -> None:
    rows, read, calls, usec = counted(r, write_config, "/api/overview")
    assert len(rows) == QUEUES
    # Expected: one /api/overview reads at most 16 MiB counting lags.
    # The count that spends the budget reads one entry past it (documented: "16 MiB plus one
    # entry a queue"; an entry's size is known only once read).
    assert read <= (16 << 20) + FIELDS * 64, (
        f"one /api/overview read {read / 2**20:.0f} MiB counting null lags in "
        f"{calls} XRANGE calls; Redis spent {usec / 1000:.0f} ms in scripts"
    )
