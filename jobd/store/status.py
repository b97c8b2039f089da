"""Where each queue stands, read from Redis alone: backlog, leases, delays, failures, limits
and consumers (one pipeline and one script call per queue, each read to a bound), so it works
from any host, with or without a daemon running there. ``jobd status`` prints it
(``cli.status``), the dashboard shows it, and the daemon's status report feeds the metrics and
systemd from it.
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
from jobd.store.groupread import (  # noqa: F401  (status.Group, status.group_spec: their home)
    CONSUMERS_LISTED,
    Group,
    group_reply,
    group_spec,
)
from jobd.store.keys import DAEMONS

# A queue's small hashes (``read_hashes``): fields and bytes read of one of open fields (the
# consumers waiting for a limit: one a daemon; the minute's counters: a few), names first, then
# the values of HASH_VALUE bytes or less in HMGETs of HASH_PAGE (``lua/lib/shown.lua
# hash_read``: a longer value is never read), and bytes of a value read at most (jobd writes
# numbers and names).
HASH_FIELDS = 256
HASH_BYTES = 64 << 10
HASH_VALUE = 256
HASH_PAGE = 64
COUNTERS = "done failed retried dead deduped cancelled"  # a minute's counters jobd writes
# A minute's counter jobd could have written: no minute counts 2**53 jobs, so the page's sums
# (60 minutes, a queue's levels) stay exact in JSON and JavaScript, and far from orjson's 64-bit
# bound; a value past it (HSET by anyone) is not jobd's and counts nothing (``counter``).
COUNTER_MAX = (1 << 53) - 1


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
    length, delayed, dead, last, this, slots_used, bucket, waiting, paused, group = replies
    result: dict[str, Any] = {
        "stream": q.stream,
        "group": q.group,
        "length": 0 if isinstance(length, Exception) else length,
        "exists": group is not None,
        "lag": None,
        "lag_at_most": None,  # lag None: at most that many wait (None: not known either)
        "pending": 0,
        "oldest_pending_age": None,
        "delayed": _count(delayed),
        "dead_lettered": _count(dead),
        "last_minute": _counters(last),
        "this_minute": _counters(this),
        "consumers": [],
        "consumers_count": 0,  # how many the group has
        "consumers_listed": True,  # False: more than CONSUMERS_LISTED, only counted
        "groups": 0,  # consumer groups the stream has
        "limits": _limits(q, slots_used, bucket, waiting, redis_ms),
        "paused": _pause(paused),
        "schedule": [
            {"name": s.name, "cron": s.cron, "timezone": s.timezone,
             "next_tick": cron.next_tick(s, now)}
            for s in q.schedule
        ],
    }  # fmt: skip
    if group is not None:
        _with_group(result, group, now)
    return result


def pending_age(group: Group, now: float) -> float:
    """The age of ``group``'s oldest pending entry at ``now``: since its id's time, and at
    least its idle time (since its last delivery, on Redis's clock): the id is the producer's to
    choose (``XADD`` of a future id gives every later entry that same millisecond), the idle
    Redis's."""
    assert group.oldest is not None
    return max(0.0, now - _ms_of(group.oldest) / 1000, group.oldest_idle / 1000)


def _with_group(result: dict[str, Any], group: Group, now: float) -> None:
    """``result`` with what ``group`` says: lag (None where Redis cannot say it, or says more
    than the stream holds: never counted by reading entries, a producer's; then at most how many
    wait), pending and the oldest's age, consumers."""
    result["groups"] = group.groups
    result["lag"] = group.lag
    if group.lag is None:
        result["lag_at_most"] = group.at_most
    if group.pending and group.oldest is not None:
        result["pending"] = group.pending
        result["oldest_pending_age"] = pending_age(group, now)
    result["consumers"] = [_consumer(*c) for c in group.consumers]
    result["consumers_count"], result["consumers_listed"] = group.count, group.listed


def _read(client: redis.Redis, q: QueueConfig, minute: int, redis_ms: int) -> list[Any]:
    """Everything ``queue_status`` reads, in one pipeline and one script call; a reply that
    failed is its exception (the group: None when the stream or group cannot be read)."""
    pipe = client.pipeline(transaction=False)
    pipe.xlen(q.stream)
    pipe.zcard(q.keys.delayed)
    pipe.xlen(q.dead_letter.stream)
    pipe.zcount(q.keys.running, redis_ms, "+inf")
    found = pipe.execute(raise_on_error=False)
    last, this, bucket, waiting, paused, group = read_hashes(client, q, minute)
    return [*found[:3], last, this, found[3], bucket, waiting, paused, group]


def read_hashes(client: redis.Redis, q: QueueConfig, minute: int) -> list[Any]:
    """The queue's small hashes ``queue_status`` shows: the counters of the last minute and of
    this one, the rate bucket, the consumers waiting for a limit, the pause (``hashes_shown``:
    only the fields jobd writes, but of the consumers waiting, whose names are theirs); and its
    group with its consumers (a ``Group``; None: no such group or stream)."""
    keys = [q.keys.stats(minute - 1), q.keys.stats(minute), q.keys.rate, q.keys.waiting,
            q.keys.paused, q.stream]  # fmt: skip
    specs = [COUNTERS, COUNTERS, "tokens at", "*", "since by", group_spec(">", q.group)]
    return hashes_shown(client, keys, specs)


def group_of(client: redis.Redis, q: QueueConfig) -> Group | None:
    """The queue's group alone (none of its consumers); None: no such group or stream."""
    return hashes_shown(client, [q.stream], [group_spec("=", q.group)])[0]  # type: ignore[no-any-return]


def group_args(group: str) -> list[object]:
    """The arguments of a ``hashes_shown`` call (keys: the stream alone) reading ``group``
    alone, for a pipeline; its reply is read by ``group_from``."""
    return [HASH_FIELDS, HASH_BYTES, HASH_VALUE, HASH_PAGE, group_spec("=", group)]


def group_from(reply: object) -> Group | None:
    """The group a ``group_args`` call read; None: no such group or stream, or an error."""
    return group_reply(reply[0]) if isinstance(reply, list) and reply else None


def hashes_shown(client: redis.Redis, keys: list[str], specs: list[str]) -> list[Any]:
    """Hashes of one slot, each as a dict, or the error its key gives (another type), read in
    Redis to a bound (``lua/hashes_shown.lua``: anyone can add fields to them, or values of any
    size): with ``spec`` '*', HASH_FIELDS fields and HASH_BYTES bytes of it (names first, then
    only the values within HASH_VALUE bytes: one field more at most); else only the fields it
    names (separated by spaces), each read only when its length is HASH_VALUE or less. A longer
    value reads as b"" (none of jobd's); a hash none of whose fields were read, as {b"": b""}
    (it is there). Of a stream, its group (``lua/lib/group.lua``: no entry copied)."""
    args = [HASH_FIELDS, HASH_BYTES, HASH_VALUE, HASH_PAGE, *specs]
    replies = scripts.call(client, "hashes_shown", keys, args)
    hashes: list[Any] = []
    for reply, spec in zip(replies, specs, strict=True):
        if spec[:1] in (">", "="):  # a stream: its group
            hashes.append(group_reply(reply))
            continue
        if not reply[0]:
            hashes.append(redis.ResponseError(os.fsdecode(reply[1])))
            continue
        rows = {reply[i]: reply[i + 1] or b"" for i in range(3, len(reply), 2)}
        if reply[1] and not rows:  # none of its fields read: there all the same
            rows = {b"": b""}
        hashes.append(rows)
    return hashes


def _count(reply: object) -> int | None:
    """A count Redis answered; None for its error (a key of another type, written by someone
    else): the JSON report cannot hold the exception, and the text shows '-'."""
    return None if isinstance(reply, Exception) else reply  # type: ignore[return-value]


def _pause(fields: object) -> dict[str, Any] | None:
    """``jobd pause``: since when (Unix seconds, Redis's clock) and by whom; None: running."""
    found = paused_from(fields)  # type: ignore[arg-type]
    return None if found is None else {"since": found.since_ms / 1000, "by": found.by}


# A daemon's consumer name (daemon.lease.consumer_name): host-pid-random (16 hex digits; 4 in
# older daemons'), and -pINDEX for one of a supervisor's daemons (``processes``).
CONSUMER = re.compile(
    r"(?P<host>.+)-(?P<pid>[0-9]+)-[0-9a-f]{4}(?:[0-9a-f]{12})?(?:-p(?P<process>[0-9]+))?"
)


def _consumer(raw: bytes, length: int, holding: int, idle_ms: int) -> dict[str, Any]:
    """A consumer of the group as XINFO CONSUMERS describes it: its name (``name_cut``: only
    its first HASH_VALUE bytes were read, of ``length``), idle seconds, and how many entries it
    holds; and, for a daemon's name, its host, pid and process index (None for another name, or
    a daemon on its own)."""
    name = raw.decode("utf-8", "backslashreplace")
    cut = int(length) > len(raw)
    parts = None if cut else CONSUMER.fullmatch(name)
    if parts and max(len(parts["pid"]), len(parts["process"] or "")) > 15:
        parts = None  # not a daemon's: a pid or index past any (and past JSON's integers)
    process = parts["process"] if parts else None
    return {
        "name": name,
        **({"name_cut": True, "name_length": int(length)} if cut else {}),
        "idle": int(idle_ms) / 1000,
        "holding": int(holding),
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
            with contextlib.suppress(ValueError, KeyError):  # not numbers: someone else's
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


# Digits of a waiting consumer's SINCE_MS read at most (15: Unix ms until the year 33658).
SINCE_DIGITS = 15


def _waiting(value: bytes) -> dict[str, Any] | None:
    """A waiting consumer's "REASON SINCE_MS" (acquire.lua); None for anything else: SINCE_MS
    is ASCII digits only (``str.isdigit`` alone takes "²", which ``int`` refuses: that one
    field failed every page and status with a 500), SINCE_DIGITS of them at most."""
    reason, _, since = value.decode("utf-8", "replace").partition(" ")
    if not (since.isascii() and since.isdigit() and len(since) <= SINCE_DIGITS):
        return None
    return {"for": reason, "since": int(since) / 1000}


def counter(raw: bytes) -> int:
    """A minute's counter as HINCRBY keeps it; 0 for anything else: not a number, or one out of
    0..COUNTER_MAX (someone else's: a 21-digit one failed every page with a 500, past orjson's
    64 bits)."""
    try:
        value = int(raw)
    except ValueError:
        return 0
    return value if 0 <= value <= COUNTER_MAX else 0


def _counters(raw: object) -> dict[str, int]:
    counts = {"done": 0, "failed": 0, "retried": 0, "dead": 0, "deduped": 0}
    if isinstance(raw, dict):
        for key, value in raw.items():
            counts[key.decode("utf-8", "replace")] = counter(value)
    return counts


def gather(
    client: redis.Redis, config: Config, clock: redisconn.Clock | None = None
) -> dict[str, Any]:
    """Every queue's status and the daemon registry. Ages and minutes are on Redis's clock (one
    TIME per server: ``clock``); ``time`` is the registry's server's (what the registry's
    listing and the dashboard's every reply say), so any host shows the same figures."""
    clock = redisconn.Clock(client) if clock is None else clock
    queues = {name: with_levels(client, q, clock.at(q.stream))
              for name, q in config.queues.items()}  # fmt: skip
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
                k: s[k]
                for k in ("stream", "length", "lag", "lag_at_most", "pending",
                          "oldest_pending_age", "delayed")
            }  # fmt: skip
    return result


def over_levels(s: dict[str, Any]) -> dict[str, Any]:
    """A queue's figures over all its priority levels (as the overview's row, ``STATUS=`` and
    the gauge say them), from its ``with_levels`` status (its own without levels; its top-level
    figures are its default level's alone): entries, pending, delayed and lag summed (delayed
    and lag None when a level's is not known; then ``lag_at_most`` when each level's bound
    is), the oldest pending age the oldest of any level's."""
    levels = list((s.get("levels") or {"": s}).values())
    ages = [b["oldest_pending_age"] for b in levels if b["oldest_pending_age"] is not None]
    bounds = [b["lag"] if b["lag"] is not None else b["lag_at_most"] for b in levels]
    lag = None if any(b["lag"] is None for b in levels) else sum(b["lag"] for b in levels)
    return {
        "length": sum(b["length"] for b in levels),
        "lag": lag,
        "lag_at_most": None if lag is not None or None in bounds else sum(bounds),
        "pending": sum(b["pending"] or 0 for b in levels),
        "oldest_pending_age": max(ages, default=None),
        "delayed": None  # a level's delayed set not read (someone else's key at its name)
        if any(b["delayed"] is None for b in levels)
        else sum(b["delayed"] for b in levels),
    }
