"""Cancelling jobs wherever they are (`jobd cancel`, the dashboard's Cancel): every stream of a
queue (its priority levels') is asked, then the delayed sets for what was found nowhere else
(``Store.cancel``, ``Store.cancel_delayed``); and how to say where each was found."""

from __future__ import annotations

import datetime

from jobd.config import QueueConfig
from jobd.store.control import Found
from jobd.store.store import Store


def cancel(store: Store, q: QueueConfig, job_ids: list[str], wait_ms: int, by: str) -> list[Found]:
    """Cancel on every stream of the queue (its priority levels'); the delayed sets are walked
    only for the jobs found nowhere else. ``by`` (user@host) is in the queue's events."""
    best: dict[str, Found] = {}
    for i, level in enumerate(q.all_levels()):
        for f in store.cancel(level, job_ids, wait_ms, by if i == 0 else ""):
            if best.get(f.job_id) is None or best[f.job_id].where == "marked":
                best[f.job_id] = f
    missing = [j for j in job_ids if best[j].where == "marked"]
    for level in q.all_levels() if missing else ():
        for f in store.cancel_delayed(level, missing, by):
            best[f.job_id] = f
    return [best[j] for j in dict.fromkeys(job_ids)]


def where(f: Found, wait: str) -> str:
    if f.where == "running":
        return (f"running on {f.consumer} (entry {f.entry}): stopped at that daemon's next "
                "lease renewal; outcome cancelled")  # fmt: skip
    if f.where == "waiting":
        return f"waiting (entry {f.entry}): acknowledged unrun when it is read"
    if f.where == "delayed":
        due = datetime.datetime.fromtimestamp(f.due_ms / 1000, datetime.UTC)
        return f"delayed (due {due.isoformat(timespec='seconds')}): removed"
    return f"not found running or delayed; cancelled if it is read within {wait}"
