"""What `jobd status` reports: each queue's backlog, leases, delays, failures and consumers.

Everything is read from Redis (one pipeline per queue), so it works from any host, with or
without a daemon running there.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any

import redis

from jobd.config import Config, QueueConfig
from jobd.daemon import periodic
from jobd.logs import printable

LAG_COUNT_CAP = 100_000  # when Redis reports lag as null, count at most this many entries


def _ms_of(stream_id: bytes | str) -> int:
    raw = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(raw.split("-")[0])


def queue_status(client: redis.Redis, q: QueueConfig, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    minute = int(now // 60)
    redis_ms = _redis_ms(client) if q.slots is not None or q.rate is not None else 0
    pipe = client.pipeline(transaction=False)
    pipe.xlen(q.stream)
    pipe.xinfo_groups(q.stream)
    pipe.xpending(q.stream, q.group)
    pipe.xinfo_consumers(q.stream, q.group)
    pipe.zcard(q.keys.delayed)
    pipe.xlen(q.dead_letter.stream)
    pipe.hgetall(q.keys.stats(minute - 1))
    pipe.hgetall(q.keys.stats(minute))
    pipe.zcount(q.keys.running, redis_ms, "+inf")
    pipe.hgetall(q.keys.rate)
    pipe.hgetall(q.keys.waiting)
    replies = pipe.execute(raise_on_error=False)
    length, groups, pending, consumers, delayed, dead, last, this = replies[:8]
    slots_used, bucket, waiting = replies[8:]
    group = None
    if not isinstance(groups, Exception):
        group = next((g for g in groups if os.fsdecode(g["name"]) == q.group), None)
    result: dict[str, Any] = {
        "stream": q.stream,
        "group": q.group,
        "length": 0 if isinstance(length, Exception) else length,
        "exists": group is not None,
        "lag": None,
        "pending": 0,
        "oldest_pending_age": None,
        "delayed": delayed,
        "dead_lettered": dead,
        "last_minute": _counters(last),
        "this_minute": _counters(this),
        "consumers": [],
        "limits": _limits(q, slots_used, bucket, waiting, redis_ms),
        "schedule": [
            {"name": s.name, "cron": s.cron, "timezone": s.timezone,
             "next_tick": periodic.next_tick(s, now)}
            for s in q.schedule
        ],
    }  # fmt: skip
    if group is None:
        return result
    result["lag"] = group.get("lag")
    if result["lag"] is None:
        result["lag"] = count_after(client, q.stream, group["last-delivered-id"])
    if not isinstance(pending, Exception) and pending["pending"]:
        result["pending"] = pending["pending"]
        result["oldest_pending_age"] = max(0.0, now - _ms_of(pending["min"]) / 1000)
    if not isinstance(consumers, Exception):
        result["consumers"] = [
            {
                "name": c["name"].decode("utf-8", "backslashreplace"),
                "idle": c["idle"] / 1000,
                "holding": c["pending"],
            }
            for c in consumers
        ]
    return result


def _redis_ms(client: redis.Redis) -> int:
    """Redis's clock, Unix ms: slots and tokens live on it (acquire.lua)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _limits(
    q: QueueConfig, slots_used: object, bucket: object, waiting: object, redis_ms: int
) -> dict[str, Any]:
    """Usage of the queue's cluster-wide limits, and the consumers waiting for them."""
    result: dict[str, Any] = {}
    if q.slots is not None:
        result["slots"] = {
            "limit": q.slots,
            "used": slots_used if isinstance(slots_used, int) else None,
        }
    if q.rate is not None:
        tokens = None
        if isinstance(bucket, dict) and b"tokens" in bucket:
            elapsed_ms = max(0.0, redis_ms - float(bucket[b"at"]))
            tokens = min(q.rate.burst, float(bucket[b"tokens"]) + elapsed_ms * q.rate.per_ms)
        result["rate"] = {
            "count": q.rate.count, "per": q.rate.per, "burst": q.rate.burst,
            "tokens": q.rate.burst if tokens is None else round(tokens, 2),
        }  # fmt: skip
    if isinstance(waiting, dict) and waiting:
        parsed = {k.decode("utf-8", "replace"): _waiting(v) for k, v in waiting.items()}
        result["waiting"] = {k: v for k, v in parsed.items() if v is not None}
    return result


def _waiting(value: bytes) -> dict[str, Any] | None:
    """A waiting consumer's "REASON SINCE_MS" (acquire.lua); None for anything else."""
    reason, _, since = value.decode("utf-8", "replace").partition(" ")
    return {"for": reason, "since": int(since) / 1000} if since.isdigit() else None


def count_after(client: redis.Redis, stream: str, last_delivered: bytes) -> int:
    """Entries after ``last_delivered`` (what lag means), counted, up to LAG_COUNT_CAP."""
    start = f"({last_delivered.decode()}"
    counted = 0
    while counted < LAG_COUNT_CAP:
        rows = client.xrange(stream, start, "+", count=10_000)
        counted += len(rows)
        if len(rows) < 10_000:
            break
        start = f"({rows[-1][0].decode()}"
    return counted


def _counters(raw: object) -> dict[str, int]:
    counts = {"done": 0, "failed": 0, "retried": 0, "dead": 0, "deduped": 0}
    if isinstance(raw, dict):
        for key, value in raw.items():
            with contextlib.suppress(ValueError):  # a counter someone else wrote into
                counts[key.decode("utf-8", "replace")] = int(value)
    return counts


def gather(client: redis.Redis, config: Config) -> dict[str, Any]:
    now = time.time()
    return {
        "redis": config.redis.describe(),
        "time": now,
        "queues": {name: with_levels(client, q, now) for name, q in config.queues.items()},
    }


def with_levels(client: redis.Redis, q: QueueConfig, now: float) -> dict[str, Any]:
    """A queue's status; with priority levels, each level's backlog too (its own stream)."""
    result = queue_status(client, q, now)
    if q.levels:
        result["levels"] = {}
        for level in q.levels:
            s = result if level.stream == q.stream else queue_status(client, level, now)
            result["levels"][level.priority] = {
                k: s[k] for k in ("stream", "length", "lag", "pending", "delayed")
            }
    return result


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def render(report: dict[str, Any]) -> str:
    lines = [f"jobd status on {report['redis']}"]
    for name, s in report["queues"].items():
        lines.append(f"queue {name}  (stream {s['stream']}, group {s['group']})")
        if not s["exists"]:
            lines.append("  no consumer group yet: no daemon has run this queue")
        last, this = s["last_minute"], s["this_minute"]
        lines += [
            f"  length {s['length']}  lag {s['lag'] if s['lag'] is not None else '-'}  "
            f"pending {s['pending']} (oldest {_age(s['oldest_pending_age'])})  "
            f"delayed {s['delayed']}  dead-lettered {s['dead_lettered']}",
            f"  last minute: done {last['done']}, failed {last['failed']} "
            f"(retried {last['retried']}, dead {last['dead']});  "
            f"this minute: done {this['done']}, failed {this['failed']}",
        ]
        if this["deduped"] or last["deduped"]:
            lines.append(f"  deduped: last minute {last['deduped']}, this minute {this['deduped']}")
        for c in s["consumers"]:
            lines.append(f"  consumer {c['name']}  idle {_age(c['idle'])}  holding {c['holding']}")
        for level, b in s.get("levels", {}).items():
            lag = b["lag"] if b["lag"] is not None else "-"
            lines.append(
                f"  level {level}: length {b['length']}  lag {lag}  pending {b['pending']}  "
                f"delayed {b['delayed']}  (stream {b['stream']})"
            )
        limits = s["limits"]
        if "slots" in limits:
            lines.append(f"  slots {limits['slots']['used']}/{limits['slots']['limit']} in use")
        if "rate" in limits:
            r = limits["rate"]
            lines.append(
                f"  rate {r['count']} per {r['per']:g}s (burst {r['burst']}): "
                f"{r['tokens']:g} token(s) left"
            )
        for name, w in limits.get("waiting", {}).items():
            what = "a slot" if w["for"] == "slot" else "a rate token"
            lines.append(f"  consumer {name} waiting for {what}")
        for p in s["schedule"]:
            at = datetime.datetime.fromtimestamp(p["next_tick"], datetime.UTC)
            lines.append(
                f"  schedule {p['name']}  {p['cron']!r} ({p['timezone']})  "
                f"next tick {at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
            )
    return "\n".join(printable(line) for line in lines)  # names others wrote: escaped
