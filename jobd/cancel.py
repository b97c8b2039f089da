"""Cancelling jobs wherever they are (`jobd cancel`, the dashboard's Cancel): every stream of a
queue (its priority levels') is asked, then the delayed sets for what was found nowhere else
(``Store.cancel``, ``Store.cancel_delayed``); how to say where each was found; and waiting
until the running ones are settled, and saying whether that shows their handlers ended
(``jobd cancel --wait``)."""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass

from jobd.config import QueueConfig
from jobd.logs import word
from jobd.store.control import Found
from jobd.store.store import Store

log = logging.getLogger("jobd.cancel")

WAIT_POLL = 0.1  # seconds between two askings whether the cancelled jobs have stopped (--wait)


def cancel(
    store: Store, q: QueueConfig, job_ids: list[str], unseen_ms: int, by: str
) -> list[Found]:
    """Cancel on every stream of the queue (its priority levels'); the delayed sets are walked
    only for the jobs found nowhere else. A job found nowhere is cancelled if it is read within
    ``unseen_ms``. ``by`` (user@host) is in the queue's events. In the order of ``job_ids``:
    every place each was found (a job id sent twice may run, or wait, twice), or one 'marked'
    when it was found nowhere."""
    found: list[Found] = []
    for i, level in enumerate(q.all_levels()):
        found += store.cancel(level, job_ids, unseen_ms, by if i == 0 else "")
    placed = {f.job_id for f in found if f.where != "marked"}
    missing = [j for j in dict.fromkeys(job_ids) if j not in placed]
    for level in q.all_levels() if missing else ():
        found += store.cancel_delayed(level, missing, by)
    placed = {f.job_id for f in found if f.where != "marked"}
    missing = [j for j in missing if j not in placed]
    if missing:  # held until others end (jobd.workflows): cancelled unrun, its end told on
        found += [Found(j, "held") for j in store.cancel_held(q, missing, by)[0]]
    if any(f.where in ("delayed", "held") for f in found):
        move_notices(store, q)
    rows: dict[str, list[Found]] = {j: [] for j in job_ids}
    for f in found:
        if f.where != "marked":
            rows[f.job_id].append(f)
    marked = {f.job_id: f for f in found if f.where == "marked"}
    return [f for j, fs in rows.items() for f in (fs or [marked[j]])]


def move_notices(store: Store, q: QueueConfig, whose: str = "the cancelled jobs'") -> None:
    """The notices jobs' ends wrote into ``q``'s outbox (to their waiters, their batches) moved
    on now, not at the queue's daemons' next look (every 2 s): the last step of a cancel (or of
    an enqueue whose held job was dead-lettered at once), its failure only logged: they stay in
    the outbox for the daemons (Redis away, or someone else's notice that fails at every move,
    store/outbox.py), no reason to fail what was done."""
    try:
        store.move_follow_ups(q)
    except Exception as exc:  # the daemons move them
        log.warning("queue=%s %s notices are left to the daemons: %s", q.name, whose, exc)


@dataclass(frozen=True)
class Stop:
    """What ``--wait`` saw of a job found running: 'stopped' (its outcome written by the daemon
    that ran it, so its handler has ended), 'running' (still pending at the end), or
    'unconfirmed' (settled ``by`` another consumer, or by no one a record names: its entry was
    taken over from a daemon that died or is cut off from Redis, and acknowledged unrun; a
    handler still running there, unseen from Redis, is stopped when that daemon reaches Redis
    again, at its next lease renewal)."""

    found: Found
    state: str
    by: str = ""


def stop_waits(
    store: Store, q: QueueConfig, found: list[Found], timeout: float | None
) -> list[Stop]:
    """Wait until each job found running is no longer pending (its outcome written), for
    ``timeout`` seconds at most (None: as long as it takes), then say who settled it (its
    history: the last record of its entry). Redis shows when an entry is settled, not when a
    handler ends: only an outcome written by the daemon that ran the handler says it ended."""
    levels = {level.stream: level for level in q.all_levels()}
    left = [f for f in found if f.where == "running"]
    settled: list[Found] = []
    end = None if timeout is None else time.monotonic() + timeout
    while left:
        by_stream: dict[str, list[Found]] = {}
        for f in left:
            by_stream.setdefault(f.stream, []).append(f)
        still = []
        for stream, fs in by_stream.items():
            pending = set(store.still_pending(levels[stream], [f.entry for f in fs]))
            still += [f for f in fs if f.entry in pending]
            settled += [f for f in fs if f.entry not in pending]
        left = still
        if not left or (end is not None and time.monotonic() >= end):
            break
        time.sleep(WAIT_POLL if end is None else max(0.0, min(WAIT_POLL, end - time.monotonic())))
    stops = {id(f): Stop(f, "running") for f in left}
    for f in settled:
        by = settled_by(store, q, f)
        stops[id(f)] = Stop(f, "stopped" if by == f.consumer else "unconfirmed", by)
    return [stops[id(f)] for f in found if id(f) in stops]


def settled_by(store: Store, q: QueueConfig, f: Found) -> str:
    """The consumer that wrote the outcome of the entry ``f`` found running ('' when no record
    says: history off, or trimmed)."""
    for record in reversed(store.job(q, f.job_id).records):
        ours = record.entry == f.entry and record.stream in ("", f.stream)
        if ours and record.event not in ("lease lost", "reclaimed"):
            return record.consumer
    return ""


def said(stop: Stop) -> str:
    """A line of ``--wait`` about a job found running."""
    f = stop.found
    job = word(f.job_id)
    if stop.state == "stopped":
        return f"{job}: stopped (entry {f.entry})"
    if stop.state == "running":
        return f"{job}: still running (entry {f.entry})"
    by = f"by {stop.by}" if stop.by else "(no record says by whom)"
    return (f"{job}: settled {by}, not by {f.consumer} that ran it (entry {f.entry}): "
            f"taken over from a daemon that died or is cut off from Redis, acknowledged "
            f"unrun; not confirmed stopped: a handler still running there is stopped when "
            f"that daemon reaches Redis again (its next lease renewal)")  # fmt: skip


def where(f: Found, unseen: str) -> str:
    if f.where == "running":
        return (f"running on {f.consumer} (entry {f.entry}): its handler is stopped now "
                "(within a second); outcome cancelled")  # fmt: skip
    if f.where == "waiting":
        return f"waiting (entry {f.entry}): acknowledged unrun whenever it is read"
    if f.where == "held":
        return "held (waiting for other jobs): cancelled unrun; the jobs waiting for it are told"
    if f.where == "delayed" and f.due_ms is None:
        return "delayed (due never: its score is no time): removed"
    if f.where == "delayed":
        try:
            due = datetime.datetime.fromtimestamp((f.due_ms or 0) / 1000, datetime.UTC)
        except (OverflowError, ValueError, OSError):  # past year 9999 (someone else's score)
            return f"delayed (due {f.due_ms} ms after 1970, no date): removed"
        return f"delayed (due {due.isoformat(timespec='seconds')}): removed"
    return ("not found running, waiting or delayed; cancelled if it is read or becomes due "
            f"within {unseen}")  # fmt: skip
