"""Figures any host can read: per-minute counters and histograms kept in Redis.

Each queue has, per minute M of Redis's clock (``keys.minute``: whichever host writes or reads
them, so a host whose clock is off neither writes nor looks elsewhere), a hash of counters
(``keys.QueueKeys.stats``: done, failed, retried, dead, deduped, cancelled) and a hash of
histograms (``keys.QueueKeys.timings``): how many jobs waited (enqueue to start, on Redis's
clock) and ran for how long, counted in the fixed buckets below. Both are kept
``keys.STATS_TTL`` (2 h), and reading the last hour of a queue is one script call, one round
trip, that reads only the fields jobd writes of its 120 hashes, each only when short
(``status.hashes_shown``): anyone can add fields to them, or values of any size."""

from __future__ import annotations

import bisect
from typing import Any

import redis

from jobd.config import QueueConfig
from jobd.store import connection as redisconn
from jobd.store import keys, status

# Upper bounds of the histogram buckets, seconds (the metrics' own: jobd.web.metrics); one more
# bucket holds everything above the last.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
PERCENTILES = (50, 90, 99)
HOUR = 60  # minutes shown
# The fields of a minute's hashes read (``status.hashes_shown``: only those, each only when
# short: anyone can add fields to them, or values of any size).
STATS = "done failed retried dead"
INDEXES = frozenset(str(i) for i in range(len(BUCKETS) + 1))  # a histogram field's, as written
TIMINGS = " ".join(f"{kind}:{i}" for kind in ("wait", "run") for i in range(len(BUCKETS) + 1))


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


def interpolated(counts: list[int], p: float) -> float | None:
    """The p-th percentile estimated from bucket counts as Prometheus's histogram_quantile
    does: linear within the bucket that holds it (from the bound below, 0 for the first); in
    the bucket above the last bound, that bound (the histogram knows nothing past it). None:
    no data."""
    total = sum(counts)
    if not total:
        return None
    rank = total * p / 100
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(BUCKETS):
                return float(BUCKETS[-1])
            low = BUCKETS[i - 1] if i else 0.0
            return low + (BUCKETS[i] - low) * (rank - seen) / n
        seen += n
    return float(BUCKETS[-1])


def last_hour(client: redis.Redis, q: QueueConfig, now: float | None = None) -> dict[str, Any]:
    """Per-minute counters of the last hour (oldest first), each minute's run-time percentiles,
    and the hour's percentiles; the hour ends at ``now``, Redis's time (read when not given)."""
    minute = keys.minute(redisconn.Clock(client).at(q.stream) if now is None else now)
    minutes = list(range(minute - HOUR + 1, minute + 1))
    keys_read = [q.keys.stats(m) for m in minutes] + [q.keys.timings(m) for m in minutes]
    replies = status.hashes_shown(client, keys_read, [STATS] * HOUR + [TIMINGS] * HOUR)
    stats, timings = replies[:HOUR], replies[HOUR:]
    series: dict[str, list[int]] = {k: [] for k in ("done", "failed", "retried", "dead")}
    for raw in stats:
        counts = raw if isinstance(raw, dict) else {}
        for name, values in series.items():
            values.append(status.counter(counts.get(name.encode(), b"0")))
    hist = {kind: [0] * (len(BUCKETS) + 1) for kind in ("wait", "run")}
    latency: dict[str, list[float | None]] = {f"p{p}": [] for p in PERCENTILES}
    for raw in timings:
        minute_hist = _histograms(raw)
        for kind, counts in minute_hist.items():
            hist[kind] = [a + b for a, b in zip(hist[kind], counts, strict=True)]
        for p in PERCENTILES:
            latency[f"p{p}"].append(interpolated(minute_hist["run"], p))
    return {
        "minutes": [m * 60 for m in minutes],
        "series": series,
        "percentiles": {
            kind: {f"p{p}": percentile(counts, p) for p in PERCENTILES}
            for kind, counts in hist.items()
        },
        # Interpolated within the buckets (not their bounds): the hour's, and each minute's
        # run time (None: no job timed that minute).
        "estimated": {
            kind: {f"p{p}": interpolated(counts, p) for p in PERCENTILES}
            for kind, counts in hist.items()
        },
        "latency": latency,
        "jobs_timed": sum(hist["run"]),
        "top_bucket": BUCKETS[-1],  # a percentile of "+Inf" is above this
    }


def _histograms(raw: object) -> dict[str, list[int]]:
    """One minute's timings hash as bucket counts per kind (wait, run); a field or value that
    is not jobd's counts nothing."""
    hist = {kind: [0] * (len(BUCKETS) + 1) for kind in ("wait", "run")}
    for name, value in (raw if isinstance(raw, dict) else {}).items():
        kind, _, index = name.decode("utf-8", "replace").partition(":")
        if kind in hist and index in INDEXES:  # ASCII digits ("²" passes str.isdigit)
            hist[kind][int(index)] += status.counter(value)
    return hist
