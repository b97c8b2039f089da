"""The dashboard's reads for its overview and queue pages (issue 36), each bounded by what it
is asked for, never by what Redis holds:

- ``GET /api/summary``: one row per queue (``queue_status``'s pipeline and script call a
  queue: state, backlog, oldest pending age, done and failed in the last minute, dead letters,
  paused; the live daemons' slots, once a daemon for all the levels it serves), the jobs
  running (their active records, 1 MiB of them read in all: two more round trips for every
  queue, ``Store.running_of``) and Redis's own figures (one INFO).
- ``GET /api/daemons``: the daemon registry (``registry.listing``: one script call, whatever
  the number of queues), polled often so that a stopped daemon leaves the page at once.
- ``GET /api/queue?queue=Q``: one queue's status, its last hour of figures (per-minute
  counters and histograms: ``figures.last_hour``) and the daemons serving it.
- ``GET /api/jobs?queue=Q&state=S[&level=L][&cursor=C][&count=N][&find=TEXT]``: a page of the
  queue's jobs in one state. ``waiting``: the entries of the level's stream after the group's
  last delivered id, oldest first (XRANGE from the cursor, an entry at a time, ``count`` at
  most); ``dead``: the dead letters, newest first (XREVRANGE likewise); ``delayed``: the delayed
  set by due time (a member at a time, only its job id and attempt leaving Redis);
  ``running``: the running jobs (their active records, read to a bound, job ids first:
  ``Store.running_read``); ``recent``: the history's jobs by their latest record (ZRANGE … REV,
  one HSTRLEN and at most one HGET a job, 1 MiB of records at most). ``find`` keeps the jobs
  whose id holds it, looking at ``SCAN`` entries at most a request. A stream entry or delayed
  member is read whole in Redis (a stream has no read of part of a field), so a request also
  stops reading once what it read holds ``browse.READ_BUDGET`` bytes (1 MiB, each field counted
  ``browse.FIELD_COST`` bytes more; one entry more at most): the reply's cursor goes on from
  where it stopped. A cursor is a position, never an index: the last entry id looked at
  (streams), the last (time, job id) shown (running), the last (score, member) looked at
  (sorted sets: ``browse.Cursor``); jobs leaving or coming before it between two requests
  shift nothing. A cursor that no page gave is a 400.
- ``GET /api/batch?id=B``: a batch's progress (``jobd batch``): total, done, failed, pending,
  state; one script reading one hash.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from jobd.config import Config, QueueConfig
from jobd.job import RESERVED_ATTEMPT
from jobd.store import connection as redisconn
from jobd.store import figures, registry, status
from jobd.store.admin import Shown
from jobd.store.browse import Cursor
from jobd.store.history import RunningRead
from jobd.store.keys import DAEMONS
from jobd.store.store import Store
from jobd.web import actions, shown
from jobd.web.actions import BadRequest

PAGE = 50  # jobs a page holds by default
PAGE_MAX = 200  # … and at most
SCAN = 10_000  # entries a search looks at, at most, per request
STATES = ("waiting", "running", "delayed", "dead", "recent")
WAITING_SHOWN = (("job_id", "job_id", shown.JOB_ID_SHOWN),
                 ("reserved_id", "jobd_job_id", shown.JOB_ID_SHOWN),
                 ("attempt", RESERVED_ATTEMPT.decode(), shown.FIELD_SHOWN))  # fmt: skip
INFO_FIELDS = (  # what the header shows of INFO
    "redis_version", "used_memory", "maxmemory", "connected_clients", "role", "aof_enabled",
    "rdb_last_save_time", "rdb_changes_since_last_save", "rdb_last_bgsave_status",
    "uptime_in_seconds", "redis_mode",
)  # fmt: skip
Query = dict[str, list[str]]
BAD_CURSOR = "cursor is the one the last page gave"


def summary(store: Store, config: Config, query: Query) -> dict[str, Any]:
    """Every queue's row, the daemons, and Redis's figures."""
    report = status.gather(store.client, config)  # on Redis's clock
    running = store.running_of([config.queues[name] for name in report["queues"]])
    rows = {name: _row(q, config.queues[name], report["daemons"], running[name])
            for name, q in report["queues"].items()}  # fmt: skip
    return {"time": report["time"], "redis": config.redis.describe(),
            "server": redis_info(store.client), "queues": rows,
            "daemons": report["daemons"], "daemons_error": report["daemons_error"]}  # fmt: skip


def running_count(found: RunningRead) -> dict[str, Any]:
    """How many jobs run, as a page says it: those running when every active record was read;
    else the records the hash holds, ``running_at_most`` (stale ones count there too)."""
    if found.complete:
        return {"running": len(found.jobs), "running_at_most": False}
    return {"running": found.records, "running_at_most": True}


def _row(
    q: dict[str, Any], cfg: QueueConfig, daemons: list[dict[str, Any]], found: RunningRead
) -> dict[str, Any]:
    """A queue's row of the overview; a priority queue's figures summed over its levels (its
    oldest pending age: the oldest of its levels').
    ``running``: the jobs running (their active records), not the entries the consumers hold
    (those read ahead too); the slots: each live daemon's concurrency for the queue, once
    however many of its levels it serves (its record lists each level with the queue's
    concurrency, which the levels share)."""
    running = running_count(found)
    levels = list((q.get("levels") or {"": q}).values())
    backlog = sum(level["lag"] or 0 for level in levels)
    ages = [lvl["oldest_pending_age"] for lvl in levels if lvl["oldest_pending_age"] is not None]
    live = [d for d in daemons if d["state"] in ("alive", "stopping")]
    ours = {(lvl.stream, lvl.group) for lvl in cfg.all_levels()}
    slots = sum(
        max((s["concurrency"] for s in d["queues"] if (s["stream"], s["group"]) in ours),
            default=0)
        for d in live
    )  # fmt: skip
    state = "idle"
    if q["paused"]:
        state = "paused"
    elif not q["exists"]:
        state = "new"
    elif backlog and not slots:
        state = "stalled"  # jobs wait and no live daemon serves it
    elif backlog or running["running"]:
        state = "busy"
    elif any(level["lag"] is None and level["length"] for level in levels):
        state = "unknown"  # entries, a level's lag not known (no group): never "idle" on a guess
    return {
        "state": state, "backlog": backlog,
        "lag_known": all(level["lag"] is not None for level in levels),
        "oldest_pending_age": max(ages, default=None), **running,
        "concurrency": slots, "pending": sum(level["pending"] or 0 for level in levels),
        "delayed": sum(level["delayed"] or 0 for level in levels),
        "done_per_minute": q["last_minute"]["done"],
        "failed_per_minute": q["last_minute"]["failed"],
        "dead_lettered": q["dead_lettered"], "paused": q["paused"],
        "levels": list(q["levels"]) if q.get("levels") else None,
    }  # fmt: skip


def redis_info(client: redis.Redis) -> dict[str, Any]:
    """What the header shows of Redis (the node holding the registry, on a cluster): version,
    memory used and its cap, clients, role, persistence; or why INFO failed."""
    try:
        info = redisconn.node_for(client, DAEMONS).info()
    except redis.RedisError as exc:
        return {"error": f"INFO failed: {exc}"}
    return {name: info.get(name) for name in INFO_FIELDS}


def daemons(store: Store, config: Config, query: Query) -> dict[str, Any]:
    """The daemon registry, as ``jobd status`` lists it."""
    return registry.listing(store.client)


def queue_page(store: Store, config: Config, query: Query) -> dict[str, Any]:
    """One queue: its status (a priority queue's figures over its levels), its last hour of
    figures, and who serves it."""
    q = actions.queue_of(config, {"queue": one(query, "queue")})
    clock = redisconn.Clock(store.client)  # Redis's time, not this host's
    now = clock.at(q.stream)
    report = status.with_levels(store.client, q, now)
    if q.levels:  # its figures the queue's, as the overview's row: its levels' in "levels"
        report.update(status.over_levels(report))
    report["hour"] = figures.last_hour(store.client, q, now)
    listed = registry.listing(store.client)["daemons"]
    report["daemons"] = [s for lvl in q.all_levels()
                         for s in registry.serving(listed, lvl.stream, lvl.group)]  # fmt: skip
    report["concurrency"] = q.concurrency
    report["levels_names"] = [lvl.priority for lvl in q.levels]
    counted = running_count(store.running_read(q))
    report["running_count"], report["running_at_most"] = counted.values()
    try:
        report["recent_count"] = int(store.client.zcard(q.keys.history_at))
    except redis.ResponseError as exc:  # a key of another type: that figure only, said so
        report["recent_count"] = None
        report["errors"] = [unreadable(store.client, {q.keys.history_at: "zset"}, exc)]
    return {"queue": q.name, "time": clock.at(DAEMONS), "status": report}


def jobs(store: Store, config: Config, query: Query) -> dict[str, Any]:
    """A page of the queue's jobs in one state (see the module's docstring)."""
    q = actions.queue_of(config, {"queue": one(query, "queue")})
    state = one(query, "state")
    if state not in STATES:
        raise BadRequest(f"state is one of {', '.join(STATES)}")
    level = q
    if q.levels:
        name = one(query, "level", q.levels[0].priority)
        level = next((lvl for lvl in q.levels if lvl.priority == name), None)  # type: ignore[assignment]
        if level is None:
            raise BadRequest("level is one of the queue's priority levels")
    count = number(one(query, "count", str(PAGE)), "count", PAGE_MAX)
    find = one(query, "find", "")
    if len(find) > actions.MAX_JOB_ID:
        raise BadRequest(f"find is at most {actions.MAX_JOB_ID} characters")
    cursor = one(query, "cursor", "")
    on = level if state in ("waiting", "delayed") else q  # a level's own: its stream, its set
    try:
        page = PAGES[state](store, config, on, cursor, count, find)
    except redis.ResponseError as exc:  # a key of another type: the page says so, empty
        page = {"jobs": [], "cursor": None, "error": unreadable(store.client, READ[state](on), exc)}
    return {"queue": q.name, "state": state, "level": level.priority, "find": find, **page}


def _waiting(
    store: Store, config: Config, q: QueueConfig, cursor: str, count: int, find: str
) -> dict[str, Any]:
    """Entries of the stream after the group's last delivered id (or the cursor), oldest first."""
    start = "-"
    group = status.group_of(store.client, q)  # in Redis, no entry copied (lib/group.lua)
    if group is not None:
        start = "(" + os.fsdecode(group.last_delivered)
    if cursor:
        after = _entry_id(cursor)
        if start == "-" or _id_key(after) > _id_key(start[1:]):
            start = "(" + after
    asked = [(field, cap) for _, field, cap in WAITING_SHOWN]
    page = store.entries_shown(q.stream, (start, "+"), asked, count, SCAN, find)
    rows = []
    for entry, width, values in page.rows:
        attempt = shown.text(values[2][0])
        rows.append({"entry": entry, **shown.waiting_job_id(entry, values[:2]),
                     "enqueued": int(entry.split("-")[0]) / 1000,
                     "attempt": attempt or "1", "stream": q.stream,
                     **shown.unshown_fields(width, values)})  # fmt: skip
    return {"jobs": rows, "cursor": None if page.ended else page.last}


def _dead(
    store: Store, config: Config, q: QueueConfig, cursor: str, count: int, find: str
) -> dict[str, Any]:
    """Dead letters, newest first, from before the cursor; payloads only when shown."""
    fields = shown.SHOWN if config.dashboard.show_payloads else shown.SHOWN[:-1]
    asked = [(field, cap) for _, field, cap in fields]
    start = "(" + _entry_id(cursor) if cursor else "+"
    page = store.entries_shown(q.dead_letter.stream, (start, "-"), asked, count, SCAN, find,
                               newest_first=True)  # fmt: skip
    rows = [shown.dead_letter(Shown(entry, values, width), fields)
            for entry, width, values in page.rows]  # fmt: skip
    return {"jobs": rows, "cursor": None if page.ended else page.last}


def _delayed(
    store: Store, config: Config, q: QueueConfig, cursor: str, count: int, find: str
) -> dict[str, Any]:
    """The delayed set by due time, past the cursor; only the job id and attempt of each
    member leave Redis; a search looks at ``SCAN`` members at most."""
    page = store.delayed_shown(q, _cursor(cursor), count, SCAN, find, cap=shown.JOB_ID_SHOWN)
    rows = [shown.delayed(q, d) for d in page.rows]
    more = None if page.ended else page.next
    return {"jobs": rows, "cursor": more.text() if more else None}


def _running(
    store: Store, config: Config, q: QueueConfig, cursor: str, count: int, find: str
) -> dict[str, Any]:
    """The running jobs of every level, oldest first (a queue runs at most its slots' worth),
    past the cursor: the (start time, job id) of the last one shown; of the active records one
    read takes (the same ones at each read: ``lib/shown.lua hash_read``; ``unread``: those it
    did not). A search is a lookup of that job id (exact), as the recent tab's."""
    after = _cursor(cursor)
    read = store.running_read(q, job_id=find)  # a search: that job's record alone (HGET)
    found = sorted(((r.since_ms or 0, os.fsencode(r.job_id), r) for r in read.jobs),
                   key=lambda t: t[:2])  # fmt: skip
    if after is not None:
        found = [t for t in found if after.passed(*t[:2])]
    page = found[:count]
    more = len(found) > count
    return {"jobs": [shown.running(r) for _, _, r in page],
            "cursor": Cursor.of(*page[-1][:2]).text() if more else None,
            "unread": 0 if read.complete else read.records - read.read}  # fmt: skip


def _recent(
    store: Store, config: Config, q: QueueConfig, cursor: str, count: int, find: str
) -> dict[str, Any]:
    """The history's jobs by their latest record, latest first, past the cursor; a search is
    a lookup by id."""
    after = _cursor(cursor)
    if find:
        view = store.job(q, find)
        rows = [{"job_id": find, "event": view.state, "at": None}] if view.records else []
        return {"jobs": rows, "cursor": None}
    total, found, last = store.recent(q, after, count)  # fewer than count: the bytes bound
    rows = [{**shown.job_id_shown(os.fsdecode(r.job_id)), "at": shown.seconds(r.at_ms),
             "event": r.event, "attempt": r.attempt, "exit_code": r.exit_code, "signal": r.signal,
             "error": r.error, "duration_ms": r.duration_ms, "consumer": r.consumer,
             **({"bad": shown.unread_history(r.unread)} if r.unread else {})}
            for r in found]  # fmt: skip
    return {"jobs": rows, "cursor": last.text() if last else None, "total": total}


PAGES = {"waiting": _waiting, "dead": _dead, "delayed": _delayed, "running": _running,
         "recent": _recent}  # fmt: skip
# The keys each page reads, and the type jobd keeps at each (what ``unreadable`` checks).
READ = {
    "waiting": lambda q: {q.stream: "stream"},
    "dead": lambda q: {q.dead_letter.stream: "stream"},
    "delayed": lambda q: {q.keys.delayed: "zset"},
    "running": lambda q: {q.keys.active: "hash"},
    "recent": lambda q: {q.keys.history_at: "zset", q.keys.history: "hash"},
}


def unreadable(client: redis.Redis, expected: dict[str, str], error: Exception) -> str:
    """Why a read failed, for the reply (never a 500): the first of the keys read that holds
    another type than jobd keeps there (someone else's), else Redis's own words."""
    for key, kind in expected.items():
        try:
            found = os.fsdecode(client.type(key))
        except redis.ResponseError:
            continue
        if found not in (kind, "none"):
            return (f"the key {key} holds a {found}, not a {kind} (written by someone else): "
                    "this cannot be shown until it is deleted")  # fmt: skip
    return f"Redis refused the read: {error}"


def _entry_id(cursor: str) -> str:
    if not actions.RECORD_ID.fullmatch(cursor):
        raise BadRequest(BAD_CURSOR)
    return cursor


def _cursor(text: str) -> Cursor | None:
    """A sorted set's cursor a page gave (None: the first page)."""
    if not text:
        return None
    try:
        return Cursor.parse(text)
    except ValueError:
        raise BadRequest(BAD_CURSOR) from None


def _id_key(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq or 0)


def number(text: str, name: str, top: int) -> int:
    """A count or index given in a query: 0 < n ≤ top for a count, 0 ≤ n for an index."""
    low = 1 if name == "count" else 0
    if not (text.isascii() and text.isdigit() and len(text) < 17 and low <= int(text) <= top):
        raise BadRequest(f"{name} is a number from {low} to {top}")
    return int(text)


def one(query: Query, name: str, default: str | None = None) -> str:
    """The one value of query parameter ``name``."""
    values = query.get(name, [] if default is None else [default])
    if len(values) != 1:
        raise BadRequest(f"give {name} once")
    return values[0]


def batch_page(store: Store, config: Config, query: Query) -> dict[str, Any]:
    """One batch's progress (``jobd batch``: one script reading one hash): its counts and
    state and incarnation, or ``found`` false when there is no such batch (never made, or
    expired)."""
    from jobd.workflows import WorkflowError, check_batch_id

    batch_id = one(query, "id")
    try:
        check_batch_id(batch_id)
    except WorkflowError as exc:
        raise BadRequest(str(exc)) from None
    state = store.batch_op(batch_id, "show")
    if state is None:
        return {"batch": batch_id, "found": False}
    # which batch of the id it is (lua/batch.lua; None: one made before jobd said): a job's page
    # tells "an earlier batch of this id" when its records name another (/api/job's
    # batch_incarnation), as `jobd job` does
    return {**state.counts(), "found": True, "on_complete": state.on_complete or None,
            "incarnation": state.incarnation or None}  # fmt: skip


READS = {"/api/daemons": daemons, "/api/queue": queue_page,
         "/api/jobs": jobs, "/api/batch": batch_page}  # fmt: skip
