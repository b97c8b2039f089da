"""Figures any host can read: per-minute counters and histograms kept in Redis.

Each queue has, per minute M, a hash of counters (``keys.QueueKeys.stats``: done, failed,
retried, dead, deduped) and a hash of histograms (``keys.QueueKeys.timings``): how many jobs
waited (enqueue to start) and ran for how long, counted in the fixed buckets below. Both are
kept ``keys.STATS_TTL`` (2 h), so they stay small and bounded, and reading the last hour of a
queue is one pipeline of 120 HGETALLs, one round trip.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

import redis

from jobd.config import QueueConfig

# Upper bounds of the histogram buckets, seconds (the metrics' own: jobd.web.metrics); one more
# bucket holds everything above the last.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
PERCENTILES = (50, 90, 99)
HOUR = 60  # minutes shown


def bucket(seconds: float) -> int:
    return bisect.bisect_left(BUCKETS, seconds)


def fields(waited: float, took: float) -> list[str]:
    """The histogram fields one job adds to."""
    return [f"wait:{bucket(waited)}", f"run:{bucket(took)}"]


def percentile(counts: list[int], p: float) -> float | str | None:
    """The upper bound of the bucket holding the p-th percentile (None: no data; "+Inf":
    above the last bound)."""
    total = sum(counts)
    if not total:
        return None
    rank = total * p / 100
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank:
            return BUCKETS[i] if i < len(BUCKETS) else "+Inf"
    return "+Inf"


def _count(raw: bytes) -> int:
    """A counter as HINCRBY keeps it; 0 for anything else (a value someone else wrote)."""
    try:
        return max(0, int(raw))
    except ValueError:
        return 0


def last_hour(client: redis.Redis, q: QueueConfig, now: float | None = None) -> dict[str, Any]:
    """Per-minute counters of the last hour (oldest first) and the hour's percentiles."""
    minute = int((time.time() if now is None else now) // 60)
    minutes = list(range(minute - HOUR + 1, minute + 1))
    pipe = client.pipeline(transaction=False)
    for m in minutes:
        pipe.hgetall(q.keys.stats(m))
    for m in minutes:
        pipe.hgetall(q.keys.timings(m))
    replies = pipe.execute(raise_on_error=False)
    stats, timings = replies[:HOUR], replies[HOUR:]
    series: dict[str, list[int]] = {k: [] for k in ("done", "failed", "retried", "dead")}
    for raw in stats:
        counts = raw if isinstance(raw, dict) else {}
        for name, values in series.items():
            values.append(_count(counts.get(name.encode(), b"0")))
    hist = {kind: [0] * (len(BUCKETS) + 1) for kind in ("wait", "run")}
    for raw in timings:
        for name, value in (raw if isinstance(raw, dict) else {}).items():
            kind, _, index = name.decode("utf-8", "replace").partition(":")
            if kind in hist and index.isdigit() and int(index) <= len(BUCKETS):
                hist[kind][int(index)] += _count(value)
    return {
        "minutes": [m * 60 for m in minutes],
        "series": series,
        "percentiles": {
            kind: {f"p{p}": percentile(counts, p) for p in PERCENTILES}
            for kind, counts in hist.items()
        },
        "jobs_timed": sum(hist["run"]),
        "top_bucket": BUCKETS[-1],  # a percentile of "+Inf" is above this
    }
