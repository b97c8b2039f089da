"""How the dashboard shows what Redis holds: a record, a job id, a running or delayed job, as
JSON the page puts into text nodes. A value is read only in the fields shown, cut in Redis; a
field jobd would not have written is shown as it is, with why the record is bad, never failing
the page; bytes that are not UTF-8 are escaped (``\\xff``)."""

from __future__ import annotations

import os
from typing import Any

from jobd.config import QueueConfig
from jobd.job import MAX_FIELDS, MAX_JOB_ID
from jobd.store.admin import Shown
from jobd.store.browse import READ_BUDGET, DelayedShown
from jobd.store.keys import HISTORY_BYTES
from jobd.store.records import Running
from jobd.web import actions

DEAD_LETTERS_SHOWN = 20
STDERR_SHOWN = 2048  # bytes of each record's stderr tail on the page
PAYLOAD_SHOWN = 4096  # bytes of the head of each payload, when payloads are shown
FIELD_SHOWN = 256  # bytes of the head of every other field
JOB_ID_SHOWN = MAX_JOB_ID  # a job id whole: jobd runs no job under a longer one
# What the page shows of a record: its name there, the record's field, and the bytes Redis
# returns of it (the first N; -N: the last N). The payload comes last (shown or not).
SHOWN = (
    ("job_id", "jobd_job_id", JOB_ID_SHOWN), ("error", "jobd_error", FIELD_SHOWN),
    ("exit_code", "jobd_exit_code", FIELD_SHOWN), ("signal", "jobd_signal", FIELD_SHOWN),
    ("attempts", "jobd_attempts", FIELD_SHOWN), ("failed_at", "jobd_failed_at", FIELD_SHOWN),
    ("stderr", "jobd_stderr", -STDERR_SHOWN), ("payload", "payload", PAYLOAD_SHOWN),
)  # fmt: skip


def delayed(level: QueueConfig, d: DelayedShown) -> dict[str, Any]:
    """A delayed job as the page shows it: when it is due, its job id (None: it runs under its
    entry id once due) and attempt (none of its payload); a member that is not a job says why."""
    attempt = None if d.malformed else text(d.attempt or b"1")
    item: dict[str, Any] = {"due": seconds(d.due_ms), "job_id": None, "attempt": attempt,
                            "level": level.priority}  # fmt: skip
    if d.job_id is not None:
        item.update(job_id_shown(os.fsdecode(d.job_id), cut=d.job_id_length > len(d.job_id)))
    if d.malformed:
        item["bad"] = d.malformed[:FIELD_SHOWN]
    return item


def waiting_job_id(entry: str, values: list[tuple[bytes | None, int]]) -> dict[str, Any]:
    """The job id a waiting entry runs under, as jobd.job takes it, from its job_id and
    jobd_job_id fields as ``entries_shown`` gives them (cut to JOB_ID_SHOWN, whole lengths): the
    first present, unless empty or holding a NUL byte; the entry's id when none is, or when the
    first present is longer than a job id (the entry is malformed, never run)."""
    for value, length in values:
        if value is None:
            continue
        if length > MAX_JOB_ID:
            break
        if value and b"\0" not in value:
            return job_id_shown(os.fsdecode(value), cut=length > len(value))
    return job_id_shown(entry)


def dead_letter(shown: Shown, fields: tuple[tuple[str, str, int], ...]) -> dict[str, Any]:
    """One record as the page shows it; a field jobd would not have written is shown as it is,
    with why the record is bad, never failing the page."""
    item: dict[str, Any] = {"id": shown.id}
    cut, raw_id = [], None
    for (name, _, cap), (value, length) in zip(fields, shown.values, strict=True):
        item[name] = text(value)
        raw_id = value if name == "job_id" else raw_id
        if length > abs(cap):
            cut.append(name)
    if raw_id and job_id_shown(os.fsdecode(raw_id), "job_id" in cut).get("inexact"):
        item["inexact"] = True  # not UTF-8 (escaped), cut or too long: the page shows it as text
    item.update(unshown_fields(shown.width, shown.values))
    item["exit_code"] = item["exit_code"] or None
    item["signal"] = item["signal"] or None
    item["failed_at"], bad = failed_at(item["failed_at"], "failed_at" in cut)
    if bad:
        item["bad"] = bad
    if cut:
        item["cut"] = cut  # only the tail of stderr, the head of the others
    return item


def unshown_fields(width: int, values: list[tuple[bytes | None, int]]) -> dict[str, Any]:
    """For an entry wider than jobd writes one (more than MAX_FIELDS fields: 100 000 empty
    ones, say), how many of its fields the page does not show (``fields_not_shown``: "… N
    fields not shown"); nothing for any other."""
    if width <= MAX_FIELDS:
        return {}
    return {"fields_not_shown": width - sum(value is not None for value, _ in values)}


def failed_at(text: str, cut: bool) -> tuple[float | None, str | None]:
    """Seconds since the epoch from jobd_failed_at (milliseconds), or None and why not."""
    if not text:
        return None, "no jobd_failed_at"
    try:
        if cut:
            raise ValueError(text)
        return int(text) / 1000, None
    except (ValueError, OverflowError):
        return None, "jobd_failed_at is not a time in milliseconds"


def unread_history(length: int) -> str:
    """Why a job's latest record is not shown: its records are longer than a page reads."""
    return (f"its records are {length} bytes, more than a page reads ({READ_BUDGET}; jobd keeps "
            f"{HISTORY_BYTES} a job): not read")  # fmt: skip


def text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", "backslashreplace")


def seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def job_id_shown(job_id: str, cut: bool = False) -> dict[str, Any]:
    """A job id as the page shows it, and whether the page can name it back exactly (cancel,
    lookup): not when it was ``cut`` (only its head read), is not UTF-8 (shown with escapes) or
    is longer than an action takes."""
    raw = os.fsencode(job_id)
    text = raw.decode("utf-8", "backslashreplace")
    exact = text == raw.decode("utf-8", "replace") and len(text) <= actions.MAX_JOB_ID and not cut
    return {"job_id": text} if exact else {"job_id": text, "inexact": True}


def running(r: Running) -> dict[str, Any]:
    """A running job as the page shows it (times: Unix seconds on Redis's clock)."""
    return {
        **job_id_shown(r.job_id), "stream": r.stream, "entry": r.entry, "consumer": r.consumer,
        "host": r.host, "pid": r.pid, "since": seconds(r.since_ms), "attempt": r.attempt,
        "deadline": seconds(r.deadline_ms), "progress": r.progress, "status": r.status,
        "cancelling": r.cancelling,
    }  # fmt: skip
