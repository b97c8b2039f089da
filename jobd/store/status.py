"""Where each queue stands, read from Redis alone: backlog, leases, delays, failures, limits
and consumers (one pipeline per queue), so it works from any host, with or without a daemon
running there. ``jobd status`` prints it (``cli.status``), the dashboard shows it, and the
daemon's status report feeds the metrics and systemd from it.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import redis

from jobd import cron
from jobd.config import Config, QueueConfig
from jobd.store import connection as redisconn
from jobd.store import keys, registry, scripts
from jobd.store.control import paused_from
from jobd.store.keys import DAEMONS

# When Redis reports a group's lag as null, the entries after its last delivered one are counted
# in Redis (lua/count_after.lua), LAG_COUNT_CAP at most, and no more once those read hold
# LAG_COUNT_BYTES (each field counted browse.FIELD_COST bytes more: 10 000 entries of 1.5 KiB
# fit, 3 of 100 000 empty fields): beyond, the lag is given as at least that (``lag_at_least``).
# One entry at a time (LAG_COUNT_STEP): a read of 16 could take 16 entries of any size past the
# bytes (1.6 times the time of reading 16 at a time for 1 KiB entries: 40 ms, not 25).
LAG_COUNT_CAP = 10_000
LAG_COUNT_STEP = 1
LAG_COUNT_BYTES = 16 << 20


def _ms_of(stream_id: bytes | str) -> int:
    raw = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(raw.split("-")[0])


def queue_status(client: redis.Redis, q: QueueConfig, now: float | None = None) -> dict[str, Any]:
    """Where queue ``q`` (one stream: a priority level is a queue here) stands at ``now``:
    Redis's time (``connection.Clock``; read here when not given), never the host's."""
    now = redisconn.Clock(client).at(q.stream) if now is None else now
    minute = keys.minute(now)
    redis_ms = int(now * 1000)
    replies = _read(client, q, minute, redis_ms)
    length, groups, pending, consumers, delayed, dead, last, this = replies[:8]
    slots_used, bucket, waiting, paused = replies[8:]
    group = None
    if not isinstance(groups, Exception):
        group = next((g for g in groups if os.fsdecode(g["name"]) == q.group), None)
    result: dict[str, Any] = {
        "stream": q.stream,
        "group": q.group,
        "length": 0 if isinstance(length, Exception) else length,
        "exists": group is not None,
        "lag": None,
        "lag_at_least": False,  # lag is a lower bound: Redis said null, and counting stopped
        "pending": 0,
        "oldest_pending_age": None,
        "delayed": _count(delayed),
        "dead_lettered": _count(dead),
        "last_minute": _counters(last),
        "this_minute": _counters(this),
        "consumers": [],
        "limits": _limits(q, slots_used, bucket, waiting, redis_ms),
        "paused": _pause(paused),
        "schedule": [
            {"name": s.name, "cron": s.cron, "timezone": s.timezone,
             "next_tick": cron.next_tick(s, now)}
            for s in q.schedule
        ],
    }  # fmt: skip
    if group is None:
        return result
    result["lag"] = group.get("lag")
    if result["lag"] is None:
        counted, exact = count_after(client, q.stream, group["last-delivered-id"])
        result["lag"], result["lag_at_least"] = counted, not exact
    if not isinstance(pending, Exception) and pending["pending"]:
        result["pending"] = pending["pending"]
        result["oldest_pending_age"] = max(0.0, now - _ms_of(pending["min"]) / 1000)
    if not isinstance(consumers, Exception):
        result["consumers"] = [_consumer(c) for c in consumers]
    return result


def _read(client: redis.Redis, q: QueueConfig, minute: int, redis_ms: int) -> list[Any]:
    """Everything ``queue_status`` reads, in one pipeline; a reply that failed is its
    exception."""
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
    pipe.hgetall(q.keys.paused)
    return pipe.execute(raise_on_error=False)


def _count(reply: object) -> int | None:
    """A count Redis answered; None for its error (a key of another type, written by someone
    else): the JSON report cannot hold the exception, and the text shows '-'."""
    return None if isinstance(reply, Exception) else reply  # type: ignore[return-value]


def _pause(fields: object) -> dict[str, Any] | None:
    """``jobd pause``: since when (Unix seconds, Redis's clock) and by whom; None: running."""
    found = paused_from(fields)  # type: ignore[arg-type]
    return None if found is None else {"since": found.since_ms / 1000, "by": found.by}


# A daemon's consumer name (daemon.lease.consumer_name): host-pid-random, and -pINDEX for
# one of a supervisor's daemons (``processes``).
CONSUMER = re.compile(r"(?P<host>.+)-(?P<pid>[0-9]+)-[0-9a-f]{4}(?:-p(?P<process>[0-9]+))?")


def _consumer(info: dict[str, Any]) -> dict[str, Any]:
    """A consumer of the group as XINFO CONSUMERS describes it: its name, idle seconds, and
    how many entries it holds; and, for a daemon's name, its host, pid and process index
    (None for another name, or a daemon on its own)."""
    name = info["name"].decode("utf-8", "backslashreplace")
    parts = CONSUMER.fullmatch(name)
    if parts and max(len(parts["pid"]), len(parts["process"] or "")) > 15:
        parts = None  # not a daemon's: a pid or index past any (and past JSON's integers)
    process = parts["process"] if parts else None
    return {
        "name": name,
        "idle": info["idle"] / 1000,
        "holding": info["pending"],
        "host": parts["host"] if parts else None,
        "pid": int(parts["pid"]) if parts else None,
        "process": int(process) if process else None,
    }


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


def count_after(client: redis.Redis, stream: str, last_delivered: bytes) -> tuple[int, bool]:
    """Entries after ``last_delivered`` (what lag means), counted in Redis up to LAG_COUNT_CAP
    and LAG_COUNT_BYTES (``lua/count_after.lua``: no entry leaves Redis), and whether that is
    all of them; 0 for a stream of another type (its error is shown elsewhere)."""
    count = client.register_script(scripts.source("count_after"))
    try:
        args = [last_delivered, LAG_COUNT_CAP, LAG_COUNT_STEP, LAG_COUNT_BYTES]
        counted, ended = count(keys=[stream], args=args)
    except redis.ResponseError:
        return 0, True
    return int(counted), bool(ended)


def _counters(raw: object) -> dict[str, int]:
    counts = {"done": 0, "failed": 0, "retried": 0, "dead": 0, "deduped": 0}
    if isinstance(raw, dict):
        for key, value in raw.items():
            with contextlib.suppress(ValueError):  # a counter someone else wrote into
                counts[key.decode("utf-8", "replace")] = int(value)
    return counts


def gather(
    client: redis.Redis, config: Config, clock: redisconn.Clock | None = None
) -> dict[str, Any]:
    """Every queue's status and the daemon registry. Ages and minutes are on Redis's clock (one
    TIME per server: ``clock``); ``time`` is the registry's server's (what the registry's
    listing and the dashboard's every reply say), so any host shows the same figures."""
    clock = redisconn.Clock(client) if clock is None else clock
    queues = {name: with_levels(client, q, clock.at(q.stream)) for name, q in config.queues.items()}
    report = {"redis": config.redis.describe(), "time": clock.at(DAEMONS), "queues": queues}
    return with_daemons(client, config, report)


def with_daemons(client: redis.Redis, config: Config, report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with the daemon registry (``daemons``, and ``daemons_error`` when it cannot be
    read whole), and each queue's ``daemons``: those serving it, read from it yet or not."""
    listed = registry.listing(client)
    report["daemons"], report["daemons_error"] = listed["daemons"], listed["error"]
    for name, q in config.queues.items():
        report["queues"][name]["daemons"] = registry.serving(listed["daemons"], q.stream, q.group)
    return report


def with_levels(client: redis.Redis, q: QueueConfig, now: float) -> dict[str, Any]:
    """A queue's status; with priority levels, each level's backlog too (its own stream)."""
    result = queue_status(client, q, now)
    if q.levels:
        result["levels"] = {}
        for level in q.levels:
            s = result if level.stream == q.stream else queue_status(client, level, now)
            result["levels"][level.priority] = {
                k: s[k] for k in ("stream", "length", "lag", "lag_at_least", "pending", "delayed")
            }
    return result
